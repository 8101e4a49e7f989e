import PubSubCore
import Testing

@testable import PubSubCLI

@Suite struct PrivatePubConfigurationTests {
    /// The file PrivatePub's generator writes (`rails g private_pub:install`), with a real token.
    static let generated = """
        development:
          server: "http://localhost:9292/faye"
          secret_token: "secret"
        test:
          server: "http://localhost:9292/faye"
          secret_token: "secret"
        production:
          server: "http://example.com/faye"
          secret_token: "6c1e5f1a9d0b4f7e8c2a3b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081"
          signature_expiration: 3600 # one hour

        """

    @Test func readsEachEnvironment() throws {
        let production = try PrivatePubConfiguration.parse(Self.generated, environment: "production")
        #expect(
            production
                == PrivatePubConfiguration(
                    server: "http://example.com/faye",
                    secretToken: "6c1e5f1a9d0b4f7e8c2a3b4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081",
                    signatureExpiration: 3600))
        let development = try PrivatePubConfiguration.parse(Self.generated, environment: "development")
        #expect(development == PrivatePubConfiguration(server: "http://localhost:9292/faye", secretToken: "secret"))
    }

    @Test func missingEnvironmentIsOneLine() {
        #expect(
            throws: PrivatePubConfigurationError("The staging environment does not exist in config/private_pub.yml")
        ) {
            try PrivatePubConfiguration.parse(Self.generated, environment: "staging", file: "config/private_pub.yml")
        }
    }

    @Test func scalarsQuotesCommentsAndNulls() throws {
        let text = """
            ---
            # shared settings
            production:
              server: 'https://push.example.com/faye' # TLS
              secret_token: "a#b \\"quoted\\" \\u00e9"
              signature_expiration: ~
              other_key: ignored
            staging:
              server: http://10.0.0.1:9292/faye
              secret_token: it's plain
              signature_expiration: 1.5
            """
        let p = try PrivatePubConfiguration.parse(text, environment: "production")
        #expect(p == PrivatePubConfiguration(server: "https://push.example.com/faye", secretToken: "a#b \"quoted\" é"))
        let s = try PrivatePubConfiguration.parse(text, environment: "staging")
        #expect(
            s
                == PrivatePubConfiguration(
                    server: "http://10.0.0.1:9292/faye", secretToken: "it's plain", signatureExpiration: 1.5))
    }

    @Test func anchorsAndMergeKeys() throws {
        let text = """
            defaults: &defaults
              server: "http://localhost:9292/faye"
              signature_expiration: 600
            development:
              <<: *defaults
              secret_token: dev
            production:
              <<: *defaults
              signature_expiration: 3600
              secret_token: prod
            """
        #expect(
            try PrivatePubConfiguration.parse(text, environment: "development")
                == PrivatePubConfiguration(
                    server: "http://localhost:9292/faye", secretToken: "dev", signatureExpiration: 600))
        #expect(
            try PrivatePubConfiguration.parse(text, environment: "production")
                == PrivatePubConfiguration(
                    server: "http://localhost:9292/faye", secretToken: "prod", signatureExpiration: 3600))
    }

    @Test func crlfLineEndings() throws {
        let text = "production:\r\n  secret_token: \"s\"\r\n  signature_expiration: 60\r\n"
        #expect(
            try PrivatePubConfiguration.parse(text, environment: "production")
                == PrivatePubConfiguration(secretToken: "s", signatureExpiration: 60))
    }

    @Test func refusesWhatItDoesNotUnderstand() {
        let cases = [
            "production:\n  secret_token: \"open\n",
            "production:\n  nested:\n    deeper: 1\n",
            "production:\n  secret_token: |\n    block\n",
            "production:\n\tsecret_token: tab\n",
            "production:\n  signature_expiration: soon\n",
            "production:\n  <<: *missing\n",
            "  secret_token: orphan\n",
        ]
        for text in cases {
            #expect(throws: PrivatePubConfigurationError.self, "\(text)") {
                try PrivatePubConfiguration.parse(text, environment: "production")
            }
        }
    }

    @Test func refusalsNameTheFileAndLine() {
        let cases = [
            (
                "production:\n  nested:\n    deeper: 1\n",
                "app.yml:3: nested mappings are not part of a PrivatePub configuration"
            ),
            (
                "production:\n  secret_token: |\n    block\n",
                "app.yml:2: only plain or quoted scalar values are supported"
            ),
            ("production:\n\tsecret_token: tab\n", "app.yml:2: tabs are not allowed for indentation in YAML"),
            ("production:\n  <<: *missing\n", "app.yml:2: found undefined alias"),
            (
                "production:\n  signature_expiration: soon\n",
                "app.yml: signature_expiration in production must be a number of seconds, not 'soon'"
            ),
            ("production:\n  - a\n", "app.yml:2: lists are not part of a PrivatePub configuration"),
        ]
        for (text, message) in cases {
            #expect(throws: PrivatePubConfigurationError(message), "\(text)") {
                try PrivatePubConfiguration.parse(text, environment: "production", file: "app.yml")
            }
        }
    }

    @Test func flowMappingsAndLaterMergesAreYAMLToo() throws {
        let text = """
            base: &base {server: "http://localhost:9292/faye", signature_expiration: 60}
            extra: &extra
              secret_token: from-extra
              signature_expiration: 5
            production:
              <<: [*base, *extra]
            """
        // The first merged mapping wins over later ones, as in Ruby's YAML.
        #expect(
            try PrivatePubConfiguration.parse(text, environment: "production")
                == PrivatePubConfiguration(
                    server: "http://localhost:9292/faye", secretToken: "from-extra",
                    signatureExpiration: 60))
    }
}
