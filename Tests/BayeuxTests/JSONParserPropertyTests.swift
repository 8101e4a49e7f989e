import Bayeux
import NIOCore
import PropertyBased
import Testing

// Random JSON against `JSONParser` and the writer (`ByteBuffer.writeJSON`). A failing check prints its input and a
// seed; add `.fixedSeed("<seed>")` to that `@Test` to run exactly that input again (one run instead of `count`).

/// Random JSON values and texts.
enum RandomJSON {
    /// A value at most `depth` levels deep (containers count, leaves do not), object keys unique.
    static func value(depth: Int, using rng: inout some RandomNumberGenerator) -> JSONValue {
        let leaf = depth == 0 || Int.random(in: 0..<10, using: &rng) < 5
        if leaf {
            switch Int.random(in: 0..<6, using: &rng) {
            case 0: return .null
            case 1: return .bool(Bool.random(using: &rng))
            case 2, 3: return .number(number(using: &rng))
            default: return .string(string(using: &rng))
            }
        }
        let count = Int.random(in: 0...5, using: &rng)
        if Bool.random(using: &rng) {
            return .array((0..<count).map { _ in value(depth: depth - 1, using: &rng) })
        }
        var object = JSONObject()
        for _ in 0..<count {
            var key = string(using: &rng)
            while object.contains(key) { key += "k" }
            object[key] = value(depth: depth - 1, using: &rng)
        }
        return .object(object)
    }

    /// RFC 8259 §6: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, sometimes longer than any Double.
    static func number(using rng: inout some RandomNumberGenerator) -> String {
        func digits(_ range: ClosedRange<Int>, using rng: inout some RandomNumberGenerator) -> String {
            String(
                (0..<Int.random(in: range, using: &rng)).map { _ in
                    Character(String(Int.random(in: 0...9, using: &rng)))
                })
        }
        var text = Bool.random(using: &rng) ? "-" : ""
        text +=
            Int.random(in: 0..<4, using: &rng) == 0
            ? "0" : String(Int.random(in: 1...9, using: &rng)) + digits(0...25, using: &rng)
        if Bool.random(using: &rng) { text += "." + digits(1...8, using: &rng) }
        if Int.random(in: 0..<3, using: &rng) == 0 {
            text +=
                ["e", "E"][Int.random(in: 0...1, using: &rng)] + ["", "+", "-"][Int.random(in: 0...2, using: &rng)]
            text += digits(1...4, using: &rng)
        }
        return text
    }

    /// Strings of the characters a writer must take care of: quotes, backslashes, control characters, U+2028 and
    /// U+2029, the edges of the planes, astral characters (surrogate pairs when escaped).
    static func string(using rng: inout some RandomNumberGenerator) -> String {
        var scalars = String.UnicodeScalarView()
        for _ in 0..<Int.random(in: 0...12, using: &rng) {
            let code: UInt32
            switch Int.random(in: 0..<10, using: &rng) {
            case 0..<4: code = UInt32.random(in: 0x20...0x7E, using: &rng)
            case 4: code = UInt32.random(in: 0...0x1F, using: &rng)
            case 5:
                code =
                    [0x22, 0x5C, 0x2F, 0x7F, 0x2028, 0x2029, 0xFEFF, 0xFFFF, 0xD7FF, 0xE000][
                        Int.random(in: 0...9, using: &rng)]
            case 6, 7: code = UInt32.random(in: 0x80...0xD7FF, using: &rng)
            case 8: code = UInt32.random(in: 0xE000...0xFFFD, using: &rng)
            default: code = UInt32.random(in: 0x10000...0x10FFFF, using: &rng)
            }
            scalars.append(Unicode.Scalar(code)!)
        }
        return String(scalars)
    }

    static func compact(_ value: JSONValue, escapeLineSeparators: Bool = false) -> [UInt8] {
        var buffer = ByteBuffer()
        buffer.writeJSON(value, escapeLineSeparators: escapeLineSeparators)
        return Array(buffer.readableBytesView)
    }

