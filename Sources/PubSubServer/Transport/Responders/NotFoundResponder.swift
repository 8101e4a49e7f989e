import NIOCore
import NIOHTTP1

/// A path outside the mount and the other routes: Faye's answer, which names the mount.
struct NotFoundResponder: HTTPResponder {
    let mount: String

    func reply(to request: RoutedRequest, on loop: any EventLoop) -> HTTPReply {
        .now(.text(.notFound, "Sure you're not looking for \(mount.isEmpty ? "/" : mount) ?"))
    }
}
