import NIOCore
import NIOWebSocket
import PropertyBased
import Testing

@testable import PubSubServer

// Random frame streams against `WebSocketFrameParser`. A failing check prints its input and a seed; add
// `.fixedSeed("<seed>")` to that `@Test` to run exactly that input again (one run instead of `count`).

/// The parser's limits for one run: small, so that random payloads cross them often.
struct FrameLimits: Sendable, CustomStringConvertible {
    var maxFrameSize: Int
    var maxMessageSize: Int
    var maxFragments: Int
    var requiresMask: Bool

    func parser() -> WebSocketFrameParser {
        WebSocketFrameParser(
            maxFrameSize: maxFrameSize, maxMessageSize: maxMessageSize, maxFragments: maxFragments,
            requiresMask: requiresMask)
    }

    var description: String {
        "limits(frame: \(maxFrameSize), message: \(maxMessageSize), fragments: \(maxFragments), mask: \(requiresMask))"
    }

    static func random(using rng: inout some RandomNumberGenerator, maxFrameSize: ClosedRange<Int> = 1...300)
        -> FrameLimits
    {
        let frame = Int.random(in: maxFrameSize, using: &rng)
        return FrameLimits(
            maxFrameSize: frame,
            maxMessageSize: Bool.random(using: &rng) ? frame : Int.random(in: frame...(frame * 4), using: &rng),
            maxFragments: Bool.random(using: &rng) ? 4096 : Int.random(in: 1...6, using: &rng),
            requiresMask: Int.random(in: 0..<4, using: &rng) != 0)
    }

    /// Random frame limits, with room for any message of any number of fragments (for long streams).
    static func randomForLongMessages(using rng: inout some RandomNumberGenerator) -> FrameLimits {
        var limits = random(using: &rng)
        limits.maxMessageSize = 1 << 30
        limits.maxFragments = 4096
        return limits
    }
}

/// One frame, its header fields chosen freely (reserved bits, no mask, a length encoding longer than needed, a
/// declared length with no payload behind it), and what it looks like on the wire.
struct RandomFrame: Sendable, CustomStringConvertible {
    enum LengthEncoding: Sendable { case short, medium, long }

    var fin: Bool
    var opcode: UInt8
    var reserved: UInt8 = 0
    var mask: [UInt8]?
    var payload: [UInt8]
    /// Larger than the payload for a frame whose header alone is over the limit (its payload is not sent).
    var declaredLength: UInt64
    var encoding: LengthEncoding

    init(fin: Bool, opcode: UInt8, mask: [UInt8]?, payload: [UInt8], encoding: LengthEncoding? = nil) {
        self.fin = fin
        self.opcode = opcode
        self.mask = mask
        self.payload = payload
        self.declaredLength = UInt64(payload.count)
        self.encoding = encoding ?? Self.minimalEncoding(payload.count)
    }

    static func minimalEncoding(_ count: Int) -> LengthEncoding {
        count <= 125 ? .short : count <= 0xFFFF ? .medium : .long
    }

    /// The 7-bit length field of the second byte.
    var lengthField: UInt8 {
        switch encoding {
        case .short: UInt8(declaredLength)
        case .medium: 126
        case .long: 127
        }
    }

    var isControl: Bool { opcode & 0x8 != 0 }

    var wire: [UInt8] {
        var out: [UInt8] = [(fin ? 0x80 : 0) | reserved | opcode, (mask == nil ? 0 : 0x80) | lengthField]
        switch encoding {
        case .short: break
        case .medium: out += [UInt8(declaredLength >> 8), UInt8(truncatingIfNeeded: declaredLength)]
        case .long: out += (0..<8).reversed().map { UInt8(truncatingIfNeeded: declaredLength >> (8 * $0)) }
        }
        if let mask {
            out += mask
            let start = out.count
            out += payload
            for i in 0..<payload.count { out[start + i] ^= mask[i & 3] }
        } else {
            out += payload
        }
        return out
    }

    var wireCount: Int { lengthHeaderCount + (mask == nil ? 0 : 4) + payload.count }

