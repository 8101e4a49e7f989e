#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The process's memory as `/metrics` reports it: the heap in use, to the byte, and the resident set.
///
/// Resident memory moves in pages and in the allocator's steps (glibc grows and trims its arenas by 128 KiB and
/// more), so a growth of a few dozen bytes per request hides in it for thousands of requests. The heap in use
/// has no such granularity: it is what `malloc` has handed out and not had back, so a leak of one small object
/// per connect shows after a few hundred connects (the soak suite, Tests/soak, asserts on it).
struct ProcessMemory: Sendable, Equatable {
    /// Bytes allocated with `malloc` and not freed, over every arena: what glibc's `mallinfo2()` reports as
    /// `uordblks + hblkhd` (chunks in use, headers included, and blocks served by `mmap`; chunks a thread keeps
    /// in its tcache count as in use). nil where the C library does not say (musl, Darwin).
    var heapAllocated: Int?
    /// Resident set size (`/proc/self/statm`'s second field, in pages, times the page size); nil off Linux.
    var resident: Int?

    static func current() -> ProcessMemory {
        ProcessMemory(heapAllocated: heapAllocatedBytes(), resident: residentBytes())
    }

    /// The heap in use from glibc's `malloc_info()` totals: the arenas' memory from the system, less their free
    /// chunks (fast bins, other bins and the top chunk), plus the `mmap`ed blocks. `malloc.h` is not part of the
    /// Glibc module, so `malloc_info` (whose signature, unlike `mallinfo2`'s struct return, Swift can call
    /// through a C function pointer) is looked up with `dlsym`.
    static func heapAllocatedBytes() -> Int? {
        #if canImport(Glibc)
            guard let mallocInfo = MallocInfo.function else { return nil }
            var buffer: UnsafeMutablePointer<CChar>? = nil
            var length = 0
            guard let stream = open_memstream(&buffer, &length) else { return nil }
            let status = mallocInfo(0, stream)
            fclose(stream)
            defer { free(buffer) }
            guard status == 0, let buffer else { return nil }
            return MallocInfo.allocated(inXML: String(cString: buffer))
        #else
            return nil
        #endif
    }

    static func residentBytes() -> Int? {
        #if os(Linux)
            guard let file = fopen("/proc/self/statm", "r") else { return nil }
            defer { fclose(file) }
            var line = [CChar](repeating: 0, count: 128)
            guard fgets(&line, Int32(line.count), file) != nil else { return nil }
            let text = String(decoding: line.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let fields = text.split(separator: " ")
            let page = sysconf(Int32(_SC_PAGESIZE))
            guard fields.count >= 2, let pages = Int(fields[1]), page > 0 else { return nil }
            return pages * page
        #else
            return nil
        #endif
    }
}

#if canImport(Glibc)
    /// glibc's `malloc_info(int options, FILE *stream)`, and the reading of what it writes.
    enum MallocInfo {
        typealias Function = @convention(c) (CInt, UnsafeMutablePointer<FILE>?) -> CInt

        /// Looked up once; libc stays loaded.
        static let function: Function? = {
            guard let handle = dlopen(nil, RTLD_NOW), let symbol = dlsym(handle, "malloc_info") else { return nil }
            return unsafeBitCast(symbol, to: Function.self)
        }()

        /// Bytes in use from the totals that close the document (the lines after the last `</heap>`, such as
        /// `<total type="mmap" count="2" size="270336"/>`): `system current - fast - rest + mmap`; nil when one of
        /// them is missing.
        static func allocated(inXML xml: String) -> Int? {
            var sizes: [String: Int] = [:]
            for line in xml.split(separator: "\n").reversed() {
                if line.hasPrefix("</heap>") { break }
                let words = line.split(whereSeparator: { $0 == " " || $0 == "<" || $0 == "/" || $0 == ">" })
                guard words.count >= 2 else { continue }
                func attribute(_ name: String) -> Substring? {
                    words.first(where: { $0.hasPrefix(name + "=\"") })?.dropFirst(name.count + 2).prefix(while: {
                        $0 != "\""
                    })
                }
                if let type = attribute("type"), let size = attribute("size").flatMap({ Int($0) }) {
                    sizes["\(words[0]) \(type)"] = size
                }
            }
            guard let system = sizes["system current"], let fast = sizes["total fast"], let free = sizes["total rest"],
                let mmap = sizes["total mmap"]
            else { return nil }
            return system - fast - free + mmap
        }
    }
#endif
