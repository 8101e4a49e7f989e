import Bayeux
import NIOCore
import NIOHTTP1
import NIOPosix
import PubSubCore
import Testing

@testable import PubSubServer

/// An engine whose every publish ends uncertain, as a Redis engine's does when its connection breaks before Redis
/// answers (`PublishUncertain`).
final class UncertainEngine: DataPathOnlyEngine, @unchecked Sendable {
    override func publish(_ event: Message, to channel: String, now: NIODeadline, on loop: any EventLoop)
        -> EventLoopFuture<String?>
    {
        loop.makeFailedFuture(PublishUncertain(reason: "the connection to the store broke before it answered"))
    }
}

/// A publish whose outcome the engine cannot know is answered as Bayeux answers a failed publish, with its own
/// code, never a bare HTTP 500; the server API says why.
@Suite struct UncertainPublishTests {
    @Test func aBayeuxPublisherGetsAnErrorReply() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let broker = Broker(engine: UncertainEngine())
        let outcomes = try await broker.handle(
            MessageBatch.elements(of: try JSONParser().parse(#"[{"channel":"/a/b","data":1,"id":"9"}]"#))!,
            context: RequestContext(connectionType: .longPolling), sink: nil, now: .now(), on: loop
        ).get()
        guard case .reply(let reply) = outcomes.first else {
            Issue.record("no reply: \(outcomes)")
            return
        }
        #expect(reply["successful"] == .bool(false))
        #expect(reply["id"] == .string("9"))
        #expect(reply.error == "500:/a/b:Publish outcome unknown")
    }

    @Test func theServerAPISaysWhy() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let tests = ServerAPIEngineTests()
        let api = tests.api(UncertainEngine())
        let (status, object) = try await tests.call(
            api, .POST, "/api/publish", body: #"{"channel":"/a","data":1}"#, on: loop)
        #expect(status == .serviceUnavailable)
        #expect(object["error"]?.stringValue?.contains("broke before it answered") == true)
        // A broadcast reports it per channel.
        let (broadcastStatus, results) = try await tests.call(
            api, .POST, "/api/broadcast", body: #"{"channels":["/a","/b"],"data":1}"#, on: loop)
        #expect(broadcastStatus == .ok, "\(results)")
        let errors = results["results"]?.arrayValue?.compactMap { $0.objectValue?["error"]?.stringValue } ?? []
        #expect(errors.count == 2 && errors.allSatisfy { $0.contains("broke before it answered") }, "\(results)")
    }
}
