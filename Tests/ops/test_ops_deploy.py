"""The files of Deploy/: systemd units checked by systemd-analyze and by their keys, the environment file
against `pubsub serve --help`, the nginx example run for real in front of a broker, and the Dockerfile's keys
(no Docker engine runs here)."""

import configparser
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest
import requests
import websocket

from opshelp import REPO, Broker, free_port, handshake, make_certificate, pubsub_bin, subscribe, connect, wait_until

pytestmark = pytest.mark.timeout(120)
DEPLOY = os.path.join(REPO, "Deploy")
UNITS = ["pubsub.service", "pubsub.socket", "pubsub-metrics.socket", "pubsub-relay.service"]


def unit(name):
    """A unit file as {section: {key: [values]}} (keys repeat in systemd units)."""
    sections = {}
    current = None
    with open(os.path.join(DEPLOY, name)) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                current = sections.setdefault(line.strip("[]"), {})
                continue
            key, _, value = line.partition("=")
            current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value):
    m = re.fullmatch(r"(\d+)(s|min)?", value)
    assert m, value
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


def test_systemd_analyze_verify_finds_nothing_to_say():
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (the key checks below still run)")
    with tempfile.TemporaryDirectory() as directory:
        for name in UNITS:
            with open(os.path.join(DEPLOY, name)) as f:
                text = f.read().replace("/usr/local/bin/pubsub", pubsub_bin())
            with open(os.path.join(directory, name), "w") as f:
                f.write(text)
        paths = [os.path.join(directory, name) for name in UNITS]
        result = subprocess.run([tool, "verify", "--man=no"] + paths, capture_output=True, text=True, timeout=60,
                                cwd=directory)
        # verify exits 0 on unknown keys and bad values too: any output at all is a finding.
        assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr
        security = subprocess.run([tool, "security", "--offline=true", "--no-pager",
                                   os.path.join(directory, "pubsub.service")],
                                  capture_output=True, text=True, timeout=60, cwd=directory)
        m = re.search(r"Overall exposure level for pubsub.service: ([0-9.]+)", security.stdout + security.stderr)
        assert m, security.stdout + security.stderr
        assert float(m.group(1)) <= 2.0, security.stdout


