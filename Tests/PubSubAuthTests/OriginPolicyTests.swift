import NIOHTTP1
import Testing

@testable import PubSubServer

@Suite struct OriginPolicyTests {
    static let policy = try! OriginPolicy.parse("https://app.example.com, https://*.example.org,http://localhost:*")

    @Test(arguments: [
        ("https://app.example.com", true),
        ("HTTPS://APP.EXAMPLE.COM", true),
        ("http://app.example.com", false),  // another scheme is another origin
        ("https://app.example.com:8443", false),
        ("https://evil.com", false),
        ("https://app.example.com.evil.com", false),
        ("https://a.example.org", true),
        ("https://a.b.example.org", true),
        ("https://example.org", false),  // *. needs a subdomain
        ("https://evilexample.org", false),
        ("https://x.example.org:444", false),  // * never spans the port
        ("http://localhost:3000", true),
        ("http://localhost", false),
        ("http://localhost:3000/x", false),
        ("null", false),
    ])
    func origins(_ origin: String, _ allowed: Bool) {
        #expect(Self.policy.allows(origin: origin) == allowed)
    }

    @Test func absentOriginSameOriginAndTheDefault() {
        #expect(Self.policy.allows(HTTPHeaders([("Host", "broker:9292")])))
        #expect(Self.policy.allows(HTTPHeaders([("Host", "broker:9292"), ("Origin", "http://broker:9292")])))
        #expect(!Self.policy.allows(HTTPHeaders([("Host", "broker:9292"), ("Origin", "http://evil:9292")])))
        #expect(OriginPolicy().allows(HTTPHeaders([("Origin", "https://anything.test")])))
        // Two Origin headers: both must pass.
        #expect(
            !Self.policy.allows(HTTPHeaders([("Origin", "https://app.example.com"), ("Origin", "https://evil.com")])))
    }

    @Test(arguments: ["app.example.com", "ftp://x.com", "https://", "https://x.com/path", "*"])
    func badPatterns(_ pattern: String) {
        #expect(throws: OriginPolicy.InvalidPattern.self) { try OriginPolicy.parse(pattern) }
    }
}
