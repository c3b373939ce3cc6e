"""Test certificates made with the ``openssl`` command line (no Python dependency): a CA, a server
certificate for 127.0.0.1 and localhost signed by it, and an unrelated second CA (the "wrong CA")."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA that signed the server certificate
    other_ca: Path  # a CA that signed nothing we serve
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d: Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("openssl command not installed")
    d.mkdir(parents=True, exist_ok=True)
    for name in ("ca", "other"):
        _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=flexinfer test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
             cwd=d)
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server.key",
         "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                               "extendedKeyUsage=serverAuth\n")
    _run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return Certs(d / "ca.pem", d / "other.pem", d / "server.pem", d / "server.key")


def make_client_cert(d: Path, name: str = "client") -> tuple[Path, Path]:
    """A client certificate (``extendedKeyUsage=clientAuth``) signed by the CA of :func:`make_certs`
    in the same directory: (certificate, key)."""
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
         "-out", f"{name}.csr", "-subj", f"/CN=flexinfer {name}", cwd=d)
    (d / f"{name}.cnf").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.cnf", cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"
