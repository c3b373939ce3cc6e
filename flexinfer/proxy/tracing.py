"""OpenTelemetry traces of forwarded requests (``PROXY_TRACING_ENABLED``, the ``otel`` extra).

Owns: the proxy's spans (one SERVER span per forwarded request, child of the client's W3C
``traceparent``/``tracestate``; under it ``flexinfer.queue_wait``, ``flexinfer.route`` per pick and
a CLIENT span ``flexinfer.upstream`` per upstream attempt, whose context replaces the client's
``traceparent`` on the request sent upstream), the tracer provider and its OTLP/HTTP exporter
(configured by the SDK from the standard ``OTEL_*`` variables), see docs/tracing.md.
The request path calls in through :class:`Tracer` only behind ``if tracer is not None`` guards
(``ProxyHandler.handle`` is wrapped once at construction), so with tracing off nothing here runs.

Must not: import ``opentelemetry`` at module import (only :meth:`Tracer.from_settings` does, when
tracing is on: a proxy without the extra, or with tracing off, never loads it); raise into the
request path (a failing tracer loses spans, never a request); keep state per request outside the
request's task (the current trace lives in a ContextVar of the handler's task).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from flexinfer.errors import FlexInferError
from flexinfer.http.protocol import Request, ResponseWriter
from flexinfer.proxy.context import ROUTE_FORWARD, RequestContext
from flexinfer.runtime.base import Endpoint, ModelView
from flexinfer.settings import ProxySettings

log = logging.getLogger("flexinfer.tracing")

DEFAULT_SERVICE_NAME = "flexinfer-proxy"
_TRACE_HEADERS = (b"traceparent", b"tracestate")
Handle = Callable[[Request, ResponseWriter], Coroutine[Any, Any, None]]


class _Trace:
    """What the spans of one request need, kept in the handler task's ContextVar."""

    __slots__ = ("attempt", "context", "error", "model", "span", "up", "upstream")

    def __init__(self, span: Any, context: Any) -> None:
        self.span = span  # the request (SERVER) span
        self.context = context  # the OTel context with ``span`` current: the parent of the others
        self.upstream: Any = None  # the open upstream (CLIENT) span
        self.up: Any = None  # the UpstreamResponse whose head came in
        self.error: FlexInferError | None = None  # the error the client was answered with
        self.attempt = 0
        self.model = ""  # the model the request was routed to


_CURRENT: contextvars.ContextVar[_Trace | None] = contextvars.ContextVar("flexinfer_trace", default=None)


class _HeaderGetter:
    """The OTel Getter over a request's ``[(name, value)]`` byte pairs (names lower-case)."""

    def get(self, carrier: list[tuple[bytes, bytes]], key: str) -> list[str] | None:
        name = key.lower().encode("latin-1")
        values = [v.decode("latin-1") for k, v in carrier if k == name]
        return values or None

    def keys(self, carrier: list[tuple[bytes, bytes]]) -> list[str]:
        return [k.decode("latin-1") for k, _ in carrier]


def tracer_for(settings: ProxySettings) -> Tracer | None:
    """The tracer the settings ask for; None with ``PROXY_TRACING_ENABLED`` off (the default)."""
    if not settings.tracing_enabled:
        return None
    return Tracer.from_settings(settings)