    /// The bytes of the header that carry the length: once these are in, an oversized frame is known.
    var lengthHeaderCount: Int {
        switch encoding {
        case .short: 2
        case .medium: 4
        case .long: 10
        }
    }

    var description: String {
        let bits = (fin ? "F" : "-") + (reserved == 0 ? "" : "R\(reserved >> 4)") + (mask == nil ? "U" : "")
        let length = declaredLength == UInt64(payload.count) ? "\(payload.count)" : "\(declaredLength)!"
        return "\(opcode)\(bits):\(length)\(encoding == Self.minimalEncoding(Int(clamping: declaredLength)) ? "" : "~")"
    }
}

/// `count` random bytes, eight from each number drawn.
func randomBytes(_ count: Int, using rng: inout some RandomNumberGenerator) -> [UInt8] {
    var bytes = [UInt8](repeating: 0, count: count)
    var i = 0
    while i < count {
        var word = rng.next()
        for _ in 0..<min(8, count - i) {
            bytes[i] = UInt8(truncatingIfNeeded: word)
            word >>= 8
            i += 1
        }
    }
    return bytes
}

/// What a parser said for a stream: the messages in order, then how it ended.
struct FrameOutcome: Equatable, CustomStringConvertible {
    struct Message: Equatable {
        var fin: Bool
        var opcode: UInt8
        var data: [UInt8]
    }
    enum End: Equatable {
        /// Nothing pending.
        case idle
        /// Bytes of a frame, or fragments of a message, wait for more.
        case waiting
        case failed(WebSocketFrameParser.ParseError)
    }
    var messages: [Message] = []
    var end: End = .idle

    var description: String {
        "\(messages.map { "\($0.opcode)\($0.fin ? "F" : "-"):\($0.data.count)" }) then \(end)"
    }
}

/// A stream of frames: mostly well-formed messages (fragmented or not, with control frames between fragments),
/// with some frames that break a rule or a limit.
struct FrameStream: Sendable, CustomStringConvertible {
    var limits: FrameLimits
    var frames: [RandomFrame]
    /// Where the reads end (offsets into `wire`, increasing, inside it).
    var cuts: [Int]

    var wire: [UInt8] { frames.flatMap(\.wire) }
    var wireCount: Int { frames.reduce(0) { $0 + $1.wireCount } }

    var description: String { "\(limits) frames \(frames) cuts \(cuts)" }

    /// `faults`: the chance that a frame breaks a rule or a limit.
    static func random(
        using rng: inout some RandomNumberGenerator, limits: FrameLimits, frames count: ClosedRange<Int> = 1...12,
        faults: Double = 0.12
    ) -> FrameStream {
        var frames: [RandomFrame] = []
        var inMessage = false
        var inText = false
        var text = TextStream()
        for _ in 0..<Int.random(in: count, using: &rng) {
            var frame = randomFrame(using: &rng, limits: limits, inMessage: inMessage)
            if frame.opcode == 1 { text = TextStream() }
            // The fragments of a text message carry UTF-8, a character sometimes split between two of them;
            // random bytes (mostly not UTF-8) are a fault.
            let textFragment = frame.opcode == 1 || (frame.opcode == 0 && inText)
            if textFragment, Double.random(in: 0..<1, using: &rng) >= faults {
                // No longer than before, or than the few bytes carried: the length encoding still fits.
                frame.payload = text.next(frame.payload.count, fin: frame.fin, limits: limits, using: &rng)
                frame.declaredLength = UInt64(frame.payload.count)
            }
            if Double.random(in: 0..<1, using: &rng) < faults {
                frame = fault(frame, using: &rng, limits: limits)
            }
            frames.append(frame)
            switch frame.opcode {
            case 1, 2:
                inMessage = !frame.fin
                inText = frame.opcode == 1
            case 0: if frame.fin { inMessage = false }
            default: break
            }
        }
        let total = frames.reduce(0) { $0 + $1.wireCount }
        return FrameStream(limits: limits, frames: frames, cuts: randomCuts(using: &rng, count: total))
    }

