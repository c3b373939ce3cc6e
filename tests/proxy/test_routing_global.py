"""The router's ``failover`` and ``weighted`` strategies (the global proxy's; docs/globalproxy.md)."""

from __future__ import annotations

from collections import Counter

from flexinfer.proxy.routing import Router
from flexinfer.runtime.base import Endpoint, ModelView

EPS = (Endpoint("10.0.0.1", 80), Endpoint("10.0.0.2", 80), Endpoint("10.0.0.3", 80))


def test_failover_takes_the_first_not_excluded() -> None:
    r, view = Router(), ModelView("m", EPS, routing="failover")
    assert r.pick(view, None, {})[0] == EPS[0]  # type: ignore[arg-type]
    assert r.pick(view, None, {}, frozenset({EPS[0].key}))[0] == EPS[1]  # type: ignore[arg-type]


def test_weighted_counts_follow_the_weights_exactly_and_interleave() -> None:
    r = Router()
    view = ModelView("m", EPS, routing="weighted", weights={EPS[0].key: 5, EPS[1].key: 2, EPS[2].key: 0})
    picks = [r.pick(view, None, {})[0].key for _ in range(70)]  # type: ignore[arg-type]
    assert Counter(picks) == {EPS[0].key: 50, EPS[1].key: 20}
    assert "".join("a" if p == EPS[0].key else "b" for p in picks[:7]).count("aaaaa") == 0  # smooth: interleaved
    only = r.pick(view, None, {}, frozenset({EPS[0].key, EPS[1].key}))[0]  # type: ignore[arg-type]
    assert only == EPS[2]  # weight 0, but the only one left