class Tracer:
    """The proxy's spans over one OTel ``TracerProvider`` (its own: the global one is left alone)."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer("flexinfer.proxy")
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._getter = _HeaderGetter()
        self._server, self._client = trace.SpanKind.SERVER, trace.SpanKind.CLIENT
        self._error = trace.StatusCode.ERROR
        self._failures = 0

    @classmethod
    def from_settings(cls, settings: ProxySettings, exporter: Any = None) -> Tracer:
        """A provider with a batch processor and the OTLP/HTTP exporter (``exporter``: another one,
        tests). Sampler, batch sizes and the exporter's endpoint, headers, timeout and compression
        come from the SDK's ``OTEL_*`` variables; the service name from the settings, else
        ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, else ``flexinfer-proxy``."""
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create()
        name = settings.tracing_service_name
        if not name and str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            name = DEFAULT_SERVICE_NAME
        if name:
            resource = resource.merge(Resource({SERVICE_NAME: name}))
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    def shutdown(self) -> None:
        """Export what is still buffered and stop the exporter (at the end of the process)."""
        self.provider.shutdown()

    def _failed(self, what: str) -> None:
        self._failures += 1
        if self._failures == 1 or self._failures % 1000 == 0:  # a broken tracer is said, not repeated
            log.warning("tracing: %s failed (%d times so far); the request goes on untraced",
                        what, self._failures, exc_info=True)

    # -- the request span ----------------------------------------------------------------------------
    def wrap(self, handle: Handle) -> Handle:
        """``handle`` inside the request span (forwarded requests only: control and admin routes
        are not traced)."""

        async def traced(req: Request, resp: ResponseWriter) -> None:
            ctx = req.ctx
            if not isinstance(ctx, RequestContext) or ctx.route != ROUTE_FORWARD:
                await handle(req, resp)
                return
            try:
                tr = self._begin(req, ctx)
            except Exception:
                self._failed("starting the request span")
                await handle(req, resp)
                return
            token = _CURRENT.set(tr)
            try:
                await handle(req, resp)
            finally:
                _CURRENT.reset(token)
                try:
                    self._end(tr, req, resp, ctx)
                except Exception:
                    self._failed("ending the request span")

        return traced

    def _begin(self, req: Request, ctx: RequestContext) -> _Trace:
        parent = self._propagator.extract(req.headers, getter=self._getter)  # type: ignore[arg-type]
        start = time.time_ns() - int((time.perf_counter() - ctx.t0) * 1e9)  # from the head's arrival
        span = self._tracer.start_span(
            f"{req.method} {ctx.path}", context=parent, kind=self._server, start_time=start,
            attributes={"http.request.method": req.method, "url.path": ctx.path,
                        "client.address": req.peer.rsplit(":", 1)[0],
                        "flexinfer.request_id": ctx.request_id.decode("ascii", "replace")})
        return _Trace(span, self._trace.set_span_in_context(span, parent))

    def _end(self, tr: _Trace, req: Request, resp: ResponseWriter, ctx: RequestContext) -> None:
        span, up, err = tr.span, tr.up, tr.error
        if ctx.model_name is not None and not tr.model:
            span.set_attribute("flexinfer.model", ctx.model_name)
        abort = resp.disconnected and not (up is not None and up.complete_notified)
        body_failed = up is not None and not up.complete_notified and not resp.disconnected and err is None
        if tr.upstream is not None:
            self._end_upstream(tr, "upstream_body" if body_failed else None)
        status = err.status if err is not None else up.status if up is not None else None
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if abort:
            span.set_attribute("flexinfer.client_abort", True)
        if body_failed:
            span.set_attribute("error.type", "upstream_body")
            span.set_status(self._error, "the upstream body failed mid-way")
        elif status is not None and status >= 500:
            span.set_attribute("error.type", err.error_code if err is not None and err.error_code else str(status))
            span.set_status(self._error, err.message if err is not None else None)
        span.end()

    def failed(self, exc: FlexInferError) -> None:
        """The request is answered with ``exc`` (``ProxyHandler._error``)."""
        tr = _CURRENT.get()
        if tr is not None:
            tr.error = exc

    # -- queue wait ----------------------------------------------------------------------------------
    async def queue_wait(self, view: ModelView, waiting: Coroutine[Any, Any, ModelView], depth: int) -> ModelView:
        """Await the activator's ``waiting`` inside a ``flexinfer.queue_wait`` span (``depth``:
        requests queued before this one)."""
        tr = _CURRENT.get()
        span = None
        if tr is not None:
            try:
                span = self._tracer.start_span("flexinfer.queue_wait", context=tr.context, attributes={
                    "flexinfer.model": view.name, "flexinfer.queue.position": depth + 1})
            except Exception:
                self._failed("the queue-wait span")
        if span is None:
            return await waiting
        try:
            ready = await waiting
            span.set_attribute("flexinfer.queue.outcome", "ready")
            return ready
        except FlexInferError as exc:
            span.set_attribute("flexinfer.queue.outcome", exc.error_code or type(exc).__name__)
            span.set_attribute("error.type", exc.error_code or type(exc).__name__)
            span.set_status(self._error, exc.message)
            raise
        except BaseException:
            span.set_attribute("flexinfer.queue.outcome", "client_abort")
            raise
        finally:
            span.end()

    # -- routing and the upstream exchange -----------------------------------------------------------
    def pick(self, router: Any, view: ModelView, data: dict[str, Any] | None, req: Request,
             exclude: frozenset[str]) -> tuple[Endpoint, str, str]:
        """``router.pick(...)`` inside a ``flexinfer.route`` span."""
        tr = _CURRENT.get()
        span = None
        if tr is not None:
            try:
                span = self._tracer.start_span("flexinfer.route", context=tr.context, attributes={
                    "flexinfer.model": view.name, "flexinfer.route.excluded": len(exclude)})
            except Exception:
                self._failed("the routing span")
        if span is None:
            return router.pick(view, data, req, exclude)  # type: ignore[no-any-return]
        try:
            ep, strategy, source = router.pick(view, data, req, exclude)
        except LookupError:
            span.set_attribute("error.type", "no_replica")
            span.set_status(self._error, f"model {view.name!r} has no reachable replica")
            span.end()
            raise
        span.set_attributes({"flexinfer.endpoint": ep.key, "flexinfer.route.strategy": strategy,
                             "flexinfer.route.source": source})
        span.end()
        return ep, strategy, source

    def send(self, req: Request, view: ModelView, data: dict[str, Any] | None, ep: Endpoint,
             headers: list[tuple[bytes, bytes]]) -> None:
        """The exchange with ``ep`` starts: open its ``flexinfer.upstream`` span and put its
        ``traceparent`` (and the client's ``tracestate``) in ``headers``, in place. An upstream span
        still open is a failed attempt (the retry after a refused connection)."""
        tr = _CURRENT.get()
        if tr is None:
            return
        try:
            if tr.upstream is not None:  # the attempt before: refused (a retry), or answered (disagg's prefill)
                self._end_upstream(tr, "connect_error" if tr.up is None else None)
                tr.up = None
            tr.attempt += 1
            tr.model = view.name
            stream = isinstance(data, dict) and data.get("stream") is True
            tr.span.set_attributes({"flexinfer.model": view.name, "flexinfer.stream": stream})
            span = tr.upstream = self._tracer.start_span("flexinfer.upstream", context=tr.context, kind=self._client,
                                                         attributes={
                "http.request.method": req.method, "server.address": ep.host, "server.port": ep.port,
                "flexinfer.endpoint": ep.key, "flexinfer.model": view.name, "flexinfer.stream": stream,
                "flexinfer.attempt": tr.attempt})
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
            headers[:] = [h for h in headers if h[0] not in _TRACE_HEADERS]
            headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items())
        except Exception:
            self._failed("the upstream span")

    def answered(self, up: Any) -> None:
        """The upstream head came in (``up``: its UpstreamResponse)."""
        tr = _CURRENT.get()
        if tr is not None:
            tr.up = up
            if tr.upstream is not None:
                tr.upstream.set_attribute("http.response.status_code", up.status)

    def _end_upstream(self, tr: _Trace, error: str | None) -> None:
        span, up, err = tr.upstream, tr.up, tr.error
        tr.upstream = None
        if error is None and up is None and err is not None:
            error = err.error_code or type(err).__name__  # no answer: the mapped upstream error
        status = up.status if up is not None else None
        if error is None and status is not None and status >= 500:
            error = str(status)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(self._error)
        span.end()
