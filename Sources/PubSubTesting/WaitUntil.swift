/// Waits for a condition instead of a guessed time: asks `condition` every `interval` until it holds, and at least
/// once more after `timeout` has passed. Returns whether it held, for an `#expect` that says what was awaited; a
/// fixed sleep is either too short on a loaded machine or too long everywhere.
///
///     #expect(try await waitUntil { client.isConnected })
public func waitUntil(
    timeout: Duration = .seconds(10),
    interval: Duration = .milliseconds(10),
    _ condition: () async throws -> Bool
) async throws -> Bool {
    let clock = ContinuousClock()
    let deadline = clock.now.advanced(by: timeout)
    while true {
        if try await condition() { return true }
        if clock.now >= deadline { return try await condition() }
        try await Task.sleep(for: interval)
    }
}
