#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The four functions of libsystemd's daemon API that `Systemd` calls, looked up with `dlopen`/`dlsym` at run
/// time instead of linked: building needs no `libsystemd-dev` (nor pkg-config), and the binary starts where
/// there is no libsystemd (a container, macOS), with systemd notifications, the watchdog and socket
/// activation off. The library is opened once and never closed.
// @unchecked: C function pointers into a library that stays loaded; they carry no state of their own.
public struct LibSystemd: @unchecked Sendable {
    typealias Notify = @convention(c) (CInt, UnsafePointer<CChar>?) -> CInt
    typealias WatchdogEnabled = @convention(c) (CInt, UnsafeMutablePointer<UInt64>?) -> CInt
    typealias ListenFDsWithNames =
        @convention(c) (
            CInt, UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>?
        ) -> CInt
    typealias IsSocket = @convention(c) (CInt, CInt, CInt, CInt) -> CInt

    /// The soname every systemd since 209 ships (Debian's `libsystemd0`, present wherever systemd is).
    public static let soname = "libsystemd.so.0"

    /// The library as loaded on first use, or nil with why (`loadError`).
    static let loaded: Result<LibSystemd, LoadError> = load(soname)
    static var shared: LibSystemd? { try? loaded.get() }

    /// Why libsystemd could not be loaded (`dlerror()`), nil when it was.
    public static var loadError: String? {
        if case .failure(let error) = loaded { return error.description }
        return nil
    }

    struct LoadError: Error, CustomStringConvertible {
        var description: String
    }

    let notify: Notify
    let watchdogEnabled: WatchdogEnabled
    let listenFDsWithNames: ListenFDsWithNames
    let isSocket: IsSocket

    /// Opens `name` and looks up the four functions; fails when the library or any of them is missing.
    static func load(_ name: String) -> Result<LibSystemd, LoadError> {
        guard let handle = dlopen(name, RTLD_NOW | RTLD_LOCAL) else {
            return .failure(LoadError(description: lastError() ?? "cannot load \(name)"))
        }
        func symbol<F>(_ symbol: String, as type: F.Type) throws(LoadError) -> F {
            guard let address = dlsym(handle, symbol) else {
                throw LoadError(description: lastError() ?? "\(name) has no \(symbol)")
            }
            return unsafeBitCast(address, to: type)
        }
        do {
            return .success(
                LibSystemd(
                    notify: try symbol("sd_notify", as: Notify.self),
                    watchdogEnabled: try symbol("sd_watchdog_enabled", as: WatchdogEnabled.self),
                    listenFDsWithNames: try symbol("sd_listen_fds_with_names", as: ListenFDsWithNames.self),
                    isSocket: try symbol("sd_is_socket", as: IsSocket.self)))
        } catch {
            dlclose(handle)
            return .failure(error)
        }
    }

    private static func lastError() -> String? {
        dlerror().map { String(cString: $0) }
    }
}
