import NIOCore
import PubSubTesting
import Testing

@testable import PubSubRedis

@Suite struct RESPEncoderTests {
    func bytes(_ command: RESPCommand) -> String {
        var buffer = ByteBuffer()
        RESPEncoder.write(command, into: &buffer)
        return String(buffer: buffer)
    }

    func bytes(_ value: RESPValue) -> String {
        var buffer = ByteBuffer()
        RESPEncoder.write(value, into: &buffer)
        return String(buffer: buffer)
    }

    @Test func commandsAreArraysOfBulkStrings() {
        #expect(bytes(RESPCommand("PING")) == "*1\r\n$4\r\nPING\r\n")
        #expect(bytes(RESPCommand("SET", "k", "v")) == "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n")
        #expect(bytes(RESPCommand("INCRBY", "k", .integer(-42))) == "*3\r\n$6\r\nINCRBY\r\n$1\r\nk\r\n$3\r\n-42\r\n")
        #expect(
            bytes(RESPCommand("X", .integer(0), .integer(Int64.min)))
                == "*3\r\n$1\r\nX\r\n$1\r\n0\r\n$20\r\n-9223372036854775808\r\n")
        #expect(bytes(RESPCommand("ECHO", "")) == "*2\r\n$4\r\nECHO\r\n$0\r\n\r\n")
        // Binary-safe: CRLF and non-ASCII inside an argument are length-prefixed, not escaped.
        #expect(
            bytes(RESPCommand("ECHO", .bytes(ByteBuffer(bytes: [0x0D, 0x0A, 0x00, 0xFF]))))
                == "*2\r\n$4\r\nECHO\r\n$4\r\n\r\n\u{0}\u{FFFD}\r\n")
        #expect(bytes(RESPCommand("ECHO", "é")) == "*2\r\n$4\r\nECHO\r\n$2\r\né\r\n")
    }

    @Test func values() {
        #expect(bytes(.simpleString(ByteBuffer(string: "OK"))) == "+OK\r\n")
        #expect(bytes(.error("ERR no")) == "-ERR no\r\n")
        #expect(bytes(.integer(1000)) == ":1000\r\n")
        #expect(bytes(.integer(-1)) == ":-1\r\n")
        #expect(bytes(.bulkString(nil)) == "$-1\r\n")
        #expect(bytes(.bulkString(ByteBuffer(string: "hello"))) == "$5\r\nhello\r\n")
        #expect(bytes(.array(nil)) == "*-1\r\n")
        #expect(bytes(.array([])) == "*0\r\n")
        #expect(
            bytes(.array([.integer(1), .array([.bulkString(ByteBuffer(string: "a"))])]))
                == "*2\r\n:1\r\n*1\r\n$1\r\na\r\n")
    }
}

@Suite struct RESPDecoderTests {
    func decode(_ text: String, limits: RESPDecoder.Limits = .init()) throws -> (RESPValue?, Int) {
        var buffer = ByteBuffer(string: text)
        let value = try RESPDecoder(limits: limits).decode(&buffer)
        return (value, buffer.readableBytes)
    }

    func value(_ text: String) throws -> RESPValue? { try decode(text).0 }

