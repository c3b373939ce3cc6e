"""Bearer-token authentication, checked in constant time.

Tokens are compared as SHA-256 digests with ``hmac.compare_digest`` (fixed length, bytes only, so a
non-ASCII header can never raise), against every configured token without an early exit. Any
malformed ``Authorization`` header is a 401, never a 500. The token itself is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from flexinfer.errors import Unauthorized

WWW_AUTHENTICATE = [(b"www-authenticate", b'Bearer realm="flexinfer"')]


class BearerAuth:
    __slots__ = ("_digests",)

    def __init__(self, tokens: Iterable[str]) -> None:
        digests = [hashlib.sha256(t.encode("utf-8")).digest() for t in tokens if t]
        if not digests:
            raise ValueError("authentication is enabled but no token is configured")
        self._digests = tuple(digests)

    def check(self, values: list[bytes]) -> bytes:
        """``values``: every Authorization header of the request. Raises Unauthorized; returns the
        token's SHA-256 digest (per-key token limits name the key by it)."""
        if len(values) != 1:
            raise Unauthorized("missing or repeated Authorization header; send 'Authorization: Bearer <key>'",
                               headers=WWW_AUTHENTICATE)
        value = values[0]
        if value[:7].lower() != b"bearer " or len(value) <= 7:
            raise Unauthorized("Authorization must be 'Bearer <key>'", headers=WWW_AUTHENTICATE)
        token = value[7:]
        if not token.isascii() or b" " in token or b"\t" in token:
            raise Unauthorized("malformed bearer token", headers=WWW_AUTHENTICATE)
        digest = hashlib.sha256(token).digest()
        ok = 0
        for d in self._digests:
            ok |= hmac.compare_digest(digest, d)
        if not ok:
            raise Unauthorized("invalid API key", headers=WWW_AUTHENTICATE)
        return digest
