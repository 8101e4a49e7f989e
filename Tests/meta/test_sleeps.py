"""Every `time.sleep` left in the Python suites, listed with its reason.

A test waits for the thing it needs (pubsubtest.wait.wait_until, a helper's wait_for, an event), not for a guessed
time: a fixed sleep is either too short on a loaded machine (a flaky failure) or too long everywhere. The sleeps
that remain are the point of their test (a fault held for its length, a quiet check, a deadline of the broker's
that must pass, a measurement window, pacing), the poll interval of a wait with a deadline, or not yet replaced
(said so). A new `time.sleep` fails this test until it is listed here with its reason; one removed must be removed
from the list too, so that the list stays the truth.

The list is by file (relative to Tests/) and by the function (Class.method, outer.inner) that calls `time.sleep`,
one reason per call, in the order of the calls."""

import ast
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

POLL = "the poll interval of a wait for a condition with a deadline"
PACE = "pacing: the test's own load, sent at a rate"
FAULT = "a fault held on purpose for its length (an outage, a stall, a slow answer, a stopped process)"
QUIET = "a quiet check: nothing (more) arrives within this time"
CLOCK = "a deadline of the broker's must pass (session timeout, token expiry, rate window, refetch interval)"
MEASURE = "a measurement window (CPU or memory over a time), or the settling before a reading"
PARKED = ("a request sent in the background reaches the broker and is held: nothing tells the test so (the "
          "held long-polls gauge, pubsubtest.metrics.wait_held, does not count a request not yet whole; the wire "
          "suites also run against Faye)")
CLOSED = "a connection the test closed reaches the broker before the next step: nothing tells the test so"
UNREPLICATED = "sessions made after the replica stopped reach the old master before it is killed"
RELAY = "relay suites, not yet reviewed"

