"""The counting of the fault suite (faultkit.Result), on made-up deliveries: what is a silent loss, an announced
one, a duplicate, an event out of order."""

from faultkit import Result, only


def result(acked, arrivals, announcements=()):
    return Result("c", set(acked), list(arrivals), list(announcements), [])


def test_everything_delivered_once_in_order():
    r = result(range(1, 6), [1, 2, 3, 4, 5])
    assert (r.delivered, r.silent, r.announced, r.duplicates, r.out_of_order) == (5, [], [], 0, 0)


def test_a_missing_event_is_silent_unless_inside_an_announced_gap():
    assert result(range(1, 7), [1, 2, 5, 6]).silent == [3, 4]
    # told of a gap after 2 arrived and before 5 did: 3 and 4 are announced
    r = result(range(1, 7), [1, 2, 5, 6], [(2, "recovered: false")])
    assert (r.silent, r.announced) == ([], [3, 4])
    # a gap announced elsewhere does not cover them
    r = result(range(1, 9), [1, 2, 5, 6, 8], [(4, "recovered: false")])
    assert (r.silent, r.announced) == ([3, 4], [7])


def test_unacknowledged_events_are_not_promised():
    r = result([1, 2, 4], [1, 2])
    assert r.silent == [4] and r.acknowledged == 3 and r.delivered == 2


def test_duplicates_and_order():
    r = result(range(1, 6), [1, 2, 3, 2, 3, 4, 5])
    assert (r.duplicates, r.out_of_order, r.silent) == (2, 0, [])
    r = result(range(1, 5), [1, 3, 2, 4])
    assert (r.duplicates, r.out_of_order) == (0, 1)


def test_an_unacknowledged_event_delivered_late_is_not_out_of_order():
    r = result([1, 2, 4], [1, 2, 4, 3])
    assert (r.out_of_order, r.unacknowledged_delivered, r.silent) == (0, [3], [])


def test_an_unacknowledged_event_delivered_early_does_not_make_later_ones_out_of_order():
    # 2's publish failed, yet it came before 1: among the acknowledged events 1, 3, 4 the order holds
    r = result([1, 3, 4], [2, 1, 3, 4])
    assert (r.out_of_order, r.unacknowledged_delivered) == (0, [2])


def test_one_publishers_events_are_counted_as_if_it_were_alone():
    # Two publishers' events interleaved, an announcement after 2 and 1000002: each is counted on its own.
    arrivals = [1, 1000001, 2, 1000002, 5, 1000003]
    announcements = [(4, "recovered: false")]
    mine, told = only(arrivals, announcements, lambda n: n < 1000000)
    assert (mine, told) == ([1, 2, 5], [(2, "recovered: false")])
    r = Result("a", {1, 2, 3, 4, 5}, mine, told, [])
    assert (r.silent, r.announced, r.out_of_order) == ([], [3, 4], 0)
    theirs, told = only(arrivals, announcements, lambda n: n >= 1000000)
    r = Result("b", {1000001, 1000002, 1000003}, theirs, told, [])
    assert (r.delivered, r.silent, r.out_of_order) == (3, [], 0)