    @Test func golden() throws {
        #expect(try value("+OK\r\n") == .simpleString(ByteBuffer(string: "OK")))
        #expect(try value("-ERR unknown command\r\n") == .error("ERR unknown command"))
        #expect(try value(":0\r\n") == .integer(0))
        #expect(try value(":-123\r\n") == .integer(-123))
        #expect(try value(":9223372036854775807\r\n") == .integer(.max))
        #expect(try value("$5\r\nhello\r\n") == .bulkString(ByteBuffer(string: "hello")))
        #expect(try value("$0\r\n\r\n") == .bulkString(ByteBuffer()))
        #expect(try value("$-1\r\n") == .bulkString(nil))
        #expect(try value("*-1\r\n") == .array(nil))
        #expect(try value("*0\r\n") == .array([]))
        #expect(try value("$4\r\na\r\nb\r\n") == .bulkString(ByteBuffer(string: "a\r\nb")))
        #expect(
            try value("*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nabc\r\n")
                == .array([
                    .bulkString(ByteBuffer(string: "message")), .bulkString(ByteBuffer(string: "ch")),
                    .bulkString(ByteBuffer(string: "abc")),
                ]))
        #expect(try value("*2\r\n*1\r\n:1\r\n*-1\r\n") == .array([.array([.integer(1)]), .array(nil)]))
    }

    @Test func consumesExactlyOneValue() throws {
        var buffer = ByteBuffer(string: ":1\r\n+OK\r\n$1\r")
        let decoder = RESPDecoder()
        #expect(try decoder.decode(&buffer) == .integer(1))
        #expect(try decoder.decode(&buffer) == .simpleString(ByteBuffer(string: "OK")))
        #expect(try decoder.decode(&buffer) == nil)
        #expect(buffer.readableBytes == 3)
    }

    /// Every prefix of a valid stream is "need more data" and consumes nothing; byte by byte it all arrives.
    @Test func everyPrefixWaits() throws {
        let text = "*3\r\n$7\r\nmessage\r\n$-1\r\n*2\r\n:42\r\n+OK\r\n"
        for cut in 0..<text.utf8.count {
            let prefix = String(decoding: Array(text.utf8)[0..<cut], as: UTF8.self)
            let (v, left) = try decode(prefix)
            #expect(v == nil, "prefix of \(cut) bytes")
            #expect(left == cut)
        }
        var buffer = ByteBuffer()
        var got: RESPValue?
        for byte in text.utf8 {
            buffer.writeInteger(byte)
            if let v = try RESPDecoder().decode(&buffer) { got = v }
        }
        #expect(got?.array?.count == 3)
        #expect(buffer.readableBytes == 0)
    }

    @Test func malformedInputThrows() {
        let cases: [(String, RESPDecoder.Error)] = [
            ("?x\r\n", .unknownType(UInt8(ascii: "?"))),
            (":12a\r\n", .invalidInteger),
            (":\r\n", .invalidInteger),
            (":-\r\n", .invalidInteger),
            (":99999999999999999999\r\n", .invalidInteger),
            ("$-2\r\n", .invalidLength),
            ("*-5\r\n", .invalidLength),
            ("$3\r\nabcde", .missingCRLF),
            ("+OK\rX", .missingCRLF),
        ]
        for (text, error) in cases {
            #expect(throws: error, "\(text.debugDescription)") { try decode(text) }
        }
    }

    @Test func limitsAreEnforcedBeforeWaiting() {
        let limits = RESPDecoder.Limits(maxBulkLength: 10, maxArrayCount: 3, maxDepth: 2, maxLineLength: 8)
        #expect(throws: RESPDecoder.Error.bulkTooLong) { try decode("$11\r\n", limits: limits) }
        #expect(throws: RESPDecoder.Error.arrayTooLong) { try decode("*4\r\n", limits: limits) }
        #expect(throws: RESPDecoder.Error.tooDeep) { try decode("*1\r\n*1\r\n*1\r\n:1\r\n", limits: limits) }
        #expect(throws: RESPDecoder.Error.lineTooLong) { try decode("+0123456789", limits: limits) }
        #expect(throws: RESPDecoder.Error.bulkTooLong) { try decode("$99999999999\r\n") }
        #expect((try? decode("*1\r\n*1\r\n:1\r\n", limits: limits))?.0 == .array([.array([.integer(1)])]))
    }

    @Test func roundTrip() throws {
        let values: [RESPValue] = [
            .array([
                .integer(-7), .bulkString(nil), .error("E"), .simpleString(ByteBuffer(string: "s")),
                .array([.bulkString(ByteBuffer(bytes: [0, 13, 10, 255]))]), .array(nil), .array([]),
            ])
        ]
        for v in values {
            var buffer = ByteBuffer()
            RESPEncoder.write(v, into: &buffer)
            #expect(try RESPDecoder().decode(&buffer) == v)
            #expect(buffer.readableBytes == 0)
        }
    }

    /// Seeded random mutations of valid streams (flips, cuts, insertions, duplications, huge lengths) never crash,
    /// never hang, and either throw, wait, or consume at least one byte per value.
    @Test func fuzz() {
        var rng = SeededGenerator(seed: 0x5EED_2026)
        let seeds = [
            "*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nabc\r\n", "+OK\r\n", "-ERR x\r\n", ":12345\r\n",
            "$-1\r\n", "*-1\r\n", "*2\r\n*1\r\n:1\r\n*0\r\n", "$5\r\nhe\r\nl\r\n",
        ].map { Array($0.utf8) }
        let alphabet = Array("*$:+-\r\n0123456789-1".utf8)
        let limits = RESPDecoder.Limits(maxBulkLength: 1 << 16, maxArrayCount: 1 << 10, maxDepth: 8, maxLineLength: 256)
        for _ in 0..<20_000 {
            var bytes = seeds[Int(rng.next() % UInt64(seeds.count))]
            for _ in 0..<(1 + rng.next() % 4) {
                let position = bytes.isEmpty ? 0 : Int(rng.next() % UInt64(bytes.count))
                switch rng.next() % 6 {
                case 0 where !bytes.isEmpty: bytes[position] = UInt8(truncatingIfNeeded: rng.next())
                case 1 where !bytes.isEmpty: bytes[position] = alphabet[Int(rng.next() % UInt64(alphabet.count))]
                case 2: bytes.insert(alphabet[Int(rng.next() % UInt64(alphabet.count))], at: position)
                case 3: bytes = Array(bytes[..<position])
                case 4: bytes += seeds[Int(rng.next() % UInt64(seeds.count))]
                default: bytes.insert(contentsOf: Array("*999999999\r\n".utf8), at: position)
                }
            }
            var buffer = ByteBuffer(bytes: bytes)
            let decoder = RESPDecoder(limits: limits)
            var rounds = 0
            while rounds < bytes.count + 1 {
                rounds += 1
                let before = buffer.readableBytes
                guard let v = try? decoder.decode(&buffer) else { break }
                _ = v
                #expect(buffer.readableBytes < before)
            }
            #expect(rounds <= bytes.count + 1)
        }
    }
}

