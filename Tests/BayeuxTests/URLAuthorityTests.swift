import Bayeux
import Testing

@Suite struct URLAuthorityTests {
    struct Golden: Sendable, CustomStringConvertible {
        var text: String
        var user: String?
        var password: String?
        var host: String
        var bracketed = false
        var port: Int?
        var description: String { text }
    }

    @Test(arguments: [
        Golden(text: "example.com", host: "example.com"),
        Golden(text: "example.com:8080", host: "example.com", port: 8080),
        Golden(text: "", host: ""),
        Golden(text: "user@h", user: "user", host: "h"),
        Golden(text: "user:p%40ss@h:1", user: "user", password: "p%40ss", host: "h", port: 1),
        // The last `@` ends the user info; the first `:` of the user info ends the user.
        Golden(text: "a@b:c:d@h:65535", user: "a@b", password: "c:d", host: "h", port: 65535),
        Golden(text: ":secret@h", user: "", password: "secret", host: "h"),
        Golden(text: "@h", user: "", host: "h"),
        Golden(text: "[::1]", host: "::1", bracketed: true),
        Golden(text: "[fe80::1%25eth0]:5432", host: "fe80::1%25eth0", bracketed: true, port: 5432),
        Golden(text: "u:p@[::1]:80", user: "u", password: "p", host: "::1", bracketed: true, port: 80),
        Golden(text: "user@:6379", user: "user", host: "", port: 6379),
    ])
    func splits(_ golden: Golden) throws {
        let authority = try URLAuthority(golden.text)
        #expect(authority.user == golden.user)
        #expect(authority.password == golden.password)
        #expect(authority.host == golden.host)
        #expect(authority.isBracketed == golden.bracketed)
        #expect(authority.port == golden.port)
    }

    @Test(arguments: [
        ("h:", URLAuthority.Failure.badPort("")),
        ("h:0", .badPort("0")),
        ("h:65536", .badPort("65536")),
        ("h:+80", .badPort("+80")),
        ("h:8o", .badPort("8o")),
        ("u:p@h:x", .badPort("x")),
        ("[::1]:", .badPort("")),
        ("[::1", .unclosedBracket),
        ("[::1]x", .junkAfterBracket("x")),
        ("[::1]8080", .junkAfterBracket("8080")),
    ])
    func refuses(_ text: String, _ failure: URLAuthority.Failure) {
        #expect(throws: failure) { try URLAuthority(text) }
    }

    @Test func anIPv6HostIsWrittenBackInBrackets() throws {
        #expect(try URLAuthority("[::1]:80").hostInURL == "[::1]")
        #expect(try URLAuthority("h:80").hostInURL == "h")
    }
}

@Suite struct PercentDecodingTests {
    @Test(arguments: [
        ("plain", "plain"),
        ("p%40ss", "p@ss"),
        ("%2f%2F", "//"),
        ("caf%C3%A9", "café"),
        ("a+b", "a+b"),
        ("%25", "%"),
        ("", ""),
    ])
    func decodes(_ text: String, _ decoded: String) throws {
        #expect(try PercentDecoding.decode(text) == decoded)
        #expect(PercentDecoding.decodeLeniently(text) == decoded)
    }

    @Test(arguments: ["%", "%4", "%zz", "a%2", "%+1", "100%"])
    func aBadEscapeIsRefusedOrKeptAsItIs(_ text: String) {
        #expect(throws: PercentDecoding.Failure.badEscape) { try PercentDecoding.decode(text) }
        #expect(PercentDecoding.decodeLeniently(text) == text)
    }

    @Test func bytesThatAreNotUTF8() {
        #expect(throws: PercentDecoding.Failure.notUTF8) { try PercentDecoding.decode("%FF") }
        #expect(PercentDecoding.decodeLeniently("a%FFb") == "a\u{FFFD}b")
        // A good escape after a bad one is still decoded.
        #expect(PercentDecoding.decodeLeniently("%zz%41") == "%zzA")
    }
}
