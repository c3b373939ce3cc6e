"""The operator's Prometheus metrics, defined once, and the ``/metrics`` handler that serves them.

Owns: :class:`OperatorMetrics` (one per ``Operator``, in its own registry, so several operators can
run in one test process): ``flexinfer_operator_reconciles_total`` {kind,result},
``flexinfer_operator_reconcile_duration_seconds`` {kind}, ``flexinfer_operator_queue_depth`` {kind}
(keys due now and not running, read from the work queues at scrape time) and
``flexinfer_operator_api_errors_total`` {verb,code} (every failed attempt of a request of the
operator's own API client, retries included); :class:`MetricsHandler`, the ``flexinfer.http``
handler of the metrics port (``GET /metrics``; 404 otherwise).

``kind`` is the work queue's name (``model``, ``model-group``, ``lora``, ``modeldeployment``,
``modelcache``, ``gpugroup``); ``result`` is ``ok``, ``requeue`` (a next look was scheduled),
``permanent`` (an unusable spec) or ``error`` (the reconcile raised; it is retried with backoff).

Must not: import kopf or a Kubernetes client, or hold reconcile logic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from flexinfer.errors import FlexInferError

if TYPE_CHECKING:
    from flexinfer.http.protocol import Request, ResponseWriter

RECONCILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RESULTS = ("ok", "requeue", "permanent", "error")


class _QueueCollector(Collector):
    """``flexinfer_operator_queue_depth``: read from the queues when scraped (no cost per trigger)."""

    def __init__(self, source: Callable[[], Mapping[str, Any]]) -> None:
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("flexinfer_operator_queue_depth",
                              "Keys of the work queue due now and waiting for a worker.", labels=["kind"])
        for name, q in sorted(self.source().items()):
            g.add_metric([name], q.depth())
        yield g


class OperatorMetrics:
    """The operator's Prometheus objects (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.reconciles = Counter("flexinfer_operator_reconciles", "Reconciles by kind and result.",
                                  ["kind", "result"], registry=r)
        self.duration = Histogram("flexinfer_operator_reconcile_duration_seconds", "Time of one reconcile.",
                                  ["kind"], buckets=RECONCILE_BUCKETS, registry=r)
        self.api_errors = Counter("flexinfer_operator_api_errors",
                                  "Failed Kubernetes API requests of the operator (each attempt), by verb and "
                                  "HTTP status (or Timeout / ConnectionError).", ["verb", "code"], registry=r)
        self._queues: Callable[[], Mapping[str, Any]] = dict
        r.register(_QueueCollector(lambda: self._queues()))

    def bind_queues(self, source: Callable[[], Mapping[str, Any]]) -> None:
        """Where the work queues are (name -> an object with ``depth()``), read at scrape time."""
        self._queues = source

    def reconciled(self, kind: str, result: str, seconds: float) -> None:
        self.reconciles.labels(kind, result).inc()
        self.duration.labels(kind).observe(seconds)

    def api_error(self, verb: str, status: int, reason: str) -> None:
        self.api_errors.labels(verb, str(status) if status else (reason or "NoAnswer")).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsHandler:
    """``flexinfer.http`` handler of the operator's metrics port."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self.metrics = metrics

    def on_headers(self, req: Request) -> FlexInferError | None:
        return None

    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        if req.path == "/metrics" and req.method in ("GET", "HEAD"):
            resp.send(200, [(b"content-type", CONTENT_TYPE_LATEST.encode())], self.metrics.render())
        else:
            resp.send(404, [(b"content-type", b"text/plain; charset=utf-8")], b"not found\n")
