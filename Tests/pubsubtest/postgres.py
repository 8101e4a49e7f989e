"""A throwaway PostgreSQL 15 cluster for the relay tests: initdb into a temporary folder with wal_level=logical,
listening on a free loopback port, run as the postgres system user when the tests run as root (initdb refuses
root). Always stopped afterwards (pg_ctl -m immediate), also when a test fails."""

import glob
import os
import shutil
import subprocess
import tempfile

from .ports import free_port
from .tls import make_authority


def pg_bin() -> str:
    explicit = os.environ.get("PGBIN")
    if explicit:
        return explicit
    for candidate in ["/usr/lib/postgresql/15/bin"] + sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(candidate, "initdb")):
            return candidate
    raise RuntimeError("PostgreSQL not found: apt-get install postgresql-15 postgresql-15-wal2json")


def has_wal2json(bindir: str) -> bool:
    libdir = subprocess.run([os.path.join(bindir, "pg_config"), "--pkglibdir"], capture_output=True,
                            text=True).stdout.strip() if os.path.exists(os.path.join(bindir, "pg_config")) else ""
    candidates = [os.path.join(libdir, "wal2json.so")] if libdir else []
    candidates.append(os.path.join(os.path.dirname(bindir), "lib", "wal2json.so"))
    return any(os.path.exists(c) for c in candidates)


def needs_wal2json():
    """The mark of a suite that needs PostgreSQL with wal2json: skipped without it, unless CI is set."""
    import pytest  # here, so that scripts using the cluster need no pytest

    try:
        present = has_wal2json(pg_bin())
    except RuntimeError:  # no PostgreSQL at all: the same skip, not an error that stops the module's collection
        present = False
    return pytest.mark.skipif(
        not os.environ.get("CI") and not present,
        reason="PostgreSQL with wal2json is not installed (apt-get install postgresql-15 postgresql-15-wal2json); "
               "required when CI is set")


class PostgresCluster:
    def __init__(self, tls=False):
        self.bindir = pg_bin()
        self.dir = None
        self.port = 0
        self.as_postgres = []
        self.started = False
        self.tls = tls
        self.ca_file = None

    def _make_certificates(self):
        """A throwaway CA and a server certificate for localhost/127.0.0.1, for ssl=on; returns their server options."""
        files = make_authority(self.dir)
        key = files["server.key"]
        os.chmod(key, 0o600)
        if os.geteuid() == 0:
            for path in (key, files["server.pem"]):
                shutil.chown(path, "postgres", "postgres")
        os.chmod(files["ca.pem"], 0o644)
        self.ca_file = files["ca.pem"]
        return f" -c ssl=on -c ssl_cert_file={files['server.pem']} -c ssl_key_file={key}"

    @property
    def dsn(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *args, **kwargs):
        return subprocess.run(self.as_postgres + list(args), check=True, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60, **kwargs)

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="pubsub-relay-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_postgres = ["runuser", "-u", "postgres", "--"]
        data = os.path.join(self.dir, "data")
        self._run(os.path.join(self.bindir, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync")
        ssl_options = self._make_certificates() if self.tls else ""
        last = None
        for _ in range(3):
            self.port = free_port()
            options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c wal_level=logical "
                       "-c max_replication_slots=8 -c max_wal_senders=8 -c fsync=off")
            options += ssl_options
            try:
                self._run(os.path.join(self.bindir, "pg_ctl"), "-D", data, "-l", os.path.join(self.dir, "log"),
                          "-w", "-t", "30", "-o", options, "start")
                self.started = True
                return self
            except subprocess.CalledProcessError as e:
                last = e
        raise RuntimeError(f"PostgreSQL did not start: {last.stderr if last else ''}\n{self.log()}")

    def restart(self, mode="immediate"):
        """Stops the server (immediate: as a crash, the slot may rewind) and starts it again on the same port."""
        self._run(os.path.join(self.bindir, "pg_ctl"), "-D", os.path.join(self.dir, "data"), "-m", mode, "-w",
                  "-t", "60", "-l", os.path.join(self.dir, "log"), "restart")

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "log")) as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        if self.started:
            try:
                self._run(os.path.join(self.bindir, "pg_ctl"), "-D", os.path.join(self.dir, "data"), "-m",
                          "immediate", "-w", "stop")
            except Exception:
                pass
            self.started = False
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
