import Bayeux
import Testing

@Suite struct ChannelGrammarTests {
    @Test(arguments: ["/foo", "/foo-bar/(x)", "/a/@!~()$", "/a_b/C9", "/metadata", "/meta/connect"])
    func validNames(_ name: String) {
        #expect(Channel.kind(of: name) == .name)
    }

    @Test(arguments: [
        ("/*", Channel.Kind.singleWildcard), ("/**", .deepWildcard), ("/foo/*", .singleWildcard),
        ("/foo/**", .deepWildcard),
    ])
    func validPatterns(_ pattern: String, _ kind: Channel.Kind) {
        #expect(Channel.kind(of: pattern) == kind)
    }

    @Test(arguments: ["foo", "/", "/a/", "//a", "/a b/c", "/a.b", "/é", "/foo/*/bar", "/foo/***", "/foo*", "/*a", ""])
    func invalid(_ text: String) {
        #expect(Channel.kind(of: text) == nil)
    }

    @Test func subscribable() {
        #expect(Channel.isSubscribable("/foo/**"))
        #expect(Channel.isSubscribable("/metadata"))
        #expect(Channel.isSubscribable("/**"))
        #expect(!Channel.isSubscribable("/meta/foo"))
        #expect(!Channel.isSubscribable("/meta/**"))
        #expect(!Channel.isSubscribable("/service/foo"))
        #expect(!Channel.isSubscribable("bad"))
    }

    @Test func expandsLikeFaye() {
        #expect(Set(Channel.expand("/a/b/c")) == ["/a/b/c", "/**", "/a/**", "/a/b/**", "/a/b/*"])
        #expect(Set(Channel.expand("/a")) == ["/a", "/**", "/*"])
    }

    @Test func matchingAgreesWithExpansion() {
        let names = ["/a", "/a/b", "/a/b/c", "/b", "/b/a"]
        let patterns = ["/*", "/**", "/a/*", "/a/**", "/a/b/*", "/a/b", "/b/**"]
        for name in names {
            let keys = Set(Channel.expand(name))
            for pattern in patterns {
                #expect(
                    Channel.matches(pattern: pattern, name: name) == keys.contains(pattern), "\(pattern) vs \(name)")
            }
        }
        #expect(!Channel.matches(pattern: "/foo/*", name: "/foo"))
        #expect(!Channel.matches(pattern: "/foo/**", name: "/foo"))
        #expect(!Channel.matches(pattern: "/foo/*", name: "/foo/bar/baz"))
    }
}

@Suite struct ErrorStringTests {
    @Test func rendersFayeForm() {
        #expect(
            BayeuxError.connectionTypeMismatch(["iframe", "flash"]).description
                == "301:iframe,flash:Connection types not supported")
        #expect(BayeuxError.clientUnknown("abc").description == "401:abc:Unknown client")
        #expect(BayeuxError.parameterMissing("version").description == "402:version:Missing required parameter")
        #expect(BayeuxError.channelForbidden("/meta/foo").description == "403:/meta/foo:Forbidden channel")
        #expect(BayeuxError.channelInvalid("").description == "405::Invalid channel")
        #expect(BayeuxError.badRequest.description == "400::Bad request")
        #expect(BayeuxError(.versionMismatch).description == "300::Version mismatch")
        #expect(BayeuxError(.extensionMismatch).description == "302::Extension mismatch")
        #expect(BayeuxError(.channelUnknown, "/x").description == "404:/x:Unknown channel")
        #expect(BayeuxError(.extensionUnknown).description == "406::Unknown extension")
        #expect(BayeuxError(.publishFailed).description == "407::Failed to publish")
        #expect(BayeuxError(.serverError).description == "500::Internal server error")
        #expect(BayeuxError(.queueOverflow, "c").description == "409:c:Queue overflow")
    }

    @Test func everyErrorMatchesTheClientGrammar() {
        // The Faye client only parses `ddd:STRING(,STRING)*:STRING` or `ddd::STRING`.
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!~()$@ /*.")
        let codes: [BayeuxError.Code] = [
            .versionMismatch, .connectionTypeMismatch, .extensionMismatch, .badRequest,
            .clientUnknown, .parameterMissing, .channelForbidden, .channelUnknown, .channelInvalid, .extensionUnknown,
            .publishFailed, .serverError, .queueOverflow, .subscriptionLimit, .channelTooLong, .tooManyMessages,
            .shuttingDown,
        ]
        for code in codes {
            let text = BayeuxError(code, "/a/b").description
            let parts = text.split(separator: ":", omittingEmptySubsequences: false)
            #expect(parts.count == 3 && parts[0].count == 3 && parts[0].allSatisfy(\.isNumber), "\(text)")
            #expect(parts[2].allSatisfy(allowed.contains), "\(text)")
        }
    }
}

@Suite struct ClientIDTests {
    @Test func fifteenBase36Characters() {
        var seen = Set<String>()
        for _ in 0..<200 {
            let id = ClientID.random()
            #expect(id.utf8.count == 15)
            #expect(id.allSatisfy { $0.isNumber || ("a"..."z").contains($0) })
            seen.insert(id)
        }
        #expect(seen.count == 200)
    }

    /// Bytes of 252 and over would favour the first four characters: they are drawn again, not folded.
    @Test func biasedBytesAreDrawnAgain() {
        struct Words: RandomNumberGenerator {
            var words: [UInt64]
            mutating func next() -> UInt64 { words.removeFirst() }
        }
        var generator = Words(words: [.max, 0xFCFD_FEFF_FCFD_FEFF, 0x2423_0100_0000_0000, 0x0000_0023_2221_201F])
        // Two words of rejected bytes, then bytes lowest first: 0 × 5, 1, 35 ("z"), 36 ("0" again: 36 % 36), then
        // 31 … 35 ("v" … "z") and 0, 0.
        #expect(ClientID.random(using: &generator) == "00000" + "1z0" + "vwxyz" + "00")
    }
}
