"""Runs each folder of Examples/ with its own run.sh, drives its page in Chromium, and takes a screenshot."""

import os
import socket
import subprocess
import tempfile
import threading
import time

import pytest
import requests

from pubsubtest.broker import REPO, pubsub_bin
from pubsubtest.ports import free_port
from pubsubtest.process import stop_group

EXAMPLES = os.path.join(REPO, "Examples")
START_TIMEOUT = 60


class Example:
    """`Examples/<name>/run.sh` in its own process group, stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, name, ports, **env):
        self.name = name
        self.ports = ports
        self.output = []
        full_env = dict(os.environ, PUBSUB=pubsub_bin(), **{k: str(v) for k, v in env.items()})
        self.proc = subprocess.Popen([os.path.join(EXAMPLES, name, "run.sh")], env=full_env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        threading.Thread(target=self._drain, daemon=True).start()
        try:
            self._wait_ready()
        except Exception:
            self.stop()
            raise

    def _drain(self):
        for line in iter(self.proc.stdout.readline, b""):
            self.output.append(line.decode("utf-8", "replace"))

    def log(self):
        return "".join(self.output[-60:])

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        pending = list(self.ports)
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}/run.sh exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}/run.sh: ports {pending} not open in {START_TIMEOUT}s:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", pending[0]), timeout=0.5):
                    pending.pop(0)
            except OSError:
                time.sleep(0.1)

    def stop(self):
        stop_group(self.proc, timeout=20)


@pytest.fixture
def run_example():
    started = []

    def start(name, ports, **env):
        example = Example(name, ports, **env)
        started.append(example)
        return example

    yield start
    for example in started:
        example.stop()


def test_background_jobs(page, run_example, screenshot):
    port, broker_port = free_port(), free_port()
    example = run_example("background-jobs", [broker_port, port], PORT=port, BROKER_PORT=broker_port,
                          STEP_SECONDS="0.25")
    page.navigate(f"http://127.0.0.1:{port}/")
    page.wait_for("document.getElementById('status').textContent === 'connected'", what="the page connected")
    page.evaluate("document.getElementById('start').click()")
    page.wait_for("document.querySelector('.job.done .result') && "
                  "document.querySelector('.job.done .result').textContent", timeout=20,
                  what=f"the job to finish\n{example.log()}")
    result = page.evaluate("document.querySelector('.job.done .result').textContent")
    assert " orders, report at /reports/" in result
    assert page.evaluate("document.querySelector('.job.done .bar div').style.width") == "100%"

    page.evaluate("document.getElementById('spy').click()")
    refused = page.wait_for("document.querySelector('#spy-result.refused') && "
                            "document.querySelector('#spy-result.refused').textContent", what="the refusal")
    assert refused.endswith("Incorrect signature.")

    # A second job, caught half way, for the picture.
    page.evaluate("document.getElementById('start').click()")
    page.wait_for("document.querySelectorAll('.job').length === 2 && "
                  "parseInt(document.querySelector('.job .bar div').style.width) >= 40", timeout=20)
    screenshot(page, "example-background-jobs")


def test_sync_notifications(page, run_example, screenshot):
    port, broker_port = free_port(), free_port()
    changes = 12
    example = run_example("sync-notifications", [broker_port, port], PORT=port, BROKER_PORT=broker_port,
                          EVERY="0.25", CHANGES=changes)
    page.navigate(f"http://127.0.0.1:{port}/")
    page.wait_for("document.body.dataset.ready === 'true'", what=f"the first rows\n{example.log()}")
    page.wait_for(f"Number(document.getElementById('changes').textContent) >= {changes}", timeout=30,
                  what=f"{changes} changes\n{example.log()}")
    time.sleep(0.5)
    rows = requests.get(f"http://127.0.0.1:{port}/orders", timeout=10).json()
    shown = page.evaluate("Array.prototype.map.call(document.querySelectorAll('#rows tr'), function (tr) {"
                          " return [Number(tr.dataset.id), tr.children[3].textContent]; })")
    assert shown == [[r["id"], r["status"]] for r in rows], "the table must equal the database after the changes"
    assert page.evaluate("document.getElementById('status').textContent") == "live"
    screenshot(page, "example-sync-notifications")


def test_privatepub_migration(page, run_example, screenshot):
    port, broker_port = free_port(), free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        f.write(f'test:\n  server: "http://127.0.0.1:{broker_port}/faye"\n  secret_token: "s3cret"\n'
                f"  signature_expiration: 3600\n")
        config = f.name
    try:
        example = run_example("privatepub-migration", [broker_port, port], PORT=port, RAILS_ENV="test",
                              PRIVATE_PUB_CONFIG=config)
        page.navigate(f"http://127.0.0.1:{port}/")
        for channel in ("/messages/new", "/notices"):
            page.wait_for(f"!!PrivatePub.subscription('{channel}')", what=f"{channel}\n{example.log()}")
            outcome = page.evaluate(f"PrivatePub.subscription('{channel}').then(function () {{ return 'ok'; }},"
                                    " function (e) { return String(e); })", await_promise=True)
            assert outcome == "ok", outcome
        for text in ("Hello from the first browser", "PrivatePub pages work unchanged"):
            page.evaluate(f"var f = document.getElementById('new_message'); f.elements.body.value = {text!r};"
                          " f.requestSubmit();")
            page.wait_for(f"Array.prototype.some.call(document.querySelectorAll('#chat li'),"
                          f" function (li) {{ return li.textContent === {text!r}; }})", what=text)
        page.wait_for("document.getElementById('notices').textContent.indexOf('2 message(s)') === 0")
        screenshot(page, "example-privatepub-migration")
    finally:
        os.unlink(config)
