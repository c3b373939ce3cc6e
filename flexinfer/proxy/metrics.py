"""Every Prometheus object of the proxy, defined once.

One :class:`ProxyMetrics` per proxy instance, each with its own registry (several proxies can run in
one test process). Label children are cached so the hot path pays one dict lookup per observation.
Counters of the HTTP core (connections, rejections) are plain integers read at scrape time by a
custom collector, so the core never calls into Prometheus.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "flexinfer_proxy"
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0, 300.0)
QUEUE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


class _ServerCollector(Collector):
    """Reads the HTTP core's plain counters (``ServerStats``) at scrape time."""

    def __init__(self, stats_source: Callable[[], Any]) -> None:
        self._source = stats_source

    def collect(self) -> Iterator[Any]:
        stats = self._source()
        if stats is None:
            return
        g = GaugeMetricFamily(f"{PREFIX}_active_connections", "Open client connections.")
        g.add_metric([], getattr(stats, "connections_active", 0))
        yield g
        c = CounterMetricFamily(f"{PREFIX}_connections", "Client connections accepted.")
        c.add_metric([], getattr(stats, "connections_total", 0))
        yield c
        r = CounterMetricFamily(f"{PREFIX}_http_rejections", "Requests refused by the HTTP core.",
                                labels=["reason"])
        for reason, n in sorted(getattr(stats, "rejections", {}).items()):
            r.add_metric([reason], n)
        yield r


class ProxyMetrics:
    """The proxy's metrics; ``render()`` gives the Prometheus text exposition."""

    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry(auto_describe=True)
        self.requests = Counter(f"{PREFIX}_requests", "Requests answered, by model and status code.",
                                ["model", "code"], registry=reg)
        self.duration = Histogram(f"{PREFIX}_request_duration_seconds", "Time from request to last byte.",
                                  ["model"], buckets=LATENCY_BUCKETS, registry=reg)
        self.ttfb = Histogram(f"{PREFIX}_time_to_first_byte_seconds",
                              "Time from request to the response head sent to the client.",
                              ["model"], buckets=LATENCY_BUCKETS, registry=reg)
        self.in_flight = Gauge(f"{PREFIX}_requests_in_flight", "Requests being proxied.", ["model"],
                               registry=reg)
        self.upstream_errors = Counter(f"{PREFIX}_upstream_errors", "Upstream failures by reason.",
                                       ["reason"], registry=reg)
        self.upstream_retries = Counter(f"{PREFIX}_upstream_retries",
                                        "Requests retried on another replica before anything was sent.",
                                        ["model"], registry=reg)
        self.client_aborts = Counter(f"{PREFIX}_client_aborts", "Clients that went away mid-request.",
                                     ["model"], registry=reg)
        self.rate_limited = Counter(f"{PREFIX}_rate_limited", "Requests refused by a rate limit.",
                                    ["model", "scope"], registry=reg)
        self.routing_decisions = Counter(f"{PREFIX}_routing_decisions", "Routing decisions.",
                                         ["model", "strategy", "key_source"], registry=reg)
        self.max_tokens_clamped = Counter(f"{PREFIX}_max_tokens_clamped", "max_tokens lowered to fit.",
                                          ["model"], registry=reg)
        self.queue_depth = Gauge(f"{PREFIX}_queue_depth", "Requests waiting for a model to wake.",
                                 ["model"], registry=reg)
        self.queue_wait = Histogram(f"{PREFIX}_queue_wait_seconds", "Time requests waited for a model.",
                                    ["model"], buckets=QUEUE_BUCKETS, registry=reg)
        self.queue_rejected = Counter(f"{PREFIX}_queue_rejected", "Requests refused: queue full.",
                                      ["model"], registry=reg)
        self.activations = Counter(f"{PREFIX}_activations", "Model wake-ups by result.",
                                   ["model", "result"], registry=reg)
        self.activation_duration = Histogram(f"{PREFIX}_activation_duration_seconds",
                                             "Time from wake to ready.", ["model", "result"],
                                             buckets=QUEUE_BUCKETS, registry=reg)
        self._req_children: dict[tuple[str, int], Any] = {}
        self._model_children: dict[str, tuple[Any, Any, Any]] = {}
        self._stats_source: Callable[[], Any] = lambda: None
        reg.register(_ServerCollector(lambda: self._stats_source()))

    def bind_server_stats(self, source: Callable[[], Any]) -> None:
        self._stats_source = source

    def per_model(self, model: str) -> tuple[Any, Any, Any]:
        """(duration, ttfb, in_flight) children for a model, cached."""
        ch = self._model_children.get(model)
        if ch is None:
            ch = (self.duration.labels(model), self.ttfb.labels(model), self.in_flight.labels(model))
            self._model_children[model] = ch
        return ch

    def count(self, model: str, code: int) -> None:
        key = (model, code)
        child = self._req_children.get(key)
        if child is None:
            child = self._req_children[key] = self.requests.labels(model, str(code))
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
