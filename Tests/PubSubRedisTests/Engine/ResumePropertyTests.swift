import Bayeux
import NIOCore
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// Random schedules of publishes (of random sizes, against a history bounded by bytes), drains, disconnects and
/// resumes, on either engine; with Redis, each step runs on a random one of two nodes, so a client resumes on a
/// node other than the one that made its token. A client either gets every matching message exactly once and
/// in order, or is told `recovered: false` (and then starts over from "now").
@Suite(.serialized, .timeLimit(.minutes(3))) struct ResumePropertyTests {
    struct Client {
        var id: String
        var node: Int
        var last: String
    }

    @Test(arguments: EngineKind.allCases)
    func resumeIsExactOrHonest(_ kind: EngineKind) async throws {
        let configuration = BrokerConfiguration(historySize: 1000, historyBytes: 2000)
        try await withCluster(kind, nodes: kind.isRedis ? 2 : 1, configuration: configuration) { cluster in
            for seed in UInt64(1)...30 {
                var rng = SeededGenerator(seed: seed)
                let nodes = cluster.nodes
                func pick() -> Int { Int(rng.next() % UInt64(nodes.count)) }
                func settle() async throws { for node in nodes { try await node.settle() } }
                func start(resume: String?) async throws -> (Client, Bool?) {
                    let n = pick()
                    let handshake = try await nodes[n].reply(
                        #"{"channel":"/meta/handshake","version":"1.0","supportedConnectionTypes":["long-polling"]}"#)
                    let id = handshake["clientId"]!.stringValue!
                    let now = try #require(handshake["ext"]?.objectValue?["position"]?.stringValue)
                    _ = try await nodes[n].connect(id)
                    let reply = try await nodes[n].subscribe(
                        id, "/a/*", ext: resume.map { #"{"resume":"\#($0)"}"# } ?? "")
                    let flag = reply["ext"]?.objectValue?["resume"]?.objectValue?["recovered"]
                    let recovered: Bool? = flag == .bool(true) ? true : flag == .bool(false) ? false : nil
                    // A recovered client goes on from its own token; one that was not starts over from "now".
                    return (Client(id: id, node: n, last: recovered == true ? resume! : now), recovered)
                }
                func receive(_ client: inout Client) async throws -> [JSONValue] {
                    try await settle()
                    client.node = pick()
                    guard let c = try await nodes[client.node].connect(client.id) else { return [] }
                    let events = c.result.events.map { try! JSONParser().parse($0.json).arrayValue![0].objectValue! }
                    if let last = events.last { client.last = last["ext"]!.objectValue!["position"]!.stringValue! }
                    return events.map { $0["data"]!.objectValue!["n"]! }
                }
                var client: Client? = try await start(resume: nil).0
                var token = client!.last
                var expected: [JSONValue] = []
                var received: [JSONValue] = []
                var counter = 0
                for _ in 0..<40 {
                    switch rng.next() % 6 {
                    case 0, 1:
                        counter += 1
                        let pad = String(repeating: "p", count: Int(rng.next() % 900))
                        _ = try await nodes[pick()].publish("/a/x", #"{"n":\#(counter),"pad":"\#(pad)"}"#)
                        expected.append(JSONValue(counter))
                    case 2:
                        _ = try await nodes[pick()].publish("/b", "0")
                    case 3:
                        if var c = client {
                            received += try await receive(&c)
                            client = c
                            token = c.last
                        }
                    case 4:
                        if let c = client {
                            _ = try await nodes[pick()].reply(#"{"channel":"/meta/disconnect","clientId":"\#(c.id)"}"#)
                            token = c.last
                            client = nil
                        }
                    default:
                        if client == nil {
                            let (c, recovered) = try await start(resume: token)
                            client = c
                            #expect(recovered != nil)
                            if recovered == false {
                                expected = []
                                received = []
                            }
                        }
                    }
                }
                if client == nil {
                    let (c, recovered) = try await start(resume: token)
                    client = c
                    if recovered == false {
                        expected = []
                        received = []
                    }
                }
                var c = client!
                received += try await receive(&c)
                #expect(received == expected, "seed \(seed)")
                _ = try await nodes[0].reply(#"{"channel":"/meta/disconnect","clientId":"\#(c.id)"}"#)
            }
        }
    }
}
