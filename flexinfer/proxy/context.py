"""What the pipeline learns about one request, and the request ids it makes.

:class:`RequestContext` is made by ``ProxyHandler.on_headers`` and read by the pipeline, the
activator and the forwarder (its own module so that they share it without importing each other).
:class:`RequestIds` makes the ids of requests that came without a usable ``X-Request-ID``.
"""

from __future__ import annotations

import os
from binascii import b2a_hex
from typing import Any

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

ROUTE_FORWARD, ROUTE_CONTROL, ROUTE_ADMIN = 0, 1, 2


class RequestContext:
    """What on_headers learned about a request, handed to handle()."""

    __slots__ = ("authenticated", "completion_tokens", "endpoint", "explain", "extra_headers", "key_id", "model_name",
                 "path", "prompt_tokens", "queue_wait", "request_id", "route", "source", "sse_open", "strip_usage", "t0",
                 "tokens", "ttft", "usage")

    def __init__(self, t0: float, request_id: bytes, path: str) -> None:
        self.t0 = t0
        self.request_id = request_id
        self.path = path  # normalized; for a forwarded request the upstream path (``/model/<n>`` stripped)
        self.route = ROUTE_FORWARD  # control endpoint, admin route, or forwarded to a model
        self.model_name: str | None = None
        self.source = ""
        self.authenticated = False
        self.sse_open = False  # an SSE response was started while waiting for the model
        self.extra_headers: list[tuple[bytes, bytes]] = []  # added to the response head
        self.explain: bytes | None = None  # X-Flexinfer-Explain of the pick, when asked for
        self.key_id: str | None = None  # the API key's id, set only when per-key token limits are on
        self.tokens: Any = None  # the request's tokenlimits.TokenCharge, when token limits are on
        self.usage: Any = None  # the request's usage.UsageTap, once an upstream head arrived
        self.strip_usage = False  # the proxy asked for the stream's usage chunk: the client must not see it
        # filled by the request path, read at its end (the access log); see docs/llm-metrics.md
        self.endpoint = ""  # the replica (host:port) of the exchange; "" until one is picked
        self.ttft = -1.0  # seconds from t0 to the first content event (SSE) / first body byte (else); -1 none
        self.prompt_tokens = -1  # from the response's usage; -1 unknown
        self.completion_tokens = -1
        self.queue_wait = 0.0  # seconds waited for the model to become ready (activation); 0.0 none


class RequestIds:
    """32 hex characters, unique without a syscall per request (request ids need not be secret): a
    random prefix per process and a counter after it. :data:`REQUEST_IDS` is the process's one
    instance, re-seeded in every forked child so that workers never share ids. Called from the
    event loop's thread only (the counter's step is not atomic in the source)."""

    __slots__ = ("_n", "_prefix")

    def __init__(self) -> None:
        self._prefix = b""
        self._n = 0
        self.reseed()

    def reseed(self) -> None:
        """A fresh random prefix and counter start (forked workers included)."""
        self._prefix = os.urandom(8).hex().encode()
        self._n = int.from_bytes(os.urandom(4), "big")  # below 2**32: never reaches 2**64

    @cython.annotation_typing(False)  # the cpdef of context.pxd
    def new(self) -> bytes:
        n = self._n
        self._n = n + 1
        if cython.compiled:  # the prefix and 16 hex digits written into one new bytes (context.pxd)
            return _id_c(self._prefix, n)  # type: ignore[name-defined]  # noqa: F821 (context.pxd)
        return self._prefix + b2a_hex(n.to_bytes(8, "big"))


REQUEST_IDS = RequestIds()
os.register_at_fork(after_in_child=REQUEST_IDS.reseed)
