import Bayeux
import NIOCore
import Testing

@Suite struct JSONParserTests {
    let parser = JSONParser(maxDepth: 8)

    @Test func parsesEveryKindAndKeepsNumberText() throws {
        let value = try parser.parse(#"{"a":[1,-2.5e3,12345678901234567890],"b":true,"c":null,"d":"x\u00e9\n"}"#)
        let object = try #require(value.objectValue)
        #expect(object.keys == ["a", "b", "c", "d"])
        #expect(object["a"] == .array([.number("1"), .number("-2.5e3"), .number("12345678901234567890")]))
        #expect(object["b"] == .bool(true))
        #expect(object["c"] == .null)
        #expect(object["d"] == .string("xé\n"))
    }

    @Test func decodesSurrogatePairs() throws {
        #expect(try parser.parse(#""\ud83d\ude00""#) == .string("😀"))
        #expect(throws: JSONParseError.self) { try parser.parse(#""\ud83d""#) }
        #expect(throws: JSONParseError.self) { try parser.parse(#""\ude00""#) }
    }

    @Test(arguments: [
        "", "{", "[1,]", "{\"a\":}", "{nope", "tru", "01", "1.", "-", "\"\u{01}\"", "[1] x", "{\"a\" 1}", "\"\\x\"",
    ])
    func rejectsMalformed(_ text: String) {
        #expect(throws: JSONParseError.self) { try parser.parse(text) }
    }

    @Test func rejectsInvalidUTF8() {
        #expect(throws: JSONParseError.self) { try parser.parse([0x22, 0xC3, 0x28, 0x22]) }
        #expect(throws: JSONParseError.self) { try parser.parse([0x22, 0xED, 0xA0, 0x80, 0x22]) }
    }

    @Test func limitsDepth() throws {
        _ = try parser.parse(String(repeating: "[", count: 8) + String(repeating: "]", count: 8))
        do {
            _ = try JSONParser(maxDepth: 8).parse(String(repeating: "[", count: 9) + String(repeating: "]", count: 9))
            Issue.record("nine levels were accepted")
        } catch let error as JSONParseError {
            #expect(error.reason == .tooDeep(limit: 8))
        }
        // A hostile nesting far beyond the limit fails fast instead of exhausting the stack.
        #expect(throws: JSONParseError.self) { try parser.parse(String(repeating: "[", count: 1_000_000)) }
    }

    @Test func lastDuplicateKeyWins() throws {
        #expect(try parser.parse(#"{"a":1,"a":2}"#).objectValue?["a"] == .number("2"))
    }
}

@Suite struct JSONWriterTests {
    @Test func roundTripsAndEscapes() throws {
        let value: JSONValue = .object(["s": .string("q\"b\\n\n\t\u{01}é/"), "n": .number("1e5"), "a": [true, nil]])
        let text = value.jsonString
        #expect(text == #"{"s":"q\"b\\n\n\t\u0001é/","n":1e5,"a":[true,null]}"#)
        #expect(try JSONParser().parse(text) == value)
    }

    @Test func everyControlCharacterIsEscapedInLowerCaseHex() throws {
        let controls = String(String.UnicodeScalarView((0..<0x20).map { Unicode.Scalar(UInt8($0)) }))
        let text = JSONValue.string(controls).jsonString
        let short: [UInt8: String] = [0x08: #"\b"#, 0x09: #"\t"#, 0x0A: #"\n"#, 0x0C: #"\f"#, 0x0D: #"\r"#]
        let expected = (0..<UInt8(0x20)).map { short[$0] ?? "\\u00" + ($0 < 0x10 ? "0" : "") + String($0, radix: 16) }
            .joined()
        #expect(text == "\"" + expected + "\"")
        #expect(try JSONParser().parse(text) == .string(controls))
    }

    @Test func escapesLineSeparatorsOnlyWhenAsked() {
        var plain = ByteBuffer()
        plain.writeJSON(.string("a\u{2028}b"))
        #expect(String(buffer: plain) == "\"a\u{2028}b\"")
        var escaped = ByteBuffer()
        escaped.writeJSON(.string("a\u{2028}b\u{2029}"), escapeLineSeparators: true)
        #expect(String(buffer: escaped) == #""a\u2028b\u2029""#)
    }
}

@Suite struct MessageBatchTests {
    @Test func nestedArraysAreFlattenedAsRubyFayeDoes() throws {
        let value = try JSONParser().parse(#"[[{"channel":"/a"}],[[{"channel":"/b"}]],[],[[]],1]"#)
        let elements = try #require(MessageBatch.elements(of: value))
        #expect(elements.count == 3)
        guard case .message(let a) = elements[0], case .message(let b) = elements[1], case .invalid = elements[2]
        else {
            Issue.record("unexpected elements \(elements)")
            return
        }
        #expect(a.channel == "/a" && b.channel == "/b")
        #expect(MessageBatch.elements(of: .string("x")) == nil)
    }

    @Test func aByteOrderMarkIsRefusedAsFayeDoes() {
        #expect(throws: JSONParseError.self) { try JSONParser().parse([0xEF, 0xBB, 0xBF, 0x5B, 0x5D]) }
    }
}