    /// The text of `value` as other writers may put it: whitespace between tokens, any character escaped
    /// (`\uXXXX` in either case, surrogate pairs, `\/`), and in objects an earlier entry under the same key that the
    /// later one overrides (RFC 8259 leaves duplicates open; the parser keeps the last, as JavaScript does).
    static func loose(_ value: JSONValue, using rng: inout some RandomNumberGenerator) -> [UInt8] {
        var out: [UInt8] = []
        func space(_ rng: inout some RandomNumberGenerator) {
            guard Int.random(in: 0..<3, using: &rng) == 0 else { return }
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                out.append([0x20, 0x09, 0x0A, 0x0D][Int.random(in: 0...3, using: &rng)])
            }
        }
        func hex4(_ v: UInt32, upper: Bool) -> [UInt8] {
            Array(
                ("\\u" + String(repeating: "0", count: 4 - String(v, radix: 16).count)
                    + String(v, radix: 16, uppercase: upper)).utf8)
        }
        func string(_ s: String, _ rng: inout some RandomNumberGenerator) {
            out.append(0x22)
            for scalar in s.unicodeScalars {
                let v = scalar.value
                let mustEscape = v < 0x20 || v == 0x22 || v == 0x5C
                if mustEscape || Int.random(in: 0..<4, using: &rng) == 0 {
                    let upper = Bool.random(using: &rng)
                    switch (v, Bool.random(using: &rng)) {
                    case (0x22, true): out += Array(#"\""#.utf8)
                    case (0x5C, true): out += Array(#"\\"#.utf8)
                    case (0x2F, true): out += Array(#"\/"#.utf8)
                    case (0x08, true): out += Array(#"\b"#.utf8)
                    case (0x0C, true): out += Array(#"\f"#.utf8)
                    case (0x0A, true): out += Array(#"\n"#.utf8)
                    case (0x0D, true): out += Array(#"\r"#.utf8)
                    case (0x09, true): out += Array(#"\t"#.utf8)
                    case (0x10000..., _):
                        let u = v - 0x10000
                        out += hex4(0xD800 + (u >> 10), upper: upper) + hex4(0xDC00 + (u & 0x3FF), upper: upper)
                    default: out += hex4(v, upper: upper)
                    }
                } else {
                    out += Array(String(scalar).utf8)
                }
            }
            out.append(0x22)
        }
        func write(_ value: JSONValue, _ rng: inout some RandomNumberGenerator) {
            space(&rng)
            switch value {
            case .null, .bool, .number: out += compact(value)
            case .string(let s): string(s, &rng)
            case .array(let elements):
                out.append(UInt8(ascii: "["))
                space(&rng)
                for (i, element) in elements.enumerated() {
                    if i > 0 { out.append(UInt8(ascii: ",")) }
                    write(element, &rng)
                }
                space(&rng)
                out.append(UInt8(ascii: "]"))
            case .object(let object):
                out.append(UInt8(ascii: "{"))
                space(&rng)
                var first = true
                for entry in object.entries {
                    let overridden = Int.random(in: 0..<6, using: &rng) == 0
                    for v in overridden ? [.string("overridden"), entry.value] : [entry.value] {
                        if !first { out.append(UInt8(ascii: ",")) }
                        first = false
                        space(&rng)
                        string(entry.key, &rng)
                        space(&rng)
                        out.append(UInt8(ascii: ":"))
                        write(v, &rng)
                    }
                }
                space(&rng)
                out.append(UInt8(ascii: "}"))
            }
            space(&rng)
        }
        write(value, &rng)
        return out
    }

    /// `depth` containers, one inside the other, of random kinds, with a leaf (or nothing) at the bottom and
    /// random siblings on the way.
    static func nested(depth: Int, using rng: inout some RandomNumberGenerator) -> [UInt8] {
        let arrays = (0..<depth).map { _ in rng.next() & 1 == 0 }
        // An object needs a value for its key; an empty array at the bottom takes no sibling before it.
        let leaf = arrays.last != true || Bool.random(using: &rng)
        let opens = [Array("[".utf8), Array("[1,".utf8), Array(#"{"k":"#.utf8), Array(#"{"s":1,"k":"#.utf8)]
        var open: [UInt8] = []
        var close: [UInt8] = []
        open.reserveCapacity(depth * 5)
        close.reserveCapacity(depth)
        for (level, isArray) in arrays.enumerated() {
            let sibling = rng.next() & 3 == 0 && (leaf || level < depth - 1)
            open.append(contentsOf: opens[(isArray ? 0 : 2) + (sibling ? 1 : 0)])
            close.append(isArray ? UInt8(ascii: "]") : UInt8(ascii: "}"))
        }
        return open + (leaf ? Array("true".utf8) : []) + close.reversed()
    }
}

/// What `parse` did: a value, or a `JSONParseError` (any other error, or a trap, fails the test).
func parseOutcome(_ bytes: [UInt8], parser: JSONParser = JSONParser()) -> Result<JSONValue, JSONParseError>? {
    do {
        return .success(try parser.parse(bytes))
    } catch let error as JSONParseError {
        #expect(error.offset >= 0 && error.offset <= bytes.count, "offset \(error.offset) of \(bytes.count) bytes")
        return .failure(error)
    } catch {
        Issue.record("not a JSONParseError: \(error)")
        return nil
    }
}

@Suite struct JSONParserPropertyTests {
    static let values = Generator { rng in RandomJSON.value(depth: Int.random(in: 0...6, using: &rng), using: &rng) }

    @Test func whatTheWriterWritesParsesToTheSameValueAndText() async {
        let input = Generator { rng in
            (RandomJSON.value(depth: Int.random(in: 0...6, using: &rng), using: &rng), Bool.random(using: &rng))
        }
        await propertyCheck(count: 400, input: input) { input in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let (value, escapeLineSeparators) = input
            let text = RandomJSON.compact(value, escapeLineSeparators: escapeLineSeparators)
            guard case .success(let parsed) = parseOutcome(text, parser: JSONParser(maxDepth: 6)) else {
                Issue.record("refused: \(String(decoding: text, as: UTF8.self))")
                return
            }
            #expect(parsed == value)
            // The same text again: key order and number text are kept.
            #expect(RandomJSON.compact(parsed, escapeLineSeparators: escapeLineSeparators) == text)
        }
    }

    @Test func otherWritersSpacingAndEscapesParseToTheSameValue() async {
        let input = Generator { rng in
            let value = RandomJSON.value(depth: Int.random(in: 0...6, using: &rng), using: &rng)
            return (value, RandomJSON.loose(value, using: &rng))
        }
        await propertyCheck(count: 400, input: input) { input in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let (value, text) = input
            let outcome = parseOutcome(text, parser: JSONParser(maxDepth: 6))
            #expect(outcome == .success(value), "\(String(decoding: text, as: UTF8.self))")
        }
    }

    /// Nesting up to the limit parses; one level more fails with `tooDeep` whatever the limit, up to the 512 that
    /// `serve` allows (which must not exhaust the stack), and however far beyond it the input goes.
    @Test func nestingPastTheDepthLimitIsRefusedAtTheLimit() async {
        let input = Generator { rng in
            let limit = [64, 512, Int.random(in: 1...16, using: &rng), Int.random(in: 1...512, using: &rng)][
                Int.random(in: 0...3, using: &rng)]
            let depth: Int
            switch Int.random(in: 0..<10, using: &rng) {
            case 0, 1: depth = limit
            case 2, 3: depth = limit + 1
            case 4: depth = Int.random(in: 5_000...20_000, using: &rng)
            default: depth = Int.random(in: 0...(limit * 2), using: &rng)
            }
            return (limit, depth, RandomJSON.nested(depth: depth, using: &rng))
        }
        await propertyCheck(count: 200, input: input) { input in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let (limit, depth, text) = input
            switch parseOutcome(text, parser: JSONParser(maxDepth: limit)) {
            case .success: #expect(depth <= limit, "\(depth) levels accepted with a limit of \(limit)")
            case .failure(let error): #expect(depth > limit && error.reason == .tooDeep(limit: limit), "\(error)")
            case nil: break
            }
        }
    }

    /// Random damage to valid JSON: the parser answers with a value or a `JSONParseError`, never a trap; and a value
    /// it accepts is one the writer writes back as JSON that parses to it again.
    @Test func damagedJSONIsAnsweredNeverATrap() async {
        let input = Generator { rng in
            let value = RandomJSON.value(depth: Int.random(in: 0...6, using: &rng), using: &rng)
            var text = Bool.random(using: &rng) ? RandomJSON.compact(value) : RandomJSON.loose(value, using: &rng)
            let special: [UInt8] =
                Array(#"{}[]",:\u0123456789-+.eE tfn"#.utf8) + [
                    0x00, 0x1F, 0x7F, 0x80, 0xBF, 0xC0, 0xED, 0xF4, 0xF5, 0xFF,
                ]
            for _ in 0..<Int.random(in: 1...4, using: &rng) {
                let at = Int.random(in: 0...text.count, using: &rng)
                let byte =
                    Bool.random(using: &rng)
                    ? special[Int.random(in: 0..<special.count, using: &rng)] : UInt8.random(in: 0...255, using: &rng)
                switch Int.random(in: 0..<5, using: &rng) {
                case 0 where at < text.count: text[at] = byte
                case 1 where at < text.count: text.remove(at: at)
                case 2 where at < text.count: text[at] ^= 1 << UInt8.random(in: 0...7, using: &rng)
                case 3: text = Array(text.prefix(at))
                default: text.insert(byte, at: at)
                }
            }
            return text
        }
        await propertyCheck(count: 600, input: input) { text in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            guard case .success(let value) = parseOutcome(text, parser: JSONParser(maxDepth: 8)) else { return }
            #expect(parseOutcome(RandomJSON.compact(value), parser: JSONParser(maxDepth: 8)) == .success(value))
        }
    }

    /// A document cut short is refused, and one followed by anything but whitespace is too (`trailingData` at the
    /// first byte after it).
    @Test func cutOrTrailedDocumentsAreRefused() async {
        let input = Generator { rng in
            let value = JSONValue.array([RandomJSON.value(depth: Int.random(in: 0...5, using: &rng), using: &rng)])
            let text = Bool.random(using: &rng) ? RandomJSON.compact(value) : RandomJSON.loose(value, using: &rng)
            let trailer = Array(
                ["x", "1", "[]", "{", "\"", "null", ",", "]", "\u{00}", "é"][Int.random(in: 0...9, using: &rng)].utf8)
            return (text, Int.random(in: 0..<text.count, using: &rng), trailer)
        }
        await propertyCheck(count: 300, input: input) { input in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let (text, cut, trailer) = input
            // Whitespace after the closing bracket is still the whole document.
            let end = (text.lastIndex(of: UInt8(ascii: "]")) ?? text.count) + 1
            let short = Array(text.prefix(min(cut, end - 1)))
            if case .success(let value) = parseOutcome(short, parser: JSONParser(maxDepth: 6)) {
                Issue.record("\(String(decoding: short, as: UTF8.self)) cut short was accepted as \(value)")
            }
            let trailed = text + trailer
            guard case .failure(let error) = parseOutcome(trailed, parser: JSONParser(maxDepth: 6)) else {
                Issue.record("\(String(decoding: trailed, as: UTF8.self)) was accepted")
                return
            }
            #expect(error.reason == .trailingData && error.offset == text.count, "\(error)")
        }
    }

    /// The parser itself has no size limit (the transports bound what reaches it: `maxRequestBytes`, the
    /// WebSocket frame limit): documents as large as a default request (1 MiB), wide or long, parse whole.
    @Test func documentsOfARequestsSizeParseWhole() async {
        let input = Generator { rng in
            let size = Int.random(in: 1_000...(1 << 20), using: &rng)
            let digits = Array("0123456789".utf8)
            var text: [UInt8] = []
            text.reserveCapacity(size + 16)
            var count = 0
            switch Int.random(in: 0..<3, using: &rng) {
            case 0:
                text.append(UInt8(ascii: "["))
                while text.count < size {
                    // Numbers of one to four digits, from one draw.
                    let n = rng.next()
                    text.append(digits[Int(n % 9) + 1])
                    for k in 0..<Int((n >> 8) % 4) { text.append(digits[Int((n >> (16 + 4 * k)) % 10)]) }
                    text.append(UInt8(ascii: ","))
                    count += 1
                }
                text[text.count - 1] = UInt8(ascii: "]")
            case 1:
                // Characters of two and three bytes, and escapes.
                text.append(UInt8(ascii: "\""))
                let pieces = [Array("é".utf8), Array("\u{2028}".utf8), Array(#"\""#.utf8), Array(#"\u00e9"#.utf8)]
                while text.count < size {
                    text.append(contentsOf: pieces[Int(rng.next() % 4)])
                    count += 1
                }
                text.append(UInt8(ascii: "\""))
            default:
                text.append(UInt8(ascii: "{"))
                while text.count < size {
                    text.append(contentsOf: "\"k\(count)\":\(count % 3 == 0 ? "true" : "[]"),".utf8)
                    count += 1
                }
                text[text.count - 1] = UInt8(ascii: "}")
            }
            return (text, count)
        }
        await propertyCheck(count: 3, input: input) { input in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let (text, count) = input
            switch parseOutcome(text) {
            case .success(.array(let elements)): #expect(elements.count == count)
            case .success(.string(let string)): #expect(string.unicodeScalars.count == count)
            case .success(.object(let object)): #expect(object.count == count)
            default: Issue.record("a document of \(text.count) bytes was not parsed whole")
            }
        }
    }
}

/// Found while sizing `documentsOfARequestsSizeParseWhole`: each key of an object was looked for among the keys
/// before it (duplicates: the last wins), so an object of n keys cost n² / 2 comparisons. A 1 MiB request of
/// 100,000 keys held a core for minutes (20,000 keys: 3.5 minutes in a debug build). The 40,000 keys here take about
/// a second in a debug build; quadratic, they would take a quarter of an hour: the time limit is between the two.
@Suite struct JSONParserLargeObjectTests {
    @Test(.timeLimit(.minutes(1))) func anObjectOfManyKeysParsesInLinearTimeAndTheLastDuplicateStillWins() throws {
        var text = "{"
        for i in 0..<40_000 { text += "\"k\(i)\":\(i)," }
        // Duplicates of an early key, a late one, and one in a form that is the same string (é as e + U+0301).
        text += #""k0":"again","k39999":"again","\u00e9":1,"e\u0301":2,"k5":"last"}"#
        let object = try #require(try JSONParser().parse(text).objectValue)
        #expect(object.count == 40_001)
        #expect(object.keys.first == "k0")
        #expect(object["k0"] == "again")
        #expect(object["k5"] == "last")
        #expect(object["k39999"] == "again")
        #expect(object["é"] == 2)
        #expect(object.keys.last == "é")
        #expect(object["k20000"] == 20000)
    }

    @Test func duplicatesInSmallObjectsAndAcrossTheIndexThresholdKeepTheFirstPlaceAndTheLastValue() throws {
        for count in [1, 7, 8, 9, 15, 16, 17, 18, 40] {
            let keys = (0..<count).map { "k\($0)" }
            let first = keys.map { "\"\($0)\":0" }
            let again = keys.reversed().map { "\"\($0)\":1" }
            let object = try #require(
                try JSONParser().parse("{" + (first + again).joined(separator: ",") + "}").objectValue)
            #expect(object.keys == keys, "\(count)")
            #expect(object.entries.allSatisfy { $0.value == 1 }, "\(count)")
        }
    }

    /// Containers of every size around the members kept on the stack while parsing (8): the same members, in
    /// order, nested or not, and arrays of up to 8 exactly as long as what they hold.
    @Test func containersAroundTheStackRoomParseWhole() throws {
        for count in 0...20 {
            let numbers = (0..<count).map { "\($0)" }
            let array = "[" + numbers.joined(separator: ",") + "]"
            let object = "{" + (0..<count).map { "\"k\($0)\":\(array)" }.joined(separator: ",") + "}"
            let parsed = try #require(try JSONParser().parse("[\(object),\(array)]").arrayValue)
            let members = try #require(parsed.first?.objectValue)
            #expect(members.keys == (0..<count).map { "k\($0)" }, "\(count)")
            for (_, value) in members.entries {
                #expect(value.arrayValue?.compactMap(\.integerValue) == (0..<count).map { Int64($0) }, "\(count)")
                if count <= 8 { #expect(value.arrayValue?.capacity == count, "\(count)") }
            }
            #expect(parsed.last?.arrayValue?.count == count)
            // Cut anywhere inside, the document is refused (what was gathered is let go).
            let whole = "[\(object),\(array)]"
            for end in stride(from: 1, to: whole.utf8.count, by: max(1, whole.utf8.count / 7)) {
                #expect(throws: JSONParseError.self) { try JSONParser().parse(Array(whole.utf8.prefix(end))) }
            }
        }
    }
}
