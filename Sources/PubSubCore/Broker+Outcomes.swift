import Bayeux
import NIOCore

extension Broker {
    /// Collects what a batch of outcomes means for a transport: the replies to send now (a connect answered now
    /// has been through the outgoing extensions), the events to deliver now, in order, and the connect (if any)
    /// whose reply is still to come. Every transport answers a request or frame with this.
    public func split(_ outcomes: [Outcome], context: RequestContext)
        -> (replies: [Message], events: CircularBuffer<WireEvent>, pending: PendingConnect?)
    {
        var replies: [Message] = []
        var events = CircularBuffer<WireEvent>.noEvents
        var pending: PendingConnect?
        for outcome in outcomes {
            switch outcome {
            case .reply(let reply): replies.append(reply)
            case .none: break
            case .connect(let connect):
                events.append(contentsOf: connect.result.events)
                if connect.result.answerNow {
                    var reply = connect.reply
                    closeBatch(&reply, for: connect)
                    if let reply = finish(reply, context: context) { replies.append(reply) }
                } else {
                    pending = connect
                }
            }
        }
        return (replies, events, pending)
    }
}
