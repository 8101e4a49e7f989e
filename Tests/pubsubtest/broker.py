"""Start a broker under test on a free loopback port.

The target is chosen by the PUBSUB_TARGET environment variable:
  pubsub (default)  the Swift server, $PUBSUB_BIN or <repo>/.build/debug/pubsub
  faye              real Faye 1.4.0 under puma (Debian packages ruby-faye and puma)
  centrifuge        a Centrifuge 0.15 node (scripts/centrifuge-node, built from Debian's Go packages), for the
                    benchmarks only: it speaks Centrifuge's protocol, not Bayeux
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading

from .ports import free_port
from .wait import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FAYE_TEMPLATE = os.path.join(REPO, "Tests", "wire", "faye", "config.ru.template")
CENTRIFUGE_SOURCE = os.path.join(REPO, "scripts", "centrifuge-node", "main.go")
# Debian's Centrifuge and the packages it imports, built in GOPATH mode (no module proxy).
CENTRIFUGE_PACKAGES = ("golang-go golang-github-centrifugal-centrifuge-dev golang-github-centrifugal-protocol-dev "
                       "golang-github-igm-sockjs-go-dev golang-github-mna-redisc-dev golang-github-fzambia-eagle-dev")


def target() -> str:
    return os.environ.get("PUBSUB_TARGET", "pubsub")


def pubsub_bin() -> str:
    return os.environ.get("PUBSUB_BIN", os.path.join(REPO, ".build", "debug", "pubsub"))


def centrifuge_bin() -> str:
    """$CENTRIFUGE_NODE_BIN, else the node built from scripts/centrifuge-node into .build-centrifuge/ (again when
    its source is newer)."""
    if os.environ.get("CENTRIFUGE_NODE_BIN"):
        return os.environ["CENTRIFUGE_NODE_BIN"]
    out = os.path.join(REPO, ".build-centrifuge")
    binary = os.path.join(out, "centrifuge-node")
    if os.path.exists(binary) and os.path.getmtime(binary) >= os.path.getmtime(CENTRIFUGE_SOURCE):
        return binary
    go = shutil.which("go")
    gopath = "/usr/share/gocode"
    if not go or not os.path.isdir(os.path.join(gopath, "src", "github.com", "centrifugal", "centrifuge")):
        raise RuntimeError(f"the Centrifuge node needs Go and Centrifuge: apt-get install -y {CENTRIFUGE_PACKAGES}")
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "GOPATH": gopath, "GO111MODULE": "off", "GOFLAGS": "",
           "GOCACHE": os.path.join(out, "cache")}
    done = subprocess.run([go, "build", "-o", binary, CENTRIFUGE_SOURCE], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"building the Centrifuge node failed (apt-get install -y {CENTRIFUGE_PACKAGES}):\n"
                           f"{done.stdout}")
    return binary


def _num(value) -> str:
    """Render a number for a command line or Ruby source: 2 -> "2", 1.5 -> "1.5"."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _ruby_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("#", "\\#") + '"'


