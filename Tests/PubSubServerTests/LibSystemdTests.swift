import Testing

@testable import PubSubServer

@Suite struct LibSystemdTests {
    #if os(Linux)
        /// Every Debian has `libsystemd0`; the ops suites check that what is loaded really talks to systemd.
        @Test func loadsTheSystemLibrary() throws {
            let library = try LibSystemd.load(LibSystemd.soname).get()
            var usec: UInt64 = 0
            // Not started by systemd: no watchdog, no sockets passed.
            #expect(library.watchdogEnabled(0, &usec) == 0)
            #expect(library.listenFDsWithNames(0, nil) == 0)
            #expect(Systemd.library != nil && LibSystemd.loadError == nil)
        }
    #endif

    @Test func aMissingLibraryIsAnErrorNotACrash() {
        let result = LibSystemd.load("libpubsub-no-such-library.so.0")
        guard case .failure(let error) = result else {
            Issue.record("loaded a library that does not exist")
            return
        }
        #expect(error.description.contains("libpubsub-no-such-library.so.0"))
    }
}
