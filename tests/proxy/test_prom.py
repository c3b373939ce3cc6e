"""flexinfer.proxy.prom, the proxy's own metric types and text writer, against prometheus_client
as the oracle: the same operations give the same exposition, byte for byte."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PCounter
from prometheus_client import Gauge as PGauge
from prometheus_client import Histogram as PHistogram
from prometheus_client import generate_latest as p_generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.utils import floatToGoString

from flexinfer.proxy import prom


def _masked(text: bytes) -> str:
    """The exposition with ``_created`` values masked (each side makes its own)."""
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text.decode())


def _drive(counter: object, gauge: object, hist: object, plain: object, seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(300):
        model = rnd.choice(["a", "b", 'q"uo\\te\nnl', "ünï"])
        op = rnd.randrange(4)
        if op == 0:
            counter.labels(model, str(rnd.choice([200, 404]))).inc(rnd.choice([1, 2.5, 0]))  # type: ignore[attr-defined]
        elif op == 1:
            g = gauge.labels(model=model)  # type: ignore[attr-defined]
            rnd.choice([g.inc, g.dec, g.set])(rnd.choice([1, -3.25, 1e7, 0.1]))
        elif op == 2:
            hist.labels(model).observe(rnd.choice([0.0, 0.05, 0.1, 0.7, 3.0, 1e9, 12345678.5]))  # type: ignore[attr-defined]
        else:
            plain.inc()  # type: ignore[attr-defined]


def test_the_same_operations_give_prometheus_clients_exposition() -> None:
    want_reg, got_reg = CollectorRegistry(), prom.Registry()
    sides = []
    for mod, reg in ((None, want_reg), (prom, got_reg)):
        C = PCounter if mod is None else prom.Counter
        G = PGauge if mod is None else prom.Gauge
        H = PHistogram if mod is None else prom.Histogram
        counter = C("flexinfer_test_requests_total", "Requests.\nSecond \\ line.", ["model", "code"], registry=reg)
        gauge = G("flexinfer_test_in_flight", "In flight.", ["model"], registry=reg)
        hist = H("flexinfer_test_seconds", "Seconds.", ["model"], buckets=(0.1, 0.5, 1.0, 1e8), registry=reg)
        plain = C("flexinfer_test_plain", "No labels.", registry=reg)
        G("flexinfer_test_untouched", "Labelled, never used.", ["x"], registry=reg)
        _drive(counter, gauge, hist, plain, seed=7)
        sides.append(reg)
    want = p_generate_latest(want_reg)
    assert _masked(prom.generate_latest(got_reg)) == _masked(want)
    # and prometheus_client's writer reads our registry (collect()) to the same bytes as ours
    assert p_generate_latest(got_reg) == prom.generate_latest(got_reg)
    assert b"e+07" in want and b'q\\"uo\\\\te\\nnl' in want and b"flexinfer_test_untouched" in want


def test_values_and_names_are_written_as_prometheus_client_writes_them() -> None:
    rnd = random.Random(3)
    values = [0, 1, -1, 1e6, 999999.9, 1e7, 12345678.5, 1e15, 1e16, 1e22, -1e7, math.inf, -math.inf, math.nan,
              1e-7, 5e-324, 1234567.0, 1000000.0]
    values += [rnd.random() * 10 ** rnd.randint(-30, 30) * rnd.choice((1, -1)) for _ in range(20000)]
    values += [float(rnd.randint(0, 10 ** rnd.randint(1, 20))) for _ in range(20000)]
    assert [prom.float_to_go_string(v) for v in values] == [floatToGoString(v) for v in values]
    for name in ("a", "a:b", "9ab", "a-b.c", "ünï", "__x", "_", "a b", "1", "x9", "é9", ":x"):
        assert prom._metric_name(name) == escape_metric_name(name)
        assert prom._label_name(name) == escape_label_name(name)


class _ForeignCollector:
    """A prometheus_client collector, as the serve runtime registers them."""

    def collect(self) -> Iterator[object]:
        c = CounterMetricFamily("flexinfer_swap_loads", "Model loads.", labels=["model"])
        c.add_metric(["m"], 3, created=1700000000.0)
        yield c
        g = GaugeMetricFamily("flexinfer_swap_resident", "Resident models.")
        g.add_metric([], 2)
        yield g


def test_a_prometheus_client_collector_registers_by_duck_type() -> None:
    ours, theirs = prom.Registry(), CollectorRegistry()
    ours.register(_ForeignCollector())
    theirs.register(_ForeignCollector())
    assert prom.generate_latest(ours) == p_generate_latest(theirs)
    assert ours.get_sample_value("flexinfer_swap_loads_total", {"model": "m"}) == 3
    assert ours.get_sample_value("flexinfer_swap_loads_total", {"model": "x"}) is None
    with pytest.raises(ValueError, match="Duplicated"):
        prom.Counter("flexinfer_swap_loads", "Again.", registry=ours)


def test_bad_use_is_refused_as_prometheus_client_refuses_it() -> None:
    reg = prom.Registry()
    c = prom.Counter("flexinfer_x", "X.", ["model"], registry=reg)
    for call in (lambda: c.labels("a").inc(-1), lambda: c.labels("a", "b"), lambda: c.labels(),
                 lambda: c.inc(), lambda: c.labels("a", model="a"), lambda: c.labels(other="a"),
                 lambda: prom.Counter("bad name", "X."), lambda: prom.Gauge("g", "G.", ["bad-label"]),
                 lambda: prom.Gauge("g", "G.", ["__reserved"]),
                 lambda: prom.Histogram("h", "H.", ["le"]), lambda: prom.Histogram("h", "H.", buckets=(2, 1)),
                 lambda: prom.Gauge("g", "G.").labels("x"),
                 lambda: prom.Counter("flexinfer_x_total", "Same family.", registry=reg),
                 lambda: prom.Gauge("flexinfer_x_created", "A sample name the counter gives.", registry=reg)):
        with pytest.raises(ValueError):
            call()
    assert reg.get_sample_value("flexinfer_x_total", {"model": "a"}) == 0.0  # the refused -1 not added
    c.labels(model="a").inc(2)
    assert reg.get_sample_value("flexinfer_x_total", {"model": "a"}) == 2.0
    c.remove("a")
    assert reg.get_sample_value("flexinfer_x_total", {"model": "a"}) is None
    reg.unregister(c)
    prom.Counter("flexinfer_x", "Free again.", registry=reg)
