"""Socket activation: the test opens the listening socket, passes it as fd 3 with LISTEN_FDS=1 and LISTEN_PID
(through activate.py, which execs the broker so the pid is right), and the broker serves on it. Connections
made while no broker runs wait in the socket's backlog and are served by the next one."""

import json
import os
import signal
import socket

import pytest
import requests

from opshelp import HERE, Process, NotifySocket, free_port, handshake, wait_until

pytestmark = pytest.mark.timeout(120)
LAUNCHER = os.path.join(HERE, "activate.py")


def listening_socket():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    s.set_inheritable(True)
    return s


def activated(sockets, names=None, listen_pid=None, notify=None, extra=()):
    """A broker launched as systemd would: the sockets become fds 3, 4, …; its own --port is a free port
    nobody connects to, to show it is not used."""
    env = {"PUBSUB_TEST_FDS": ",".join(str(s.fileno()) for s in sockets)}
    if names:
        env["PUBSUB_TEST_FDNAMES"] = ":".join(names)
    if listen_pid:
        env["PUBSUB_TEST_LISTEN_PID"] = str(listen_pid)
    if notify:
        env["NOTIFY_SOCKET"] = notify.path
    own_port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(own_port), "--timeout", "5"] + list(extra)
    return Process(args, env=env, launcher=LAUNCHER, pass_fds=[s.fileno() for s in sockets]), own_port


def raw_handshake_request(port):
    body = json.dumps([{"channel": "/meta/handshake", "version": "1.0",
                        "supportedConnectionTypes": ["long-polling"]}]).encode()
    return (f"POST /faye HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def read_response(conn, timeout):
    conn.settimeout(timeout)
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


def port_accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_broker_serves_on_the_inherited_socket():
    sock = listening_socket()
    port = sock.getsockname()[1]
    notify = NotifySocket()
    server, own_port = activated([sock], names=["pubsub"], notify=notify)
    try:
        notify.wait_for("READY", "1", timeout=30)
        cid = handshake(f"http://127.0.0.1:{port}/faye")
        assert len(cid) == 15
        # The broker did not bind --port: it served on what it was given.
        assert not port_accepts(own_port)
        assert "serving on sockets passed by systemd" in server.log()
    finally:
        assert server.stop() == 0, server.log()
        notify.close()
        sock.close()


def test_a_connection_made_between_two_brokers_is_served_by_the_second():
    """A restart never refuses a connection: the socket outlives the process."""
    sock = listening_socket()
    port = sock.getsockname()[1]
    first, _ = activated([sock])
    wait_until(lambda: "serving on sockets passed by systemd" in first.log(), 30, message="first broker up")
    handshake(f"http://127.0.0.1:{port}/faye")
    assert first.stop() == 0, first.log()

    # Nobody runs now; the kernel still completes the TCP handshake and queues the request (made and sent before
    # the second broker starts: nothing to wait for).
    waiting = socket.create_connection(("127.0.0.1", port), timeout=5)
    waiting.sendall(raw_handshake_request(port))

    second, _ = activated([sock])
    try:
        response = read_response(waiting, timeout=30)
        head, _, body = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), response[:300]
        assert json.loads(body)[0]["successful"] is True
    finally:
        waiting.close()
        assert second.stop() == 0, second.log()
        sock.close()


def test_a_socket_named_metrics_serves_the_metrics():
    main, metrics = listening_socket(), listening_socket()
    port, metrics_port = main.getsockname()[1], metrics.getsockname()[1]
    server, _ = activated([main, metrics], names=["pubsub", "metrics"])
    try:
        wait_until(lambda: "serving on sockets passed by systemd" in server.log(), 30, message="broker up")
        handshake(f"http://127.0.0.1:{port}/faye")
        r = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert r.status_code == 200 and "pubsub_sessions 1.0" in r.text, r.text[:500]
        # With a metrics listener, the broker port keeps /metrics to itself.
        assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 404
        assert requests.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=10).text == "ready\n"
    finally:
        assert server.stop() == 0, server.log()
        main.close()
        metrics.close()


def test_sockets_meant_for_another_process_are_left_alone():
    sock = listening_socket()
    server, own_port = activated([sock], listen_pid=1)
    try:
        wait_until(lambda: port_accepts(own_port), 30, message="broker on its own --port")
        handshake(f"http://127.0.0.1:{own_port}/faye")
        assert "systemd" not in server.log()
    finally:
        assert server.stop() == 0, server.log()
        sock.close()