    static func randomCuts(using rng: inout some RandomNumberGenerator, count: Int) -> [Int] {
        guard count > 1 else { return [] }
        switch Int.random(in: 0..<4, using: &rng) {
        case 0: return Array(1..<count)  // a byte at a time
        case 1:  // reads of a random small size
            let size = Int.random(in: 2...17, using: &rng)
            return Array(stride(from: size, to: count, by: size))
        default:  // a few cuts anywhere
            let k = Int.random(in: 0...min(8, count - 1), using: &rng)
            return Set((0..<k).map { _ in Int.random(in: 1..<count, using: &rng) }).sorted()
        }
    }

    static func randomPayload(using rng: inout some RandomNumberGenerator, limits: FrameLimits, control: Bool)
        -> [UInt8]
    {
        let bound = control ? min(125, limits.maxFrameSize) : limits.maxFrameSize
        let count: Int
        switch Int.random(in: 0..<10, using: &rng) {
        case 0..<5: count = Int.random(in: 0...min(bound, 12), using: &rng)
        case 5..<8: count = Int.random(in: 0...bound, using: &rng)
        default: count = max(0, bound - Int.random(in: 0...1, using: &rng))  // at the limit
        }
        return randomBytes(count, using: &rng)
    }

    static func randomMask(using rng: inout some RandomNumberGenerator, limits: FrameLimits) -> [UInt8]? {
        if !limits.requiresMask, Bool.random(using: &rng) { return nil }
        // All-zero masks too: they are legal and leave the payload as it is.
        if Int.random(in: 0..<8, using: &rng) == 0 { return [0, 0, 0, 0] }
        return (0..<4).map { _ in UInt8.random(in: 0...255, using: &rng) }
    }

    static func randomFrame(using rng: inout some RandomNumberGenerator, limits: FrameLimits, inMessage: Bool)
        -> RandomFrame
    {
        let roll = Int.random(in: 0..<10, using: &rng)
        let opcode: UInt8
        let fin: Bool
        if roll < 2 {
            opcode = [8, 9, 10, 9, 10][Int.random(in: 0..<5, using: &rng)]  // close, ping, pong
            fin = true
        } else if inMessage {
            opcode = 0
            fin = Bool.random(using: &rng)
        } else {
            opcode = Bool.random(using: &rng) ? 1 : 2
            fin = Int.random(in: 0..<3, using: &rng) != 0
        }
        var payload = randomPayload(using: &rng, limits: limits, control: opcode & 0x8 != 0)
        if opcode == 8 { payload = randomCloseBody(using: &rng, limits: limits) }
        var frame = RandomFrame(
            fin: fin, opcode: opcode, mask: randomMask(using: &rng, limits: limits), payload: payload)
        // A longer length encoding than needed: RFC 6455 asks for the shortest, the parser takes any (but a control
        // frame's 7-bit field must hold its length).
        if opcode & 0x8 == 0, Int.random(in: 0..<8, using: &rng) == 0 {
            frame.encoding = payload.count <= 0xFFFF && Bool.random(using: &rng) ? .medium : .long
        }
        return frame
    }

    /// A close body RFC 6455 allows: empty, or a status code a peer may send and a short UTF-8 reason.
    static func randomCloseBody(using rng: inout some RandomNumberGenerator, limits: FrameLimits) -> [UInt8] {
        let bound = min(125, limits.maxFrameSize)
        guard bound >= 2, Int.random(in: 0..<4, using: &rng) != 0 else { return [] }
        let codes: [UInt16] = [
            1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 4321, 4999,
        ]
        let code = codes[Int.random(in: 0..<codes.count, using: &rng)]
        var reason = Array(Array("bye, ça va 👋".utf8).prefix(Int.random(in: 0...(bound - 2), using: &rng)))
        while String(validating: reason, as: UTF8.self) == nil { reason.removeLast() }  // not inside a character
        return [UInt8(code >> 8), UInt8(code & 0xFF)] + reason
    }

