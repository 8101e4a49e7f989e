import Bayeux

/// A WebSocket's frames whose messages are with the broker, and the one frame that waits for them: a
/// sub-machine of `ConnectionStateMachine`.
///
/// A client's messages reach the engine in the order it sent them, whatever the engine's latency (a Redis round
/// trip). A frame of publishes only, with no authorization stage, is handed to the engine whole while the broker
/// takes it (`Broker.dispatchesAtOnce`), so the next such frame may follow at once: the engine sends their
/// scripts in the order it was given them, on one Redis connection, and a publisher that keeps several publishes
/// in flight is not held to one Redis round trip each. Any other frame (a meta message, or an authorization
/// stage that answers later) is exclusive: it waits until the frames before it are answered, and no frame is
/// taken after it until it is answered.
///
/// Bounded: at most `maxCount` frames in flight, together at most `maxBytes` (unless one alone is larger, as
/// one frame always could be), and one frame held; reading is withheld while no frame is taken, so what else
/// waits is one read's worth of bytes in the frame parser.
struct FramesInFlight {
    struct Frame {
        var elements: [MessageBatch.Element]
        /// The size of the frame's payload: what its messages hold while they are with the broker.
        var bytes: Int32
        var exclusive: Bool
    }

    static let maxCount: UInt8 = 16
    let maxBytes: Int32
    private(set) var count: UInt8 = 0
    private(set) var bytes: Int32 = 0
    /// The frame in flight must be answered before any other is handed over.
    private var exclusive = false
    private(set) var held: Frame?

    init(maxBytes: Int) {
        self.maxBytes = Int32(clamping: maxBytes)
    }

    var isEmpty: Bool { count == 0 }

    /// Whether the next frame may be taken from the parser.
    var takesFrames: Bool { held == nil && !exclusive && count < Self.maxCount && bytes < maxBytes }

    /// A frame was parsed: it goes to the broker now (returned), or it is held until the frames in flight are
    /// answered.
    mutating func arrived(_ frame: Frame) -> Frame? {
        precondition(takesFrames, "a frame arrived while none is taken")
        guard fits(frame) else {
            held = frame
            return nil
        }
        start(frame)
        return frame
    }

    /// A frame of `bytes` was answered.
    mutating func finished(bytes: Int32) {
        precondition(count > 0, "a frame finished that had not started")
        count -= 1
        self.bytes -= bytes
        if count == 0 { exclusive = false }
    }

    /// The held frame, when it may go to the broker now.
    mutating func startHeld() -> Frame? {
        guard let frame = held, fits(frame) else { return nil }
        held = nil
        start(frame)
        return frame
    }

    /// The connection ends: the held frame is never handled.
    mutating func dropHeld() {
        held = nil
    }

    private func fits(_ frame: Frame) -> Bool {
        count == 0 || (!frame.exclusive && Int64(bytes) + Int64(frame.bytes) <= Int64(maxBytes))
    }

    private mutating func start(_ frame: Frame) {
        count += 1
        bytes += frame.bytes
        exclusive = exclusive || frame.exclusive
    }
}
