"""A small Chrome DevTools Protocol client: headless Chromium from Debian, driven over websocket-client.

Every wait is bounded. Console output, page exceptions and network activity of each page are recorded, so a
failing test can show what the page saw.
"""

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request

import websocket

from .process import stop_group

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def chromium_path():
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return explicit
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """One headless Chromium process; `new_page()` opens a tab with its own DevTools connection."""

    START_TIMEOUT = 30.0

    def __init__(self, binary=None, width=1024, height=768):
        self.binary = binary or chromium_path()
        if not self.binary:
            raise RuntimeError("Chromium not found: apt-get install -y chromium (or set CHROMIUM)")
        self.profile = tempfile.mkdtemp(prefix="pubsub-chromium-")
        args = [
            self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
            "--disable-extensions", "--disable-sync", "--mute-audio", "--hide-scrollbars",
            "--disable-features=Translate,MediaRouter,OptimizationHints",
            f"--window-size={width},{height}", "--remote-debugging-port=0", "--remote-allow-origins=*",
            f"--user-data-dir={self.profile}", "about:blank",
        ]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.port = self._wait_port()
        self.pages = []

    def _wait_port(self):
        marker = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + self.START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Chromium exited with {self.proc.returncode} at start")
            try:
                with open(marker) as f:
                    first = f.readline().strip()
                if first:
                    return int(first)
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError("Chromium did not open its DevTools port in time")

    def _http(self, path, method="GET"):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read().decode())

    def new_page(self):
        target = self._http("/json/new?about:blank", method="PUT")
        page = Page(target["webSocketDebuggerUrl"], target["id"], self)
        self.pages.append(page)
        return page

    def close_target(self, target_id):
        try:
            self._http(f"/json/close/{target_id}")
        except Exception:
            pass

    def close(self):
        for page in list(self.pages):
            page.close()
        stop_group(self.proc, timeout=5)
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    """One tab. `evaluate` runs JavaScript; `wait_for` polls an expression until it is truthy."""

    def __init__(self, ws_url, target_id, browser):
        self.browser = browser
        self.target_id = target_id
        self.ws = websocket.create_connection(ws_url, timeout=10, suppress_origin=True)
        self.ids = itertools.count(1)
        self.lock = threading.Condition()
        self.results = {}
        self.console = []
        self.events = []
        self.closed = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable")

    def _read(self):
        while True:
            try:
                self.ws.settimeout(None)
                raw = self.ws.recv()
            except Exception:
                break
            if not raw:
                break
            msg = json.loads(raw)
            with self.lock:
                if "id" in msg:
                    self.results[msg["id"]] = msg
                else:
                    self._event(msg)
                self.lock.notify_all()
        with self.lock:
            self.closed = True
            self.lock.notify_all()

    def _event(self, msg):
        method, params = msg.get("method"), msg.get("params", {})
        self.events.append((method, params))
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append(f"console.{params.get('type')}: {text}")
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.console.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Log.entryAdded":
            e = params.get("entry", {})
            self.console.append(f"log.{e.get('level')}: {e.get('text')} {e.get('url', '')}")

    def send(self, method, params=None, timeout=15):
        mid = next(self.ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        with self.lock:
            while mid not in self.results:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closed:
                    raise CDPError(f"{method}: no answer in {timeout}s")
                self.lock.wait(remaining)
            msg = self.results.pop(mid)
        if "error" in msg:
            raise CDPError(f"{method}: {msg['error']}")
        return msg.get("result", {})

    def navigate(self, url, timeout=20):
        with self.lock:
            start = len(self.events)
        self.send("Page.navigate", {"url": url})
        deadline = time.monotonic() + timeout
        with self.lock:
            while not any(m == "Page.loadEventFired" for m, _ in self.events[start:]):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CDPError(f"{url} did not load in {timeout}s\n{self.dump()}")
                self.lock.wait(remaining)

    def evaluate(self, expression, await_promise=False, timeout=15):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": await_promise}, timeout=timeout)
        if "exceptionDetails" in result:
            d = result["exceptionDetails"]
            raise CDPError(f"{expression!r} threw: {d.get('exception', {}).get('description') or d.get('text')}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression, timeout=15, interval=0.1, what=None):
        """Polls `expression` until it is truthy; returns its value or fails with the page's console."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or expression}\n{self.dump()}")
            time.sleep(interval)

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", {"format": "png"}, timeout=30)["data"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def network(self, method):
        with self.lock:
            return [p for m, p in self.events if m == method]

    def requests(self):
        return [p["request"] for p in self.network("Network.requestWillBeSent")]

    def websockets(self):
        return [p["url"] for p in self.network("Network.webSocketCreated")]

    def dump(self):
        with self.lock:
            lines = list(self.console)
        return "page console:\n  " + "\n  ".join(lines[-40:]) if lines else "page console: (empty)"

    def close(self):
        if self in self.browser.pages:
            self.browser.pages.remove(self)
        try:
            self.ws.close()
        except Exception:
            pass
        self.browser.close_target(self.target_id)