class Broker:
    """Context manager running one server process; `with Broker(timeout=2) as b: ...`."""

    START_TIMEOUT = 30.0

    def __init__(self, *, timeout=45, interval=0, secret=None, signature_expiration=None,
                 extra_args=(), target=None, env=None):
        self.timeout = timeout
        self._added_env = dict(env or {})  # added to the environment the process is started with
        self.interval = interval
        self.secret = secret
        self.signature_expiration = signature_expiration
        self.extra_args = tuple(extra_args)
        self.target = target or globals()["target"]()
        self.port = 0
        self.url = ""
        self.ws_url = ""
        self._proc = None
        self._tmpdir = None
        self._out = []
        self._out_lock = threading.Lock()
        self._reader = None

    # -- lifecycle -------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def _command(self):
        if self.target == "pubsub":
            binary = pubsub_bin()
            if not os.path.exists(binary):
                raise RuntimeError(f"pubsub binary not found at {binary} (set PUBSUB_BIN)")
            cmd = [binary, "serve", "--host", "127.0.0.1", "--port", str(self.port),
                   "--timeout", _num(self.timeout), "--interval", _num(self.interval)]
            if self.secret is not None:
                cmd += ["--secret", self.secret]
            if self.signature_expiration is not None:
                cmd += ["--signature-expiration", _num(self.signature_expiration)]
            cmd += list(self.extra_args)
            return cmd, None
        if self.target == "faye":
            puma = shutil.which("puma")
            if not puma:
                raise RuntimeError("puma not found: apt-get install -y ruby-faye puma")
            self._tmpdir = tempfile.mkdtemp(prefix="faye-wire-")
            with open(FAYE_TEMPLATE) as f:
                source = f.read()
            source = (source
                      .replace("@@SECRET@@", "nil" if self.secret is None else _ruby_str(self.secret))
                      .replace("@@SIGNATURE_EXPIRATION@@",
                               "nil" if self.signature_expiration is None else _num(self.signature_expiration))
                      .replace("@@TIMEOUT@@", _num(self.timeout))
                      .replace("@@INTERVAL@@", _num(self.interval)))
            config = os.path.join(self._tmpdir, "config.ru")
            with open(config, "w") as f:
                f.write(source)
            cmd = [puma, "--bind", f"tcp://127.0.0.1:{self.port}", "--environment", "production",
                   "--threads", "4:16", config] + list(self.extra_args)
            return cmd, self._tmpdir
        if self.target == "centrifuge":
            return [centrifuge_bin(), "-port", str(self.port)] + list(self.extra_args), None
        raise ValueError(f"unknown target {self.target!r} (want 'pubsub', 'faye' or 'centrifuge')")

    def start(self, port=None):
        """Starts the server on a free port, or on `port` (restart() uses the one it had)."""
        last_error = None
        for _attempt in range(3):
            self.port = port or free_port()
            self.url = f"http://127.0.0.1:{self.port}/faye"
            self.ws_url = f"ws://127.0.0.1:{self.port}/faye"
            if self.target == "centrifuge":
                self.url = self.ws_url = f"ws://127.0.0.1:{self.port}/connection/websocket"
            cmd, cwd = self._command()
            self._out = []
            self._proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL,
                                          env={**os.environ, **self._added_env} if self._added_env else None,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          start_new_session=True)
            self._reader = threading.Thread(target=self._drain, args=(self._proc,), daemon=True)
            self._reader.start()
            try:
                self._wait_ready()
                return self
            except RuntimeError as e:
                last_error = e
                self.kill()
                if "exited" not in str(e):
                    break
        raise last_error

    def restart(self):
        """Stops the server and starts it again on the same port, as a real deployment restarts."""
        port = self.port
        self.stop()
        self.start(port=port)

    def _drain(self, proc):
        for line in iter(proc.stdout.readline, b""):
            with self._out_lock:
                self._out.append(line.decode("utf-8", "replace"))
        proc.stdout.close()

    def _wait_ready(self):
        state = wait_until(lambda: "exited" if self._proc.poll() is not None else self._accepts(),
                           self.START_TIMEOUT, raises=False)
        if state == "exited":
            self._reader.join(timeout=2)  # its last words read
            raise RuntimeError(f"server exited with {self._proc.returncode} before accepting:\n{self.log()}")
        if state:
            return
        raise RuntimeError(f"server did not accept TCP on port {self.port} within "
                           f"{self.START_TIMEOUT}s:\n{self.log()}")

    def _accepts(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    @property
    def pid(self):
        """The server's process id (puma's for Faye), or None before start."""
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self):
        return None if self._proc is None else self._proc.poll()

    def stop(self):
        """SIGTERM, wait, then SIGKILL if needed."""
        if not self._signal_and_wait(signal.SIGTERM):
            self.kill()
        self._cleanup()

    def kill(self):
        """SIGKILL."""
        self._signal_and_wait(signal.SIGKILL)
        self._cleanup()

    def _signal_and_wait(self, sig):
        """Sends `sig` to the server's process group, then waits 5 s at most; False if it is still running."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return True
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
            return True
        except subprocess.TimeoutExpired:
            return False

    def _cleanup(self):
        if self._reader is not None:
            self._reader.join(timeout=2)
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def log(self) -> str:
        """Captured stdout/stderr of the server so far."""
        with self._out_lock:
            return "".join(self._out)