@Suite struct RedisURLTests {
    @Test func parses() throws {
        let plain = try RedisConfiguration(url: "redis://127.0.0.1:6379/0")
        #expect(plain.host == "127.0.0.1" && plain.port == 6379 && plain.database == 0 && plain.password == nil)
        let full = try RedisConfiguration(url: "redis://:s%40cret@example.test:6380/3")
        #expect(full.host == "example.test" && full.port == 6380 && full.database == 3)
        #expect(full.password == "s@cret" && full.username == nil)
        let user = try RedisConfiguration(url: "redis://alice:pw@[::1]:7000")
        #expect(user.username == "alice" && user.password == "pw" && user.host == "::1" && user.port == 7000)
        let bare = try RedisConfiguration(url: "redis://localhost")
        #expect(bare.host == "localhost" && bare.port == 6379 && bare.database == 0)
        #expect(full.redacted == "redis://:***@example.test:6380/3")
    }

    @Test(arguments: [
        "http://x", "redis://h:0", "redis://h:99999", "redis://h:1/x", "redis://:%zz@h", "redis://h:port",
        "redis://[::1", "redis://[::1]x", "redis://h:+80",
    ])
    func rejects(_ url: String) {
        #expect(throws: RedisConfiguration.URLError.self) { try RedisConfiguration(url: url) }
    }

    @Test func errorsNeverShowThePassword() {
        do {
            _ = try RedisConfiguration(url: "redis://:topsecret@h:notaport")
            Issue.record("accepted")
        } catch {
            #expect(!"\(error)".contains("topsecret"))
        }
    }
}
