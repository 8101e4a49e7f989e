"""The web app of the background-jobs example (standing in for your Rails, Django or Express app).

  GET  /                 the page
  POST /jobs             creates a job and returns its channel with a signature for this user only
  POST /jobs/<id>/start  starts worker.sh for it (the page calls this once it is subscribed)

Signatures are PrivatePub's: sha1(secret + channel + timestamp), timestamp in milliseconds. Without one the
broker refuses the subscription, so nobody can watch a job they were not given.
"""

import hashlib
import json
import os
import re
import secrets
import subprocess
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
SECRET = os.environ["PUBSUB_SECRET"]
BROKER_URL = os.environ.get("BROKER_URL", "http://localhost:9292/faye")
PORT = int(os.environ.get("PORT", "8000"))
JOBS = set()


def sign(channel):
    timestamp = int(time.time() * 1000)
    signature = hashlib.sha1(f"{SECRET}{channel}{timestamp}".encode()).hexdigest()
    return {"server": BROKER_URL, "channel": channel, "timestamp": timestamp, "signature": signature}


class App(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/":
            return self.reply(404, "text/plain", "not found")
        with open(os.path.join(HERE, "index.html"), encoding="utf-8") as f:
            self.reply(200, "text/html; charset=utf-8", f.read().replace("{{BROKER_URL}}", BROKER_URL))

    def do_POST(self):
        if self.path == "/jobs":
            job = secrets.token_hex(8)
            JOBS.add(job)
            return self.reply(200, "application/json", json.dumps({"job": job, **sign(f"/jobs/{job}")}))
        m = re.fullmatch(r"/jobs/([0-9a-f]{16})/start", self.path)
        if m and m.group(1) in JOBS:
            JOBS.discard(m.group(1))
            subprocess.Popen([os.path.join(HERE, "worker.sh"), m.group(1)], stdin=subprocess.DEVNULL)
            return self.reply(202, "application/json", "{}")
        self.reply(404, "text/plain", "not found")

    def reply(self, status, content_type, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", PORT), App)
    print(f"background-jobs: open http://localhost:{PORT}/ (broker {BROKER_URL})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
