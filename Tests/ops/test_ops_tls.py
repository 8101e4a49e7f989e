"""HTTPS and WSS on the same port with a certificate made by openssl, and SIGHUP reloading it without
dropping connections."""

import json
import os
import signal
import shutil
import tempfile

import pytest
import requests
import websocket

from opshelp import (Broker, Process, der_of, free_port, make_certificate, metric, scrape, served_certificate,
                     wait_until)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def certs():
    directory = tempfile.mkdtemp(prefix="pubsub-tls-")
    a = make_certificate(directory, "pubsub-test-a")
    b = make_certificate(directory, "pubsub-test-b")
    served = (os.path.join(directory, "served.crt"), os.path.join(directory, "served.key"))
    shutil.copy(a[0], served[0])
    shutil.copy(a[1], served[1])
    both = os.path.join(directory, "both.crt")
    with open(both, "w") as out:
        for path in (a[0], b[0]):
            with open(path) as f:
                out.write(f.read())
    yield {"dir": directory, "a": a, "b": b, "served": served, "both": both}
    shutil.rmtree(directory, ignore_errors=True)


def install(source, target):
    """Replace a served file the way a renewal does: write beside it, then rename over it."""
    temporary = target + ".new"
    shutil.copy(source, temporary)
    os.replace(temporary, target)


def tls_broker(certs):
    cert, key = certs["served"]
    return Broker(timeout=5, extra_args=["--tls-cert", cert, "--tls-key", key])


def wss(b, ca):
    ws = websocket.create_connection(f"wss://127.0.0.1:{b.port}/faye", timeout=10, sslopt={"ca_certs": ca})
    ws.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["websocket"]}]))
    cid = json.loads(ws.recv())[0]["clientId"]
    ws.send(json.dumps([{"channel": "/meta/connect", "clientId": cid, "connectionType": "websocket"}]))
    assert json.loads(ws.recv())[0]["successful"] is True
    return ws, cid


def test_https_and_wss_on_one_port(certs):
    with tls_broker(certs) as b:
        url = f"https://127.0.0.1:{b.port}/faye"
        ca = certs["a"][0]
        reply = requests.post(url, json=[{"channel": "/meta/handshake", "version": "1.0",
                                          "supportedConnectionTypes": ["long-polling"]}], verify=ca, timeout=10).json()
        assert reply[0]["successful"] is True
        ws, cid = wss(b, ca)
        ws.send(json.dumps([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/t"}]))
        assert json.loads(ws.recv())[0]["successful"] is True
        r = requests.post(url, json=[{"channel": "/t", "data": {"over": "https"}}], verify=ca, timeout=10)
        assert r.json()[0]["successful"] is True
        ws.settimeout(5)
        event = json.loads(ws.recv())
        assert event[0]["channel"] == "/t" and event[0]["data"] == {"over": "https"}, event
        assert requests.get(f"https://127.0.0.1:{b.port}/healthz", verify=ca, timeout=10).text == "ok\n"
        ws.close()
        # Plain HTTP on the TLS port is not served.
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://127.0.0.1:{b.port}/healthz", timeout=5)
        samples = scrape(f"https://127.0.0.1:{b.port}/metrics", verify=ca)
        assert metric(samples, "pubsub_tls_certificate_not_after_seconds") > 1_000_000_000
        assert "listening on https://" in b.log()


def test_sighup_reloads_the_certificate_without_dropping_connections(certs):
    with tls_broker(certs) as b:
        assert served_certificate(b.port) == der_of(certs["a"][0])
        # Connections opened before the reload: a WebSocket with a subscription, and a keep-alive HTTPS session.
        ws, cid = wss(b, certs["a"][0])
        ws.send(json.dumps([{"channel": "/meta/subscribe", "clientId": cid, "subscription": "/renewal"}]))
        assert json.loads(ws.recv())[0]["successful"] is True
        session = requests.Session()
        session.trust_env = False  # REQUESTS_CA_BUNDLE would override session.verify
        session.verify = certs["a"][0]
        url = f"https://127.0.0.1:{b.port}/faye"
        assert session.get(f"https://127.0.0.1:{b.port}/healthz", timeout=10).status_code == 200

        install(certs["b"][0], certs["served"][0])
        install(certs["b"][1], certs["served"][1])
        b._proc.send_signal(signal.SIGHUP)
        wait_until(lambda: served_certificate(b.port) == der_of(certs["b"][0]), 10,
                   message="new connections get certificate B")
        assert "TLS certificate reloaded" in b.log()

        # Both old connections still work: the session publishes over its connection, the WebSocket receives.
        r = session.post(url, json=[{"channel": "/renewal", "data": {"n": 1}}], timeout=10)
        assert r.json()[0]["successful"] is True
        ws.settimeout(5)
        event = json.loads(ws.recv())
        assert event[0]["channel"] == "/renewal" and event[0]["data"] == {"n": 1}, event
        assert b.alive()
        # A new client trusting only B gets through.
        r = requests.get(f"https://127.0.0.1:{b.port}/readyz", verify=certs["b"][0], timeout=10)
        assert r.status_code == 200
        samples = scrape(f"https://127.0.0.1:{b.port}/metrics", verify=certs["both"])
        assert metric(samples, "pubsub_tls_reloads_total", result="ok") == 1.0
        ws.close()
        session.close()


def test_a_failed_reload_keeps_the_running_certificate(certs):
    with tls_broker(certs) as b:
        with open(certs["served"][0], "w") as f:
            f.write("not a certificate\n")
        b._proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "TLS certificate reload failed" in b.log(), 10, message="reload failure logged")
        assert b.alive()
        assert served_certificate(b.port) == der_of(certs["a"][0])
        samples = scrape(f"https://127.0.0.1:{b.port}/metrics", verify=certs["a"][0])
        assert metric(samples, "pubsub_tls_reloads_total", result="failed") == 1.0


def test_unusable_tls_files_stop_the_start_with_a_clear_message(certs):
    port = free_port()
    missing = os.path.join(certs["dir"], "missing.crt")
    server = Process(["--port", str(port), "--tls-cert", missing, "--tls-key", certs["a"][1]])
    assert server.wait(timeout=30) != 0
    server.stop()
    assert f"cannot use {missing} as the TLS certificate" in server.log(), server.log()
    # A key that does not belong to the certificate.
    server = Process(["--port", str(port), "--tls-cert", certs["a"][0], "--tls-key", certs["b"][1]])
    assert server.wait(timeout=30) != 0
    server.stop()
    assert "TLS" in server.log(), server.log()
    # Only one of the two.
    server = Process(["--port", str(port), "--tls-cert", certs["a"][0]])
    assert server.wait(timeout=30) != 0
    server.stop()
    assert "--tls-cert and --tls-key go together" in server.log(), server.log()
