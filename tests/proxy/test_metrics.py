"""The per-request series kept as plain numbers export exactly what prometheus_client objects with
the same names, labels and buckets would (``_created`` values aside); their plain rows (the
cross-worker snapshot) are what they collect; the cross-worker text writer writes what
prometheus_client writes."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from flexinfer.proxy import prom
from flexinfer.proxy.metrics import LATENCY_BUCKETS, PREFIX, ProxyMetrics


def _oracle() -> tuple[CollectorRegistry, Counter, Histogram, Histogram, Gauge]:
    reg = CollectorRegistry()
    requests = Counter(f"{PREFIX}_requests", "Requests answered, by model and status code.",
                       ["model", "code"], registry=reg)
    duration = Histogram(f"{PREFIX}_request_duration_seconds", "Time from request to last byte.",
                         ["model"], buckets=LATENCY_BUCKETS, registry=reg)
    ttfb = Histogram(f"{PREFIX}_time_to_first_byte_seconds",
                     "Time from request to the response head sent to the client.",
                     ["model"], buckets=LATENCY_BUCKETS, registry=reg)
    in_flight = Gauge(f"{PREFIX}_requests_in_flight", "Requests being proxied.", ["model"], registry=reg)
    return reg, requests, duration, ttfb, in_flight


def _section(text: str, names: tuple[str, ...]) -> str:
    """The lines of ``names`` only, with ``_created`` values masked."""
    lines = [line for line in text.splitlines()
             if any(line.startswith((n, f"# HELP {n} ", f"# TYPE {n} ")) for n in names)]
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", "\n".join(lines))


def test_plain_series_match_prometheus_client() -> None:
    reg, requests, duration, ttfb, in_flight = _oracle()
    m = ProxyMetrics()
    for model, value in (("a", 0.0005), ("a", 0.001), ("a", 0.0011), ("b", 0.7), ("a", 400.0), ("b", 5.0)):
        duration.labels(model).observe(value)
        ttfb.labels(model).observe(value / 3)
        in_flight.labels(model).inc()
        st = m.model(model)
        st.observe_duration(value)
        st.observe_ttfb(value / 3)
        st.in_flight += 1
    in_flight.labels("b").dec()
    m.model("b").in_flight -= 1
    in_flight.labels("idle")
    m.model("idle")  # a model seen but never observed: zero series, as a fresh child
    duration.labels("idle")
    ttfb.labels("idle")
    for model, code in (("a", 200), ("a", 200), ("", 404), ("b", 502)):
        requests.labels(model, str(code)).inc()
        m.count(model, code)
    names = (f"{PREFIX}_requests", f"{PREFIX}_request_duration_seconds", f"{PREFIX}_time_to_first_byte_seconds",
             f"{PREFIX}_requests_in_flight")
    want = _section(generate_latest(reg).decode(), names)
    got = _section(m.render().decode(), names)
    assert got == want
    assert 'flexinfer_proxy_requests_total{code="200",model="a"} 2.0' in got
    parsed = {f.name: f.type for f in text_string_to_metric_families(m.render().decode())}
    assert parsed[f"{PREFIX}_requests"] == "counter"
    assert parsed[f"{PREFIX}_request_duration_seconds"] == "histogram"
    assert parsed[f"{PREFIX}_requests_in_flight"] == "gauge"


def test_a_single_shared_worker_renders_exactly_what_prometheus_client_does(tmp_path: Path) -> None:
    m = ProxyMetrics()
    for model in ("a", 'q"uo\\te\nnl', "ünï"):
        m.count(model, 200)
        m.model(model).observe_duration(0.01)
        m.model(model).observe_ttfb(1e-7)
        m.rate_limited.labels(model, "global").inc()
        m.queue_wait.labels(model).observe(2e6)
    m.model("a").duration_sum = 12345678.5  # a value that floatToGoString writes with an exponent
    m.upstream_errors.labels("timeout", "10.0.0.1:8000").inc()
    m.bind_server_stats(lambda: SimpleNamespace(connections_active=1, connections_total=2, rejections={}))
    want = generate_latest(m.registry)
    assert m.render() == want
    m.share_across_workers(str(tmp_path), 0, 1)
    assert m.render() == want
    assert b"e+07" in want and b'q\\"uo\\\\te\\nnl' in want


def test_rows_are_what_collect_gives(tmp_path: Path) -> None:
    m = ProxyMetrics()
    m.count("a", 200)
    m.count("", 404)
    m.model("a").observe_duration(0.4)
    m.model("a").in_flight = 2
    m.model("idle")
    m.decided("a", "least_loaded", "none")
    assert m.registry.rows() == prom.collected_rows(m.registry)
    assert m.registry.rows() == prom.collected_rows(m.registry)  # the label caches


def test_answers_and_decisions_are_counted_per_label_set_whatever_the_order() -> None:
    """The tallies (nested by label, both twins): interleaved models, codes, strategies and sources
    each count alone, keep the stamp of their first count, and render as one series each."""
    import random

    rnd = random.Random(7)
    m = ProxyMetrics()
    want_codes: dict[tuple[str, int], int] = {}
    want_picks: dict[tuple[str, str, str], int] = {}
    for _ in range(500):
        model, code = rnd.choice(["a", "b", ""]), rnd.choice([200, 404, 429, 502])
        m.count(model, code)
        want_codes[(model, code)] = want_codes.get((model, code), 0) + 1
        pick = (rnd.choice(["a", "b"]), rnd.choice(["least_loaded", "affinity"]), rnd.choice(["none", "user"]))
        m.decided(*pick)
        want_picks[pick] = want_picks.get(pick, 0) + 1
    created = {(mo, c): t.created for mo, codes in m._requests.items() for c, t in codes.items()}
    m.count("a", 200)
    want_codes[("a", 200)] += 1
    assert created[("a", 200)] == m._requests["a"][200].created
    got_codes: dict[tuple[str, int], float] = {}
    got_picks: dict[tuple[str, str, str], float] = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for smp in fam.samples:
            if smp.name == f"{PREFIX}_requests_total":
                got_codes[(smp.labels["model"], int(smp.labels["code"]))] = smp.value
            elif smp.name == f"{PREFIX}_routing_decisions_total":
                got_picks[(smp.labels["model"], smp.labels["strategy"], smp.labels["key_source"])] = smp.value
    assert got_codes == want_codes and got_picks == want_picks
    assert m.totals("b")[0] == {c: n for (mo, c), n in want_codes.items() if mo == "b"}
    assert m.totals("never")[0] == {}


def test_latency_bucket_is_bisect_left() -> None:
    """The histograms' bucket lookup (a loop the build runs in C) answers as bisect_left does: at
    every bound, between bounds, beyond the last, and for 0, negatives, inf and NaN."""
    import bisect
    import math
    import random

    from flexinfer.proxy.metrics import _latency_bucket

    rnd = random.Random(15)
    values = [rnd.uniform(-1.0, 400.0) for _ in range(5000)] + [rnd.uniform(0.0, 0.02) for _ in range(5000)]
    values += list(LATENCY_BUCKETS) + [math.nextafter(b, math.inf) for b in LATENCY_BUCKETS]
    values += [0.0, -0.0, -1.0, 1e-12, math.inf, -math.inf, math.nan]
    assert [_latency_bucket(v) for v in values] == [bisect.bisect_left(LATENCY_BUCKETS, v) for v in values]
    assert _latency_bucket(LATENCY_BUCKETS[-1] * 2) == len(LATENCY_BUCKETS)  # +Inf
