"""Runs a command where libsystemd cannot be loaded: in a private mount namespace, /dev/null is mounted over
the library file, so dlopen("libsystemd.so.0") fails as on a system without it. Needs root and unshare(1).
The process keeps its pid (unshare and sh exec), so signals reach the command."""

import os
import subprocess
import sys


def library_file():
    # ldconfig's cache names the soname's path; the mount goes over the file its symlinks end at.
    for line in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libsystemd.so.0 ("):
            return os.path.realpath(path)
    sys.exit("without_libsystemd: ldconfig -p lists no libsystemd.so.0")


if __name__ == "__main__":
    target = library_file()
    os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          'mount --bind /dev/null "$0" && exec "$@"', target] + sys.argv[1:])
