"""The web app of the sync-notifications example: the page, and the rows as they are now (GET /orders)."""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
DATABASE_URL = os.environ["DATABASE_URL"]
BROKER_URL = os.environ.get("BROKER_URL", "http://localhost:9292/faye")
PORT = int(os.environ.get("PORT", "8001"))


class App(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/":
            with open(os.path.join(HERE, "index.html"), encoding="utf-8") as f:
                return self.reply("text/html; charset=utf-8", f.read().replace("{{BROKER_URL}}", BROKER_URL))
        if self.path == "/orders":
            with psycopg.connect(DATABASE_URL) as conn:
                rows = conn.execute("SELECT coalesce(json_agg(o ORDER BY id), '[]') FROM orders o").fetchone()[0]
            return self.reply("application/json", json.dumps(rows))
        self.send_error(404)

    def reply(self, content_type, body):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", PORT), App)
    print(f"sync-notifications: open http://localhost:{PORT}/ (broker {BROKER_URL})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
