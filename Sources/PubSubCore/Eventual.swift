import NIOCore

/// A value now, or a future of it: what the broker and its engine give when an answer may be ready at once.
/// The memory engine takes a publish without waiting for anything; a chain of `EventLoopFuture`s would still
/// allocate a promise and a callback for every step (five steps from the engine to the connection), so a value
/// that is ready travels as a value, and only an answer that must wait (Redis, an authorization hook) becomes a
/// future. The transforms keep the order of a future's: `map` runs on the value, `flatMapErrorThrowing` on the
/// error.
public enum Eventual<Value: Sendable>: Sendable {
    case now(Result<Value, any Error>)
    case later(EventLoopFuture<Value>)

    public static func value(_ value: Value) -> Eventual { .now(.success(value)) }

    /// The answer as a future (one allocation when it was ready).
    public func future(on loop: any EventLoop) -> EventLoopFuture<Value> {
        switch self {
        case .now(let result): return loop.makeCompletedFuture(result)
        case .later(let future): return future
        }
    }

    public func map<New: Sendable>(_ transform: @escaping @Sendable (Value) -> New) -> Eventual<New> {
        switch self {
        case .now(let result): return .now(result.map(transform))
        case .later(let future): return .later(future.map(transform))
        }
    }

    public func flatMapErrorThrowing(_ recover: @escaping @Sendable (any Error) throws -> Value) -> Eventual {
        switch self {
        case .now(.success): return self
        case .now(.failure(let error)): return .now(Result { try recover(error) })
        case .later(let future): return .later(future.flatMapErrorThrowing(recover))
        }
    }

    /// The answers in order: now when each is (the first failure, if any), else a future of them all (failed by
    /// the first that fails).
    public static func all<Element: Sendable>(_ answers: [Eventual<Element>], on loop: any EventLoop) -> Eventual<
        [Element]
    >
    where Value == [Element] {
        var values: [Element] = []
        values.reserveCapacity(answers.count)
        for answer in answers {
            switch answer {
            case .now(.success(let value)): values.append(value)
            case .now(.failure(let error)): return .now(.failure(error))
            case .later:
                return .later(EventLoopFuture.whenAllSucceed(answers.map { $0.future(on: loop) }, on: loop))
            }
        }
        return .value(values)
    }
}
