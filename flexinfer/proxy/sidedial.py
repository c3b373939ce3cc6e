"""How the proxy's side channels (the engine scraper, the active health check) dial an endpoint:
plain TCP, or TLS and a peer's key when the endpoint carries an ``UpstreamLink`` (docs/tls.md), the
same way its requests go (``Pools.get_linked``).

Owns: :func:`side_open` (a connection with the link's TLS context, SNI, certificate name and client
certificate),
:func:`side_request_lines` (the link's base path and ``Authorization: Bearer`` for a GET), and one
SSL context per link, built once (loading a CA store costs milliseconds; a scrape runs every second).
Must not: send a client's credentials anywhere, or be used on the request path.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

__all__ = ["side_auth", "side_open", "side_path"]

_contexts: dict[Any, ssl.SSLContext] = {}
_MAX_CONTEXTS = 256


def _context(link: Any) -> ssl.SSLContext:
    ctx = _contexts.get(link)
    if ctx is None:
        from flexinfer.http.tls import tls_context  # only where an endpoint has TLS (docs/tls.md)

        ctx = tls_context(link.ca_file, link.insecure_skip_verify, link.cert_file, link.key_file)  # OSError: a failed dial
        if len(_contexts) >= _MAX_CONTEXTS:
            _contexts.clear()
        _contexts[link] = ctx
    return ctx


async def side_open(host: str, port: int, link: Any | None,
                    limit: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``host:port``: over TLS (verified as the link says) when ``link.tls``."""
    if link is None or not link.tls:
        return await asyncio.open_connection(host, port, limit=limit)
    return await asyncio.open_connection(host, port, limit=limit, ssl=_context(link),
                                         server_hostname=link.server_hostname or host)


def side_path(link: Any | None, path: str) -> str:
    """``path`` under the link's base path (a peer at ``https://host/api``)."""
    return path if link is None else link.path_prefix + path


def side_auth(link: Any | None) -> str:
    """The header line that authenticates a side request to a keyed peer (else nothing)."""
    return f"Authorization: Bearer {link.api_key}\r\n" if link is not None and link.api_key else ""
