"""`pubsub publish`, `subscribe` (long-polling and WebSocket) to a broker serving HTTPS/WSS with a certificate
made by openssl: trusted with --ca-file or PUBSUB_CA_FILE, refused without it, and checked against the host."""

import json
import shutil
import subprocess
import tempfile
import threading

import pytest

from clitools import SECRET, Broker, clean_env, pubsub_bin, run
from pubsubtest.tls import make_self_signed

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def tls():
    directory = tempfile.mkdtemp(prefix="pubsub-cli-tls-")
    cert, key = make_self_signed(directory, "pubsub-cli-test")
    other, other_key = make_self_signed(directory, "somebody-else", names=["elsewhere.example"])
    with Broker(secret=SECRET, extra_args=["--tls-cert", cert, "--tls-key", key]) as broker:
        yield {"broker": broker, "ca": cert, "other": other, "other_key": other_key, "port": broker.port}
    shutil.rmtree(directory, ignore_errors=True)


def subscribe_then_publish(tls, sub_url, pub_args, env=None):
    sub = subprocess.Popen([pubsub_bin(), "subscribe", "--url", sub_url, "--secret", SECRET, "--count", "1",
                            "--timeout", "20", "--ca-file", tls["ca"], "/tls/news"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    subscribed = threading.Event()
    err = []

    def read():
        for line in sub.stderr:
            err.append(line)
            if "subscribed to" in line:
                subscribed.set()
    threading.Thread(target=read, daemon=True).start()
    assert subscribed.wait(20), err
    published = run(["publish", "--secret", SECRET, *pub_args, "/tls/news", '{"over":"tls"}'], env=env)
    out, _ = sub.communicate(timeout=20)
    return published, sub.returncode, out, err


@pytest.mark.parametrize("scheme", ["https", "wss"])
def test_publish_and_subscribe_over_tls_with_a_trusted_certificate(tls, scheme):
    url = f"{scheme}://127.0.0.1:{tls['port']}/faye"
    published, code, out, err = subscribe_then_publish(
        tls, url, ["--url", f"https://localhost:{tls['port']}/faye", "--ca-file", tls["ca"]])
    assert published.returncode == 0, published.stderr
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"over": "tls"}


def test_pubsub_ca_file_from_the_environment(tls):
    published = run(["publish", "--url", f"https://127.0.0.1:{tls['port']}/faye", "--secret", SECRET, "/tls/env",
                     '"x"'], env=clean_env(PUBSUB_CA_FILE=tls["ca"]))
    assert published.returncode == 0, published.stderr


@pytest.mark.parametrize("args", [[], ["--ca-file", "OTHER"]])
def test_an_untrusted_certificate_is_refused_with_one_line(tls, args):
    args = [tls["other"] if a == "OTHER" else a for a in args]
    result = run(["publish", "--url", f"https://127.0.0.1:{tls['port']}/faye", "--secret", SECRET, *args,
                  "/tls/x", '"x"'])
    assert result.returncode == 69, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "CERTIFICATE_VERIFY_FAILED" in lines[0], result.stderr


def test_a_certificate_for_another_host_is_refused(tls):
    """A certificate that chains to a trusted root but names another host."""
    with Broker(secret=SECRET, extra_args=["--tls-cert", tls["other"], "--tls-key", tls["other_key"]]) as elsewhere:
        for scheme in ("https", "wss"):
            result = run(["subscribe", "--url", f"{scheme}://127.0.0.1:{elsewhere.port}/faye", "--secret", SECRET,
                          "--ca-file", tls["other"], "--timeout", "5", "/tls/x"])
            assert result.returncode == 69, result.stderr
            assert "failedToValidateHostname" in result.stderr, result.stderr


@pytest.mark.parametrize("scheme", ["https", "wss"])
def test_an_untrusted_certificate_is_refused_by_subscribe_too(tls, scheme):
    result = run(["subscribe", "--url", f"{scheme}://127.0.0.1:{tls['port']}/faye", "--secret", SECRET,
                  "--timeout", "5", "/tls/x"])
    assert result.returncode == 69 and "CERTIFICATE_VERIFY_FAILED" in result.stderr, result.stderr


def test_an_unreadable_ca_file_is_a_usage_error(tls):
    result = run(["publish", "--url", f"https://127.0.0.1:{tls['port']}/faye", "--ca-file", "/nonexistent.pem",
                  "/tls/x", '"x"'])
    assert result.returncode == 64 and "cannot set up TLS with /nonexistent.pem" in result.stderr, result.stderr
