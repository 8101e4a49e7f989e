"""Socket activation the way systemd does it, for tests: the listening sockets arrive as inherited file
descriptors (numbers given in PUBSUB_TEST_FDS, comma-separated), are moved to 3, 4, … and the launcher execs
the command with LISTEN_FDS, LISTEN_PID (its own pid, which exec keeps) and LISTEN_FDNAMES set.

    python3 activate.py /path/to/pubsub serve …

PUBSUB_TEST_FDNAMES gives the names (colon-separated); PUBSUB_TEST_LISTEN_PID overrides LISTEN_PID (to test
that a broker ignores sockets meant for another process)."""

import fcntl
import os
import sys


def main():
    fds = [int(n) for n in os.environ.pop("PUBSUB_TEST_FDS").split(",")]
    names = os.environ.pop("PUBSUB_TEST_FDNAMES", "")
    pid = os.environ.pop("PUBSUB_TEST_LISTEN_PID", "")
    # Move every descriptor out of the way first (above 100), then into place: a source may itself be 3 or 4.
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
    for fd in fds:
        os.close(fd)
    for i, fd in enumerate(moved):
        os.dup2(fd, 3 + i, inheritable=True)
        os.close(fd)
    os.environ["LISTEN_FDS"] = str(len(fds))
    os.environ["LISTEN_PID"] = pid or str(os.getpid())
    if names:
        os.environ["LISTEN_FDNAMES"] = names
    os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
