"""The dashboard at /admin in headless Chromium: it asks for the key, its numbers follow clients as they come and
go, a channel's presence opens on a click, and its publish form reaches a subscriber. Screenshots (desktop and
phone width) go to $PUBSUB_SCREENSHOTS or Tests/browser/screenshots/."""

import json

import pytest

from apikit import APIBroker, api_handshake, api_subscribe, bayeux, parked_connect


def text_of(page, selector):
    return page.evaluate(f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent || ''")


def wait_total(page, n):
    page.wait_for(f"(document.querySelector('#clients-total b') || {{}}).textContent === '{n}'",
                  what=f"{n} clients on the page", timeout=15)


@pytest.fixture
def dashboard_broker():
    with APIBroker(timeout=10) as b:
        yield b


def test_dashboard_follows_clients_and_publishes(dashboard_broker, page, screenshot):  # noqa: F811
    b = dashboard_broker
    page.navigate(f"{b.base}/admin")
    assert page.evaluate("!document.getElementById('login').classList.contains('hidden')")
    # A wrong key is refused and the form stays.
    page.evaluate("document.getElementById('key').value = 'wrong-key-wrong-key';"
                  "document.getElementById('login-form').requestSubmit()")
    page.wait_for("document.getElementById('login-error').textContent.length > 0", what="the refusal")
    assert page.evaluate("document.getElementById('app').classList.contains('hidden')")
    page.evaluate(f"document.getElementById('key').value = {json.dumps(b.key)};"
                  "document.getElementById('login-form').requestSubmit()")
    wait_total(page, 0)
    assert b.key not in page.evaluate("document.documentElement.outerHTML")

    # Clients come: the numbers, transports and channels follow.
    ids = [api_handshake(b) for _ in range(3)]
    for cid in ids:
        api_subscribe(b, cid, "/dash/room")
    api_subscribe(b, ids[0], "/dash/quiet")
    wait_total(page, 3)
    page.wait_for("[...document.querySelectorAll('#channels tr')].some(r => r.textContent === '/dash/room3')",
                  what="/dash/room with 3 subscribers")
    assert "long-polling3" in text_of(page, "#transports")

    # Presence on a click.
    page.evaluate("[...document.querySelectorAll('#channels tr')].find(r => r.cells[0].textContent === '/dash/room').click()")
    page.wait_for("document.querySelectorAll('#presence tr').length === 3", what="presence of /dash/room")
    assert set(ids) <= set(page.evaluate("[...document.querySelectorAll('#presence tr')].map(r => r.cells[0].textContent)"))

    # The publish form reaches a subscriber (a parked long-poll).
    t, box = parked_connect(b, ids[1])
    page.evaluate("document.getElementById('pub-channel').value = '/dash/room';"
                  "document.getElementById('pub-data').value = '{\"text\": \"from the dashboard\"}';"
                  "document.getElementById('publish').requestSubmit()")
    t.join(10)
    events = [m for m in box[0] if m.get("channel") == "/dash/room"]
    assert events and events[0]["data"] == {"text": "from the dashboard"}
    page.wait_for("document.getElementById('pub-result').textContent.startsWith('published at ')", what="result")

    # The rates plot shows the publish; a bad publish lands in the errors list.
    page.wait_for("Math.max(...[...document.querySelectorAll('#plot polyline[data-series=publishes]')]"
                  ".flatMap(p => p.getAttribute('points').split(' ').map(x => 160 - parseFloat(x.split(',')[1])))) > 10",
                  what="a publish in the plot", timeout=10)
    page.evaluate("document.getElementById('pub-channel').value = '/dash/*';"
                  "document.getElementById('publish').requestSubmit()")
    page.wait_for("document.getElementById('errors').textContent.includes('invalid channel')", what="the error")

    # Clients go: the numbers follow.
    bayeux(b, [{"channel": "/meta/disconnect", "clientId": ids[2]}])
    b.ok("POST", "disconnect", json_body={"clientId": ids[0]})
    wait_total(page, 1)
    page.wait_for("[...document.querySelectorAll('#channels tr')].some(r => r.textContent === '/dash/room1')",
                  what="/dash/room with 1 subscriber")
    assert "/dash/quiet" not in text_of(page, "#channels")
    # A request the broker refuses shows among this node's errors.
    import requests
    requests.post(b.url, data="{not json", headers={"Content-Type": "application/json"}, timeout=5)
    page.wait_for("document.getElementById('server-errors').textContent.includes('bad request')",
                  what="the refused request")
    screenshot(page, "dashboard")

    # Readable on a phone: nothing wider than the screen.
    page.send("Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    page.wait_for("window.innerWidth === 390", what="the phone's viewport")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(page, "dashboard-phone")


def test_dashboard_uses_no_external_assets(dashboard_broker, page):  # noqa: F811
    b = dashboard_broker
    page.navigate(f"{b.base}/admin")
    page.evaluate(f"document.getElementById('key').value = {json.dumps(b.key)};"
                  "document.getElementById('login-form').requestSubmit()")
    wait_total(page, 0)
    urls = [r["url"] for r in page.requests()]
    assert urls and all(u.startswith(b.base + "/") for u in urls), urls
    assert {u.split("?")[0][len(b.base):] for u in urls} <= {"/admin", "/api/info", "/api/channels", "/api/rates",
                                                               "/api/errors"}
