"""Forwarding one resolved request to a replica and streaming the answer back.

Owns: the upstream header set (canonical, hop-by-hop and internal headers dropped, request id and
X-Forwarded-For set by us), the single retry on a refused connection (only when nothing was sent),
the mapping of upstream failures to OpenAI errors, the SSE error event when an upstream dies
mid-stream (no fake ``[DONE]``), cancelling the upstream when the client goes away, and the
per-request metrics (with the request's :class:`~flexinfer.proxy.usage.UsageTap`: tokens, time to
first token, inter-token latency, the per-endpoint series; docs/llm-metrics.md).
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter
from typing import Any

import orjson

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer import errors
from flexinfer.http.client import Pools, UpstreamConnectError, UpstreamError
from flexinfer.http.protocol import ClientGone
from flexinfer.http.request import Request, ResponseWriter
from flexinfer.http.responses import sse_event
from flexinfer.http.upstream import UpstreamResponse
from flexinfer.proxy.context import RequestContext
from flexinfer.proxy.disagg import Disagg
from flexinfer.proxy.metrics import ModelStats, ProxyMetrics
from flexinfer.proxy.retrybudget import RetryBudget
from flexinfer.proxy.routing import Router
from flexinfer.proxy.tracing import Tracer
from flexinfer.proxy.usage import UsageTap
from flexinfer.runtime.base import Endpoint, ModelView
from flexinfer.settings import ProxySettings

# Never forwarded upstream: hop-by-hop headers, framing (re-done by the client), and headers the
# proxy owns. Names listed in the client's Connection header are dropped too.
_DROP_UP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
    b"upgrade", b"http2-settings", b"host", b"content-length", b"expect", b"proxy-authorization",
    b"x-request-id", b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto", b"forwarded",
    b"x-real-ip", b"x-model-id",
})
# Never copied back to the client: hop-by-hop, framing (re-done by our writer), ours.
_DROP_DOWN = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
    b"upgrade", b"content-length", b"date", b"server", b"x-request-id",
})
_SSE = b"text/event-stream"


log = logging.getLogger("flexinfer.proxy")


#: upstream_headers' verdict per header name (names come interned from the HTTP core's name cache):
#: 0 forwarded, 1 left out, 2 Authorization (left out when the proxy checked it), 3 Connection
#: (left out, and so are the names it lists). Bounded like the HTTP core's caches.
_up_kinds: dict[bytes, int] = {}
_UP_KINDS_MAX = 4096
#: a client address ("host:port") -> the X-Forwarded-For value; bounded, cleared when full
_peer_hosts: dict[str, bytes] = {}


def _up_kind(name: bytes) -> int:
    if name == b"connection":
        kind = 3
    elif name in _DROP_UP or name.startswith(b"x-flexinfer-"):
        kind = 1
    elif name == b"authorization":
        kind = 2
    else:
        kind = 0
    if len(_up_kinds) < _UP_KINDS_MAX:
        _up_kinds[name] = kind
    return kind


def _forwarded_for(peer: str) -> bytes:
    hosts: dict[str, bytes] = _peer_hosts
    host = hosts.get(peer)
    if host is None:
        host = peer.rsplit(":", 1)[0].encode()
        if len(hosts) >= _UP_KINDS_MAX:
            hosts.clear()
        hosts[peer] = host
    return host


def upstream_headers(req: Request, request_id: bytes, drop_auth: bool) -> list[tuple[bytes, bytes]]:
    out = []
    kinds: dict[bytes, int] = _up_kinds  # (typed: the build's get is a C dict lookup)
    named: set[bytes] | None = None  # the names a Connection header lists (rare: built only then)
    for item in req.headers:
        kind = kinds.get(item[0])
        if kind is None:
            kind = _up_kind(item[0])
        if kind:
            if kind == 3 and named is None:
                named = {t.strip().lower() for k, v in req.headers if k == b"connection" for t in v.split(b",")}
            if kind != 2 or drop_auth:
                continue
        out.append(item)
    if named:
        out = [item for item in out if item[0] not in named]
    out += ((b"x-request-id", request_id), (b"x-forwarded-for", _forwarded_for(req.peer)),
            (b"x-forwarded-proto", b"http"))
    return out


@cython.annotation_typing(False)  # the cpdef of forward.pxd
def downstream_headers(up: UpstreamResponse, request_id: bytes, extra: list[tuple[bytes, bytes]]
                       ) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in up.headers if k not in _DROP_DOWN]
    out.append((b"x-request-id", request_id))
    out.extend(extra)
    return out


def _is_sse(up: UpstreamResponse) -> bool:
    v: bytes
    for k, v in up.headers:
        if k == b"content-type":
            return v.startswith(_SSE)
    return False


class Forwarder:
    """Sends a request to a replica of a model and relays the response."""

    __slots__ = ("_explain", "_release", "disagg", "metrics", "pools", "retries", "router", "settings", "tracer")

    def __init__(self, pools: Pools, router: Router, metrics: ProxyMetrics, settings: ProxySettings,
                 tracer: Tracer | None = None) -> None:
        self.pools = pools
        self.tracer = tracer  # None: tracing off
        self.router = router
        # router.release as one callable, made once: the release every answer hands to
        # when_complete. Looked up by name: on the typed router the build converts the cpdef
        # method's C function itself, and that conversion took it as a function of another
        # signature (gcc: incompatible pointer type; its C call lacked the dispatch flag)
        self._release = getattr(router, "release")  # noqa: B009
        self.metrics = metrics
        self.settings = settings
        self._explain = _EXPLAIN_MODES[settings.route_explain]
        self.retries = RetryBudget()  # F12: open retries <= max(3, 20 % of the model's in-flight)
        self.disagg = Disagg(self)  # prefill/decode disaggregation (only for views with endpoint roles)

    def _decided(self, req: Request, view: ModelView, ep: Endpoint, strategy: str, source: str) -> None:
        """Count the pick in ``routing_decisions_total``, note the replica in the request's
        context (``endpoint``, for the access log) and, when asked, explain the pick."""
        if source.startswith("prefix-match"):  # bounded label values
            source = "prefix-match"
        self.metrics.decided(view.name, strategy, source)
        ctx = req.ctx
        if not isinstance(ctx, RequestContext):
            return
        ctx.endpoint = ep.key
        explain = self._explain
        if explain and (explain == 2 or req.get(b"x-flexinfer-explain") == b"1"):
            decision = self.router.last_decision if strategy == "scored" else None
            text = (decision.header() if decision is not None and decision.key == ep.key
                    else f"pick={ep.key}; reason={strategy} ({source})")
            ctx.explain = text.encode("ascii", "replace")

    async def _send(self, req: Request, path: str, view: ModelView, data: dict[str, Any] | None,
                    headers: list[tuple[bytes, bytes]], body: bytes,
                    first: tuple[Endpoint, str, str] | None = None, begin: _Begin | None = None,
                    exclude: frozenset[str] = frozenset()) -> tuple[UpstreamResponse, Endpoint, str, str]:
        """Open the upstream exchange; one retry on another replica if the first refused us.
        ``first``: a pick made already (the disaggregated flow picks the decode replica early).
        ``begin``: the client's answer starts from the upstream read that carried the head.
        ``exclude``: replicas not to pick (the retry's: the one that refused; within the retry budget)."""
        try:
            if first is not None:
                ep, strategy, source = first
            elif self.tracer is None:
                ep, strategy, source = self.router.pick(view, data, req, exclude)
            else:  # the pick in a span (flexinfer.proxy.tracing)
                ep, strategy, source = self.tracer.pick(self.router, view, data, req, exclude)
        except LookupError:
            raise errors.ServiceUnavailable(
                f"model {view.name!r} has no reachable replica", retry_after=1) from None
        self._decided(req, view, ep, strategy, source)
        link = ep.link  # None: plain http, keyed by (host, port) as before
        try:
            pool = self.pools.get(ep.host, ep.port) if link is None else self.pools.get_linked(ep.host, ep.port, link)
        except UpstreamConnectError as exc:  # an unreadable ca_file: the replica cannot be dialled
            raise _map_upstream(exc, view) from None
        self.router.acquire(ep)
        if self.tracer is not None:  # the upstream span; its traceparent goes upstream
            self.tracer.send(req, view, data, ep, headers)
        try:
            if begin is not None:  # the head callback learns the pick before the request leaves
                begin.ep, begin.strategy, begin.source = ep, strategy, source
            # the model's own response_timeout (ModelView), else (None) the pool's setting
            up = await pool.request(req.method, path, headers, body, response_timeout=view.response_timeout,
                                    on_head=None if begin is None else begin.on_head)
        except UpstreamConnectError as exc:
            self.router.release(ep)
            self.metrics.upstream_errors.labels(exc.reason, ep.key).inc()
            self._outcome(view, ep, False, "connect")
            if not exclude and len(view.endpoints) > 1 and await self._retry_slot(view):
                self.metrics.upstream_retries.labels(view.name).inc()
                try:  # the retry counts against the budget until its head is in (or it failed)
                    return await self._send(req, path, view, data, headers, body, None, begin,
                                            frozenset((ep.key,)))
                finally:
                    self.retries.done(view.name)
            raise _map_upstream(exc, view) from None
        except UpstreamError as exc:
            self.router.release(ep)
            self.metrics.upstream_errors.labels(exc.reason, ep.key).inc()
            self._outcome(view, ep, False, "timeout" if exc.reason in _TIMEOUTS else "5xx")
            raise _map_upstream(exc, view) from None
        except BaseException:  # cancelled: after the head callback, its when_complete may have released
            if begin is None or begin.up is None or not begin.up.complete_notified:
                self.router.release(ep)
            raise
        if self.router.ejector is not None:
            self._outcome(view, ep, up.status < 500, "ok" if up.status < 500 else "5xx")
        if self.tracer is not None:
            self.tracer.answered(up)
        return up, ep, strategy, source

    async def _retry_slot(self, view: ModelView) -> bool:
        """A slot of the retry budget for one retry of ``view``'s request (then ``retries.done``):
        at once, or after waiting (at most the connect timeout) for an open retry to end."""
        budget = self.retries
        endpoints = [e.key for e in view.endpoints]

        def in_flight() -> int:  # the model's open upstream requests, the asking one included
            return 1 + sum(self.router.load.loads(endpoints))

        if budget.take(view.name, in_flight()):
            return True
        budget.waited += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.upstream.connect_timeout
        while (left := deadline - loop.time()) > 0:
            try:
                async with asyncio.timeout(left):
                    await budget.wait_slot(view.name)
            except TimeoutError:
                break
            if budget.take(view.name, in_flight()):
                return True
        budget.refused += 1
        return False

    @cython.annotation_typing(False)  # the cpdef of forward.pxd
    def _outcome(self, view: ModelView, ep: Endpoint, ok: bool, kind: str) -> None:
        """Tell the ejector how the exchange went; count and log an ejection once."""
        ejector = self.router.ejector
        if ejector is None or (ok and ep.key not in ejector.unsettled):
            return  # a success with nothing to reset: no call (Ejector.unsettled)
        if ejector.record(ep.key, ok, kind):
            self.metrics.endpoint_ejections.labels(view.name, ep.key).inc()
            st = ejector.state(ep.key)
            log.warning("endpoint %s of %s ejected for %.0fs after %d consecutive failures (last: %s)",
                        ep.key, view.name, st["ejected_for_s"], ejector.consecutive, kind)

    async def _error_into_stream(self, up: UpstreamResponse, resp: ResponseWriter, view: ModelView) -> None:
        """The backend refused a request whose SSE response was already started: say it as an event."""
        try:
            raw = await up.read_all(64 * 1024)
            err = orjson.loads(raw).get("error") if raw else None
        except (UpstreamError, orjson.JSONDecodeError, AttributeError):
            err = None
        if isinstance(err, dict):  # the backend's own error object, passed on as it is
            resp.write(sse_event(orjson.dumps({"error": err})))
        else:
            resp.write(sse_error(errors.BadGateway(f"backend answered {up.status}")))
        resp.end()
        self.metrics.count(view.name, up.status)

    def _answer(self, up: UpstreamResponse, resp: ResponseWriter, ctx: RequestContext, ep: Endpoint,
                strategy: str, source: str, stats: ModelStats) -> bool:
        """The upstream head is in: release the replica when the body is complete (before the client
        has the last byte, so a session's next request finds it idle), tap the body for its usage
        under token limits, start the client's response (unless an SSE answer is open already) and
        record the time to first byte. False: the backend refused a request whose SSE answer was
        open (the caller says so as an event). Run from ``forward`` or, earlier, from the read that
        carried the head (:class:`_Begin`)."""
        up.when_complete(self._release, ep)
        # the request's one tap (token limits share it): usage, TTFT/ITL, the usage chunk we asked for
        tap = ctx.tokens.tap if ctx.tokens is not None else UsageTap()
        sse = _is_sse(up)
        tap.start(up.status, sse, ctx.strip_usage and up.content_length is None, ctx.t0, stats)
        ctx.usage = up.tap = tap
        if ctx.sse_open:  # we already answered 200 + SSE comments while the model woke up
            if up.status != 200:
                return False
        else:
            extra = ctx.extra_headers
            if self.settings.route_header:
                extra.append((b"x-flexinfer-route", f"{strategy};{source};{ep.key}".encode()))
            if ctx.explain is not None:
                extra.append((b"x-flexinfer-explain", ctx.explain))
            resp.start(up.status, downstream_headers(up, ctx.request_id, extra), up.content_length)
        stats.observe_ttfb(perf_counter() - ctx.t0)
        return True

    async def forward(self, req: Request, resp: ResponseWriter, ctx: RequestContext, view: ModelView,
                      data: dict[str, Any] | None, body: bytes) -> None:
        metrics = self.metrics
        stats: ModelStats = metrics.model(view.name)
        headers = upstream_headers(req, ctx.request_id, drop_auth=ctx.authenticated)
        stats.in_flight += 1
        begun = False  # the head callback answered the client already (_Begin)
        up: UpstreamResponse  # (typed in the build: relay_done is a C call)
        t_send = perf_counter()  # the exchange starts: the endpoint's duration counts from here
        try:
            path = f"{ctx.path}?{req.query}" if req.query else ctx.path
            if view.disaggregated:  # prefill on one replica, then this exchange with a decode replica
                up, ep, strategy, source = await self.disagg.send(req, ctx, path, view, data, headers, body)
            elif ctx.sse_open:
                up, ep, strategy, source = await self._send(req, path, view, data, headers, body)
            else:  # the client's head and first body bytes leave from the upstream read of the head
                up, ep, strategy, source = await self._send(req, path, view, data, headers, body,
                                                            begin=_Begin(self, resp, ctx, stats))
                begun = resp.started
            try:
                if not begun and not self._answer(up, resp, ctx, ep, strategy, source, stats):
                    await self._error_into_stream(up, resp, view)
                    return
                try:
                    if up.relay_done(resp) < 0:  # (a plain body that came with its head: no coroutine)
                        await up.relay(resp)
                except UpstreamError as exc:
                    metrics.upstream_errors.labels(exc.reason, ep.key).inc()
                    if (ctx.sse_open or _is_sse(up)) and not resp.disconnected:
                        resp.write(sse_error(errors.BadGateway(f"upstream failed mid-stream ({exc.reason})")))
                    resp.abort()
                    metrics.count(view.name, 502)
                    return
                resp.end()
                metrics.count(view.name, up.status)
                now = perf_counter()
                stats.observe_duration(now - ctx.t0)
                metrics.endpoint(view.name, ep.key).observe_duration(now - t_send)
            except ClientGone:
                up.close()
                metrics.client_aborts.labels(view.name).inc()
                metrics.count(view.name, 499)
            except BaseException:
                up.close()
                raise
            finally:
                if not up.complete_notified:
                    self.router.release(ep)
                tap = ctx.usage
                if tap is not None:  # what the body said: tokens (parsed once), TTFT
                    _account(tap, ctx, stats)
        finally:
            stats.in_flight -= 1


def _account(tap: UsageTap, ctx: RequestContext, stats: ModelStats) -> None:
    """The request's tokens and TTFT, from its tap, into its context and its model's counters."""
    ctx.ttft = tap.ttft
    tap.finish()
    usage = tap.usage()
    if usage is not None:
        prompt, completion = usage
        if prompt >= 0:
            ctx.prompt_tokens = prompt
            stats.prompt_tokens += prompt
        ctx.completion_tokens = completion
        stats.completion_tokens += completion


_TIMEOUTS = frozenset(("connect_timeout", "response_timeout", "idle_timeout"))
_EXPLAIN_MODES = {"off": 0, "request": 1, "always": 2}


def sse_error(err: errors.FlexInferError) -> bytes:
    """An OpenAI error object as one SSE event (the openai client raises APIError on it)."""
    return sse_event(err.body())


def _map_upstream(exc: UpstreamError, view: ModelView) -> errors.FlexInferError:
    reason = exc.reason
    if isinstance(exc, UpstreamConnectError):
        return errors.ServiceUnavailable(f"model {view.name!r}: no replica accepted the connection ({reason})",
                                         retry_after=1, code="upstream_unavailable")
    if reason in ("connect_timeout", "response_timeout", "idle_timeout"):
        return errors.GatewayTimeout(f"model {view.name!r}: upstream {reason.replace('_', ' ')}",
                                     code="upstream_timeout")
    if reason == "not_replayed":
        return errors.BadGateway(
            f"model {view.name!r}: the replica closed the connection after the request was sent and "
            "before answering; it was not sent again because the engine may have run it",
            code="upstream_not_replayed")
    return errors.BadGateway(f"model {view.name!r}: upstream error ({reason})")


class _Begin:
    """The head callback of a plain exchange (no SSE answer opened before): ``Forwarder._answer``
    and the relay start run in the upstream read that carried the head, so its first body bytes go
    out in that read too instead of a loop turn later, when ``forward`` resumes (under load a turn
    serves every ready connection: milliseconds). One small object per request: ``_send`` fills in
    the pick before it sends."""

    __slots__ = ("ctx", "ep", "fwd", "resp", "source", "stats", "strategy", "up")

    def __init__(self, fwd: Forwarder, resp: ResponseWriter, ctx: RequestContext, stats: ModelStats) -> None:
        self.fwd = fwd
        self.resp = resp
        self.ctx = ctx
        self.stats = stats
        self.ep: Endpoint = None  # type: ignore[assignment]  # set by _send before the request leaves
        self.strategy = self.source = ""
        self.up: UpstreamResponse | None = None  # the response whose head came in

    def on_head(self, up: UpstreamResponse) -> None:
        self.up = up
        self.fwd._answer(up, self.resp, self.ctx, self.ep, self.strategy, self.source, self.stats)
        up.start_relay(self.resp)
