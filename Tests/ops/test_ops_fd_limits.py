"""One process at its file descriptor ceiling: the soft RLIMIT_NOFILE raised to the hard one at start, a default
--max-connections derived from it, and, when every descriptor is in use all the same, no spinning accept loop:
clients over the ceiling get 503 (through a reserve descriptor) or a prompt close, the burst is logged and
counted, and service resumes as soon as descriptors free up. Each broker is held to a small limit with
setrlimit in the child (Process(nofile=...))."""

import os
import socket
import threading
import time

import pytest
import requests

from opshelp import Process, free_port, handshake, metric, scrape, wait_until

pytestmark = pytest.mark.timeout(120)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User plus system CPU time of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def open_descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def nofile_limits(pid):
    """(soft, hard) of 'Max open files' in /proc/PID/limits."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                parts = line.split()
                return int(parts[3]), int(parts[4])
    raise AssertionError("no 'Max open files' line")


def start(nofile, *args):
    port = free_port()
    p = Process(["--host", "127.0.0.1", "--port", str(port), "--threads", "2", *args], nofile=nofile)
    wait_until(lambda: "listening on" in p.log() or p.proc.poll() is not None, 30, message="broker listening")
    assert p.proc.poll() is None, p.log()
    return p, port


def request(port, path="/healthz", timeout=5):
    """One keep-alive HTTP request on a new socket: (socket, status, body) with the socket left open; status
    None when the server closed without answering."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        if not head:
            return s, None, b""
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = s.recv(4096)
            if not chunk:
                break
            body += chunk
        return s, int(head.split()[1]), body
    except ConnectionResetError:
        return s, None, b""


def fill_to_the_ceiling(port, limit):
    """Opens keep-alive connections answered 200 until one is answered 503 through the reserve descriptor
    (the ceiling); returns the held ones."""
    held = []
    for _ in range(limit):
        s, status, body = request(port)
        if status == 200:
            held.append(s)
            continue
        s.close()
        assert status == 503 and b"No file descriptor left" in body, (status, body)
        return held
    raise AssertionError(f"no ceiling after {limit} connections")


# ---------------------------------------------------------------- (e) raised soft limit, (a) derived default

def test_soft_limit_is_raised_to_the_hard_one_and_max_connections_derived_from_it():
    p, port = start((256, 1024))
    try:
        assert nofile_limits(p.pid) == (1024, 1024)
        log = p.log()
        assert "file descriptor limit: soft 1024 (raised from 256), hard 1024" in log, log
        assert "max connections: 960, from the descriptor limit 1024 less 64" in log, log
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
        assert metric(samples, "pubsub_file_descriptor_limit") == 1024
        assert metric(samples, "pubsub_max_connections") == 960
    finally:
        p.stop()


def test_small_limit_derives_a_small_max_connections_that_answers_503():
    p, port = start((128, 128))
    try:
        assert nofile_limits(p.pid) == (128, 128)
        log = p.log()
        assert "file descriptor limit: soft 128, hard 128" in log, log
        assert "max connections: 64, from the descriptor limit 128" in log, log
        held = []
        for _ in range(64):
            s, status, body = request(port)
            assert status == 200, (status, body, p.log())
            held.append(s)
        s, status, body = request(port)
        s.close()
        assert status == 503 and b"Too many connections (limit 64)" in body, (status, body)
        assert open_descriptors(p.pid) < 128
        for s in held:
            s.close()
        # The refusal is logged by the event loop after the 503 went out: give a loaded machine a moment.
        wait_until(lambda: "connections refused: --max-connections reached" in p.log(), timeout=10,
                   message="the refusal logged")
    finally:
        p.stop()


def test_explicit_max_connections_is_kept_and_warned_about_when_over_the_limit():
    p, _ = start((128, 128), "--max-connections", "500")
    try:
        assert "--max-connections 500 is more than the descriptor limit 128 allows (about 64" in p.log(), p.log()
    finally:
        p.stop()
    p, _ = start((1024, 1024), "--max-connections", "500")
    try:
        assert "max connections: 500 (--max-connections)" in p.log(), p.log()
        assert "more than the descriptor limit" not in p.log()
    finally:
        p.stop()


