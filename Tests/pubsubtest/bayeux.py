"""Bayeux over HTTP for the suites that do not compare replies byte for byte (the wire suites' `wirekit` does):
`bayeux()` POSTs any messages; `handshake`, `connect`, `subscribe` and `publish` send one message each;
`post_form` sends one as a PrivatePub back end does.

Each of the four takes, after its own arguments, the `id` and `ext` to put in its message, and passes any other
keyword (timeout, headers, session, verify) to `bayeux()`. `check` says whether the reply must be successful:
asserted by default for handshake, subscribe and publish, left to the test for connect (a held or refused connect
is what many tests look at)."""

import json
import urllib.parse

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


def post_form(target, message, **kw):
    """Sends one message as PrivatePub's publish_to does (a Rails back end): a form POST with one field,
    message=<JSON>. Returns the parsed replies (HTTP 200 asserted); keywords go to `bayeux()`."""
    body = "message=" + urllib.parse.quote(json.dumps(message))
    return bayeux(target, body, headers={"Content-Type": "application/x-www-form-urlencoded"}, **kw)


def _message(channel, fields, id, ext, **ext_fields):
    """{"channel": channel, **fields, "id": id, "ext": ext}: `ext` with the `ext_fields` that are not None,
    without the id or ext when there is none."""
    m = {"channel": channel, **fields}
    if id is not None:
        m["id"] = id
    e = dict(ext or {})
    e.update((k, v) for k, v in ext_fields.items() if v is not None)
    if e:
        m["ext"] = e
    return m


def _first(replies, check):
    """The first reply, asserted successful when `check`."""
    if check:
        assert replies[0]["successful"] is True, replies
    return replies[0]


def handshake(target, *, types=("long-polling",), id=None, ext=None, token=None, reply=False, check=True, **kw):
    """A /meta/handshake offering the connection `types`; `token` goes in ext.token (the JWT extension). Returns
    the clientId, or with reply=True the whole reply (for its error, or ext.position)."""
    replies = bayeux(target, [_message("/meta/handshake", {"version": "1.0", "supportedConnectionTypes": list(types)},
                                       id, ext, token=token)], **kw)
    answer = _first(replies, check)
    return answer if reply else answer["clientId"]


def connect(target, cid, *, advice_timeout=None, id=None, ext=None, split=False, check=False, **kw):
    """A long-polling /meta/connect, with advice.timeout (milliseconds; 0: answered at once) when given. Returns
    the replies as they came, or with split=True the pair (the /meta/connect reply, the other replies: the
    events). check=True asserts the first reply is the /meta/connect's, successful."""
    fields = {"clientId": cid, "connectionType": "long-polling"}
    if advice_timeout is not None:
        fields["advice"] = {"timeout": advice_timeout}
    replies = bayeux(target, [_message("/meta/connect", fields, id, ext)], **kw)
    if check:
        assert replies[0].get("channel") == "/meta/connect" and replies[0]["successful"] is True, replies
    if not split:
        return replies
    return ([r for r in replies if r.get("channel") == "/meta/connect"][0],
            [r for r in replies if r.get("channel") != "/meta/connect"])


def subscribe(target, cid, subscription, *, id=None, ext=None, token=None, resume=None, unsubscribe=False,
              check=True, **kw):
    """A /meta/subscribe to `subscription` (a channel, or a list), or with unsubscribe=True the /meta/unsubscribe
    from it; `token` goes in ext.token, `resume` in ext.resume (pubsub's position extension). Returns the reply."""
    channel = "/meta/unsubscribe" if unsubscribe else "/meta/subscribe"
    replies = bayeux(target, [_message(channel, {"clientId": cid, "subscription": subscription}, id, ext,
                                       token=token, resume=resume)], **kw)
    return _first(replies, check)


def publish(target, channel, data, *, cid=None, id=None, ext=None, check=True, **kw):
    """Publishes `data` on `channel`, as the client `cid` when given. Returns the reply."""
    fields = {"data": data}
    if cid:
        fields["clientId"] = cid
    replies = bayeux(target, [_message(channel, fields, id, ext)], **kw)
    return _first(replies, check)


def publish_all(target, channel, data, *, ext=None, **kw):
    """Publishes on `channel` each item of `data` (a list; anything else is one event) in one request, as a back
    end does (no clientId), with `ext` in each message when given. Asserts every reply successful; returns them."""
    items = data if isinstance(data, list) else [data]
    replies = bayeux(target, [_message(channel, {"data": d}, None, ext) for d in items], **kw)
    assert len(replies) == len(items) and all(r.get("successful") is True for r in replies), replies
    return replies
