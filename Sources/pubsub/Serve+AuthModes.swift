import ArgumentParser
import Foundation
import NIOCore
import PubSubAuth
import PubSubCore
import PubSubServer
import ServiceLifecycle

/// The authorization modes beyond PrivatePub (JWT, the HTTP hook) and the browser-access options of `pubsub serve`.
struct AuthModeOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "HS256 secret: clients present JWTs in ext.token (PUBSUB_JWT_KEY).", valueName: "secret"))
    var jwtKey: String?

    @Option(
        help: ArgumentHelp(
            "PEM public key (RSA for RS256, P-256 for ES256) that verifies JWTs (PUBSUB_JWT_PUBLIC_KEY).",
            valueName: "file"))
    var jwtPublicKey: String?

    @Option(
        help: ArgumentHelp(
            "JWKS URL (an OIDC provider's jwks_uri) whose RS256 and ES256 keys verify JWTs by kid (PUBSUB_JWT_JWKS_URL).",
            valueName: "url"))
    var jwtJwksUrl: String?

    @Option(
        help: ArgumentHelp(
            "Seconds between fetches of the JWKS; default 300 (PUBSUB_JWT_JWKS_REFRESH).", valueName: "seconds"))
    var jwtJwksRefresh: Double?

    @Option(
        help: ArgumentHelp(
            "Every JWT's aud must contain this audience (PUBSUB_JWT_AUDIENCE).", valueName: "audience"))
    var jwtAudience: String?

    @Option(help: ArgumentHelp("Every JWT's iss must be this issuer (PUBSUB_JWT_ISSUER).", valueName: "issuer"))
    var jwtIssuer: String?

    @Option(
        help: ArgumentHelp(
            "URL the broker POSTs each authorization question to; the app answers {\"allow\": …} (PUBSUB_AUTH_HOOK).",
            valueName: "url"))
    var authHook: String?

    @Option(
        help: ArgumentHelp(
            "Actions the hook decides: any of handshake, subscribe, publish; default subscribe (PUBSUB_AUTH_HOOK_ACTIONS).",
            valueName: "list"))
    var authHookActions: String?

    @Option(help: "Seconds the hook may take; later is a refusal; default 2 (PUBSUB_AUTH_HOOK_TIMEOUT).")
    var authHookTimeout: Double?

    @Option(help: "Seconds an identical question reuses the hook's answer; default 0, never (PUBSUB_AUTH_HOOK_CACHE).")
    var authHookCache: Double?

    @Option(help: "Hook calls in flight at once; more wait (PUBSUB_AUTH_HOOK_CONCURRENCY, default 64).")
    var authHookConcurrency: Int?

    @Option(
        help: ArgumentHelp(
            "Web origins allowed to use CORS and WebSocket, comma-separated (https://app.example.com, https://*.example.com); default any. JSON-P cannot be protected by origin: see --disable-callback-polling (PUBSUB_ALLOWED_ORIGINS).",
            valueName: "list"))
    var allowedOrigins: String?

    @Flag(
        help:
            "Refuse JSON-P callback-polling, which --allowed-origins cannot protect (PUBSUB_DISABLE_CALLBACK_POLLING=1)."
    )
    var disableCallbackPolling = false

    /// What the flags and variables ask for, read and checked without building anything.
    struct Resolved {
        var jwtKey: String?
        var jwtPublicKeyPEM: String?
        var jwtPublicKeyFile: String?
        var jwtExpectations: JWTExpectations
        var jwks: JWKSSettings?
        var hook: HookSettings?
        var origins: OriginPolicy
        var callbackPolling: Bool
        var hasJWT: Bool { jwtKey != nil || jwtPublicKeyPEM != nil || jwks != nil }
        var isEmpty: Bool { !hasJWT && hook == nil }
    }

    func resolve() throws -> Resolved {
        let jwtKey = self.jwtKey ?? Environment.string("PUBSUB_JWT_KEY")
        if let jwtKey, jwtKey.utf8.count < 32 {
            throw ValidationError("--jwt-key must be at least 32 bytes (RFC 7518: as long as SHA-256's output)")
        }
        let keyFile = jwtPublicKey ?? Environment.string("PUBSUB_JWT_PUBLIC_KEY")
        var pem: String?
        if let keyFile {
            guard let data = FileManager.default.contents(atPath: keyFile) else {
                throw ValidationError("--jwt-public-key \(keyFile): cannot read the file")
            }
            pem = String(decoding: data, as: UTF8.self)
            guard pem!.contains("-----BEGIN") else {
                throw ValidationError("--jwt-public-key \(keyFile): not a PEM file")
            }
        }
        let expectations = JWTExpectations(
            audience: jwtAudience ?? Environment.string("PUBSUB_JWT_AUDIENCE"),
            issuer: jwtIssuer ?? Environment.string("PUBSUB_JWT_ISSUER"))
        let jwks = try resolveJWKS()
        if expectations != JWTExpectations(), jwtKey == nil, keyFile == nil, jwks == nil {
            throw ValidationError("--jwt-audience and --jwt-issuer need --jwt-key, --jwt-public-key or --jwt-jwks-url")
        }
        var hook: HookSettings?
        let actionsText = authHookActions ?? Environment.string("PUBSUB_AUTH_HOOK_ACTIONS")
        let timeout = try Environment.pick(authHookTimeout, "PUBSUB_AUTH_HOOK_TIMEOUT") ?? 2
        let cache = try Environment.pick(authHookCache, "PUBSUB_AUTH_HOOK_CACHE") ?? 0
        let concurrency =
            try Environment.pick(authHookConcurrency, "PUBSUB_AUTH_HOOK_CONCURRENCY") ?? 64
        if let url = authHook ?? Environment.string("PUBSUB_AUTH_HOOK") {
            guard let parsed = URL(string: url), ["http", "https"].contains(parsed.scheme ?? ""), parsed.host != nil
            else { throw ValidationError("--auth-hook \(url): not an http:// or https:// URL") }
            var actions: Set<AuthorizationAction> = [.subscribe]
            if let actionsText {
                actions = []
                for name in actionsText.split(separator: ",").map({ String($0).trimmingSpaces }) where !name.isEmpty {
                    guard let action = AuthorizationAction(rawValue: name) else {
                        throw ValidationError("--auth-hook-actions: \(name) is not handshake, subscribe or publish")
                    }
                    actions.insert(action)
                }
                guard !actions.isEmpty else {
                    throw ValidationError("--auth-hook-actions must name at least one action")
                }
            }
            guard timeout > 0, timeout <= 60 else {
                throw ValidationError("--auth-hook-timeout must be above 0 and at most 60 seconds")
            }
            guard cache >= 0, cache <= 3600 else {
                throw ValidationError("--auth-hook-cache must be between 0 and 3600 seconds")
            }
            guard concurrency > 0 else { throw ValidationError("--auth-hook-concurrency must be a positive number") }
            hook = HookSettings(
                url: url, actions: actions, timeout: .nanoseconds(Int64(timeout * 1e9)),
                maxConcurrent: concurrency, cacheTTL: .nanoseconds(Int64(cache * 1e9)))
        } else if actionsText != nil || authHookTimeout != nil || authHookCache != nil || authHookConcurrency != nil {
            throw ValidationError(
                "--auth-hook-actions, --auth-hook-timeout, --auth-hook-cache and --auth-hook-concurrency need --auth-hook"
            )
        }
        var origins = OriginPolicy()
        if let list = allowedOrigins ?? Environment.string("PUBSUB_ALLOWED_ORIGINS") {
            do { origins = try OriginPolicy.parse(list) } catch { throw ValidationError("--allowed-origins \(error)") }
            if origins.patterns?.isEmpty == true { throw ValidationError("--allowed-origins names no origin") }
        }
        let noJSONP = Environment.isSet(disableCallbackPolling, "PUBSUB_DISABLE_CALLBACK_POLLING")
        return Resolved(
            jwtKey: jwtKey, jwtPublicKeyPEM: pem, jwtPublicKeyFile: keyFile, jwtExpectations: expectations,
            jwks: jwks, hook: hook, origins: origins,
            callbackPolling: !noJSONP)
    }

    /// `--jwt-jwks-url` and `--jwt-jwks-refresh` (or their variables): an http(s) URL with a host, and a refresh
    /// between 1 s and a day.
    func resolveJWKS() throws -> JWKSSettings? {
        let refresh = try Environment.pick(jwtJwksRefresh, "PUBSUB_JWT_JWKS_REFRESH")
        guard let url = jwtJwksUrl ?? Environment.string("PUBSUB_JWT_JWKS_URL") else {
            if jwtJwksRefresh != nil { throw ValidationError("--jwt-jwks-refresh needs --jwt-jwks-url") }
            return nil
        }
        guard let parsed = URL(string: url), ["http", "https"].contains(parsed.scheme?.lowercased() ?? ""),
            let host = parsed.host, !host.isEmpty
        else { throw ValidationError("--jwt-jwks-url \(url): not an http:// or https:// URL") }
        let seconds = refresh ?? 300
        guard seconds >= 1, seconds <= 86_400 else {
            throw ValidationError("--jwt-jwks-refresh must be between 1 and 86400 seconds")
        }
        return JWKSSettings(url: url, refreshInterval: seconds)
    }
}

