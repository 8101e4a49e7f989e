"""Fixtures and helpers of the suites that drive a browser (browser, api): headless Chromium (Debian's
`chromium`), a page server on its own port (so pages are cross-origin to the broker), and screenshots.

Test modules import the fixtures they use from here (or through their folder's conftest.py).

Screenshots go to $PUBSUB_SCREENSHOTS or Tests/browser/screenshots/; each path is printed when it is taken.
"""

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .broker import REPO
from .cdp import Browser

SCREENSHOTS = os.environ.get("PUBSUB_SCREENSHOTS", os.path.join(REPO, "Tests", "browser", "screenshots"))

class PageServer:
    """Serves pages registered by the tests from http://127.0.0.1:<own port>/."""

    def __init__(self):
        self.pages = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?", 1)[0]
                if path not in pages:
                    self.send_error(404)
                    return
                content_type, body = pages[path]
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def add(self, path, body, content_type="text/html; charset=utf-8"):
        self.pages[path] = (content_type, body.encode("utf-8") if isinstance(body, str) else body)
        return self.origin + path

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="session")
def browser():
    b = Browser()
    yield b
    b.close()


@pytest.fixture
def page(browser):
    p = browser.new_page()
    yield p
    p.close()


@pytest.fixture(scope="session")
def page_server():
    s = PageServer()
    yield s
    s.close()


@pytest.fixture
def screenshot(request):
    """screenshot(page, name) saves a PNG under the screenshots folder, prints its path and returns it."""
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")

    def take(page, name):
        path = page.screenshot(os.path.join(SCREENSHOTS, f"{name}.png"))
        request.node.user_properties.append(("screenshot", path))
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"\nscreenshot: {path}")
        else:
            print(f"screenshot: {path}")
        return path

    return take
