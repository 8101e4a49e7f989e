"""A throwaway PostgreSQL 15 cluster for the relay tests: initdb into a temporary folder with wal_level=logical,
listening on a free loopback port, run as the postgres system user when the tests run as root (initdb refuses
root). Always stopped afterwards (pg_ctl -m immediate), also when a test fails.

    PostgresCluster()                       trust, the built-in output plugins only (pgoutput, test_decoding)
    PostgresCluster(wal2json=True)          wal2json allowed as an output plugin too (output_plugin_libraries,
                                            when the server has that setting: 15.19 and later)
    PostgresCluster(auth="scram-sha-256")   TCP connections (host and replication lines of pg_hba.conf, on
    PostgresCluster(auth="md5")             127.0.0.1 and ::1) need the password, stored by that method; the Unix
                                            socket stays trust. `dsn` and `conninfo` carry the password.
    PostgresCluster(tls=True)               ssl=on with a throwaway CA (`ca_file`); with `auth`, TCP needs TLS
                                            (hostssl lines)
    settings={"name": "value"}, wal_segsize=1 (MB, initdb --wal-segsize): for the tests of WAL retention.

`needs_postgres()` is the mark of a suite that needs PostgreSQL only (the relay's default plugin, pgoutput, is
built in); `needs_wal2json()` the mark of a test of the wal2json plugin."""

import functools
import glob
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import urllib.parse

from .ports import free_port
from .tls import make_authority

# The default of output_plugin_libraries (PostgreSQL 15.19 and later refuse any other output plugin).
BUILT_IN_PLUGINS = "pgoutput, test_decoding"
AUTH_METHODS = ("scram-sha-256", "md5")


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


def server_version(bindir: str) -> tuple:
    """(major, minor) of `postgres --version` ("postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)")."""
    out = subprocess.run([os.path.join(bindir, "postgres"), "--version"], capture_output=True, text=True,
                         timeout=30).stdout
    match = re.search(r"\(PostgreSQL\) (\d+)(?:\.(\d+))?", out)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else (0, 0)


