"""Throwaway certificates for the TLS suites, made with openssl (EC P-256, valid two days).

`make_authority` makes a private certificate authority and a certificate it signed, for servers that are given a CA
file to trust; `make_self_signed` makes a certificate that is its own authority."""

import ipaddress
import os
import subprocess

LOCAL_NAMES = ("127.0.0.1", "localhost")
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"]


def _openssl(directory, *args):
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=30)


def _subject_alt_names(names):
    def entry(name):
        try:
            ipaddress.ip_address(name)
            return f"IP:{name}"
        except ValueError:
            return f"DNS:{name}"

    return "subjectAltName=" + ",".join(entry(name) for name in names)


def make_authority(directory, names=LOCAL_NAMES, authority="pubsub test CA"):
    """A certificate authority (ca.pem, ca.key) and a certificate it signed for `names` (server.pem, server.key),
    usable by a server and by a client, all in `directory`; returns the paths by file name:
    {"ca.pem": ..., "server.pem": ..., "server.key": ...}."""
    _openssl(directory, "req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.pem", "-subj", f"/CN={authority}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl(directory, "req", *_EC, "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={names[0]}")
    with open(os.path.join(directory, "server.ext"), "w") as f:
        f.write(f"{_subject_alt_names(names)}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n")
    _openssl(directory, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return {name: os.path.join(directory, name) for name in ("ca.pem", "server.pem", "server.key")}


def make_self_signed(directory, name, names=LOCAL_NAMES):
    """A self-signed certificate named `name` (its subject) for `names`, as `<name>.crt` and `<name>.key` in
    `directory`; returns (certificate path, key path). A client trusts it by taking the certificate as its CA file."""
    cert, key = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    _openssl(directory, "req", "-x509", *_EC, "-keyout", key, "-out", cert, "-subj", f"/CN={name}",
             "-addext", _subject_alt_names(names))
    return cert, key
