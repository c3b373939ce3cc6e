"""How the proxy's side channels (the engine scraper, the active health check) dial an endpoint:
plain TCP, or TLS and a peer's key when the endpoint carries an ``UpstreamLink`` (docs/tls.md), the
same way its requests go (``Pools.get_linked``).

Owns: :func:`side_open` (a connection with the link's TLS context, SNI, certificate name and client
certificate; the context is the link's pool's, ``flexinfer.http.tls.link_context``), :func:`side_path`
and :func:`side_auth` (the link's base path and ``Authorization: Bearer`` for a GET).
Must not: send a client's credentials anywhere, or be used on the request path.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["side_auth", "side_open", "side_path"]


async def side_open(host: str, port: int, link: Any | None,
                    limit: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``host:port``: over TLS (verified as the link says) when ``link.tls``."""
    if link is None or not link.tls:
        return await asyncio.open_connection(host, port, limit=limit)
    from flexinfer.http.tls import link_context  # only where an endpoint has TLS (docs/tls.md)

    return await asyncio.open_connection(host, port, limit=limit, ssl=link_context(link),  # OSError: a failed dial
                                         server_hostname=link.server_hostname or host)


def side_path(link: Any | None, path: str) -> str:
    """``path`` under the link's base path (a peer at ``https://host/api``)."""
    return path if link is None else link.path_prefix + path


def side_auth(link: Any | None) -> str:
    """The header line that authenticates a side request to a keyed peer (else nothing)."""
    return f"Authorization: Bearer {link.api_key}\r\n" if link is not None and link.api_key else ""