/// The JWKS schedule (`--jwt-jwks-url`) as a service: keys refetched on time even while no token arrives, and
/// the loop ended by the broker's graceful shutdown.
struct JWKSRefreshService: Service {
    let source: JWKSKeySource

    func run() async {
        await cancelWhenGracefulShutdown {
            await source.run()
        }
    }
}

extension AuthOptions {
    /// The authorization modes in the order they are asked (cheap ones first, the hook last), and the
    /// sentences the start log says about them.
    ///
    /// `services` are to run in the broker's service group, before the server (so that they stop after it has
    /// drained): the JWKS refresh.
    func makeAuthorization() async throws -> (
        pipeline: AuthorizationPipeline, summary: [String], warnings: [String], services: [any Service]
    ) {
        let (privatePub, privatePubSummary) = try resolve()
        let modes = try self.modes.resolve()
        var authorizers: [any Authorizer] = []
        var summary: [String] = []
        var warnings: [String] = []
        var services: [any Service] = []
        if let privatePub {
            var withoutPublic = privatePub
            withoutPublic.publicChannels = []
            authorizers.append(withoutPublic)
        }
        if let privatePubSummary { summary.append(privatePubSummary) }
        let publics = try publicPatterns()
        if !publics.isEmpty {
            authorizers.append(PublicChannels(publics))
            if privatePub == nil { summary.append("anyone may subscribe to " + publics.joined(separator: ", ")) }
        }
        if modes.hasJWT {
            var jwks: JWKSKeySource?
            if let settings = modes.jwks {
                let source = JWKSKeySource(settings: settings)
                // The first fetch, before the broker listens (bounded by the fetch timeout): a provider that is down
                // now does not stop the broker, whose JWKS tokens are refused until a fetch succeeds.
                await source.refreshIfDue()
                jwks = source
                services.append(JWKSRefreshService(source: source))
                if settings.url.lowercased().hasPrefix("http://"), !Self.isLoopback(settings.url) {
                    warnings.append(
                        "--jwt-jwks-url \(settings.url) is plain HTTP: whoever can change the answer on the way can sign tokens"
                    )
                }
            }
            let jwt: JWTAuthorizer
            do {
                jwt = try await JWTAuthorizer.make(
                    hmacSecret: modes.jwtKey, publicKeyPEM: modes.jwtPublicKeyPEM,
                    publicKeyName: modes.jwtPublicKeyFile ?? "public key", jwks: jwks, expecting: modes.jwtExpectations)
            } catch let error as JWTAuthorizer.KeyError {
                switch error {
                case .notAPublicKey: throw ValidationError("--jwt-public-key \(error)")
                case .shortSecret: throw ValidationError("--jwt-key: \(error)")
                }
            }
            authorizers.append(jwt)
            summary.append(
                "JWTs (\(jwt.algorithms.map(\.rawValue).joined(separator: ", "))) in ext.token set the session's user and grant channels"
            )
            if let jwks, let settings = modes.jwks {
                let held = jwks.keys.map { "\($0.count) key(s) held" } ?? "no keys yet: JWKS tokens are refused"
                summary.append(
                    "JWKS \(settings.url), refetched every \(AuthOptions.number(settings.refreshInterval)) s and for an unknown kid (at most every \(AuthOptions.number(settings.unknownKidInterval)) s); \(held)"
                )
            }
        }
        if let hook = modes.hook {
            authorizers.append(HookAuthorizer(settings: hook))
            let actions = AuthorizationAction.allCases.filter { hook.actions.contains($0) }.map(\.rawValue)
            summary.append("the hook \(hook.url) decides \(actions.joined(separator: ", "))")
        }
        let pipeline = AuthorizationPipeline(authorizers)
        if !authorizers.isEmpty {
            if pipeline.deciders(for: .subscribe).isEmpty {
                warnings.append("no authorization mode decides subscribes: anyone may subscribe")
            }
            if pipeline.deciders(for: .publish).isEmpty {
                warnings.append("no authorization mode decides publishes: anyone may publish")
            }
            if modes.origins.patterns == nil {
                warnings.append(
                    "authorization is configured but any web origin may use the broker with its users' cookies: set --allowed-origins"
                )
            }
        }
        return (pipeline, summary, warnings, services)
    }

    /// Whether a URL names this machine (`127.0.0.0/8`, `::1`, `localhost`), where plain HTTP is not on a network.
    static func isLoopback(_ url: String) -> Bool {
        guard let host = URL(string: url)?.host?.lowercased() else { return false }
        return host == "localhost" || host.hasPrefix("127.") || host == "::1" || host == "[::1]"
    }
}
