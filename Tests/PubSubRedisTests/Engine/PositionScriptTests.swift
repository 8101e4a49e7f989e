import NIOCore
import NIOPosix
import PubSubTesting
import Testing

@testable import PubSubCore
@testable import PubSubRedis

/// The position permutation runs in Swift (memory engine, the handshake position of a Redis node) and in the
/// Redis engine's Lua scripts (the position written into each published event, the resume): both must give the
/// very same tokens, in a real redis-server.
@Suite(.serialized, .timeLimit(.minutes(1))) struct PositionScriptTests {
    static let probe = RedisScripts.Script(
        RedisScripts.positionFunctions + """
            local key, out = ARGV[3], {}
            local n = tonumber(ARGV[4])
            for i = 0, n - 1 do
              local epoch, hi, lo = tonumber(ARGV[5 + 3 * i]), tonumber(ARGV[6 + 3 * i]), tonumber(ARGV[7 + 3 * i])
              out[#out + 1] = token(key, epoch, hi * 4294967296 + lo)
              local uh, ul = unpermute(key, hi, lo)
              local ph, pl = permute(key, uh, ul)
              out[#out + 1] = string.format('%08x%08x', uh, ul)
              out[#out + 1] = string.format('%08x%08x', ph, pl)
            end
            return out
            """)

    /// A client of `server`, connected (or given up on after 2 s: its commands then fail).
    private func connected(_ server: RedisServer) async throws -> RedisClient {
        let client = RedisClient(
            configuration: try RedisConfiguration(url: server.url),
            eventLoop: MultiThreadedEventLoopGroup.singleton.next())
        client.start()
        _ = try await waitUntil(timeout: .seconds(2)) { client.isConnected }
        return client
    }

    @Test func luaAndSwiftGiveTheSameTokens() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        let client = try await connected(server)
        defer { _ = client.close() }
        var rng = SystemRandomNumberGenerator()
        for key in [PositionKey(text: "0123456789abcdef0123456789abcdef")!, PositionKey.random(), PositionKey.random()]
        {
            // Sequences a Lua number holds exactly (below 2^53): as many as Redis' INCR will ever give.
            let sequences: [UInt64] =
                [0, 1, 2, 35, 36, 37, 1295, 1296, 0xffff_ffff, 1 << 32, (1 << 32) + 1, 1 << 52, (1 << 53) - 1]
                + (0..<40).map { _ in rng.next() as UInt64 >> 11 }
                + (0..<20).map { _ in UInt64.random(in: 0...100_000) }
            let epochs: [UInt64] = sequences.map { _ in UInt64.random(in: 1...(1 << 52)) }
            var arguments: [RESPArgument] = [0, "pk", "pc", .string(key.text), .integer(Int64(sequences.count))]
            for (epoch, sequence) in zip(epochs, sequences) {
                arguments += [
                    .string(String(epoch)), .integer(Int64(sequence >> 32)), .integer(Int64(sequence & 0xffff_ffff)),
                ]
            }
            let reply = try await client.send(RESPCommand(["EVAL", .string(Self.probe.plain.source)] + arguments)).get()
            let values = try #require(reply.array).map { $0.string ?? "" }
            #expect(values.count == 3 * sequences.count)
            for (i, (epoch, sequence)) in zip(epochs, sequences).enumerated() {
                #expect(
                    values[3 * i] == Position(epoch: epoch, sequence: sequence).token(key: key), "sequence \(sequence)")
                // The value passed in is taken as a permuted one: unpermute and permute back, both ways alike.
                let unpermuted = PositionCipher.unpermute(sequence, key: key)
                #expect(values[3 * i + 1] == hex16(unpermuted), "sequence \(sequence)")
                #expect(values[3 * i + 2] == hex16(sequence), "sequence \(sequence)")
            }
        }
    }

    @Test func luaUndoesFullWidthPermutedValues() async throws {
        let server = try await RedisServer.start()
        defer { server.stop() }
        let client = try await connected(server)
        defer { _ = client.close() }
        let key = PositionKey.random()
        // What tokens carry: permuted values over all 64 bits, as the node hands them to the subscribe script.
        let permuted = (0..<50).map { PositionCipher.permute(UInt64($0) * 7919, key: key) } + [0, .max, 1 << 63]
        var arguments: [RESPArgument] = [0, "pk", "pc", .string(key.text), .integer(Int64(permuted.count))]
        for value in permuted {
            arguments += ["1", .integer(Int64(value >> 32)), .integer(Int64(value & 0xffff_ffff))]
        }
        let reply = try await client.send(RESPCommand(["EVAL", .string(Self.probe.plain.source)] + arguments)).get()
        let values = try #require(reply.array).map { $0.string ?? "" }
        for (i, value) in permuted.enumerated() {
            #expect(values[3 * i + 1] == hex16(PositionCipher.unpermute(value, key: key)))
            #expect(values[3 * i + 2] == hex16(value))
        }
    }
}

private func hex16(_ value: UInt64) -> String {
    let s = String(value, radix: 16)
    return String(repeating: "0", count: 16 - s.count) + s
}