# ---------------------------------------------------------------- (b, c, d, f) at the ceiling

def test_at_the_descriptor_ceiling_no_spin_prompt_503_and_service_resumes():
    # --max-connections above what 64 descriptors hold: the ceiling itself is reached.
    p, port = start((64, 64), "--max-connections", "1000", "--header-timeout", "60", "--idle-timeout", "60")
    held = []
    try:
        held = fill_to_the_ceiling(port, 64)
        assert len(held) >= 20, len(held)
        wait_until(lambda: open_descriptors(p.pid) == 64, 5, message="every descriptor in use")
        wait_until(lambda: "accept failed: no file descriptor left" in p.log(), 5, message="burst logged")

        # (c) Clients over the ceiling that send a request are answered 503 at once, one after the other.
        answered = []
        started = time.monotonic()
        for _ in range(20):
            s, status, body = request(port)
            s.close()
            answered.append((status, body))
        took = time.monotonic() - started
        assert all(status == 503 and b"No file descriptor left" in body for status, body in answered), answered
        assert took < 5, took

        # A client that sends nothing is closed promptly (the header timeout of a shed connection is 1 s),
        # not left hanging for the broker's 60 s.
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        started = time.monotonic()
        assert silent.recv(100) == b""
        assert time.monotonic() - started < 5
        silent.close()

        # (b) Under a steady stream of new clients at the ceiling, the broker does not spin.
        stop = threading.Event()
        outcomes = []

        def pressure():
            while not stop.is_set():
                try:
                    s, status, _ = request(port, timeout=3)
                    s.close()
                    outcomes.append(status)
                except OSError as e:
                    outcomes.append(type(e).__name__)
                time.sleep(0.05)

        worker = threading.Thread(target=pressure, daemon=True)
        before = cpu_seconds(p.pid)
        worker.start()
        time.sleep(5)
        stop.set()
        worker.join(10)
        used = cpu_seconds(p.pid) - before
        assert used < 0.5, f"{used:.2f} s of CPU in 5 s at the ceiling"
        assert len(outcomes) >= 20 and set(outcomes) == {503}, outcomes

        # (d) Descriptors free up: a new client handshakes again.
        for s in held[:10]:
            s.close()
        held = held[10:]
        cid = wait_until(lambda: try_handshake(port), 10, interval=0.1, message="handshake after descriptors freed")
        assert cid

        # (f) The burst's end is logged once the failures stop, and everything was counted.
        wait_until(lambda: "accepting connections again" in p.log(), 10, message="end of the burst logged")
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
        assert metric(samples, "pubsub_accept_errors_total", error="EMFILE") >= 20
        assert metric(samples, "pubsub_connections_refused_total", reason="descriptors") >= 40
        assert metric(samples, "pubsub_connections_refused_total", reason="max_connections") == 0
        # Logged per burst, not per failure.
        log = p.log()
        assert 1 <= log.count("accept failed: no file descriptor left") <= 3, log
        assert "--max-connections 1000 is more than the descriptor limit 64 allows" in log
    finally:
        for s in held:
            s.close()
        p.stop()


def try_handshake(port):
    try:
        return handshake(f"http://127.0.0.1:{port}/faye", timeout=2)
    except (requests.RequestException, AssertionError):
        return None


def test_metrics_listener_at_the_ceiling_answers_503_too():
    metrics_port = free_port()
    p, port = start((64, 64), "--max-connections", "1000", "--header-timeout", "60", "--idle-timeout", "60",
                    "--metrics-port", str(metrics_port))
    held = []
    try:
        held = fill_to_the_ceiling(port, 64)
        s, status, body = request(metrics_port, path="/metrics")
        s.close()
        assert status == 503 and b"No file descriptor left" in body, (status, body)
        before = cpu_seconds(p.pid)
        time.sleep(2)
        assert cpu_seconds(p.pid) - before < 0.3
        for s in held[:5]:
            s.close()
        held = held[5:]
        wait_until(lambda: requests.get(f"http://127.0.0.1:{metrics_port}/healthz", timeout=2).status_code == 200,
                   10, interval=0.1, message="metrics port serves again")
    finally:
        for s in held:
            s.close()
        p.stop()
