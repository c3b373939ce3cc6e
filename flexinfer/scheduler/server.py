"""HTTP surface of the extender: ``POST /filter``, ``POST /score`` (alias ``/prioritize``),
``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

:meth:`ExtenderApp.dispatch` maps (method, path, body) to a :class:`Reply` with no I/O, so it can be
tested without sockets; :class:`ExtenderHandler` is the thin ``flexinfer.http`` handler around it.
POST verbs are matched on the last path segment, so a ``urlPrefix`` with a path works too.

Failure policy (reliability plan E1, E4): a malformed body is a 400 with ``{"Error": ...}`` (never a
500); with NodeNames (``nodeCacheCapable: true``) and a node cache not yet synced, the answer is a
503, which kube-scheduler treats as an extender error: with ``ignorable: true`` it schedules without
the extender (fail-open), otherwise the pod waits for the next cycle (fail-closed). Nodes the cache
does not know fail the filter with a reason and score 0. Missing benchmark data scores tokens/s as 0.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from flexinfer.errors import FlexInferError
from flexinfer.scheduler import logic, wire
from flexinfer.scheduler.inventory import Inventory
from flexinfer.scheduler.nodecache import NodeFactsCache
from flexinfer.scheduler.settings import ExtenderSettings

if TYPE_CHECKING:
    from flexinfer.http.protocol import Request, ResponseWriter

log = logging.getLogger(__name__)

JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
UNKNOWN_NODE_REASON = "node not found in the extender's node cache"


class Reply(NamedTuple):
    """What :meth:`ExtenderApp.dispatch` answers."""

    status: int
    body: bytes
    content_type: bytes = JSON


class Candidates(NamedTuple):
    """The request's nodes: facts, names the inventory does not know (NodeNames form), every name in
    request order, and the items' JSON as received (fast-path Nodes form) for the filter's echo."""

    facts: list[logic.NodeFacts]
    missing: list[str]
    names: list[str]
    raws: list[Any] | None


class ExtenderMetrics:
    """The extender's Prometheus objects, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("flexinfer_scheduler_requests_total", "Extender requests by verb and status.",
                                ["verb", "code"], registry=r)
        self.duration = Histogram("flexinfer_scheduler_request_duration_seconds", "Time to answer a verb.",
                                  ["verb"], registry=r,
                                  buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.nodes = Histogram("flexinfer_scheduler_candidate_nodes", "Candidate nodes per request.", ["verb"],
                               registry=r, buckets=(1, 10, 100, 500, 1000, 5000, 10000))
        self.filtered = Counter("flexinfer_scheduler_filtered_nodes_total", "Nodes rejected, by reason.",
                                ["reason"], registry=r)
        self.tenant_usage = Gauge("flexinfer_scheduler_tenant_usage_ratio",
                                  "GPUs held by the tenant divided by its budget.", ["tenant"], registry=r)
        self.tenant_adj = Gauge("flexinfer_scheduler_tenant_score_adjustment",
                                "Tenant fair-share term of the last score for the tenant.", ["tenant"], registry=r)
        self.inventory = Gauge("flexinfer_scheduler_inventory_objects", "Objects in the in-memory inventory.",
                               ["kind"], registry=r)
        self.restarts = Counter("flexinfer_scheduler_watch_restarts_total", "Watch re-lists and back-offs.",
                                ["kind", "reason"], registry=r)

    def on_restart(self, kind: str, reason: str) -> None:
        self.restarts.labels(kind, reason).inc()


class ExtenderApp:
    """Routes and verbs; all state is the inventory (read-only here), the NodeList facts cache and
    the metrics."""

    def __init__(self, settings: ExtenderSettings, inventory: Inventory,
                 metrics: ExtenderMetrics | None = None) -> None:
        self.settings = settings
        self.inventory = inventory
        self.metrics = metrics or ExtenderMetrics()
        self.node_cache = NodeFactsCache()  # facts of NodeList items by their exact JSON

    # -- routing ------------------------------------------------------------------------------------

    def dispatch(self, method: str, path: str, body: bytes) -> Reply:
        """Answer one request. Never raises: bugs become a 500 with a logged traceback."""
        verb = path.rstrip("/").rsplit("/", 1)[-1] if path.rstrip("/") else ""
        t0 = time.perf_counter()
        try:
            if verb in ("filter", "score", "prioritize"):
                if method != "POST":
                    reply = Reply(405, wire.error_result(f"{verb} needs POST"))
                elif verb == "filter":
                    reply = self.filter(body)
                else:
                    reply = self.score(body)
            elif path in ("/healthz", "/livez"):
                reply = Reply(200, b"ok", TEXT) if method in ("GET", "HEAD") else Reply(405, b"", TEXT)
            elif path == "/readyz":
                ok = self.inventory.synced
                reply = Reply(200 if ok else 503, b"ok" if ok else b"inventory not synced", TEXT)
            elif path == "/metrics":
                self._refresh_gauges()
                reply = Reply(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST.encode())
            else:
                reply = Reply(404, wire.error_result(f"no route for {method} {path}"))
        except Exception:  # pragma: no cover - a bug; keep serving
            log.exception("extender %s %s failed", method, path)
            reply = Reply(500, wire.error_result("internal error"))
        if verb in ("filter", "score", "prioritize"):
            name = "score" if verb == "prioritize" else verb
            self.metrics.requests.labels(name, str(reply.status)).inc()
            self.metrics.duration.labels(name).observe(time.perf_counter() - t0)
        return reply

    def _refresh_gauges(self) -> None:
        inv = self.inventory
        self.metrics.inventory.labels("nodes").set(len(inv.nodes))
        self.metrics.inventory.labels("configmaps").set(len(inv.configmaps))
        self.metrics.inventory.labels("pods").set(len(inv.pods))

    # -- verbs --------------------------------------------------------------------------------------

    def _parse(self, body: bytes, verb: str) -> tuple[wire.ExtenderArgs, list[int] | None]:
        """The request, read against the verb's previous NodeList when there is one
        (:func:`wire.walk_items`), else by :func:`wire.parse_args` (raises :class:`wire.WireError`)."""
        prev = self.node_cache.previous_items(verb)
        walked = wire.walk_items(body, prev) if prev else None
        if walked is not None:
            return walked
        return wire.parse_args(body), None

    def _candidates(self, args: wire.ExtenderArgs, verb: str, known: list[int] | None = None) -> Candidates | Reply:
        """Facts of the request's nodes. Raises :class:`wire.WireError` for a bad NodeList item."""
        if args.items is not None:  # the fast path: raw items, facts from the cache
            facts = self.node_cache.resolve(args.items, verb, known)
            return Candidates(facts, [], [f.name for f in facts], args.items)
        if args.nodes is not None:
            return Candidates(self.node_cache.facts(args.nodes), [], [n.name for n in args.nodes], None)
        if not self.inventory.nodes_synced:
            return Reply(503, wire.error_result("node cache not synced yet"))
        names = args.node_names or []
        facts, missing = self.inventory.lookup(names)
        return Candidates(facts, missing, names, None)

    def filter(self, body: bytes) -> Reply:
        """``ExtenderArgs`` → ``ExtenderFilterResult``."""
        try:
            args, known = self._parse(body, "filter")
            got = self._candidates(args, "filter", known)
        except wire.WireError as exc:
            return Reply(400, wire.filter_result([], {}, {}, error=str(exc)))
        if isinstance(got, Reply):
            return got
        facts, missing = got.facts, got.missing
        pod = logic.pod_facts(args.pod, self.settings.tenant_label_key)
        out = logic.filter_nodes(pod, facts)
        for name in missing:
            if name not in out.failed and name not in out.passed:
                out.failed[name] = UNKNOWN_NODE_REASON
                out.codes[name] = [logic.REASON_UNKNOWN_NODE]
        self.metrics.nodes.labels("filter").observe(len(facts) + len(missing))
        counts: dict[str, int] = {}
        for codes in out.codes.values():
            for code in codes:
                counts[code] = counts.get(code, 0) + 1
        for code, n in counts.items():
            self.metrics.filtered.labels(code).inc(n)
        echo = None
        if args.is_nodes_form:
            raws = got.raws if got.raws is not None else [n.json() for n in args.nodes or []]
            echo = (got.names, raws)
        return Reply(200, wire.filter_result(out.passed, out.failed, out.unresolvable, echo=echo))

    def score(self, body: bytes) -> Reply:
        """``ExtenderArgs`` → ``HostPriorityList`` with integer scores 0..10."""
        try:
            args, known = self._parse(body, "score")
            got = self._candidates(args, "score", known)
        except wire.WireError as exc:
            return Reply(400, wire.error_result(str(exc)))
        if isinstance(got, Reply):
            return got
        facts, missing = got.facts, got.missing
        pod = logic.pod_facts(args.pod, self.settings.tenant_label_key)
        inv = self.inventory
        used = inv.tenant_used(pod.tenant)
        inputs = logic.ScoreInputs(bench=inv.bench(pod.namespace),
                                   fallback_tps=inv.deployment_tps(pod.namespace, pod.deployment),
                                   tenant_used_gpus=used)
        static = None if args.is_nodes_form else inv.nodes.static
        scores = logic.score_nodes(pod, facts, self.settings, inputs, static)
        for name in missing:
            scores.setdefault(name, 0)
        if self.settings.tenant_fairshare_enabled:
            self.metrics.tenant_usage.labels(pod.tenant).set(used / self.settings.tenant_budget_gpus)
            self.metrics.tenant_adj.labels(pod.tenant).set(logic.tenant_adjustment(self.settings, used))
        self.metrics.nodes.labels("score").observe(len(scores))
        return Reply(200, wire.priority_list(scores, list(dict.fromkeys(got.names))))


class ExtenderHandler:
    """``flexinfer.http`` handler: everything is decided by :meth:`ExtenderApp.dispatch`."""

    def __init__(self, app: ExtenderApp) -> None:
        self.app = app

    def on_headers(self, req: Request) -> FlexInferError | None:
        return None

    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        reply = self.app.dispatch(req.method, req.path, req.body)
        resp.send(reply.status, [(b"content-type", reply.content_type)], reply.body)


def make_app(settings: ExtenderSettings, namespace: str = "", **kw: Any) -> ExtenderApp:
    """An app with a fresh inventory (not yet watching) and metrics."""
    return ExtenderApp(settings, Inventory(settings, namespace), **kw)
