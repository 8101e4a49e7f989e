import NIOCore
import Testing

@testable import PubSubRedis

/// Discovery and failover decisions, driven without sockets.
@Suite struct SentinelStateMachineTests {
    let s1 = RedisEndpoint(host: "10.0.0.1", port: 26379)
    let s2 = RedisEndpoint(host: "10.0.0.2", port: 26379)
    let s3 = RedisEndpoint(host: "10.0.0.3", port: 26379)
    let m1 = RedisEndpoint(host: "10.0.1.1", port: 6379)
    let m2 = RedisEndpoint(host: "10.0.1.2", port: 6379)

    func machine() -> SentinelStateMachine {
        SentinelStateMachine(sentinels: [s1, s2, s3], masterName: "mymaster")
    }

    @Test func asksEachSentinelInTurnUntilOneNamesAMaster() {
        var m = machine()
        #expect(m.discover() == .ask(server: 0, s1))
        #expect(m.sentinelAnswered(0, .failed("connection refused")) == .ask(server: 1, s2))
        #expect(m.sentinelAnswered(1, .unknownName) == .ask(server: 2, s3))
        #expect(m.sentinelAnswered(2, .master(m1)) == .connect(m1))
        #expect(m.roleChecked(m1, named: 2, role: "master") == .use(switched: false))
        #expect(m.master == m1)
        // The sentinel that answered is asked first next time.
        #expect(m.discover() == .ask(server: 2, s3))
    }

    /// Through `MasterDiscovery`, as `MasterMonitor` drives it: the check is judged with the sentinel that named
    /// the address.
    @Test func theCheckIsJudgedWithTheSentinelThatNamedTheAddress() {
        var m = machine()
        #expect(m.discover() == .ask(server: 0, s1))
        #expect(m.answered(0, .failed("refused")) == .ask(server: 1, s2))
        #expect(m.answered(1, .master(m1)) == .connect(m1))
        #expect(m.checked(m1, "slave") == .reject)
        // Sentinel 1 named a replica: the next round starts after it.
        #expect(m.discover() == .ask(server: 2, s3))
        #expect(m.answered(2, .master(m2)) == .connect(m2))
        #expect(m.checked(m2, "master") == .use(switched: false))
        #expect(m.discover() == .ask(server: 2, s3))
    }

    @Test func noSentinelAnsweringFailsTheRoundWithEveryReason() {
        var m = machine()
        _ = m.discover()
        _ = m.sentinelAnswered(0, .failed("refused"))
        _ = m.sentinelAnswered(1, .failed("timeout"))
        guard case .fail(let reason) = m.sentinelAnswered(2, .unknownName) else {
            Issue.record("expected a failure")
            return
        }
        #expect(reason.contains("refused") && reason.contains("timeout") && reason.contains("knows no master"))
        // The next round starts again.
        #expect(m.discover() == .ask(server: 0, s1))
    }

    @Test func aNodeThatIsNoLongerMasterIsRejectedAndTheNextSentinelAskedFirst() {
        var m = machine()
        _ = m.discover()
        #expect(m.sentinelAnswered(0, .master(m1)) == .connect(m1))
        // Demoted, or a stale answer: ROLE says slave.
        #expect(m.roleChecked(m1, named: 0, role: "slave") == .reject)
        #expect(m.master == nil)
        #expect(m.discover() == .ask(server: 1, s2))
        // No answer to ROLE at all counts the same.
        #expect(m.roleChecked(m1, named: 1, role: nil) == .reject)
        #expect(m.discover() == .ask(server: 2, s3))
    }

    @Test func aNewMasterAfterAVerifiedOneIsAFailover() {
        var m = machine()
        #expect(m.roleChecked(m1, named: 0, role: "master") == .use(switched: false))
        // The same master again (a reconnect after a cut) is no failover.
        #expect(m.roleChecked(m1, named: 0, role: "master") == .use(switched: false))
        #expect(m.switches == 0)
        #expect(m.roleChecked(m2, named: 1, role: "master") == .use(switched: true))
        #expect(m.switches == 1)
        #expect(m.master == m2)
    }

    @Test func switchMasterForThisNameAndANewAddressAsksForRediscovery() {
        var m = machine()
        _ = m.roleChecked(m1, named: 0, role: "master")
        #expect(m.signal(.switchMaster(name: "other", to: m2)) == .ignore)
        #expect(m.signal(.switchMaster(name: "mymaster", to: m1)) == .ignore)  // already there
        #expect(m.signal(.switchMaster(name: "mymaster", to: m2)) == .rediscover)
        #expect(m.signal(.readOnly) == .rediscover)
    }