    /// `frame` made to break one rule or limit.
    static func fault(_ frame: RandomFrame, using rng: inout some RandomNumberGenerator, limits: FrameLimits)
        -> RandomFrame
    {
        var frame = frame
        switch Int.random(in: 0..<10, using: &rng) {
        case 0: frame.reserved = [0x10, 0x20, 0x40, 0x70][Int.random(in: 0..<4, using: &rng)]
        case 1: frame.mask = nil
        case 2: frame.fin = false  // a fragmented control frame, or a data frame that leaves a message open
        case 3: frame.opcode = UInt8.random(in: 0...15, using: &rng)  // unknown opcodes, stray continuations
        case 4, 5:  // a payload over the frame limit, sent in full
            let count = limits.maxFrameSize + Int.random(in: 1...40, using: &rng)
            frame.payload = randomBytes(count, using: &rng)
            frame.declaredLength = UInt64(count)
            frame.encoding = RandomFrame.minimalEncoding(count)
        case 6:  // only a header claiming more than the limit (up to 2^64 - 1)
            frame.payload = []
            frame.declaredLength = randomOversizedLength(using: &rng, limits: limits)
            frame.encoding = RandomFrame.minimalEncoding(Int(clamping: frame.declaredLength))
        case 7:  // a control frame over 125 bytes
            frame.opcode = [8, 9, 10][Int.random(in: 0..<3, using: &rng)]
            frame.payload = (0..<Int.random(in: 126...200, using: &rng)).map { _ in 0x61 }
            frame.declaredLength = UInt64(frame.payload.count)
            frame.encoding = .medium
        case 8:  // a close body of one byte, an invalid code, or a reason that is not UTF-8
            frame.opcode = 8
            frame.fin = true
            frame.payload =
                [
                    [0x03], [0x03, 0xEC], [0x03, 0xED], [0x00, 0x00], [0x0B, 0xB7], [0x13, 0x88], [0x03, 0xE8, 0xFF],
                    [0x03, 0xE8, 0x61, 0xC3],
                ][Int.random(in: 0..<8, using: &rng)]
            frame.declaredLength = UInt64(frame.payload.count)
            frame.encoding = .short
        default:  // a control frame whose short length has a longer encoding
            frame.opcode = 9
            frame.fin = true
            frame.payload = Array(frame.payload.prefix(125))
            frame.declaredLength = UInt64(frame.payload.count)
            frame.encoding = Bool.random(using: &rng) ? .medium : .long
        }
        return frame
    }

    static func randomOversizedLength(using rng: inout some RandomNumberGenerator, limits: FrameLimits) -> UInt64 {
        let over = UInt64(limits.maxFrameSize) + 1
        switch Int.random(in: 0..<5, using: &rng) {
        case 0: return over
        case 1: return UInt64.random(in: over...(over + 0xFFFF), using: &rng)
        case 2: return UInt64.random(in: over...UInt64(Int.max), using: &rng)
        case 3: return UInt64.random(in: (UInt64(Int.max) + 1)...UInt64.max, using: &rng)  // not an Int at all
        default: return UInt64.max
        }
    }

    /// What the parser must say for these frames, read whole: a model of RFC 6455 §5 with the parser's limits.
    func expected() -> FrameOutcome {
        var outcome = FrameOutcome()
        var fragments: [[UInt8]] = []
        var fragmentsOpcode: UInt8 = 0
        var size = 0
        func fail(_ error: WebSocketFrameParser.ParseError) -> FrameOutcome {
            outcome.end = .failed(error)
            return outcome
        }
        var text: [UInt8] = []
        for frame in frames {
            // Header checks, in the order the header is read.
            if ![0, 1, 2, 8, 9, 10].contains(frame.opcode) { return fail(.protocolError) }
            if frame.reserved != 0 { return fail(.protocolError) }
            if frame.mask == nil, limits.requiresMask { return fail(.protocolError) }
            if frame.isControl, !frame.fin || frame.lengthField > 125 { return fail(.protocolError) }
            if frame.declaredLength > UInt64(limits.maxFrameSize) { return fail(.tooLarge) }
            switch frame.opcode {
            case 0, 1, 2:
                if frame.opcode == 0, fragments.isEmpty { return fail(.protocolError) }
                if frame.opcode != 0, !fragments.isEmpty { return fail(.protocolError) }
                if frame.opcode != 0, frame.fin {
                    outcome.messages.append(.init(fin: true, opcode: frame.opcode, data: frame.payload))
                    continue
                }
                if frame.opcode != 0 { fragmentsOpcode = frame.opcode }
                size += frame.payload.count
                if size > limits.maxMessageSize { return fail(.tooLarge) }
                if fragments.count >= limits.maxFragments { return fail(.protocolError) }
                if fragmentsOpcode == 1 {
                    // UTF-8 so far, found wrong in the fragment that makes it so.
                    text += frame.payload
                    let valid = frame.fin ? String(validating: text, as: UTF8.self) != nil : isUTF8Prefix(text)
                    if !valid { return fail(.invalidUTF8) }
                }
                fragments.append(frame.payload)
                if frame.opcode == 0, frame.fin {
                    outcome.messages.append(.init(fin: true, opcode: fragmentsOpcode, data: fragments.flatMap { $0 }))
                    fragments = []
                    size = 0
                    text = []
                }
            default:
                // Control frames come out as they are, also between fragments; a close body must be one a peer may
                // send.
                if frame.opcode == 8, !isValidCloseBody(frame.payload) { return fail(.protocolError) }
                outcome.messages.append(.init(fin: frame.fin, opcode: frame.opcode, data: frame.payload))
            }
        }
        outcome.end = fragments.isEmpty ? .idle : .waiting
        return outcome
    }
}