SLEEPS = {
    "auth/authkit.py": {
        "HookServer.answer": [
            FAULT,  # time.sleep(self.slow_seconds)
        ],
    },
    "auth/test_jwks.py": {
        "wait_past_unknown_kid_interval": [
            CLOCK,  # time.sleep(max(0.0, since + 11 - time.monotonic()))
        ],
    },
    "auth/test_jwt.py": {
        "test_expiry_mid_session_answers_connect_401_with_advice_handshake": [
            CLOCK,  # time.sleep(2.5)
        ],
    },
    "auth/test_jwt_faye_reconnect.py": {
        "test_faye_client_rehandshakes_with_a_fresh_token": [
            PACE,  # time.sleep(0.4)
        ],
    },
    "browser/test_browser_auth.py": {
        "test_a_page_from_another_origin_is_refused": [
            QUIET,  # time.sleep(1)
        ],
    },
    "browser/test_browser_client.py": {
        "test_resume_after_the_session_is_lost": [
            QUIET,  # time.sleep(0.5)
        ],
    },
    "browser/test_browser_examples.py": {
        "Example._wait_ready": [
            POLL,  # time.sleep(0.1)
        ],
    },
    "browser/test_browser_shards.py": {
        "test_wildcard_resumes_over_every_shard": [
            QUIET,  # time.sleep(0.5)
        ],
    },
    "cli/clitools.py": {
        "Listener.assert_quiet": [
            QUIET,  # time.sleep(seconds)
        ],
    },
    "cli/test_bench.py": {
        "test_workers_over_two_source_addresses": [
            POLL,  # time.sleep(0.2)
        ],
    },
    "cli/test_subscribe_positions.py": {
        "Publisher.run": [
            PACE,  # time.sleep(self.pause)
        ],
    },
    "cluster/cluster_helpers.py": {
        "Publisher.run": [
            PACE,  # time.sleep(0.005)
        ],
    },
    "cluster/test_cluster.py": {
        "test_long_polling_client_on_a_different_node_at_every_request": [
            PACE,  # time.sleep(0.02)
        ],
        "test_redis_restart_in_the_middle_of_a_publish_stream.publisher": [
            PACE,  # time.sleep(0.01)
        ],
        "test_redis_restart_in_the_middle_of_a_publish_stream": [
            FAULT,  # time.sleep(1.0)
        ],
        "test_resume_on_another_node_and_after_redis_lost_its_data": [
            FAULT,  # time.sleep(0.5)
        ],
    },
    "cluster/test_redis_cluster.py": {
        "migrate": [
            FAULT,  # time.sleep(pause)
        ],
    },
    "cluster/test_redis_shards.py": {
        "test_one_shards_master_killed_the_others_go_on": [
            FAULT,  # time.sleep(0.3)
        ],
    },
    "cluster/test_sentinel.py": {
        "test_master_killed_while_publishing_both_nodes_follow_the_failover": [
            UNREPLICATED,  # time.sleep(0.3)
        ],
    },
    "fault/faultkit.py": {
        "play_faults": [
            FAULT,  # time.sleep(seconds)
            FAULT,  # time.sleep(gap)
        ],
        "play": [
            FAULT,  # time.sleep(WARMUP)
            FAULT,  # time.sleep(tail)
        ],
    },
    "hostile/hostilekit.py": {
        "Guard.__init__": [
            MEASURE,  # time.sleep(0.2)
        ],
    },
    "hostile/measure.py": {
        "Run.__enter__": [
            MEASURE,  # time.sleep(0.3)
        ],
        "Run.settle": [
            POLL,  # time.sleep(0.2)
        ],
        "_attack_for": [
            FAULT,  # time.sleep(max(0.0, seconds - 10))
        ],
        "item2": [
            PARKED,  # time.sleep(0.5)
        ],
        "_count_open": [
            POLL,  # time.sleep(0.2)
        ],
        "item3": [
            PACE,  # time.sleep(0.25)
            FAULT,  # time.sleep(WAIT)
        ],
        "item7": [
            MEASURE,  # time.sleep(5)
        ],
    },
    "hostile/test_hostile_compression.py": {
        "test_a_decompression_bomb_is_closed_with_1009_and_costs_no_memory": [
            MEASURE,  # time.sleep(0.3)
            MEASURE,  # time.sleep(0.3)
            MEASURE,  # time.sleep(0.3)
        ],
    },
    "hostile/test_hostile_parked_memory.py": {
        "test_parked_long_polls_keep_no_request_memory": [
            MEASURE,  # time.sleep(0.5)
            MEASURE,  # time.sleep(1)
        ],
    },
    "hostile/test_hostile_timeouts.py": {
        "test_slowloris_header_trickle_is_closed_after_the_header_timeout": [
            PACE,  # time.sleep(0.2)
        ],
        "test_open_eventsource_is_not_cut": [
            QUIET,  # time.sleep(max(HEADER, IDLE, 2 * PING, SEND) + 1)
        ],
        "test_idle_websocket_that_answers_pings_is_not_cut": [
            QUIET,  # time.sleep(max(IDLE, 2 * PING, SEND) + 2)
        ],
        "test_websocket_across_a_held_connect_is_not_cut": [
            QUIET,  # time.sleep(HOLD + 1)
        ],
    },
    "meta/test_ports.py": {
        "_churn": [
            PACE,  # time.sleep(0.01)
        ],
    },
    "ops/test_ops_drain.py": {
        "test_stops_accepting_at_once_and_exits_within_the_drain_timeout_despite_a_stuck_client": [
            PARKED,  # time.sleep(0.2)
        ],
        "test_a_connect_that_completes_during_the_drain_is_answered_at_once": [
            PARKED,  # time.sleep(0.3)
        ],
    },
    "ops/test_ops_fd_limits.py": {
        "test_at_the_descriptor_ceiling_no_spin_prompt_503_and_service_resumes.pressure": [
            PACE,  # time.sleep(0.05)
        ],
        "test_at_the_descriptor_ceiling_no_spin_prompt_503_and_service_resumes": [
            MEASURE,  # time.sleep(5)
        ],
        "test_metrics_listener_at_the_ceiling_answers_503_too": [
            MEASURE,  # time.sleep(2)
        ],
    },
    "ops/test_ops_limits.py": {
        "test_per_ip_publish_limit_answers_429_with_headers_and_spares_other_addresses": [
            CLOCK,  # time.sleep(1.1)
        ],
    },
    "ops/test_ops_systemd.py": {
        "test_no_watchdog_pings_without_watchdog_usec_or_for_another_pid": [
            QUIET,  # time.sleep(1.5)
        ],
        "test_without_libsystemd_the_broker_serves_and_says_so_once": [
            QUIET,  # time.sleep(1)
        ],
    },
    "pubsubtest/cdp.py": {
        "Browser._wait_port": [
            POLL,  # time.sleep(0.05)
        ],
        "Page.wait_for": [
            POLL,  # time.sleep(interval)
        ],
    },
    "pubsubtest/wait.py": {
        "wait_until": [
            POLL,  # time.sleep(interval)
        ],
    },
    "relay/test_relay_blip.py": {
        "test_changes_arrive_as_events": [
            RELAY,  # time.sleep(0.5)
        ],
        "test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys": [
            RELAY,  # time.sleep(random.uniform(0, 0.03))
            RELAY,  # time.sleep(0.5)
        ],
    },
    "relay/test_relay_couchdb.py": {
        "test_changes_arrive_as_events": [
            RELAY,  # time.sleep(0.3)
            RELAY,  # time.sleep(0.1)
        ],
        "test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys.write": [
            RELAY,  # time.sleep(0.02)
        ],
        "test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys": [
            RELAY,  # time.sleep(0.5)
        ],
        "test_unknown_since_resyncs_loudly": [
            RELAY,  # time.sleep(0.5)
        ],
    },
    "relay/test_relay_file.py": {
        "test_serve_relay_publishes_in_process_and_counts_on_metrics": [
            RELAY,  # time.sleep(0.2)
        ],
        "test_serve_relay_counts_a_full_resync_on_metrics": [
            RELAY,  # time.sleep(0.2)
        ],
    },
    "relay/test_relay_pgoutput.py": {
        "writer_of.write": [
            PACE,  # time.sleep(pause)
        ],
    },
    "relay/test_relay_postgres.py": {
        "test_insert_update_delete_arrive_as_events": [
            RELAY,  # time.sleep(0.5)
            RELAY,  # time.sleep(0.1)
        ],
        "test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys.write": [
            RELAY,  # time.sleep(0.02)
        ],
        "test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys": [
            RELAY,  # time.sleep(random.uniform(0, 0.03))
            RELAY,  # time.sleep(0.5)
        ],
        "test_a_terminated_backend_reconnects_without_a_gap": [
            RELAY,  # time.sleep(0.3)
        ],
        "relay_until_caught_up": [
            RELAY,  # time.sleep(0.3)
        ],
        "test_a_lost_position_means_a_full_resync_then_live_changes": [
            RELAY,  # time.sleep(0.5)
        ],
    },
    "relay/test_relay_postgres_large.py": {
        "test_kill_9_inside_a_large_transaction_resumes_after_the_last_acknowledged_change": [
            RELAY,  # time.sleep(0.5)
        ],
    },
    "relay/test_relay_routes.py": {
        "test_each_user_gets_exactly_their_rows_on_both_transports_and_nobody_else_does": [
            RELAY,  # time.sleep(1.5)
        ],
        "test_null_owner_rows_are_counted_in_the_broker_metrics": [
            RELAY,  # time.sleep(1.5)
        ],
        "test_hostile_owner_values_land_on_exactly_their_escaped_channel": [
            RELAY,  # time.sleep(1.5)
        ],
        "test_a_client_resumes_its_routed_channel_from_its_last_position": [
            RELAY,  # time.sleep(0.5)
        ],
    },
    "relay/test_relay_routes_documents.py": {
        "test_each_user_hears_of_their_documents_only_across_a_move_a_restart_and_a_delete": [
            RELAY,  # time.sleep(0.5)
        ],
        "test_a_tombstone_goes_by_the_remembered_values_else_by_its_own_fields_else_nowhere": [
            RELAY,  # time.sleep(0.5)
        ],
        "test_simperium_user_route_puts_every_change_of_the_bucket_on_the_token_users_channel": [
            RELAY,  # time.sleep(0.3)
        ],
        "test_the_remembered_values_survive_a_kill_9": [
            RELAY,  # time.sleep(0.5)
        ],
    },
    "relay/test_relay_simperium.py": {
        "test_index_and_live_changes_arrive_as_events": [
            RELAY,  # time.sleep(0.3)
            RELAY,  # time.sleep(0.05)
        ],
        "test_kill_9_mid_stream_then_restart_delivers_every_change_with_stable_keys": [
            RELAY,  # time.sleep(random.uniform(0, 0.02))
            RELAY,  # time.sleep(0.5)
        ],
    },
    "relay/test_relay_tls.py": {
        "test_an_untrusted_certificate_is_reported_loudly_without_an_event_or_a_crash": [
            RELAY,  # time.sleep(1)
        ],
    },
    "webhooks/test_webhooks.py": {
        "test_webhook_events_selects_what_is_posted": [
            QUIET,  # time.sleep(1.5)
        ],
    },
    "webhooks/test_webhooks_cluster.py": {
        "test_two_nodes_post_each_event_once": [
            QUIET,  # time.sleep(1.5)
        ],
        "test_events_carry_the_user_on_every_node": [
            QUIET,  # time.sleep(1.5)
        ],
    },
    "wire/test_bad_input.py": {
        "test_websocket_abrupt_disconnects": [
            CLOSED,  # time.sleep(0.3)
        ],
    },
    "wire/test_conformance.py": {
        "test_22_session_expiry": [
            CLOCK,  # time.sleep(t * 2 - 1.0)
            CLOCK,  # time.sleep(t * 2 - 1.0)
            CLOCK,  # time.sleep(t * 2 + 1.5)
        ],
        "test_22b_subscribe_does_not_keep_a_session_alive": [
            PACE,  # time.sleep(0.5)
        ],
        "test_ws_events_pushed_one_per_frame_while_connect_held": [
            PARKED,  # time.sleep(0.3)
        ],
        "test_ws_close_does_not_destroy_client": [
            CLOSED,  # time.sleep(0.3)
        ],
        "test_a_poll_whose_client_went_away_keeps_the_next_event_for_the_next_poll": [
            PARKED,  # time.sleep(0.5)
            CLOSED,  # time.sleep(0.5)
        ],
    },
    "wire/test_privatepub_flows.py": {
        "RawSocket.assert_no_events": [
            QUIET,  # time.sleep(seconds)
        ],
        "test_ios_socketrocket_flow_receives_publish_to": [
            QUIET,  # time.sleep(0.6)
        ],
        "test_wildcard_with_its_own_signature_is_accepted": [
            QUIET,  # time.sleep(QUIET)
        ],
        "_refused_publish": [
            QUIET,  # time.sleep(0.3)
        ],
    },
    "wire/wirekit.py": {
        "wait_parked": [
            PARKED,  # time.sleep(seconds)
        ],
    },
}


