#!/usr/bin/env python3
"""Memory per long-poll connect over Redis Cluster shards, for several broker binaries in one session: one real
3-master Redis Cluster, then for each run a broker (`--engine redis --redis-cluster … --redis-shards N`) with
`--clients` long-polling clients, each on a channel of its own first segment (so spread over every shard), each
`/meta/connect` parked and woken by a publish; the broker's heap in use (its /metrics) and VmRSS after `--warmup`
connects and after `--connects` more, and its descriptors before the clients and after they disconnected. Prints
a Markdown table (a binary without the heap gauge gets "—" for the heap).

    python3 Tests/soak/measure_shards.py --run before=/tmp/pubsub-before-leakfix:3 \\
        --run after=/tmp/pubsub-after-leakfix:3 --run after=/tmp/pubsub-after-leakfix:1

Not collected by pytest (no test_ prefix). The figures are in docs/BENCHMARKS-cluster.md.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
# soakkit and the test support package (Tests/pubsubtest) are found on PYTHONPATH, as pytest.ini's `pythonpath`
# gives Tests/ to pytest: run again with both folders on it.
if not {TESTS, HERE} <= set(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, HERE, os.environ.get("PYTHONPATH")]))
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]])

from soakkit import Backends, soak  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=BINARY:SHARDS",
                        help="a broker binary and its --redis-shards (1 or 3); repeatable, run in this order")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--connects", type=int, default=10000)
    parser.add_argument("--transport", default="long-polling")
    parser.add_argument("--session-connects", type=int, default=10**9,
                        help="connects per session before a client starts a new one (default: one session each)")
    a = parser.parse_args()
    rows = []
    started = time.monotonic()
    with Backends() as backends:
        for run in a.run:
            label, _, rest = run.partition("=")
            binary, _, shards = rest.rpartition(":")
            r = soak(backends, f"cluster-{shards}", a.transport, clients=a.clients, warmup=a.warmup,
                     connects=a.connects, session_connects=a.session_connects, binary=binary,
                     progress=lambda m: print(m, file=sys.stderr, flush=True))
            print(r.describe(), file=sys.stderr, flush=True)
            print("  heap less acknowledged positions after warm-up, KiB by connects:", r.heap_curve(),
                  file=sys.stderr, flush=True)
            print("  RSS after warm-up +KiB by connects:", r.curve(), file=sys.stderr, flush=True)
            rows.append((label, binary, shards, r))
    sessions = "one session each" if a.session_connects >= 10**9 else f"a new session every {a.session_connects}"
    print(f"\n{a.clients} {a.transport} clients ({sessions}), {a.warmup} warm-up connects, then {a.connects} "
          f"measured; {time.monotonic() - started:.0f} s in all\n")
    print("| broker | --redis-shards | heap bytes per connect (slope, less acknowledged positions; those) "
          "| RSS after warm-up → end (MiB) | RSS bytes per connect (end − warm-up; slope) "
          "| connects/s | fds before clients → with them → after they left |")
    print("|---|---|---|---|---|---|---|")
    for label, binary, shards, r in rows:
        heap = "—" if r.heap_slope is None else f"**{r.heap_slope:,.1f}**; {r.positions_slope:,.1f}"
        print(f"| {label} (`{binary}`) | {shards} | {heap} | {r.rss_warm / 2**20:.1f} → {r.rss_end / 2**20:.1f} "
              f"| {r.bytes_per_connect:,.0f}; {r.slope:,.0f} | {r.measured / r.seconds:.0f} "
              f"| {r.fds_baseline} → {r.fds_busy} → {r.fds_after} |")


if __name__ == "__main__":
    main()
