import ArgumentParser
import Bayeux
import PubSubCore

/// The authentication options of `pubsub serve`.
struct AuthOptions: ParsableArguments {
    @Option(help: "Secret token: subscriptions must be signed with it and publishes must carry it (PUBSUB_SECRET).")
    var secret: String?

    @Option(
        help:
            "Seconds a subscription signature stays valid; default forever, as PrivatePub (PUBSUB_SIGNATURE_EXPIRATION)."
    )
    var signatureExpiration: Double?

    @Option(
        help:
            "Seconds a signature's timestamp may lie in the future, for clock skew; default 300 (PUBSUB_MAX_CLOCK_SKEW)."
    )
    var maxClockSkew: Double?

    @Option(
        help: ArgumentHelp(
            "Subscription signatures accepted: privatepub (SHA-1, the default), hmac (HMAC-SHA256) or both (PUBSUB_SIGNATURES).",
            valueName: "scheme"))
    var signatures: SignatureScheme?

    @Flag(help: "HMAC signatures must be bound to the subscriber's clientId (PUBSUB_REQUIRE_CLIENT_BINDING=1).")
    var requireClientBinding = false

    @Option(
        name: .customLong("public"),
        help: ArgumentHelp(
            "A channel or pattern anyone may subscribe to without a signature; repeatable (PUBSUB_PUBLIC, comma-separated).",
            valueName: "pattern"))
    var publicChannels: [String] = []

    @OptionGroup var privatePub: PrivatePubConfigOptions

    @OptionGroup(title: "Authorization beyond PrivatePub") var modes: AuthModeOptions

    /// The secret: the flag, then the PrivatePub file, then PUBSUB_SECRET.
    func secretToken() throws -> String? {
        try self.secret ?? privatePub.load()?.secretToken ?? Environment.string("PUBSUB_SECRET")
    }

    /// The auth extension to install (none when there is no secret), and a sentence saying what it checks.
    /// Precedence: flags, then the PrivatePub file, then environment variables.
    func resolve() throws -> (extension: PrivatePubAuth?, summary: String?) {
        let file = try privatePub.load()
        let secret = try secretToken()
        let expiration =
            try signatureExpiration ?? file?.signatureExpiration
            ?? Environment.value("PUBSUB_SIGNATURE_EXPIRATION", as: Double.self)
        let skew = try Environment.pick(maxClockSkew, "PUBSUB_MAX_CLOCK_SKEW") ?? 300
        let scheme = try Environment.pick(signatures, "PUBSUB_SIGNATURES", .privatePub)
        let binding = Environment.isSet(requireClientBinding, "PUBSUB_REQUIRE_CLIENT_BINDING")
        let publics = try publicPatterns()
        if let expiration, !(expiration >= 0 && expiration.isFinite) {
            throw ValidationError("--signature-expiration must be a number of seconds")
        }
        guard skew >= 0, skew.isFinite else { throw ValidationError("--max-clock-skew must not be negative") }
        guard let secret else {
            if signatures != nil || binding || signatureExpiration != nil {
                throw ValidationError(
                    "--signatures, --require-client-binding and --signature-expiration need a secret (--secret or PUBSUB_SECRET)"
                )
            }
            if !publics.isEmpty, try modes.resolve().isEmpty {
                throw ValidationError(
                    "--public needs an authorization mode (--secret, --jwt-key, --jwt-public-key, --jwt-jwks-url or --auth-hook)"
                )
            }
            return (nil, nil)
        }
        guard !secret.isEmpty else { throw ValidationError("the secret must not be empty") }
        let auth = PrivatePubAuth(
            secret: secret, signatureExpiration: expiration, maxClockSkew: skew, signatures: scheme,
            requireClientBinding: binding, publicChannels: publics)
        var summary: String
        switch scheme {
        case .privatePub: summary = "subscriptions need PrivatePub (SHA-1) signatures"
        case .hmac: summary = "subscriptions need HMAC-SHA256 signatures" + (binding ? " bound to the clientId" : "")
        case .both:
            summary =
                "subscriptions need PrivatePub (SHA-1) or HMAC-SHA256 signatures"
                + (binding ? " (HMAC bound to the clientId)" : "")
        }
        summary += expiration.map { ", valid for \(Self.number($0)) s" } ?? ", valid forever"
        if !publics.isEmpty { summary += ", except on public " + publics.joined(separator: ", ") }
        summary += "; publishing needs the secret token"
        if let server = file?.server { summary += "; PrivatePub's configuration names the server \(server)" }
        return (auth, summary)
    }

    /// `--public` patterns, or PUBSUB_PUBLIC (comma-separated).
    func publicPatterns() throws -> [String] {
        var publics = publicChannels
        if publics.isEmpty, let env = Environment.string("PUBSUB_PUBLIC") {
            publics = env.split(separator: ",").map { String($0).trimmingSpaces }.filter { !$0.isEmpty }
        }
        for pattern in publics where !Channel.isSubscribable(pattern) {
            throw ValidationError("--public \(pattern): not a channel name or pattern anyone could subscribe to")
        }
        return publics
    }

    static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }
}

extension String {
    var trimmingSpaces: String {
        var s = Substring(self)
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return String(s)
    }
}