    @Test func theWatcherGoesRoundTheSentinels() {
        var m = machine()
        #expect((0..<4).map { _ in m.nextWatchedSentinel() } == [s1, s2, s3, s1])
    }

    @Test func parsesSentinelReplies() {
        #expect(
            SentinelStateMachine.parseSwitchMaster("mymaster 10.0.1.1 6379 10.0.1.2 6380")! == (
                "mymaster", RedisEndpoint(host: "10.0.1.2", port: 6380)
            ))
        #expect(SentinelStateMachine.parseSwitchMaster("mymaster 10.0.1.1 6379") == nil)
        #expect(SentinelStateMachine.parseSwitchMaster("mymaster 10.0.1.1 6379 10.0.1.2 99999") == nil)
        let address = RESPValue.array([
            .bulkString(ByteBuffer(string: "10.0.1.2")), .bulkString(ByteBuffer(string: "6380")),
        ])
        #expect(
            SentinelStateMachine.parseMasterAddress(address) == .master(RedisEndpoint(host: "10.0.1.2", port: 6380)))
        #expect(SentinelStateMachine.parseMasterAddress(.array(nil)) == .unknownName)
        #expect(SentinelStateMachine.parseMasterAddress(.error("ERR no such")) == .failed("ERR no such"))
        #expect(SentinelStateMachine.parseMasterAddress(.integer(1)) != .unknownName)
        #expect(
            SentinelStateMachine.parseRole(.array([.bulkString(ByteBuffer(string: "master")), .integer(0)])) == "master"
        )
        #expect(SentinelStateMachine.parseRole(.integer(1)) == nil)
    }

    @Test func readsTheSentinelListAndTheMasterName() throws {
        let (plain, master) = try RedisSentinelConfiguration.parse(
            sentinels: "127.0.0.1:26379, 127.0.0.2 ,[::1]:26380", masterName: "mymaster")
        #expect(
            plain.sentinels == [
                RedisEndpoint(host: "127.0.0.1", port: 26379), RedisEndpoint(host: "127.0.0.2", port: 26379),
                RedisEndpoint(host: "::1", port: 26380),
            ])
        #expect(plain.masterName == "mymaster")
        #expect(!master.tls && master.password == nil && master.database == 0)
        #expect(!plain.sentinelConnection.tls)

        let (secure, secureMaster) = try RedisSentinelConfiguration.parse(
            sentinels: "rediss://:pw@s1:26379,rediss://:pw@s2", masterName: "rediss://:masterpw@prod/2")
        #expect(secure.sentinelConnection.tls && secure.sentinelConnection.password == "pw")
        #expect(secure.sentinels.map(\.port) == [26379, 26379])
        #expect(secure.masterName == "prod")
        #expect(secureMaster.tls && secureMaster.password == "masterpw" && secureMaster.database == 2)

        #expect(throws: RedisSentinelConfiguration.ParseError.self) {
            try RedisSentinelConfiguration.parse(sentinels: "rediss://s1,redis://s2", masterName: "m")
        }
        #expect(throws: RedisSentinelConfiguration.ParseError.self) {
            try RedisSentinelConfiguration.parse(sentinels: " , ", masterName: "m")
        }
        #expect(throws: RedisSentinelConfiguration.ParseError.self) {
            try RedisSentinelConfiguration.parse(sentinels: "s1:notaport", masterName: "m")
        }
        #expect(throws: RedisSentinelConfiguration.ParseError.self) {
            try RedisSentinelConfiguration.parse(sentinels: "s1", masterName: "my master")
        }
    }

    // MARK: Confirming the master followed

    /// A machine following m1, named by sentinel 1 (index 0) and verified at `t0`.
    func following(at t0: NIODeadline) -> SentinelStateMachine {
        var m = machine()
        _ = m.discover()
        _ = m.answered(0, .master(m1))
        _ = m.checked(m1, "master")
        m.verified(now: t0)
        return m
    }

    @Test func nothingIsConfirmedBeforeAMasterIsFollowed() {
        var m = machine()
        #expect(m.confirm() == .none)
        #expect(!m.isConfirmed(now: .uptimeNanoseconds(1), within: .seconds(5)))
    }

    @Test func aMajorityOfSentinelsNamingTheMasterFollowedConfirmsIt() {
        let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)
        var m = following(at: t0)
        #expect(m.quorum == 2)
        #expect(m.isConfirmed(now: t0 + .seconds(5), within: .seconds(5)))
        #expect(!m.isConfirmed(now: t0 + .seconds(6), within: .seconds(5)))
        #expect(m.confirm() == .ask(server: 0, s1))
        // One round at a time.
        #expect(m.confirm() == .none)
        #expect(m.confirmationAnswered(0, .master(m1), now: t0 + .seconds(6)) == .ask(server: 1, s2))
        #expect(!m.isConfirmed(now: t0 + .seconds(6), within: .seconds(5)), "one of three is not a majority")
        #expect(m.confirmationAnswered(1, .master(m1), now: t0 + .seconds(6)) == .confirmed)
        #expect(m.isConfirmed(now: t0 + .seconds(11), within: .seconds(5)))
        #expect(m.confirm() == .ask(server: 0, s1))
    }

    /// A node cut off from the sentinels but not from the old master: no announcement, no READONLY, and the
    /// master it follows goes on answering. Only the confirmation can tell.
    @Test func noSentinelAnsweringLeavesTheMasterUnconfirmedWithEveryReason() {
        let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)
        var m = following(at: t0)
        #expect(m.confirm() == .ask(server: 0, s1))
        #expect(m.confirmationAnswered(0, .failed("timeout"), now: t0) == .ask(server: 1, s2))
        #expect(m.confirmationAnswered(1, .unknownName, now: t0) == .ask(server: 2, s3))
        guard case .unconfirmed(let why) = m.confirmationAnswered(2, .failed("refused"), now: t0) else {
            Issue.record("expected the round to confirm nothing")
            return
        }
        #expect(why.contains("timeout") && why.contains("knows no master") && why.contains("refused"))
        #expect(!m.isConfirmed(now: t0 + .seconds(6), within: .seconds(5)))
        // The next round starts again, and a late answer of the old round changes nothing.
        #expect(m.confirmationAnswered(0, .master(m2), now: t0) == .none)
        #expect(m.confirm() == .ask(server: 0, s1))
    }

    @Test func aSentinelNamingAnotherMasterMakesTheOneFollowedStale() {
        let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)
        var m = following(at: t0)
        #expect(m.confirm() == .ask(server: 0, s1))
        #expect(m.confirmationAnswered(0, .failed("refused"), now: t0) == .ask(server: 1, s2))
        #expect(m.confirmationAnswered(1, .master(m2), now: t0) == .stale(named: m2, by: s2))
        // The next discovery starts at the sentinel that named the new master, and the ROLE check is judged
        // with it; the switch is counted once m2 is verified.
        #expect(m.discover() == .ask(server: 1, s2))
        #expect(m.answered(1, .master(m2)) == .connect(m2))
        #expect(m.checked(m2, "master") == .use(switched: true))
        m.verified(now: t0 + .seconds(1))
        #expect(m.master == m2 && m.switches == 1)
        #expect(m.confirm() == .ask(server: 1, s2))
        #expect(m.confirmationAnswered(1, .master(m2), now: t0 + .seconds(2)) == .ask(server: 2, s3))
        #expect(m.confirmationAnswered(2, .master(m2), now: t0 + .seconds(2)) == .confirmed)
    }

    /// A node on the minority side of a partition, with the old master and one sentinel: that sentinel still names
    /// the old master (it cannot fail over alone), the others are out of reach. One sentinel does not confirm it.
    @Test func oneSentinelOfThreeDoesNotConfirmTheMaster() {
        let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)
        var m = following(at: t0)
        #expect(m.confirm() == .ask(server: 0, s1))
        #expect(m.confirmationAnswered(0, .master(m1), now: t0) == .ask(server: 1, s2))
        #expect(m.confirmationAnswered(1, .failed("timeout"), now: t0) == .ask(server: 2, s3))
        guard case .unconfirmed(let why) = m.confirmationAnswered(2, .failed("refused"), now: t0) else {
            Issue.record("expected the round to confirm nothing")
            return
        }
        #expect(why.contains("1 of 3 sentinels named it, 2 must"), "\(why)")
        #expect(!m.isConfirmed(now: t0 + .seconds(6), within: .seconds(5)))
        // The next round starts at the sentinel that named it; two of them confirm it again.
        #expect(m.confirm() == .ask(server: 0, s1))
        #expect(m.confirmationAnswered(0, .master(m1), now: t0 + .seconds(7)) == .ask(server: 1, s2))
        #expect(m.confirmationAnswered(1, .master(m1), now: t0 + .seconds(7)) == .confirmed)
        #expect(m.isConfirmed(now: t0 + .seconds(8), within: .seconds(5)))
    }

    /// With one sentinel configured, its answer is the majority.
    @Test func aLoneSentinelIsItsOwnMajority() {
        var m = SentinelStateMachine(sentinels: [s1], masterName: "mymaster")
        _ = m.discover()
        _ = m.answered(0, .master(m1))
        _ = m.checked(m1, "master")
        #expect(m.quorum == 1)
        #expect(m.confirm() == .ask(server: 0, s1))
        #expect(m.confirmationAnswered(0, .master(m1), now: .uptimeNanoseconds(1)) == .confirmed)
    }
}
