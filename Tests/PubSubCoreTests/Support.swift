import Bayeux
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded

@testable import PubSubCore

/// Drives a broker with messages written as JSON text, on an embedded loop, with explicit time.
struct Harness {
    let loop = EmbeddedEventLoop()
    let broker: Broker
    var now = NIODeadline.uptimeNanoseconds(1_000_000_000)

    init(configuration: BrokerConfiguration = .init(timeout: .seconds(45)), extensions: [any BayeuxExtension] = []) {
        broker = Broker(configuration: configuration, extensions: ExtensionPipeline(extensions))
    }

    init(engine: MemoryEngine) {
        broker = Broker(configuration: engine.configuration, engine: engine)
    }

    func send(_ json: String, sink: (any DeliverySink)? = nil, type: ConnectionType = .longPolling) -> [Outcome] {
        let elements = MessageBatch.elements(of: try! JSONParser().parse(json))!
        let future = broker.handle(
            elements, context: RequestContext(connectionType: type), sink: sink, now: now, on: loop)
        let box = NIOLockedValueBox<[Outcome]?>(nil)
        future.whenSuccess { outcomes in box.withLockedValue { $0 = outcomes } }
        loop.run()
        let outcomes = box.withLockedValue { $0! }
        // As a transport does (`Broker.split`): a connect answered now closes its session's batch as it is sent.
        for case .connect(let connect) in outcomes where connect.result.answerNow {
            var reply = connect.reply
            broker.closeBatch(&reply, for: connect)
        }
        return outcomes
    }

    /// The replies as JSON (a successful connect shows its reply).
    func replies(_ json: String, sink: (any DeliverySink)? = nil) -> [JSONValue] {
        send(json, sink: sink).compactMap { outcome in
            switch outcome {
            case .reply(let m): return .object(m.fields)
            case .connect(let c): return .object(c.reply.fields)
            case .none: return nil
            }
        }
    }

    func reply(_ json: String, sink: (any DeliverySink)? = nil) -> JSONObject {
        replies(json, sink: sink)[0].objectValue!
    }

    func handshake() -> String {
        reply(#"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)[
            "clientId"]!
            .stringValue!
    }

    func connect(_ clientId: String, sink: (any DeliverySink)? = nil) -> Outcome {
        send(#"{"channel":"/meta/connect","clientId":"\#(clientId)","connectionType":"long-polling"}"#, sink: sink)[0]
    }

    func subscribe(_ clientId: String, _ channel: String) -> JSONObject {
        reply(#"{"channel":"/meta/subscribe","clientId":"\#(clientId)","subscription":"\#(channel)"}"#)
    }

    func publish(_ channel: String, _ data: String = "1") -> JSONObject {
        reply(#"{"channel":"\#(channel)","data":\#(data)}"#)
    }
}
