"""The global proxy's TLS material towards the members: the PEM of a GlobalProxy's ``tls.secretRef``
(``ca.crt``, ``tls.crt``, ``tls.key``) checked and written to private files (docs/globalproxy.md).

``ssl`` loads a client certificate from files only, so each good version of the Secret is written
to its own directory (named by the digest of its content, mode 0700, files 0600) under one private
temporary directory: a changed Secret gives new paths, hence new links and new pools, and the
directory of the version before is removed once the new one is taken. :meth:`TLSStore.close`
removes them all (the proxy's stop).

Owns: :class:`TLSStore`, :class:`TLSMaterialError` (with a condition reason). Must not: read the
Kubernetes API (``runtime.kubeglobal`` does), or log or put PEM text into a message.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flexinfer.http.tls import tls_context
from flexinfer.k8s.kubeconfig import secret_bytes
from flexinfer.runtime.globalrt import TLSFiles

__all__ = ["CA_KEY", "CERT_KEY", "INVALID", "KEY_KEY", "TLSMaterialError", "TLSStore"]

CA_KEY, CERT_KEY, KEY_KEY = "ca.crt", "tls.crt", "tls.key"
INVALID = "InvalidCertificate"


class TLSMaterialError(ValueError):
    """The Secret's content cannot be used; ``reason`` is the condition's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def secret_pem(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """The Secret's keys of interest, decoded (``data`` is base64, ``stringData`` plain)."""
    out: dict[str, bytes] = {}
    for k in (CA_KEY, CERT_KEY, KEY_KEY):
        try:
            value = secret_bytes(secret, k)
        except ValueError:  # binascii.Error
            raise TLSMaterialError(INVALID, f"key {k} of the Secret is not base64") from None
        if value is not None:
            out[k] = value
    return out


class TLSStore:
    """The current good version of the material, as files (see the module docstring)."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self.digest: str | None = None
        self.files: TLSFiles | None = None
        self.summary = ""

    def take(self, pem: Mapping[str, bytes]) -> TLSFiles:
        """Check ``pem`` (a context is built from it, as a pool will) and make it current; the same
        content again returns the same files. Raises :class:`TLSMaterialError`; the current
        version then stays."""
        if (CERT_KEY in pem) != (KEY_KEY in pem):
            raise TLSMaterialError(INVALID, f"the Secret has {CERT_KEY if CERT_KEY in pem else KEY_KEY} "
                                            f"without {KEY_KEY if CERT_KEY in pem else CERT_KEY}")
        if not pem:
            raise TLSMaterialError(INVALID, f"the Secret has none of {CA_KEY}, {CERT_KEY}, {KEY_KEY}")
        digest = hashlib.sha256(b"\0".join(k.encode() + b"=" + v for k, v in sorted(pem.items()))).hexdigest()[:16]
        if digest == self.digest and self.files is not None:
            return self.files
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="flexinfer-global-tls-"))  # 0700
        d = self._root / digest
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(mode=0o700)
        paths: dict[str, str] = {}
        for k, v in pem.items():
            p = d / k
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(v)
            paths[k] = str(p)
        files = TLSFiles(paths.get(CA_KEY), paths.get(CERT_KEY), paths.get(KEY_KEY))
        try:
            tls_context(files.ca_file, False, files.cert_file, files.key_file)
        except (OSError, ssl.SSLError, ValueError) as exc:
            shutil.rmtree(d, ignore_errors=True)
            what = " and ".join(k for k in (CA_KEY, CERT_KEY, KEY_KEY) if k in pem)
            raise TLSMaterialError(INVALID, f"{what} of the Secret cannot be used: "
                                            f"{getattr(exc, 'reason', None) or exc.__class__.__name__}") from None
        if self.digest is not None and self.digest != digest:
            shutil.rmtree(self._root / self.digest, ignore_errors=True)
        self.digest, self.files = digest, files
        self.summary = ", ".join(n for k, n in ((CA_KEY, "ca.crt as the trust root"),
                                                (CERT_KEY, "client certificate tls.crt")) if k in pem)
        return files

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        self.digest = self.files = None