/// Text that more bytes could make UTF-8: whole characters, then the start of one (told by its lead byte, and, past
/// it, by the character that 0x80s complete it to). Independent of the parser's validator, for the model.
func isUTF8Prefix(_ bytes: [UInt8]) -> Bool {
    for unfinished in 0...min(3, bytes.count) {
        guard String(validating: bytes.dropLast(unfinished), as: UTF8.self) != nil else { continue }
        if unfinished == 0 { return true }
        let tail = Array(bytes.suffix(unfinished))
        let length: Int
        switch tail[0] {
        case 0xC2...0xDF: length = 2
        case 0xE0...0xEF: length = 3
        case 0xF0...0xF4: length = 4
        default: continue
        }
        guard unfinished < length else { continue }
        if unfinished == 1 { return true }
        let completed = tail + [UInt8](repeating: 0x80, count: length - unfinished)
        if String(validating: completed, as: UTF8.self) != nil { return true }
    }
    return false
}

/// A close body as RFC 6455 §5.5.1 and §7.4 allow (with 1012–1014, registered since), for the model.
func isValidCloseBody(_ body: [UInt8]) -> Bool {
    if body.isEmpty { return true }
    guard body.count >= 2 else { return false }
    let code = Int(body[0]) << 8 | Int(body[1])
    let valid = (1000...1003).contains(code) || (1007...1014).contains(code) || (3000...4999).contains(code)
    return valid && String(validating: body.dropFirst(2), as: UTF8.self) != nil
}

/// The text of one message cut into fragments anywhere, also inside a character: the bytes of random characters
/// of one to four bytes, a character cut by the end of one fragment going on at the start of the next.
struct TextStream {
    private var carry: [UInt8] = []

    /// `count` bytes for a fragment that is not the last; for the last, whole characters up to `count` (or what is
    /// carried, if more), so that the message ends between characters.
    mutating func next(
        _ count: Int, fin: Bool, limits: FrameLimits, using rng: inout some RandomNumberGenerator
    ) -> [UInt8] {
        var out = carry
        carry = []
        let room = fin ? max(count, out.count) : count
        while out.count < room {
            // Characters no longer than a frame, so that what is carried fits in the next one.
            let character = Self.randomCharacter(maxLength: min(4, limits.maxFrameSize), using: &rng)
            if character[0] < 0x80 {
                out += character.prefix(room - out.count)  // ASCII is cut anywhere, never carried
                continue
            }
            if fin, out.count + character.count > room { break }
            out += character
        }
        if out.count > room {
            carry = Array(out[room...])
            out.removeSubrange(room...)
        }
        return out
    }

