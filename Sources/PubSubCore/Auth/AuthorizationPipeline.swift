import Bayeux
import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The configured authorization modes, asked in order. A subscribe or publish is accepted when any one mode
/// accepts it (each channel of a subscribe on its own); a handshake is refused when a mode refuses it outright.
/// An action that no configured mode decides is not checked (the start log says so).
public struct AuthorizationPipeline: Sendable {
    public var authorizers: [any Authorizer]
    /// Wall-clock seconds since the Unix epoch: token expiry is wall-clock time.
    public var wallClock: @Sendable () -> Double
    public let grants: SessionGrants

    public init(
        _ authorizers: [any Authorizer] = [],
        wallClock: @escaping @Sendable () -> Double = AuthorizationPipeline.wallClockSeconds
    ) {
        self.authorizers = authorizers
        self.wallClock = wallClock
        self.grants = SessionGrants()
    }

    @Sendable public static func wallClockSeconds() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    public var isEmpty: Bool { authorizers.isEmpty }

    public func deciders(for action: AuthorizationAction) -> [any Authorizer] {
        authorizers.filter { $0.actions.contains(action) }
    }

    /// Whether some mode grants sessions (so connects check expiry and subscribes read the grant).
    public var usesGrants: Bool { authorizers.contains { $0.grantsSessions } }

    /// Whether some mode needs the session's user for `action`.
    public func needsUser(for action: AuthorizationAction) -> Bool {
        deciders(for: action).contains { $0.needsUser }
    }

    /// Removes every mode's credentials from a message about to be published.
    public func scrub(_ message: inout Message) {
        for authorizer in authorizers { authorizer.scrub(&message) }
    }

    /// Decides a subscribe (each of `channels`) or a publish (`channels` is the one channel): the modes are
    /// asked in order and the first acceptance ends the asking, so the hook is not called when a token already
    /// grants the channel.
    public func decide(
        _ request: AuthorizationRequest, channels: [String], on loop: any EventLoop
    ) -> EventLoopFuture<AuthorizationVerdict> {
        let deciders = deciders(for: request.action)
        guard !deciders.isEmpty else { return loop.makeSucceededFuture(.accepted(user: nil, grant: nil)) }
        return Self.decide(deciders, request, channels: channels[...], on: loop)
    }

    private static func decide(
        _ deciders: [any Authorizer], _ request: AuthorizationRequest, channels: ArraySlice<String>,
        on loop: any EventLoop
    ) -> EventLoopFuture<AuthorizationVerdict> {
        guard let first = channels.first else {
            return loop.makeSucceededFuture(.accepted(user: request.user, grant: nil))
        }
        var one = request
        one.channel = first
        return askUntilAccepted(deciders[...], one, decisions: [], on: loop).flatMap { verdict in
            if case .refused = verdict { return loop.makeSucceededFuture(verdict) }
            return decide(deciders, request, channels: channels.dropFirst(), on: loop)
        }
    }

    private static func askUntilAccepted(
        _ deciders: ArraySlice<any Authorizer>, _ request: AuthorizationRequest,
        decisions: [AuthorizationDecision], on loop: any EventLoop
    ) -> EventLoopFuture<AuthorizationVerdict> {
        guard let next = deciders.first else { return loop.makeSucceededFuture(.any(decisions)) }
        return next.authorize(request, on: loop).hop(to: loop).flatMap { decision in
            let decisions = decisions + [decision]
            if case .allow = decision { return loop.makeSucceededFuture(.any(decisions)) }
            return askUntilAccepted(deciders.dropFirst(), request, decisions: decisions, on: loop)
        }
    }

    /// Decides a handshake: every mode that decides handshakes is asked in order (a later one sees the user an
    /// earlier one established), until one refuses.
    public func decideHandshake(_ request: AuthorizationRequest, on loop: any EventLoop)
        -> EventLoopFuture<AuthorizationVerdict>
    {
        Self.handshake(deciders(for: .handshake)[...], request, decisions: [], on: loop)
    }

    private static func handshake(
        _ deciders: ArraySlice<any Authorizer>, _ request: AuthorizationRequest,
        decisions: [AuthorizationDecision], on loop: any EventLoop
    ) -> EventLoopFuture<AuthorizationVerdict> {
        let verdict = AuthorizationVerdict.handshake(decisions)
        guard let next = deciders.first else { return loop.makeSucceededFuture(verdict) }
        if case .refused = verdict { return loop.makeSucceededFuture(verdict) }
        var one = request
        if case .accepted(let user, let grant) = verdict {
            one.user = user
            one.grant = grant
        }
        return next.authorize(one, on: loop).hop(to: loop).flatMap { decision in
            handshake(deciders.dropFirst(), request, decisions: decisions + [decision], on: loop)
        }
    }
}
