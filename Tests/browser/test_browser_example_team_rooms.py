"""Examples/team-rooms in Chromium: JWT at login, rooms through the app's hook, a refused room delivers nothing."""

from pubsubtest.ports import free_port
from test_browser_examples import run_example  # noqa: F401  (a fixture)

ROOM_STATE = "document.querySelector('#{room} .state').textContent"


def test_team_rooms(browser, run_example, screenshot):
    port, broker_port = free_port(), free_port()
    example = run_example("team-rooms", [broker_port, port], PORT=port, BROKER_PORT=broker_port)
    alice, bob = browser.new_page(), browser.new_page()
    try:
        alice.navigate(f"http://127.0.0.1:{port}/?user=alice")
        bob.navigate(f"http://127.0.0.1:{port}/?user=bob")
        for p in (alice, bob):
            p.wait_for("document.getElementById('status').textContent === 'connected'", what=example.log())
            for room in ("inbox", "lobby"):
                p.wait_for(f"{ROOM_STATE.format(room=room)} === 'subscribed'", what=f"{room}\n{example.log()}")
        alice.wait_for(f"{ROOM_STATE.format(room='ops')} === 'subscribed'")
        bob.wait_for(f"{ROOM_STATE.format(room='ops')}.indexOf('refused') === 0")
        assert bob.evaluate(ROOM_STATE.format(room="ops")) == "refused: Not a member of ops"

        alice.evaluate("post('ops')")
        alice.wait_for("document.querySelectorAll('#ops li').length === 1", what="alice's post in ops")
        alice.evaluate("post('lobby')")
        for p in (alice, bob):
            p.wait_for("document.querySelectorAll('#lobby li').length === 1", what="alice's post in the lobby")
        assert bob.evaluate("document.querySelectorAll('#ops li').length") == 0
        assert alice.evaluate("document.getElementById('tokens').textContent") == "1"
        for name, p in (("alice", alice), ("bob", bob)):
            p.send("Page.bringToFront")  # a tab in the background is not painted
            screenshot(p, f"example-team-rooms-{name}")
    finally:
        alice.close()
        bob.close()