    /// A character of up to `maxLength` bytes, or a run of ASCII ones (long payloads are made quickly).
    static func randomCharacter(maxLength: Int, using rng: inout some RandomNumberGenerator) -> [UInt8] {
        let length = Int.random(in: 1...maxLength, using: &rng)
        if length == 1 {
            return randomBytes(Int.random(in: 1...16, using: &rng), using: &rng).map { 0x20 + $0 % 0x5F }
        }
        let value: UInt32
        switch length {
        case 2: value = UInt32.random(in: 0x80...0x7FF, using: &rng)
        case 3:
            value =
                Bool.random(using: &rng)
                ? .random(in: 0x800...0xD7FF, using: &rng) : .random(in: 0xE000...0xFFFF, using: &rng)
        default: value = UInt32.random(in: 0x10000...0x10FFFF, using: &rng)
        }
        return Array(String(Character(Unicode.Scalar(value)!)).utf8)
    }
}

/// Runs a parser over `wire` read in pieces ending at `cuts`, draining it after every read as the handler does.
/// Returns what it said and the most storage it held after a read was drained.
func parseFrames(_ wire: [UInt8], cuts: [Int], limits: FrameLimits) -> (outcome: FrameOutcome, held: Int) {
    var parser = limits.parser()
    var outcome = FrameOutcome()
    var held = 0
    var start = 0
    for end in cuts + [wire.count] where end > start {
        parser.append(ByteBuffer(bytes: wire[start..<end]))
        start = end
        do {
            while let frame = try parser.next() {
                outcome.messages.append(
                    .init(
                        fin: frame.fin, opcode: UInt8(webSocketOpcode: frame.opcode),
                        data: Array(frame.data.readableBytesView)))
            }
        } catch {
            // After an error the parser is not used again: the connection closes.
            outcome.end = .failed(error)
            return (outcome, held)
        }
        held = max(held, parser.pendingCapacity)
    }
    outcome.end = parser.isIdle ? .idle : .waiting
    return (outcome, held)
}

@Suite struct WebSocketFrameParserPropertyTests {
    static let streams = Generator { rng in
        FrameStream.random(using: &rng, limits: FrameLimits.random(using: &rng))
    }

    /// Streams whose frames cross 125 and 65,535 bytes, the points where the length encoding changes, read in
    /// pieces of up to 4 KiB (a byte at a time would take long).
    static let largeStreams = Generator { rng in
        let limits = FrameLimits.random(using: &rng, maxFrameSize: 100...70_000)
        var stream = FrameStream.random(using: &rng, limits: limits, frames: 1...4, faults: 0.2)
        let total = stream.wireCount
        stream.cuts = []
        var at = Int.random(in: 1...4096, using: &rng)
        while at < total {
            stream.cuts.append(at)
            at += Int.random(in: 1...4096, using: &rng)
        }
        return stream
    }

    @Test func messagesAreTheOnesTheFramesCarry() async {
        await propertyCheck(count: 400, input: Self.streams) { stream in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let (outcome, _) = parseFrames(stream.wire, cuts: [], limits: stream.limits)
            #expect(outcome == stream.expected())
            for message in outcome.messages {
                #expect(message.data.count <= max(stream.limits.maxFrameSize, stream.limits.maxMessageSize))
            }
        }
    }

    @Test func anyCutPointsGiveTheSameMessagesAndEndAsOneRead() async {
        await propertyCheck(count: 400, input: Self.streams) { stream in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let wire = stream.wire
            let whole = parseFrames(wire, cuts: [], limits: stream.limits).outcome
            let split = parseFrames(wire, cuts: stream.cuts, limits: stream.limits).outcome
            #expect(split == whole)
        }
    }

    @Test func largeFramesAtAnyCutPointsAreTheOnesSent() async {
        await propertyCheck(count: 40, input: Self.largeStreams) { stream in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let split = parseFrames(stream.wire, cuts: stream.cuts, limits: stream.limits).outcome
            #expect(split == stream.expected())
        }
    }

