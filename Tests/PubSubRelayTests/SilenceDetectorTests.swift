import NIOCore
import Testing

@testable import PubSubRelay

/// The one rule for a feed's silence, with time as an input.
@Suite struct SilenceDetectorTests {
    static let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    @Test func aServerThatCanBeAskedIsProbedThenGivenUp() {
        var detector = SilenceDetector(quiet: .seconds(20), answer: .seconds(10), now: Self.start)
        #expect(detector.check(now: Self.start + .seconds(19)) == .fine)
        detector.heard(now: Self.start + .seconds(5))
        #expect(detector.check(now: Self.start + .seconds(24)) == .fine)
        #expect(detector.check(now: Self.start + .seconds(25)) == .probe)
        #expect(detector.check(now: Self.start + .seconds(30)) == .fine)
        // Other traffic is not the answer.
        detector.heard(now: Self.start + .seconds(31))
        #expect(detector.check(now: Self.start + .seconds(35)) == .fine)
        #expect(detector.check(now: Self.start + .seconds(36)) == .dead(silence: .seconds(5)))
    }

    @Test func anAnswerEndsTheWaitAndTheRelaysWaitDoesNotCount() {
        var detector = SilenceDetector(quiet: .seconds(20), answer: .seconds(10), now: Self.start)
        #expect(detector.check(now: Self.start + .seconds(20)) == .probe)
        detector.answered(now: Self.start + .seconds(21))
        #expect(detector.probeSent == nil)
        detector.wait()
        #expect(detector.check(now: Self.start + .seconds(500)) == .fine)
        detector.resume(now: Self.start + .seconds(500))
        #expect(detector.check(now: Self.start + .seconds(519)) == .fine)
        #expect(detector.check(now: Self.start + .seconds(520)) == .probe)
        // A wait while a probe is out gives the answer its full time again.
        detector.wait()
        detector.resume(now: Self.start + .seconds(600))
        #expect(detector.check(now: Self.start + .seconds(610)) == .fine)
        #expect(detector.check(now: Self.start + .seconds(611)) == .dead(silence: .seconds(11)))
    }

    @Test func aServerThatCannotBeAskedIsGivenUpAfterTheQuiet() {
        var detector = SilenceDetector(quiet: .seconds(20), answer: nil, now: Self.start)
        #expect(detector.check(now: Self.start + .seconds(20)) == .fine)
        #expect(detector.check(now: Self.start + .seconds(21)) == .dead(silence: .seconds(21)))
    }
}
