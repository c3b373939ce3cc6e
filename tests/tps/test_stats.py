"""bench runner statistics (pure): percentiles and the rate of one sample."""

from __future__ import annotations

import pytest

from flexinfer import tps
from flexinfer.tps import Sample


def test_percentile() -> None:
    vals = [float(v) for v in range(1, 101)]
    assert tps.percentile(vals, 50) == pytest.approx(50.5)
    assert tps.percentile(vals, 90) == pytest.approx(90.1)
    assert tps.percentile(vals, 99) == pytest.approx(99.01)
    assert tps.percentile([3.0], 99) == 3.0


def test_sample_rate_formula() -> None:
    s = Sample(tokens=128, chunks=128, latency=2.0, ttft=0.1, decode_seconds=1.27)
    assert s.decode_tokens == 127 and s.tokens_per_second == pytest.approx(100.0)
    one = Sample(tokens=1, chunks=1, latency=0.5, ttft=0.4)
    assert one.tokens_per_second == pytest.approx(2.0)  # no decode window: tokens / wall time