    /// Bytes that arrive later never change what was already said: a stream cut short says a prefix of what the
    /// whole stream says, and fails only as the whole one does.
    @Test func aStreamCutShortSaysAPrefixOfWhatTheWholeSays() async {
        let input = Generator { rng in
            let stream = FrameStream.random(using: &rng, limits: FrameLimits.random(using: &rng))
            return (stream, Int.random(in: 0...stream.wireCount, using: &rng))
        }
        await propertyCheck(count: 300, input: input) { input in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let (stream, length) = input
            let wire = stream.wire
            let whole = parseFrames(wire, cuts: [], limits: stream.limits).outcome
            let cuts = stream.cuts.filter { $0 < length }
            let short = parseFrames(Array(wire.prefix(length)), cuts: cuts, limits: stream.limits).outcome
            #expect(Array(whole.messages.prefix(short.messages.count)) == short.messages)
            if case .failed = short.end { #expect(short == whole) }
        }
    }

    /// Well-formed streams many times longer than the bound, in reads that rarely line up with frames: the
    /// storage held after a read is drained stays under what one partial frame, the read that completed it and
    /// the 4 KiB of read frames the parser keeps before compacting can need (twice that, for the power-of-two
    /// growth of a buffer).
    @Test func heldStorageStaysUnderTheBoundOverLongStreams() async {
        let input = Generator { rng in
            let limits = FrameLimits.randomForLongMessages(using: &rng)
            var stream = FrameStream.random(using: &rng, limits: limits, frames: 150...300, faults: 0)
            let total = stream.wireCount
            let size = Int.random(in: 1...700, using: &rng)
            let jitter = Int.random(in: 0...size / 2, using: &rng)
            stream.cuts = Array(stride(from: size, to: total, by: size)).enumerated().map {
                max(1, $0.element - ($0.offset % 2) * jitter)
            }
            return stream
        }
        await propertyCheck(count: 40, input: input) { stream in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let wire = stream.wire
            let largestRead = zip(stream.cuts + [wire.count], [0] + stream.cuts).map { $0 - $1 }.max() ?? 0
            let (outcome, held) = parseFrames(wire, cuts: stream.cuts, limits: stream.limits)
            #expect(outcome == stream.expected())
            let bound = 2 * (4096 + 14 + stream.limits.maxFrameSize + largestRead)
            #expect(held <= bound, "held \(held) bytes of a \(wire.count)-byte stream; bound \(bound)")
        }
    }

    /// A frame whose header claims more than the limit fails as soon as its length is read: its payload is never
    /// waited for (nor held), however the stream is cut.
    @Test func anOversizedFrameFailsAtItsHeaderNotByGrowing() async {
        let input = Generator { rng in
            let limits = FrameLimits.randomForLongMessages(using: &rng)
            var stream = FrameStream.random(using: &rng, limits: limits, frames: 0...4, faults: 0)
            var frame = FrameStream.randomFrame(using: &rng, limits: limits, inMessage: false)
            frame.opcode = [0, 1, 2][Int.random(in: 0..<3, using: &rng)]
            frame.mask = FrameStream.randomMask(using: &rng, limits: limits) ?? [1, 2, 3, 4]
            frame.declaredLength = FrameStream.randomOversizedLength(using: &rng, limits: limits)
            frame.encoding = RandomFrame.minimalEncoding(Int(clamping: frame.declaredLength))
            // What follows the header: the start of a payload that never ends.
            frame.payload = randomBytes(Int.random(in: 0...limits.maxFrameSize + 100, using: &rng), using: &rng)
            stream.frames.append(frame)
            stream.cuts = FrameStream.randomCuts(using: &rng, count: stream.wireCount)
            return stream
        }
        await propertyCheck(count: 300, input: input) { stream in
            await Task.yield()  // a long run of checks leaves the test pool to other tests
            let wire = stream.wire
            let oversized = stream.frames.last!
            let headerEnd = wire.count - oversized.wireCount + oversized.lengthHeaderCount
            var parser = stream.limits.parser()
            var start = 0
            var failure: WebSocketFrameParser.ParseError?
            for end in stream.cuts + [wire.count] where end > start && failure == nil {
                parser.append(ByteBuffer(bytes: wire[start..<end]))
                start = end
                do throws(WebSocketFrameParser.ParseError) {
                    while try parser.next() != nil {}
                } catch {
                    failure = error
                }
                if failure == nil {
                    #expect(end < headerEnd, "the length of the oversized frame is in, and it is still waited for")
                }
            }
            // The frames before it are well-formed (a message they leave open does not change the error).
            #expect(failure == .tooLarge)
        }
    }
}
