"""Every Prometheus object of the proxy, defined once.

One :class:`ProxyMetrics` per proxy instance, each with its own registry (several proxies can run in
one test process). The per-request series (requests by model and code, request duration, time to
first byte, requests in flight; tokens, time to first token, inter-token latency, and per endpoint
the duration, docs/llm-metrics.md) are plain integers, floats and bucket lists kept by
:class:`ModelStats` / :class:`EndpointStats` and exported at scrape time by a custom collector with the same names, labels,
types and samples (``_created`` included) as labelled metrics would give: a request
pays a few integer additions and no lock. The rarer series are :mod:`flexinfer.proxy.prom` metrics.
Counters of the HTTP core (connections, rejections) are plain integers read at scrape time too, so
the core never calls into Prometheus.
Must not: slow the per-request methods (no lock, no Prometheus call, nothing for the sharing
below), or read the HTTP core beyond its ``ServerStats``.

With ``flexinfer proxy --workers N`` each worker calls :meth:`ProxyMetrics.share_across_workers`
once after the fork: from then on :meth:`ProxyMetrics.render` answers for the whole machine (counters
and histograms summed over the workers, never going backwards across scrapes whoever answers;
``_created`` the minimum; gauges summed or labelled ``worker="<index>"``; the rules and why are in
:mod:`flexinfer.proxy.workermetrics`) and the server tick calls :meth:`ProxyMetrics.publish`. A
single process renders its own registry, as before; the per-request methods are the same either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

from flexinfer.proxy.prom import (
    Counter,
    Family,
    Gauge,
    Histogram,
    Labels,
    Registry,
    SampleRow,
    TextWriter,
    float_to_go_string,
    histogram_rows,
)
from flexinfer.proxy.workermetrics import WorkerShare

PREFIX = "flexinfer_proxy"
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0, 300.0)
#: inter-token latency: engines decode a token every ~5-100 ms; finer below 100 ms than LATENCY_BUCKETS
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
               0.3, 0.5, 1.0, 2.5, 5.0)
#: (model, endpoint) pairs with their own series; more (an inventory churning through replicas) share
#: the endpoint label value "other", so the label stays bounded
MAX_ENDPOINT_SERIES = 1024
QUEUE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


_LATENCY_LE = [float_to_go_string(b) for b in LATENCY_BUCKETS] + ["+Inf"]
_ITL_LE = [float_to_go_string(b) for b in ITL_BUCKETS] + ["+Inf"]


@cython.annotation_typing(False)  # the cpdef of metrics.pxd
def _latency_bucket(seconds: float) -> int:
    """``bisect_left(LATENCY_BUCKETS, seconds)``: the first bucket not below ``seconds``, found by a
    loop the build runs in C (a request's times fall in the first few buckets; the build's call to
    bisect compares boxed floats)."""
    i = 0
    for b in LATENCY_BUCKETS:
        if not b < seconds:  # (bisect_left's own test: a NaN lands in bucket 0, as there)
            return i
        i += 1
    return i


class EndpointStats:
    """The request duration of one (model, endpoint) pair, and the base of :class:`ModelStats`:
    plain numbers, written by one event loop thread (a non-cumulative count per bucket of
    :data:`LATENCY_BUCKETS` plus one for +Inf, and their sum)."""

    __slots__ = ("created", "duration", "duration_sum")

    def __init__(self) -> None:
        self.created = time.time()
        self.duration = [0] * (len(LATENCY_BUCKETS) + 1)
        self.duration_sum = 0.0

    def observe_duration(self, seconds: float) -> None:
        self.duration[_latency_bucket(seconds)] += 1
        self.duration_sum += seconds


class ModelStats(EndpointStats):
    """The per-request series of one model: the duration (:class:`EndpointStats`), time to first
    byte and to first token, inter-token latency (:data:`ITL_BUCKETS`; a stream's gaps are added by
    its usage tap when it ends), tokens, and the in-flight gauge's value."""

    __slots__ = ("completion_tokens", "in_flight", "itl", "itl_sum", "prompt_tokens", "ttfb", "ttfb_sum", "ttft",
                 "ttft_sum")

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.ttfb = [0] * (len(LATENCY_BUCKETS) + 1)
        self.ttfb_sum = 0.0
        self.ttft = [0] * (len(LATENCY_BUCKETS) + 1)  # time to first token (SSE content event)
        self.ttft_sum = 0.0
        self.itl = [0] * (len(ITL_BUCKETS) + 1)  # inter-token latency (ITL_BUCKETS)
        self.itl_sum = 0.0
        self.prompt_tokens = 0  # from the responses' usage
        self.completion_tokens = 0

    def observe_ttfb(self, seconds: float) -> None:
        self.ttfb[_latency_bucket(seconds)] += 1
        self.ttfb_sum += seconds

    def observe_ttft(self, seconds: float) -> None:
        self.ttft[_latency_bucket(seconds)] += 1
        self.ttft_sum += seconds