@functools.lru_cache(maxsize=None)
def server_settings(bindir: str) -> frozenset:
    """The names of the settings the server knows (`postgres --describe-config`, which needs no data directory and
    runs as root too); empty when it cannot say."""
    try:
        out = subprocess.run([os.path.join(bindir, "postgres"), "--describe-config"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(line.split("\t", 1)[0] for line in out.splitlines() if "\t" in line)


def restricts_output_plugins(bindir: str = None) -> bool:
    """Whether the server refuses output plugins not named by output_plugin_libraries (15.19 and later)."""
    bindir = bindir or pg_bin()
    known = server_settings(bindir)
    if known:
        return "output_plugin_libraries" in known
    major, minor = server_version(bindir)
    return major == 15 and minor >= 19


def _postgres_present() -> bool:
    try:
        pg_bin()
        return True
    except RuntimeError:
        return False


def needs_postgres():
    """The mark of a suite that needs PostgreSQL (the relay's default plugin, pgoutput, is part of the server):
    skipped without it, unless CI is set."""
    import pytest  # here, so that scripts using the cluster need no pytest

    return pytest.mark.skipif(
        not os.environ.get("CI") and not _postgres_present(),
        reason="PostgreSQL is not installed (apt-get install postgresql-15); required when CI is set")


def needs_wal2json():
    """The mark of a test of the wal2json plugin (`--plugin wal2json`, or slots of its own): skipped without
    PostgreSQL and wal2json, unless CI is set. It runs on a `PostgresCluster(wal2json=True)`."""
    import pytest

    present = _postgres_present() and has_wal2json(pg_bin())
    return pytest.mark.skipif(
        not os.environ.get("CI") and not present,
        reason="PostgreSQL with wal2json is not installed (apt-get install postgresql-15 postgresql-15-wal2json); "
               "required when CI is set")


def _conninfo_value(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class PostgresCluster:
    def __init__(self, tls=False, wal2json=False, auth=None, password=None, settings=None, wal_segsize=None):
        if auth not in (None,) + AUTH_METHODS:
            raise ValueError(f"auth: one of {AUTH_METHODS} or None, not {auth!r}")
        self.bindir = pg_bin()
        self.dir = None
        self.port = 0
        self.as_postgres = []
        self.started = False
        self.tls = tls
        self.ca_file = None
        self.wal2json = wal2json
        self.auth = auth
        self.user = "postgres"
        self.password = (password or f"pubsub-{secrets.token_hex(8)}") if auth else password
        self.wal_segsize = wal_segsize
        # The server's settings beyond the defaults of start(), as given on its command line (`-c name=value`).
        self.settings = dict(settings or {})
        if wal2json and restricts_output_plugins(self.bindir):
            self.settings.setdefault("output_plugin_libraries", f"{BUILT_IN_PLUGINS}, wal2json")
        if auth == "md5":
            self.settings.setdefault("password_encryption", "md5")

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

    def url(self, host="127.0.0.1", password=None, user=None, **params) -> str:
        """A postgres:// URL of the cluster for the relay's --dsn: its own password (when it has one) unless
        `password` is given (False: none), and `params` as the query (sslmode=..., sslrootcert=...)."""
        password = self.password if password is None else (password or None)
        userinfo = urllib.parse.quote(user or self.user, safe="")
        if password is not None:
            userinfo += ":" + urllib.parse.quote(password, safe="")
        query = ("?" + urllib.parse.urlencode(params, safe="/")) if params else ""
        return f"postgres://{userinfo}@{host}:{self.port}/postgres{query}"

    @property
    def dsn(self) -> str:
        return self.url()

    @property
    def conninfo(self) -> str:
        """libpq's key=value form over TCP, for the tests' own psycopg connections (with the password)."""
        info = f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres"
        return info + (f" password={_conninfo_value(self.password)}" if self.password is not None else "")

    def connect(self, **kwargs):
        """A psycopg connection in autocommit mode (the tests' own, over TCP)."""
        import psycopg  # here, so that the module imports without it

        return psycopg.connect(self.conninfo, autocommit=True, **kwargs)

    def _run(self, *args, **kwargs):
        return subprocess.run(self.as_postgres + list(args), check=True, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60, **kwargs)

    def _initdb(self, data):
        args = [os.path.join(self.bindir, "initdb"), "-D", data, "-U", self.user, "-E", "UTF8", "--no-sync"]
        if self.wal_segsize:
            args.append(f"--wal-segsize={self.wal_segsize}")
        if not self.auth:
            self._run(*args, "-A", "trust")
            return
        pwfile = os.path.join(self.dir, "pwfile")
        with open(pwfile, "w") as f:
            f.write(self.password + "\n")
        os.chmod(pwfile, 0o600)
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        try:
            self._run(*args, "--auth-local=trust", f"--auth-host={self.auth}", f"--pwfile={pwfile}")
        finally:
            os.unlink(pwfile)
        # Written out rather than left to initdb's template: the lines this cluster promises, nothing else.
        host = "hostssl" if self.tls else "host"
        lines = ["local all all trust", "local replication all trust"]
        lines += [f"{host} {database} all {address} {self.auth}"
                  for database in ("all", "replication") for address in ("127.0.0.1/32", "::1/128")]
        with open(os.path.join(data, "pg_hba.conf"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def _store_password(self):
        """initdb stored the password as SCRAM (password_encryption's default); an md5 cluster stores it again as
        md5 over the trusted socket, so that the server asks for MD5 (md5 with a SCRAM secret would use SCRAM)."""
        if self.auth != "md5":
            return
        sql = f"SET password_encryption = 'md5'; ALTER ROLE {self.user} PASSWORD {_sql_literal(self.password)}"
        self._run(os.path.join(self.bindir, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", self.dir, "-p",
                  str(self.port), "-U", self.user, "-d", "postgres", "-c", sql)

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="pubsub-relay-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_postgres = ["runuser", "-u", "postgres", "--"]
        data = os.path.join(self.dir, "data")
        self._initdb(data)
        ssl_options = self._make_certificates() if self.tls else ""
        extra = "".join(f" -c {shlex.quote(f'{name}={value}')}" for name, value in self.settings.items())
        last = None
        for _ in range(3):
            self.port = free_port()
            options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c wal_level=logical "
                       "-c max_replication_slots=8 -c max_wal_senders=8 -c fsync=off")
            options += ssl_options + extra
            try:
                self._run(os.path.join(self.bindir, "pg_ctl"), "-D", data, "-l", os.path.join(self.dir, "log"),
                          "-w", "-t", "30", "-o", options, "start")
                self.started = True
                break
            except subprocess.CalledProcessError as e:
                last = e
        if not self.started:
            raise RuntimeError(f"PostgreSQL did not start: {last.stderr if last else ''}\n{self.log()}")
        self._store_password()
        return self

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
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
        return False


def _sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
