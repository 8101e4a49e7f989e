/* Counts the heap allocations of the process it is preloaded into (LD_PRELOAD), as swift-nio's allocation
 * counter does: every call of malloc, calloc, realloc, posix_memalign, aligned_alloc and memalign, across every
 * thread. The count lives in a file (ALLOC_COUNTER_FILE, 8 bytes, mapped shared), so a test reads it from outside
 * at any moment. Before the file is mapped (the loader's own allocations), the count goes to a local word. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static _Atomic uint64_t early;
static _Atomic uint64_t *counter = &early;

static inline void count(void) { atomic_fetch_add_explicit(counter, 1, memory_order_relaxed); }

__attribute__((constructor)) static void map_counter(void) {
    const char *path = getenv("ALLOC_COUNTER_FILE");
    if (path == NULL) return;
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return;
    if (ftruncate(fd, sizeof(uint64_t)) == 0) {
        void *word = mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (word != MAP_FAILED) counter = word;
    }
    close(fd);
}

void *malloc(size_t size) {
    count();
    return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
    count();
    return __libc_calloc(n, size);
}

void *realloc(void *pointer, size_t size) {
    count();
    return __libc_realloc(pointer, size);
}

void *memalign(size_t alignment, size_t size) {
    count();
    return __libc_memalign(alignment, size);
}

void *aligned_alloc(size_t alignment, size_t size) {
    count();
    return __libc_memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) return 22; /* EINVAL */
    count();
    void *pointer = __libc_memalign(alignment, size);
    if (pointer == NULL) return 12; /* ENOMEM */
    *out = pointer;
    return 0;
}
