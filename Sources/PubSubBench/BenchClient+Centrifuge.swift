import NIOCore

/// Centrifuge's JSON protocol (0.15, the library under Centrifugo), so that a Centrifuge node is measured by the
/// same load as a Bayeux server. One command per line of a WebSocket text frame, `{"id":N,"method":M,"params":…}`
/// (connect is method 0, subscribe 1, publish 3); a reply carries its command's `id` and a `result` or an `error`;
/// a publication is a line without an id, `{"result":{"channel":…,"data":{"data":…}}}`, whose data holds the
/// bench marker as a Bayeux event's does. A subscriber connects and subscribes, then only reads: there is no
/// `/meta/connect` to repeat.
extension BenchClient {
    func sendCentrifugeConnect() {
        centrifugeConnecting = true
        send("{\"id\":\(takeId()),\"params\":{}}")
    }

    /// Every channel of the subscriber's slot, one subscribe command per line in one frame.
    private func sendCentrifugeSubscribe() {
        guard case .subscriber(let slot) = role else { return }
        let commands = shared.memberships[slot].map {
            "{\"id\":\(takeId()),\"method\":1,\"params\":{\"channel\":\"\(shared.channels[$0])\"}}"
        }
        centrifugeSubscribesPending = commands.count
        send(commands.joined(separator: "\n"))
    }

    /// Everything the node sent in one frame: publications are counted as events; replies move the client from
    /// connect to subscribe to ready, and acknowledge publishes.
    func receivedCentrifuge(_ body: ByteBuffer, now: UInt64) {
        let ok = body.withUnsafeReadableBytes { bytes in
            ReplyScanner.scan(bytes) { item in
                switch item {
                case .event(let marker):
                    self.event(marker, now: now)
                case .other(let object):
                    if let reply = ReplyScanner.commandReply(object) {
                        self.centrifugeReply(error: reply.error, now: now)
                    } else {
                        self.stats.recordError(
                            "unexpected push: \(String(decoding: UnsafeRawBufferPointer(rebasing: object.prefix(120)), as: UTF8.self))"
                        )
                    }
                }
            }
        }
        if !ok { stats.recordError("unreadable reply: \(String(buffer: body).prefix(120))") }
    }

    /// A reply to one of this client's commands, in the order they were sent (Centrifuge answers a connection's
    /// commands in order); `error` is the error's JSON, nil for a result.
    private func centrifugeReply(error: String?, now: UInt64) {
        if centrifugeConnecting {
            centrifugeConnecting = false
            if let error {
                fail("connect failed: \(error)")
            } else if isSubscriber {
                sendCentrifugeSubscribe()
            } else {
                becomeReady()
            }
        } else if centrifugeSubscribesPending > 0 {
            if let error {
                fail("subscribe failed: \(error)")
                return
            }
            centrifugeSubscribesPending -= 1
            if centrifugeSubscribesPending == 0 { becomeReady() }
        } else {
            if let error { stats.recordError("publish failed: \(error)") }
            acknowledged(success: error == nil, channel: nil, now: now)
        }
    }
}
