"""Every `@unchecked Sendable` in Sources says why it is safe, in a `// @unchecked:` comment just above it.

The compiler cannot check these types; the comment is the proof a reader checks instead. It names the lock that
guards the mutable state (`lock`, the lock of a `NIOLockedValueBox`), or says that the type is immutable after it
is made, or loop-bound (touched on one event loop only) and why it is not an `NIOLoopBound`. A state that is
neither belongs in a lock or an `NIOLoopBound`, and then the type is plain `Sendable`."""

import os
import re

SOURCES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "Sources")
REASONS = re.compile(r"guarded by|immutable|loop-bound|C function pointers|test support|only ever inside")


def unchecked_declarations():
    for root, _, files in os.walk(SOURCES):
        for name in sorted(files):
            if not name.endswith(".swift"):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
            for i, line in enumerate(lines):
                if "@unchecked Sendable" in line and not line.lstrip().startswith("//"):
                    comment = []
                    j = i - 1
                    while j >= 0 and lines[j].lstrip().startswith("//") and not lines[j].lstrip().startswith("///"):
                        comment.insert(0, lines[j].strip().lstrip("/").strip())
                        j -= 1
                    yield os.path.relpath(path, SOURCES), i + 1, " ".join(comment)


def test_every_unchecked_sendable_says_why():
    missing = [f"{path}:{line}" for path, line, comment in unchecked_declarations()
               if not comment.startswith("@unchecked:") or not REASONS.search(comment)]
    assert not missing, ("an `@unchecked Sendable` without a `// @unchecked:` comment naming its lock or why it is "
                         "immutable or loop-bound:\n" + "\n".join(missing))


def test_the_check_finds_them():
    found = list(unchecked_declarations())
    assert any(path.endswith("MemoryEngine.swift") for path, _, _ in found)
    assert all(comment for _, _, comment in found)
