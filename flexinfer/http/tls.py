"""TLS and peer credentials on upstream connections (docs/tls.md): the client SSL context and the
peer pool.

Owns: :func:`tls_context` (system CAs or a CA file, hostname checked, TLS 1.2+, ALPN http/1.1, or no
verification for tests), :class:`Link` (what a pool reads of an endpoint's
``flexinfer.runtime.base.UpstreamLink``) and :class:`KeyedPool` (a peer's API key instead of the
client's Authorization, and its base path). ``Pools.get_linked`` (client.py) builds these pools.
Must not: touch plain-http pools, or forward a client's Authorization to a keyed peer.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Protocol

from flexinfer.http.client import UpstreamConnectError, UpstreamPool, UpstreamResponse
from flexinfer.settings import UpstreamSettings

__all__ = ["KeyedPool", "Link", "link_context", "linked_pool", "tls_context"]

_contexts: dict[Link, ssl.SSLContext] = {}  # per link, built once (a CA store takes milliseconds to load)
_MAX_CONTEXTS = 256


class Link(Protocol):
    """What a pool reads of :class:`flexinfer.runtime.base.UpstreamLink` (TLS and a peer's key)."""

    @property
    def tls(self) -> bool: ...
    @property
    def server_hostname(self) -> str | None: ...
    @property
    def ca_file(self) -> str | None: ...
    @property
    def insecure_skip_verify(self) -> bool: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def path_prefix(self) -> str: ...
    @property
    def cert_file(self) -> str | None: ...
    @property
    def key_file(self) -> str | None: ...


def tls_context(ca_file: str | None = None, insecure_skip_verify: bool = False, cert_file: str | None = None,
                key_file: str | None = None) -> ssl.SSLContext:
    """The client context of a TLS upstream: the system CAs (or ``ca_file``), hostname checked, TLS 1.2
    or newer, HTTP/1.1 offered by ALPN; ``insecure_skip_verify``: no verification at all (tests);
    ``cert_file``/``key_file``: the client certificate presented (mTLS), read here, once."""
    ctx = ssl.create_default_context(cafile=ca_file)
    if cert_file is not None:
        ctx.load_cert_chain(cert_file, key_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    if insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class KeyedPool(UpstreamPool):
    """A peer's pool: its requests carry its own ``Authorization: Bearer`` (the peer's API key; the
    client's Authorization and Proxy-Authorization are then dropped, never forwarded) and/or go under
    the peer's base path (``path_prefix``)."""

    def __init__(self, host: str, port: int, settings: UpstreamSettings, api_key: str | None,
                 ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None,
                 path_prefix: str = "") -> None:
        super().__init__(host, port, settings, ssl_context, server_hostname)
        self._auth = (b"authorization", b"Bearer " + api_key.encode("latin-1")) if api_key else None
        self._prefix = path_prefix

    async def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      *, response_timeout: float | None = None,
                      on_head: Callable[[UpstreamResponse], None] | None = None) -> UpstreamResponse:
        if self._auth is not None:
            headers = [(k, v) for k, v in headers if k != b"authorization" and k != b"proxy-authorization"]
            headers.append(self._auth)
        return await super().request(method, self._prefix + path, headers, body,
                                     response_timeout=response_timeout, on_head=on_head)


def link_context(link: Link) -> ssl.SSLContext:
    """The client context of a TLS link, made once per link and shared by its pool and the side
    channels (flexinfer.proxy.sidedial); OSError / ssl.SSLError when its files cannot be used."""
    ctx = _contexts.get(link)
    if ctx is None:
        ctx = tls_context(link.ca_file, link.insecure_skip_verify, link.cert_file, link.key_file)
        if len(_contexts) >= _MAX_CONTEXTS:  # links come from config and rotated Secrets: bounded
            _contexts.clear()
        _contexts[link] = ctx
    return ctx


def linked_pool(host: str, port: int, settings: UpstreamSettings, link: Link) -> UpstreamPool:
    """A new pool for an endpoint with a link: TLS with its context (made once, here) and/or keyed.
    An unreadable ``ca_file`` (or client certificate) is an ``UpstreamConnectError`` (``tls_config``)."""
    ctx = None
    if link.tls:
        try:
            ctx = link_context(link)
        except (OSError, ssl.SSLError) as exc:
            what = f"ca_file {link.ca_file!r}" + (f", cert_file {link.cert_file!r}" if link.cert_file else "")
            raise UpstreamConnectError(f"TLS settings of {host}:{port}: {what}: "
                                       f"{getattr(exc, 'strerror', None) or exc}", reason="tls_config") from None
    if link.api_key or link.path_prefix:
        return KeyedPool(host, port, settings, link.api_key, ctx, link.server_hostname, link.path_prefix)
    return UpstreamPool(host, port, settings, ctx, link.server_hostname)
