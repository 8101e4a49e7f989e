import Testing

@testable import PubSubRelay

/// SASLprep as PostgreSQL applies it to SCRAM passwords: RFC 4013's examples (section 3), and PostgreSQL's rule
/// that a password SASLprep refuses is used raw.
@Suite struct SASLprepTests {
    @Test(arguments: [
        ("I\u{00AD}X", "IX"),  // soft hyphen mapped to nothing
        ("user", "user"),
        ("USER", "USER"),
        ("\u{00AA}", "a"),  // NFKC
        ("\u{2168}", "IX"),  // NFKC
        ("a\u{00A0}b\u{3000}c", "a b c"),  // non-ASCII spaces mapped to a space
        ("pa\u{0308}ss", "p\u{00E4}ss"),  // decomposed to composed
        ("\u{0627}\u{0628}", "\u{0627}\u{0628}"),  // right to left only
    ])
    func prepared(input: String, output: String) {
        #expect(Array(SASLprep.prepare(input).unicodeScalars) == Array(output.unicodeScalars))
    }

    @Test(arguments: [
        "\u{0007}",  // ASCII (even a control character) is used as it is
        "\u{00AD}",  // empty once mapped
        "\u{0627}1",  // right to left, not ending with a right-to-left character
        "a\u{0627}\u{0628}",  // right to left mixed with a left-to-right letter
        "x\u{0221}",  // unassigned in Unicode 3.2
        "x\u{E000}",  // private use
        "x\u{0085}",  // a non-ASCII control character
        "x\u{FFFE}",  // a non-character
        "x\u{E0041}",  // a tag
    ])
    func usedRaw(input: String) {
        #expect(Array(SASLprep.prepare(input).unicodeScalars) == Array(input.unicodeScalars))
    }

    /// The client's proof for a password SASLprep changes is the proof for the prepared password.
    @Test func scramProvesThePreparedPassword() throws {
        let serverFirst = Array("r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".utf8)
        var raw = SCRAMSHA256Client(password: "pa\u{0308}ss\u{00A0}wo\u{00AD}rd", nonce: "abc")
        var prepared = SCRAMSHA256Client(password: "p\u{00E4}ss word", nonce: "abc")
        #expect(try raw.finalMessage(after: serverFirst) == prepared.finalMessage(after: serverFirst))
        var other = SCRAMSHA256Client(password: "p\u{00E4}ssword", nonce: "abc")
        #expect(try raw.finalMessage(after: serverFirst) != other.finalMessage(after: serverFirst))
    }
}
