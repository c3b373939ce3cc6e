"""The request pipeline: extract -> auth -> limit -> resolve -> (activate) -> route -> forward.

:class:`ProxyHandler` is the ``flexinfer.http`` Handler of the proxy. ``on_headers`` does everything
that needs no body (control endpoints, auth, header/path model names, unknown models) so refused
requests are answered before a body byte is read; ``handle`` parses the body once, resolves the
model, and hands the request to :mod:`flexinfer.proxy.forward`. It knows the runtime only through
``flexinfer.runtime.base``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from time import perf_counter
from typing import Any, Protocol

import orjson

from flexinfer import errors
from flexinfer.errors import FlexInferError
from flexinfer.http.client import Pools
from flexinfer.http.request import Request, ResponseWriter
from flexinfer.http.server import HTTPServer
from flexinfer.proxy import accesslog, debugview, extract, tracing, usage
from flexinfer.proxy.activation import Activator
from flexinfer.proxy.auth import BearerAuth
from flexinfer.proxy.context import REQUEST_IDS, ROUTE_ADMIN, ROUTE_CONTROL, RequestContext, RequestIds
from flexinfer.proxy.ejection import Ejector
from flexinfer.proxy.extract import body_model, normalize_path, parse_json_counted, rewrite_model, route_path
from flexinfer.proxy.forward import Forwarder, sse_error
from flexinfer.proxy.limits import Limiter, LocalBuckets
from flexinfer.proxy.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from flexinfer.proxy.metrics import ProxyMetrics
from flexinfer.proxy.routing import Router
from flexinfer.proxy.tokencount import TokenCounter
from flexinfer.proxy.tokenlimits import TokenBuckets, TokenCharge, TokenLimiter, key_id
from flexinfer.runtime.base import Inventory, ModelView, Scaler
from flexinfer.settings import ProxySettings

log = logging.getLogger("flexinfer.proxy")

JSON = [(b"content-type", b"application/json")]
_REQUEST_ID_RE = re.compile(rb"[A-Za-z0-9._:\-]{1,128}\Z")
_HEALTH_BODY = b'{"status":"ok"}'
_CONTROL = frozenset({"/healthz", "/readyz", "/metrics", "/v1/models", "/debug/endpoints"})
_AUTHED_CONTROL = frozenset({"/v1/models", "/debug/endpoints"})  # behind the API keys when auth is on


def ejector_for(settings: ProxySettings) -> Ejector | None:
    """The passive outlier ejection the settings ask for (None: ``PROXY_EJECT_CONSECUTIVE=0``)."""
    if settings.eject_consecutive <= 0:
        return None
    return Ejector(settings.eject_consecutive, settings.eject_base, settings.eject_max_share, settings.eject_max)


class AdminRoutes(Protocol):
    """Extra routes served next to the OpenAI API (the local runtime's ``/running``, ``/logs``, ...)."""

    def match(self, path: str) -> bool:
        """Whether ``path`` (normalized) is one of these routes; called for every request."""
        ...

    async def handle(self, req: Request, resp: ResponseWriter) -> None: ...


class ProxyHandler:
    """The proxy's HTTP handler."""

    # "__dict__": a wrapper may replace ``handle``/``on_headers`` on the instance (tracing, the access
    # log) and tests may set more; the listed ones are C slots in the compiled build (pipeline.pxd)
    __slots__ = ("__dict__", "_ask_usage", "_key_ids", "_open", "access_log", "activator", "admin", "auth",
                 "forwarder", "inventory", "limiter", "metrics", "pools", "request_ids", "router", "scaler", "server",
                 "settings", "token_counter", "token_limiter", "tracer")

    def __init__(self, inventory: Inventory, settings: ProxySettings, *, pools: Pools | None = None,
                 metrics: ProxyMetrics | None = None, router: Router | None = None,
                 limiter: Limiter | None = None, activator: Activator | None = None,
                 scaler: Scaler | None = None, admin: AdminRoutes | None = None,
                 request_ids: RequestIds = REQUEST_IDS, token_limiter: TokenLimiter | None = None,
                 token_buckets: TokenBuckets | None = None, tracer: tracing.Tracer | None = None) -> None:
        self.inventory = inventory
        self.settings = settings
        self.metrics = metrics or ProxyMetrics()
        self.pools = pools or Pools(settings.upstream)
        self.router = router or Router(ejector=ejector_for(settings))
        if limiter is None and settings.rate_limit_enabled:
            limiter = Limiter(settings, self.metrics)
        self.limiter = limiter
        if token_limiter is None and TokenLimiter.enabled(settings):  # token limits share the buckets
            if token_buckets is None:
                token_buckets = limiter.buckets if limiter is not None and hasattr(limiter.buckets, "charge") \
                    else LocalBuckets(settings)  # type: ignore[assignment]
            assert token_buckets is not None
            token_limiter = TokenLimiter(settings, self.metrics, token_buckets)
        self.token_limiter = token_limiter
        self.token_counter = TokenCounter(self.pools, settings.token_count_timeout) \
            if token_limiter is not None and settings.token_count == "tokenizer" else None
        self._key_ids = token_limiter is not None and token_limiter.key is not None
        self.scaler = scaler
        if activator is None and scaler is not None:
            activator = Activator(inventory, scaler, settings, self.metrics)
        self.activator = activator
        tokens = settings.tokens() if settings.auth_enabled else ()
        self.auth: BearerAuth | None = BearerAuth(tokens) if settings.auth_enabled else None
        self.tracer = tracer if tracer is not None else tracing.tracer_for(settings)  # None: tracing off
        if self.tracer is not None:  # the request span around handle (flexinfer.proxy.tracing)
            self.handle = self.tracer.wrap(self.handle)  # type: ignore[method-assign, assignment]
        self.forwarder = Forwarder(self.pools, self.router, self.metrics, settings, self.tracer)
        self._ask_usage = settings.stream_usage
        self.metrics.endpoint_load = self._endpoint_load
        self.admin = admin  # extra routes (the local runtime's /running, /logs, ...)
        self.request_ids = request_ids  # ids for requests without a usable X-Request-ID
        self.server: HTTPServer | None = None
        self.access_log = accesslog.AccessLog() if settings.access_log else None
        self._open: dict[str, int] = {}  # requests holding a slot of a model's concurrency_limit
        if self.access_log is not None:  # refusals of on_headers are logged too (off: no wrapper)
            self.on_headers = accesslog.refusals(self.on_headers, self.access_log)  # type: ignore[method-assign,assignment]

    # -- wiring ----------------------------------------------------------------------------------
    def attach(self, server: HTTPServer) -> None:
        self.server = server
        self.metrics.bind_server_stats(lambda: server.stats)

    def _endpoint_load(self) -> list[tuple[str, str, int]]:
        """(model, endpoint, requests open) of every endpoint of the inventory (scrape time only)."""
        open_ = self.router.in_flight
        return [(v.name, ep.key, open_.get(ep.key, 0)) for v in self.inventory.models() for ep in v.endpoints]

    @property
    def draining(self) -> bool:
        return self._is_draining()

    def _is_draining(self) -> bool:
        """The server this handler serves is draining (a C call per request in the build)."""
        server = self.server
        return server is not None and bool(server.draining)

    # -- phase 1: headers only -------------------------------------------------------------------
    def on_headers(self, req: Request) -> FlexInferError | None:
        rid = req.get(b"x-request-id")
        if rid is None or not _REQUEST_ID_RE.match(rid):
            rid = self.request_ids.new()
        try:
            # decided once: every route below (control, admin, forward) sees the normalized path
            req.path = path = normalize_path(req.path)
        except FlexInferError as exc:
            return exc
        ctx = RequestContext(perf_counter(), rid, path)
        req.ctx = ctx
        if path in _CONTROL or path.startswith("/v1/models/"):
            ctx.route = ROUTE_CONTROL
            if path in _AUTHED_CONTROL or path.startswith("/v1/models/"):
                return self._authenticate(req, ctx)
            return None
        if self.admin is not None and self.admin.match(path):
            ctx.route = ROUTE_ADMIN
            return self._authenticate(req, ctx)
        try:
            err = self._authenticate(req, ctx)
            if err is not None:
                return err
            name, ctx.path = route_path(path)
            source = "path"
            header = req.get(b"x-model-id")
            if header is not None:
                try:
                    name = header.decode("ascii")
                except UnicodeDecodeError:
                    raise errors.InvalidModelName("X-Model-ID must be ASCII", param="model") from None
                extract.check_model_name(name, "X-Model-ID")
                source = "header"
            if name is not None:
                if self.inventory.resolve(name) is None:
                    raise errors.ModelNotFound(f"model {name!r} does not exist", param="model")
                ctx.model_name, ctx.source = name, source
        except FlexInferError as exc:
            return exc
        return None

    def _authenticate(self, req: Request, ctx: RequestContext) -> FlexInferError | None:
        if self.auth is None:
            return None
        values = [v for k, v in req.headers if k == b"authorization"]
        try:
            digest = self.auth.check(values)
        except errors.Unauthorized as exc:
            return exc
        ctx.authenticated = True
        if self._key_ids:
            ctx.key_id = key_id(digest)
        return None

    # -- phase 2: the whole request --------------------------------------------------------------
    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        ctx: RequestContext = req.ctx  # type: ignore[assignment]
        if ctx.route == ROUTE_CONTROL:
            self._control(req, resp, ctx)
            return
        if ctx.route == ROUTE_ADMIN:
            assert self.admin is not None
            await self.admin.handle(req, resp)
            return
        model_label = ""
        held: str | None = None  # the model whose concurrency_limit slot this request holds
        resp.cancel_on_disconnect()  # stop waiting/forwarding the moment the client leaves
        try:
            if self._is_draining():
                raise errors.ShuttingDown("the proxy is shutting down; retry on another instance")
            data: dict[str, Any] | None = None
            model_scan: extract.KeyScan | None = None
            ctype = req.content_type
            if req.body and ctype == b"application/json":
                data, model_scan = parse_json_counted(req.body)
            name = ctx.model_name
            if name is None:
                if data is not None:
                    name = body_model(data)
                    ctx.source = "body"
                elif ctype == b"multipart/form-data" and req.body:
                    name = extract.multipart_model(req.body, req.get(b"content-type") or b"")
                    ctx.source = "multipart"
            elif ctype == b"multipart/form-data" and req.body:
                # the body goes to the backend untouched: it must not name another model
                other = extract.multipart_model(req.body, req.get(b"content-type") or b"")
                if other is not None and other != name:
                    raise errors.BadRequest(
                        f"the multipart \"model\" field ({other!r}) names another model than the "
                        f"{ctx.source} ({name!r})", param="model", code="model_conflict")
            if name is None:
                raise errors.MissingModel(
                    "no model named: set \"model\" in the body, the X-Model-ID header or a /model/<name>/ path",
                    param="model")
            view = self.inventory.resolve(name)
            if view is None:
                raise errors.ModelNotFound(f"model {name!r} does not exist", param="model")
            model_label = view.name
            if self.scaler is not None:
                self.scaler.record_demand(view)
            if view.concurrency_limit is not None:  # per-model options (ModelView): off, one read each
                held = self._admit(view)
            filtered = False
            if view.filters is not None and data is not None:
                filtered = view.filters.apply(data)
            if self.limiter is not None:
                pending = self.limiter.check(view.name)
                if pending is not None:  # a shared (Redis) lease is on its way
                    await pending
            if self.token_limiter is not None:
                counted = await self.token_counter.count(view, data) if self.token_counter is not None else None
                admitted = self.token_limiter.admit(view.name, ctx.key_id, data, len(req.body), counted)
                ctx.tokens = admitted if isinstance(admitted, TokenCharge) else await admitted
            # the model the backend must see: the served name, or for a LoRA adapter (routed to its
            # parent's replicas, rewrite_model False) the adapter name the client routed by
            target = view.upstream_model if view.rewrite_model else name
            if not view.ready or not view.endpoints:
                view = await self._activate(view, ctx, resp, data)
            body = req.body
            clamped = None
            if data is not None and view.context_window and self.settings.max_tokens_clamp:
                clamped = extract.clamp_max_tokens(data, view.context_window, self.settings.max_tokens_reserve)
            if clamped is not None:
                assert data is not None
                if "model" in data:
                    data["model"] = target
                body = orjson.dumps(data)
                ctx.extra_headers.append((b"x-flexinfer-maxtokens-clamped", b"%d->%d" % clamped))
                self.metrics.max_tokens_clamped.labels(view.name).inc()
            elif filtered:  # the model's filters changed the body: encoded again
                assert data is not None
                if "model" in data:
                    data["model"] = target
                body = orjson.dumps(data)
            elif data is not None and "model" in data:
                body = rewrite_model(body, data, target, model_scan)
            if self._ask_usage and data is not None and data.get("stream") is True and ctx.path in usage.USAGE_PATHS:
                asked = usage.ask_usage(body, data, target)  # the stream's usage for the metrics; stripped again
                if asked is not None:
                    body, ctx.strip_usage = asked, True
            await self.forwarder.forward(req, resp, ctx, view, data, body)
        except FlexInferError as exc:
            self._error(resp, ctx, exc, model_label)
        except asyncio.CancelledError:
            # the client went away while we waited (the writer cancelled us: cancel_on_disconnect)
            self.metrics.client_aborts.labels(model_label).inc()
            self.metrics.count(model_label, 499)
            if not resp.finished:
                resp.abort()
        finally:
            if held is not None:
                self._release(held)
            if ctx.tokens is not None:  # charge what the response says it used (token limits)
                ctx.tokens.settle()
            if self.access_log is not None:
                self.access_log.request(req, resp, ctx, model_label)

    def _admit(self, view: ModelView) -> str:
        """A slot of the model's ``concurrency_limit`` (released by :meth:`_release`), or 429 at once."""
        name = view.name
        held = self._open.get(name, 0)
        limit = view.concurrency_limit
        assert limit is not None
        if held >= limit:
            self.metrics.rate_limited.labels(name, "concurrency").inc()
            raise errors.RateLimited(f"model {name!r} already has {held} requests in flight (its "
                                     f"concurrency_limit); retry shortly", retry_after=1,
                                     code="concurrency_limit_exceeded")
        self._open[name] = held + 1
        return name

    def _release(self, name: str) -> None:
        left = self._open.get(name, 1) - 1
        if left > 0:
            self._open[name] = left
        else:
            self._open.pop(name, None)

    async def _activate(self, view: ModelView, ctx: RequestContext, resp: ResponseWriter,
                        data: dict[str, Any] | None) -> ModelView:
        if self.activator is None:
            raise errors.ServiceUnavailable(f"model {view.name!r} has no ready replica")
        waiting = self.activator.wait_ready(view, ctx, resp, data)
        if self.tracer is not None:  # the queue-wait span (flexinfer.proxy.tracing)
            return await self.tracer.queue_wait(view, waiting, self.activator.queue_depth(view.name))
        return await waiting

    def _error(self, resp: ResponseWriter, ctx: RequestContext, exc: FlexInferError, model: str) -> None:
        if self.tracer is not None:
            self.tracer.failed(exc)
        self.metrics.count(model, exc.status)
        if resp.started:
            if ctx.sse_open and not resp.finished and not resp.disconnected:
                resp.write(sse_error(exc))
                resp.end()
            elif not resp.finished:
                resp.abort()
            return
        resp.send_error(exc, [(b"x-request-id", ctx.request_id), *exc.headers])

    # -- control endpoints -----------------------------------------------------------------------
    def _control(self, req: Request, resp: ResponseWriter, ctx: RequestContext) -> None:
        path = req.path
        if req.method not in ("GET", "HEAD"):
            resp.send_error(errors.MethodNotAllowed(f"{req.method} is not allowed on {path}"))
            return
        if path == "/healthz":
            resp.send(200, JSON, _HEALTH_BODY)
        elif path == "/readyz":
            if self.draining:
                resp.send(503, JSON, b'{"status":"draining"}')
            else:
                resp.send(200, JSON, b'{"status":"ready"}')
        elif path == "/metrics":
            resp.send(200, [(b"content-type", METRICS_CONTENT_TYPE)], self.metrics.render())
        elif path == "/debug/endpoints":
            if not self.settings.debug_endpoints:
                resp.send_error(errors.NotFound("/debug/endpoints is off (PROXY_DEBUG_ENDPOINTS=false)"),
                                [(b"x-request-id", ctx.request_id)])
                return
            resp.send(200, [*JSON, (b"x-request-id", ctx.request_id), (b"cache-control", b"no-store")],
                      debugview.document(self.inventory.models(), self.router))
        elif path == "/v1/models":
            data = [self._model_object(v) for v in self.inventory.models() if not v.unlisted]
            resp.send(200, [*JSON, (b"x-request-id", ctx.request_id)],
                      orjson.dumps({"object": "list", "data": data}))
        else:  # /v1/models/<id>
            name = path[len("/v1/models/"):]
            view = self.inventory.resolve(name) if name else None
            if view is None:
                resp.send_error(errors.ModelNotFound(f"model {name!r} does not exist", param="model"),
                                [(b"x-request-id", ctx.request_id)])
                return
            resp.send(200, [*JSON, (b"x-request-id", ctx.request_id)], orjson.dumps(self._model_object(view)))

    @staticmethod
    def _model_object(v: ModelView) -> dict[str, Any]:
        return {
            "id": v.name,
            "object": "model",
            "created": v.created,
            "owned_by": v.owned_by,
            "ready": v.ready,
            "aliases": list(v.aliases),
            "served_name": v.upstream_model,
            **dict(v.metadata),
        }
