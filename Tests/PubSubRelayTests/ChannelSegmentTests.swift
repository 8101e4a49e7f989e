import Bayeux
import Testing

@testable import PubSubRelay

@Suite struct ChannelSegmentTests {
    @Test func keepsTheSafeCharacters() {
        #expect(ChannelSegment.escape("n1") == "n1")
        #expect(ChannelSegment.escape("a-b_c!d~e(f)g@h") == "a-b_c!d~e(f)g@h")
    }

    @Test func escapesEverythingElseAsDollarHex() {
        #expect(ChannelSegment.escape("notes/1 a.b") == "notes$2F1$20a$2Eb")
        #expect(ChannelSegment.escape("$") == "$24")
        #expect(ChannelSegment.escape("*") == "$2A")
        #expect(ChannelSegment.escape("12::34") == "12$3A$3A34")
        #expect(ChannelSegment.escape("é") == "$C3$A9")
        #expect(ChannelSegment.escape("") == "$")
    }

    @Test func roundTripsAnyText() {
        var generator = SystemRandomNumberGenerator()
        let alphabet = Array("ab09-_!~()@$/.: *é😀\u{0}\n%\"")
        for _ in 0..<2000 {
            let length = Int.random(in: 0...12, using: &generator)
            let text = String((0..<length).map { _ in alphabet.randomElement(using: &generator)! })
            let segment = ChannelSegment.escape(text)
            #expect(Channel.kind(of: "/changes/" + segment) == .name, "\(segment)")
            #expect(ChannelSegment.unescape(segment) == text)
        }
    }

    @Test func refusesSegmentsEscapeCannotProduce() {
        #expect(ChannelSegment.unescape("") == nil)
        #expect(ChannelSegment.unescape("$2") == nil)
        #expect(ChannelSegment.unescape("$zz") == nil)
        #expect(ChannelSegment.unescape("$41") == nil)  // "A" is never escaped
        #expect(ChannelSegment.unescape("a.b") == nil)
        #expect(ChannelSegment.unescape("$FF") == nil)  // not UTF-8
    }

    @Test func mapsAChangeToItsChannelAndData() throws {
        let mapping = ChangeMapping(prefix: "/changes/", includeDocument: true)
        let change = Change(
            collection: ["public", "notes"], id: "n/1", operation: .update, seq: "0/16B3748:2",
            document: ["id": "n/1", "rev": .number("2")], extra: ["txn": "731"])
        let message = mapping.message(for: change, sourceID: "pg:relay")
        #expect(message.channel == "/changes/public/notes/n$2F1")
        let data = try #require(message.data.objectValue)
        #expect(data["id"] == "n/1")
        #expect(data["op"] == "update")
        #expect(data["seq"] == "0/16B3748:2")
        #expect(data["txn"] == "731")
        #expect(data["doc"] == .object(["id": "n/1", "rev": .number("2")]))
        #expect(data["key"] == .string(message.key))
        #expect(message.key.count == 32)
        // Deterministic: the same change always has the same key; another position another key.
        #expect(mapping.message(for: change, sourceID: "pg:relay").key == message.key)
        var later = change
        later.seq = "0/16B3800:1"
        #expect(mapping.message(for: later, sourceID: "pg:relay").key != message.key)
        #expect(
            ChangeMapping(includeDocument: false).message(for: change, sourceID: "pg:relay").data.objectValue?["doc"]
                == nil)
    }

    @Test func truncateGoesToTheCollectionChannel() {
        let change = Change(collection: ["public", "notes"], id: nil, operation: .truncate, seq: "0/1:1")
        let message = ChangeMapping().message(for: change, sourceID: "pg:s")
        #expect(message.channel == "/changes/public/notes")
        #expect(message.data.objectValue?["id"] == .null)
    }

    @Test func prefixes() {
        #expect(ChangeMapping.isValidPrefix("/changes"))
        #expect(ChangeMapping.isValidPrefix("/app/db"))
        #expect(!ChangeMapping.isValidPrefix("/meta/x"))
        #expect(!ChangeMapping.isValidPrefix("/service"))
        #expect(!ChangeMapping.isValidPrefix("/a/*"))
        #expect(!ChangeMapping.isValidPrefix("changes"))
    }
}