class Tally:
    """One labelled counter of the per-request tables: how many, since when (its ``_created``), and
    its label pairs (made by the first scrape that exports it)."""

    __slots__ = ("created", "labels", "n")

    def __init__(self, created: float) -> None:
        self.created = created
        self.n = 0
        self.labels: Labels | None = None


_REQUESTS_HELP = "Requests answered, by model and status code."
_DURATION_HELP = "Time from request to last byte."
_TTFB_HELP = "Time from request to the response head sent to the client."
_IN_FLIGHT_HELP = "Requests being proxied."
_DECISIONS_HELP = "Routing decisions (picks of a replica), by model, strategy and key source."
_PROMPT_HELP = "Prompt tokens, from the responses' usage."
_COMPLETION_HELP = "Completion tokens, from the responses' usage."
_TTFT_HELP = "Time from request to the first SSE event that carries content."
_ITL_HELP = "Time between content-carrying SSE events (events of one read share its gap)."
_EP_DURATION_HELP = "Time from the upstream exchange's start to the last byte, by model and endpoint."
_EP_IN_FLIGHT_HELP = "Requests open to an endpoint (host:port) of a model."


class _RequestCollector:
    """Exports the plain per-request numbers of :class:`ProxyMetrics` at scrape time, as rows (the
    registry's ``collect()`` makes objects of them where asked)."""

    def __init__(self, owner: ProxyMetrics) -> None:
        self._owner = owner
        #: model -> (its labels, its labels with each ``le``): made once per model
        self._labels: dict[str, tuple[Labels, list[Labels]]] = {}

    def rows(self) -> list[Family]:
        owner = self._owner
        name = f"{PREFIX}_requests"
        total, created = f"{name}_total", f"{name}_created"
        req: list[SampleRow] = []
        for model, codes in list(owner._requests.items()):
            for code, tally in list(codes.items()):
                labels = tally.labels
                if labels is None:
                    labels = tally.labels = (("model", model), ("code", str(code)))
                req.append((total, labels, tally.n))
                req.append((created, labels, tally.created))
        decname = f"{PREFIX}_routing_decisions"
        dtotal, dcreated = f"{decname}_total", f"{decname}_created"
        dec: list[SampleRow] = []
        for model, strategies in list(owner._decisions.items()):
            for strategy, sources in list(strategies.items()):
                for source, tally in list(sources.items()):
                    dlabels = tally.labels
                    if dlabels is None:
                        dlabels = tally.labels = (("model", model), ("strategy", strategy), ("key_source", source))
                    dec.append((dtotal, dlabels, tally.n))
                    dec.append((dcreated, dlabels, tally.created))
        models = list(owner._models.items())
        labelled = [(st, self._model_labels(m)) for m, st in models]
        duration: list[SampleRow] = []
        ttfb: list[SampleRow] = []
        in_flight: list[SampleRow] = []
        dname, tname = f"{PREFIX}_request_duration_seconds", f"{PREFIX}_time_to_first_byte_seconds"
        for st, (labels, les) in labelled:
            histogram_rows(duration, dname, labels, les, st.duration, st.duration_sum, st.created)
            histogram_rows(ttfb, tname, labels, les, st.ttfb, st.ttfb_sum, st.created)
            in_flight.append((f"{PREFIX}_requests_in_flight", labels, st.in_flight))
        return [(name, "counter", _REQUESTS_HELP, "", req),
                (decname, "counter", _DECISIONS_HELP, "", dec),
                (dname, "histogram", _DURATION_HELP, "", duration),
                (tname, "histogram", _TTFB_HELP, "", ttfb),
                (f"{PREFIX}_requests_in_flight", "gauge", _IN_FLIGHT_HELP, "", in_flight),
                *self._llm_rows(labelled)]

    def _llm_rows(self, labelled: list[tuple[ModelStats, tuple[Labels, list[Labels]]]]) -> list[Family]:
        """Tokens, TTFT, ITL and the per-endpoint series (docs/llm-metrics.md)."""
        owner = self._owner
        out: list[Family] = []
        for name, doc, attr in ((f"{PREFIX}_prompt_tokens", _PROMPT_HELP, "prompt_tokens"),
                                (f"{PREFIX}_completion_tokens", _COMPLETION_HELP, "completion_tokens")):
            rows: list[SampleRow] = []
            for st, (labels, _) in labelled:
                rows.append((f"{name}_total", labels, getattr(st, attr)))
                rows.append((f"{name}_created", labels, st.created))
            out.append((name, "counter", doc, "", rows))
        ttft: list[SampleRow] = []
        itl: list[SampleRow] = []
        tname, iname = f"{PREFIX}_time_to_first_token_seconds", f"{PREFIX}_inter_token_latency_seconds"
        for st, (labels, les) in labelled:
            histogram_rows(ttft, tname, labels, les, st.ttft, st.ttft_sum, st.created)
            ites = [(*labels, ("le", le)) for le in _ITL_LE]
            histogram_rows(itl, iname, labels, ites, st.itl, st.itl_sum, st.created)
        out.append((tname, "histogram", _TTFT_HELP, "", ttft))
        out.append((iname, "histogram", _ITL_HELP, "", itl))
        ename = f"{PREFIX}_endpoint_request_duration_seconds"
        eps: list[SampleRow] = []
        for (m, ep), es in list(owner._endpoints.items()):
            elabels: Labels = (("model", m), ("endpoint", ep))
            histogram_rows(eps, ename, elabels, [(*elabels, ("le", le)) for le in _LATENCY_LE], es.duration,
                            es.duration_sum, es.created)
        out.append((ename, "histogram", _EP_DURATION_HELP, "", eps))
        gname = f"{PREFIX}_endpoint_in_flight"
        out.append((gname, "gauge", _EP_IN_FLIGHT_HELP, "",
                    [(gname, (("model", m), ("endpoint", ep)), n) for m, ep, n in owner.endpoint_load()]))
        return out

    def _model_labels(self, model: str) -> tuple[Labels, list[Labels]]:
        got = self._labels.get(model)
        if got is None:
            labels: Labels = (("model", model),)
            got = self._labels[model] = (labels, [(("model", model), ("le", le)) for le in _LATENCY_LE])
        return got