def _sleeps(path):
    """{function: [line, ...]} of the `time.sleep` calls in one file, and the lines that import `sleep` itself."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found, imports = {}, []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name])
                continue
            if isinstance(child, ast.ImportFrom) and child.module == "time" and any(
                    a.name == "sleep" for a in child.names):
                imports.append(child.lineno)
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "sleep"
                    and isinstance(child.func.value, ast.Name) and child.func.value.id == "time"):
                found.setdefault(".".join(scope) or "<module>", []).append(child.lineno)
            visit(child, scope)

    visit(tree, [])
    return found, imports


def _scan():
    found, imports = {}, []
    for folder, dirs, files in os.walk(TESTS):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                calls, imported = _sleeps(path)
                rel = os.path.relpath(path, TESTS)
                if calls:
                    found[rel] = calls
                imports += [f"{rel}:{line}" for line in imported]
    return found, imports


def test_every_sleep_is_listed_with_its_reason():
    found, imports = _scan()
    assert not imports, f"`from time import sleep` hides sleeps from this list; use time.sleep: {imports}"
    unlisted, gone = [], []
    for rel in sorted(set(found) | set(SLEEPS)):
        calls, listed = found.get(rel, {}), SLEEPS.get(rel, {})
        for function in sorted(set(calls) | set(listed)):
            lines, reasons = calls.get(function, []), listed.get(function, [])
            unlisted += [f"{rel}:{line} in {function}" for line in lines[len(reasons):]]
            if len(reasons) > len(lines):
                gone.append(f"{rel} {function}: {len(reasons) - len(lines)} listed, not found")
    assert not unlisted, ("time.sleep calls not in the list of Tests/meta/test_sleeps.py: wait for the condition "
                          "with pubsubtest.wait.wait_until, or list the sleep with its reason:\n  "
                          + "\n  ".join(unlisted))
    assert not gone, "listed sleeps that are gone: remove them from the list:\n  " + "\n  ".join(gone)


def test_the_list_stays_small_outside_the_relay_suites():
    """The bound moves down only: a fixed sleep outside the relay suites is the exception."""
    outside = sum(len(r) for rel, fns in SLEEPS.items() if not rel.startswith("relay/") for r in fns.values())
    assert outside <= 70, f"{outside} sleeps listed outside Tests/relay"
    assert all(r for fns in SLEEPS.values() for rs in fns.values() for r in rs)
