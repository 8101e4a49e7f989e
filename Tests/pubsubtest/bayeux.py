"""Bayeux over HTTP for the suites that do not compare replies byte for byte (the wire suites' `wirekit` does)."""

import json

import requests

HTTP_TIMEOUT = 10


def bayeux(target, messages, *, timeout=HTTP_TIMEOUT, headers=None, session=None, verify=True):
    """POSTs `messages` (Bayeux messages, or bytes or text sent as they are) to `target` (a Broker, or a URL),
    asserts HTTP 200 and returns the parsed replies. `session` reuses a requests.Session's connection; `verify`
    is requests' (a CA file for https)."""
    url = target if isinstance(target, str) else target.url
    data = messages if isinstance(messages, (bytes, str)) else json.dumps(messages)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    r = (session or requests).post(url, data=data, headers=h, timeout=timeout, verify=verify)
    if r.status_code != 200:
        log = "" if isinstance(target, str) else "\n" + target.log()[-2000:]
        raise AssertionError(f"HTTP {r.status_code} {r.text[:300]!r} from {url}{log}")
    return r.json()
