import Testing

@testable import PubSubServer

/// The default `--max-connections` and the soft limit raised at start, as figures.
@Suite struct DescriptorLimitTests {
    @Test(arguments: [
        (64, 32), (128, 64), (256, 192), (1024, 960), (4096, 3892), (20_000, 19_000), (65_536, 62_260),
        (1_048_576, 996_148),
    ])
    func defaultMaxConnectionsLeavesHeadroom(soft: Int, expected: Int) {
        #expect(DescriptorLimit.defaultMaxConnections(soft: soft) == expected)
    }

    @Test func headroomIsAtLeast64ButAtMostHalfTheLimit() {
        #expect(DescriptorLimit.headroom(soft: 10) == 5)
        #expect(DescriptorLimit.headroom(soft: 100) == 50)
        #expect(DescriptorLimit.headroom(soft: 1000) == 64)
        #expect(DescriptorLimit.headroom(soft: 100_000) == 5000)
        #expect(DescriptorLimit.defaultMaxConnections(soft: 1) == 1)
    }

    @Test func anUnlimitedSoftLimitHasNoDefaultLimit() {
        #expect(DescriptorLimit.defaultMaxConnections(soft: Int.max) == 0)
        #expect(DescriptorLimit(soft: Int.max, hard: Int.max).allows(maxConnections: 0))
    }

    @Test func anExplicitMaxConnectionsIsCheckedAgainstTheLimit() {
        let limit = DescriptorLimit(soft: 1024, hard: 1024)
        #expect(limit.allows(maxConnections: 960))
        #expect(!limit.allows(maxConnections: 961))
        #expect(!limit.allows(maxConnections: 5000))
        // No limit at all cannot be held by 1024 descriptors either.
        #expect(!limit.allows(maxConnections: 0))
    }

    @Test func theSoftLimitIsRaisedToTheHardOneOrToTheKernelCeilingWhenThatIsUnlimited() {
        #expect(DescriptorLimit(soft: 256, hard: 1024).raiseTarget(nrOpen: 1_048_576) == 1024)
        #expect(DescriptorLimit(soft: 1024, hard: 1024).raiseTarget(nrOpen: 1_048_576) == nil)
        #expect(DescriptorLimit(soft: 1024, hard: Int.max).raiseTarget(nrOpen: 1_048_576) == 1_048_576)
        #expect(DescriptorLimit(soft: 1024, hard: Int.max).raiseTarget(nrOpen: nil) == Int.max)
        #expect(DescriptorLimit(soft: Int.max, hard: Int.max).raiseTarget(nrOpen: nil) == nil)
    }

    @Test func theProcessLimitCanBeReadAndRaisingLeavesSoftAtMostHard() {
        guard let limit = DescriptorLimit.current() else {
            Issue.record("getrlimit failed")
            return
        }
        #expect(limit.soft <= limit.hard)
        let raise = DescriptorLimit.raiseSoftToHard()
        #expect(raise.before == limit)
        #expect(raise.failure == nil)
        #expect(raise.after.map { $0.soft >= limit.soft && $0.soft <= $0.hard } == true)
    }
}