class _ServerCollector:
    """Reads the HTTP core's plain counters (``ServerStats``) at scrape time."""

    def __init__(self, stats_source: Callable[[], Any]) -> None:
        self._source = stats_source

    def rows(self) -> list[Family]:
        stats = self._source()
        if stats is None:
            return []
        active, total = f"{PREFIX}_active_connections", f"{PREFIX}_connections"
        rejections = f"{PREFIX}_http_rejections"
        return [(active, "gauge", "Open client connections.", "",
                 [(active, (), getattr(stats, "connections_active", 0))]),
                (total, "counter", "Client connections accepted.", "",
                 [(f"{total}_total", (), getattr(stats, "connections_total", 0))]),
                (rejections, "counter", "Requests refused by the HTTP core.", "",
                 [(f"{rejections}_total", (("reason", reason),), n)
                  for reason, n in sorted(getattr(stats, "rejections", {}).items())])]


class ProxyMetrics:
    """The proxy's metrics; ``render()`` gives the Prometheus text exposition."""

    # the per-request tables are C slots in the compiled build (metrics.pxd); "__dict__" for the rest
    __slots__ = ("__dict__", "_decisions", "_endpoints", "_models", "_requests")

    def __init__(self) -> None:
        self.registry = reg = Registry()
        #: model -> status code -> answers. Nested by label, not keyed by a tuple: a request finds its
        #: tally by a str and an int (the str's hash is cached), where a tuple key was built and hashed
        #: twice per request (bench/instr.py, issue 15). Plain numbers, no lock per request.
        self._requests: dict[str, dict[int, Tally]] = {}
        #: model -> strategy -> key source -> picks (``routing_decisions_total``), nested alike
        self._decisions: dict[str, dict[str, dict[str, Tally]]] = {}
        self._models: dict[str, ModelStats] = {}
        self._endpoints: dict[tuple[str, str], EndpointStats] = {}
        #: (model, endpoint, requests open) of every endpoint of the inventory, read at scrape time
        self.endpoint_load: Callable[[], list[tuple[str, str, int]]] = list
        reg.register(_RequestCollector(self))
        self.upstream_errors = Counter(f"{PREFIX}_upstream_errors", "Upstream failures by reason and endpoint.",
                                       ["reason", "endpoint"], registry=reg)
        self.upstream_retries = Counter(f"{PREFIX}_upstream_retries",
                                        "Requests retried on another replica before anything was sent.",
                                        ["model"], registry=reg)
        self.client_aborts = Counter(f"{PREFIX}_client_aborts", "Clients that went away mid-request.",
                                     ["model"], registry=reg)
        self.rate_limited = Counter(f"{PREFIX}_rate_limited", "Requests refused by a rate limit.",
                                    ["model", "scope"], registry=reg)
        self.endpoint_ejections = Counter(f"{PREFIX}_endpoint_ejections",
                                          "Endpoints taken out of rotation after consecutive failures.",
                                          ["model", "endpoint"], registry=reg)
        self.disagg_requests = Counter(f"{PREFIX}_disagg_requests",
                                       "Prefill/decode disaggregation steps by stage and outcome.",
                                       ["model", "stage", "outcome"], registry=reg)
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
        self._stats_source: Callable[[], Any] = lambda: None
        reg.register(_ServerCollector(lambda: self._stats_source()))
        self._share: WorkerShare | None = None
        self._writer = TextWriter()

    def bind_server_stats(self, source: Callable[[], Any]) -> None:
        self._stats_source = source

    def model(self, model: str) -> ModelStats:
        """The per-request numbers of a model (duration, ttfb, in flight), made on first use."""
        st = self._models.get(model)
        if st is None:
            st = self._models[model] = ModelStats()
        return st

    def endpoint(self, model: str, endpoint: str) -> EndpointStats:
        """The per-request numbers of one endpoint of a model, made on first use (bounded:
        :data:`MAX_ENDPOINT_SERIES` pairs, then endpoint ``other``)."""
        key = (model, endpoint)
        es = self._endpoints.get(key)
        if es is None:
            if len(self._endpoints) >= MAX_ENDPOINT_SERIES:
                key = (model, "other")
                es = self._endpoints.get(key)
            if es is None:
                es = self._endpoints[key] = EndpointStats()
        return es

    @cython.annotation_typing(False)  # the cpdef of metrics.pxd
    def count(self, model: str, code: int) -> None:
        """One answered request of ``model`` with status ``code``."""
        codes = self._requests.get(model)
        if codes is None:
            codes = self._requests[model] = {}
        tally = codes.get(code)
        if tally is None:
            tally = codes[code] = Tally(time.time())
        tally.n += 1

    def totals(self, model: str) -> tuple[dict[int, int], int, int]:
        """(answers by status code, prompt tokens, completion tokens) of ``model`` so far: the numbers
        the exported series carry, read without making a series (the local status page shows them)."""
        codes = {c: tally.n for c, tally in self._requests.get(model, {}).items()}
        st = self._models.get(model)
        return codes, (st.prompt_tokens if st is not None else 0), (st.completion_tokens if st is not None else 0)

    @cython.annotation_typing(False)  # the cpdef of metrics.pxd
    def decided(self, model: str, strategy: str, source: str) -> None:
        """One routing decision: ``routing_decisions_total`` of (model, strategy, key source)."""
        strategies = self._decisions.get(model)
        if strategies is None:
            strategies = self._decisions[model] = {}
        sources = strategies.get(strategy)
        if sources is None:
            sources = strategies[strategy] = {}
        tally = sources.get(source)
        if tally is None:
            tally = sources[source] = Tally(time.time())
        tally.n += 1

    def share_across_workers(self, directory: str, index: int, count: int, *,
                             publish_interval: float | None = None) -> None:
        """Make :meth:`render` answer for all ``count`` workers of this machine, this one being
        ``index``; the snapshots live in ``directory`` (private to the machine, kept while it runs).
        Call once in the worker after the fork, before serving; a snapshot left in ``directory`` by
        a dead worker of the same index becomes the base this one's counters continue from.
        ``publish_interval`` (default ``workermetrics.PUBLISH_INTERVAL``, 1 s) bounds how often
        :meth:`publish` writes: longer costs less, and only delays what the other workers' scrapes
        show of this one (and what a crash loses), never the monotonic view."""
        if self._share is not None:
            raise RuntimeError("metrics already shared across workers")
        self._share = WorkerShare(self.registry, directory, index, count, publish_interval)

    def publish(self, force: bool = False) -> None:
        """Publish this worker's snapshot for the other workers' scrapes: the server tick calls it
        (it writes at most once per publish interval unless ``force``; nothing when not shared).
        :meth:`render` publishes by itself."""
        if self._share is not None:
            self._share.publish(force)

    def render(self) -> bytes:
        """The Prometheus text exposition: this process's, or the machine's when shared."""
        if self._share is not None:
            return self._share.render()
        return self._writer.write_rows(self.registry.rows())