def test_broker_unit_keys():
    u = unit("pubsub.service")
    service = u["Service"]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert service["ExecStart"][0].startswith("/usr/local/bin/pubsub serve")
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert seconds(service["WatchdogSec"][0]) >= 10
    # The stop timeout leaves room for the default 10 s drain.
    assert seconds(service["TimeoutStopSec"][0]) > 10
    assert service["KillSignal"] == ["SIGTERM"]
    assert int(service["LimitNOFILE"][0]) >= 65536
    for key, value in [("DynamicUser", "yes"), ("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                       ("ProtectHome", "yes"), ("PrivateTmp", "yes"), ("RestrictSUIDSGID", "yes")]:
        assert service[key] == [value], key
    assert service["CapabilityBoundingSet"] == [""]
    assert "pubsub.socket" in u["Unit"]["Requires"][0]
    assert u["Install"]["WantedBy"] == ["multi-user.target"]


def test_socket_units_keys():
    s = unit("pubsub.socket")["Socket"]
    assert s["ListenStream"] == ["127.0.0.1:9292"]
    assert s["Service"] == ["pubsub.service"]
    assert s["FileDescriptorName"] != ["metrics"]
    m = unit("pubsub-metrics.socket")["Socket"]
    assert m["FileDescriptorName"] == ["metrics"] and m["Service"] == ["pubsub.service"]


def test_relay_unit_keys():
    u = unit("pubsub-relay.service")
    service = u["Service"]
    exec_start = service["ExecStart"][0]
    assert exec_start.startswith("/usr/local/bin/pubsub relay postgres ")
    assert "--checkpoint %S/pubsub-relay/" in exec_start
    # Every flag the unit passes is one `pubsub relay postgres` takes.
    help_text = subprocess.run([pubsub_bin(), "relay", "postgres", "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    flags = re.findall(r"(--[a-z-]+)", exec_start)
    assert flags and all(flag in help_text for flag in flags), (flags, help_text)
    # The variables it expands come from relay.env or Environment=.
    with open(os.path.join(DEPLOY, "relay.env")) as f:
        defined = set(re.findall(r"^#?([A-Z_]+)=", f.read(), re.M))
    defined |= {e.split("=")[0] for e in service.get("Environment", [])}
    assert set(re.findall(r"\$\{([A-Z_]+)\}", exec_start)) <= defined
    assert service["StateDirectory"] == ["pubsub-relay"]
    for key, value in [("DynamicUser", "yes"), ("NoNewPrivileges", "yes"), ("ProtectSystem", "strict")]:
        assert service[key] == [value], key
    assert "pubsub.service" in u["Unit"]["After"][0]


def test_every_variable_of_the_env_file_is_a_serve_option():
    help_text = subprocess.run([pubsub_bin(), "serve", "--help"], capture_output=True, text=True, timeout=30).stdout
    with open(os.path.join(DEPLOY, "pubsub.env")) as f:
        names = set(re.findall(r"^#?(PUBSUB_[A-Z_]+)=", f.read(), re.M))
    assert len(names) > 20
    missing = [n for n in sorted(names) if n not in help_text]
    assert not missing, missing


def test_dockerfile_keys():
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = f.read()
    assert re.search(r"^FROM swift:\S+ AS build$", text, re.M)
    # libsystemd is loaded at run time: building needs no -dev package.
    assert "libsystemd-dev" not in text
    assert re.search(r"swift build -c release --product pubsub", text)
    assert re.search(r"^FROM debian:bookworm-slim$", text, re.M)
    assert re.search(r"^USER 65532:65532$", text, re.M)
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.M)
    assert re.search(r"^EXPOSE 9292", text, re.M)
    assert re.search(r'^ENTRYPOINT \["/usr/local/bin/pubsub", "serve"\]$', text, re.M)
    assert os.path.exists(os.path.join(DEPLOY, "Dockerfile.dockerignore"))


def test_readme_documents_every_file():
    with open(os.path.join(DEPLOY, "README.md")) as f:
        text = f.read()
    for name in os.listdir(DEPLOY):
        if name != "README.md":
            assert name in text, name
    assert "nginx/pubsub.conf" in text


@pytest.fixture
def nginx_in_front():
    """Deploy/nginx/pubsub.conf run by nginx on loopback, in front of a broker, with a test certificate."""
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx is None:
        pytest.skip("nginx not installed (scripts/install-test-deps installs nginx-light)")
    directory = tempfile.mkdtemp(prefix="pubsub-nginx-")
    cert, key = make_certificate(directory, "pubsub-nginx")
    broker = Broker(timeout=3, extra_args=["--publish-limit-per-ip", "2", "--publish-limit-window", "60",
                                           "--trust-forwarded-for"])
    broker.start()
    http_port, https_port = free_port(), free_port()
    with open(os.path.join(DEPLOY, "nginx", "pubsub.conf")) as f:
        site = f.read()
    site = (site.replace("127.0.0.1:9292", f"127.0.0.1:{broker.port}")
                .replace("listen 80;", f"listen 127.0.0.1:{http_port};")
                .replace("listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;")
                .replace("/etc/ssl/certs/pubsub.pem", cert)
                .replace("/etc/ssl/private/pubsub.key", key))
    site = "\n".join(line for line in site.split("\n") if "[::]" not in line)
    with open(os.path.join(directory, "site.conf"), "w") as f:
        f.write(site)
    main = f"""
daemon off;
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {directory}/body;
    proxy_temp_path {directory}/proxy;
    include {directory}/site.conf;
}}
"""
    with open(os.path.join(directory, "nginx.conf"), "w") as f:
        f.write(main)
    check = subprocess.run([nginx, "-t", "-c", os.path.join(directory, "nginx.conf")], capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([nginx, "-c", os.path.join(directory, "nginx.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    def up():
        try:
            socket.create_connection(("127.0.0.1", https_port), timeout=0.5).close()
            return True
        except OSError:
            return False
    try:
        wait_until(up, 10, message="nginx listening")
        yield {"https": f"https://127.0.0.1:{https_port}", "http_port": http_port, "cert": cert, "broker": broker}
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        broker.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_nginx_example_proxies_websocket_long_polling_and_client_addresses(nginx_in_front):
    base, cert = nginx_in_front["https"], nginx_in_front["cert"]
    url = base + "/faye"
    # Plain HTTP is redirected to HTTPS.
    r = requests.get(f"http://127.0.0.1:{nginx_in_front['http_port']}/faye", allow_redirects=False, timeout=10)
    assert r.status_code == 301
    # WebSocket upgrade through the proxy.
    ws = websocket.create_connection(url.replace("https", "wss"), timeout=10, sslopt={"ca_certs": cert})
    ws.send(json.dumps([{"channel": "/meta/handshake", "version": "1.0", "supportedConnectionTypes": ["websocket"]}]))
    wcid = json.loads(ws.recv())[0]["clientId"]
    ws.send(json.dumps([{"channel": "/meta/subscribe", "clientId": wcid, "subscription": "/p"}]))
    assert json.loads(ws.recv())[0]["successful"] is True
    ws.send(json.dumps([{"channel": "/meta/connect", "clientId": wcid, "connectionType": "websocket"}]))
    assert json.loads(ws.recv())[0]["successful"] is True
    # A long-poll held for the broker's whole timeout (3 s) comes back as the broker's answer, not a 504.
    cid = handshake(url, verify=cert)
    connect(url, cid, verify=cert)
    t0 = time.monotonic()
    reply = connect(url, cid, verify=cert, timeout=20)
    assert reply[0]["successful"] is True and 2.5 < time.monotonic() - t0 < 6
    # An event goes through unbuffered, and the broker's rate-limit headers come back through the proxy; the
    # per-IP budget follows X-Forwarded-For (the test's address as nginx saw it).
    r = requests.post(url, json=[{"channel": "/p", "data": {"via": "nginx"}}], verify=cert, timeout=10)
    assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "1"
    ws.settimeout(5)
    event = json.loads(ws.recv())
    assert event[0]["data"] == {"via": "nginx"}
    # /metrics stays inside; health goes through.
    assert requests.get(base + "/metrics", verify=cert, timeout=10).status_code == 404
    assert requests.get(base + "/readyz", verify=cert, timeout=10).text == "ready\n"
    ws.close()


def test_the_relay_configuration_example_is_valid():
    """Deploy/relay.json names one feed of every source; `relay run --check` reads it without connecting."""
    result = subprocess.run([pubsub_bin(), "relay", "run", "--check", os.path.join(DEPLOY, "relay.json")],
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    kinds = [line.split(": ", 1)[1].split(" ")[0] for line in result.stdout.strip().splitlines()]
    assert sorted(kinds) == ["blip", "couchdb", "postgres", "simperium"]
    with open(os.path.join(DEPLOY, "relay.json")) as f:
        checkpoints = [feed["checkpoint"] for feed in json.load(f)["feeds"]]
    # Every checkpoint lives in the relay unit's state directory, the only place it may write.
    assert all(path.startswith("/var/lib/pubsub-relay/") for path in checkpoints)
