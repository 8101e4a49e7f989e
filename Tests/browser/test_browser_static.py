"""The browser client as the broker serves it: URLs, caching headers, and that it is the source in client/."""

import importlib.machinery
import importlib.util
import os
import subprocess

import pytest
import requests

from pubsubtest.broker import REPO, Broker

TIMEOUT = 10


def load_embedder():
    path = os.path.join(REPO, "scripts", "embed-client")
    loader = importlib.machinery.SourceFileLoader("embed_client", path)
    spec = importlib.util.spec_from_loader("embed_client", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def broker(request):
    with Broker(timeout=5) as b:
        yield b


def expected_source():
    embed = load_embedder()
    with open(embed.SOURCE, encoding="utf-8") as f:
        return embed.served_text(f.read())


def test_generated_swift_file_matches_client_source():
    r = subprocess.run([os.path.join(REPO, "scripts", "embed-client"), "--check"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", ["/faye/client.js", "/faye.js"])
def test_client_served_with_validators(broker, path):
    base = broker.url[: -len("/faye")]
    r = requests.get(base + path, timeout=TIMEOUT)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert r.text == expected_source(), "the binary serves something else than client/client.js"
    etag, modified = r.headers["ETag"], r.headers["Last-Modified"]
    assert etag.startswith('"') and len(etag) == 42
    assert modified.endswith(" GMT")
    assert "Faye.Client = Client" in r.text

    r = requests.get(base + path, headers={"If-None-Match": etag}, timeout=TIMEOUT)
    assert r.status_code == 304 and r.content == b""
    assert r.headers["ETag"] == etag
    r = requests.get(base + path, headers={"If-None-Match": f'W/{etag}, "other"'}, timeout=TIMEOUT)
    assert r.status_code == 304
    r = requests.get(base + path, headers={"If-Modified-Since": modified}, timeout=TIMEOUT)
    assert r.status_code == 304
    r = requests.get(base + path, headers={"If-Modified-Since": "Sat, 01 Jan 2000 00:00:00 GMT"}, timeout=TIMEOUT)
    assert r.status_code == 200 and r.text == expected_source()
    r = requests.get(base + path, headers={"If-None-Match": '"stale"', "If-Modified-Since": modified},
                     timeout=TIMEOUT)
    assert r.status_code == 200, "If-None-Match decides when both are sent"


def test_other_static_names(broker):
    base = broker.url[: -len("/faye")]
    assert requests.get(base + "/faye/faye-browser-min.js", timeout=TIMEOUT).text == expected_source()
    r = requests.get(base + "/faye/nope.js", timeout=TIMEOUT)
    assert r.status_code == 404
    assert requests.get(base + "/faye.map", timeout=TIMEOUT).status_code == 404
    r = requests.post(base + "/faye/client.js", data="x", timeout=TIMEOUT)
    assert r.status_code == 405 and r.headers["Allow"] == "GET, HEAD"
    r = requests.head(base + "/faye/client.js", timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["ETag"]


def test_static_files_keep_the_bayeux_endpoint_working(broker):
    r = requests.post(broker.url, json=[{"channel": "/meta/handshake", "version": "1.0",
                                         "supportedConnectionTypes": ["long-polling"]}], timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()[0]["successful"] is True
