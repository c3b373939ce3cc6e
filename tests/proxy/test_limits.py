"""Rate limits: refused requests get 429 + Retry-After and never reach the backend."""

from __future__ import annotations

import random

import openai
import pytest

from flexinfer.errors import RateLimited
from flexinfer.proxy.limits import Limiter
from flexinfer.proxy.metrics import ProxyMetrics
from flexinfer.settings import ProxySettings
from tests.proxy.conftest import Stack, fast_settings, model


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_per_model_limit_through_the_proxy(stack: Stack) -> None:
    s = fast_settings(rate_limit_enabled=True, rate_limit_per_model=0.5, rate_limit_burst=3)
    stack.start_proxy([model("a", stack.stub), model("b", stack.stub)], s)
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    ok = refused = 0
    for _ in range(8):
        try:
            c.chat.completions.create(model="a", messages=[{"role": "user", "content": "x"}])
            ok += 1
        except openai.RateLimitError as e:
            refused += 1
            assert e.code == "rate_limit_exceeded"
            assert int(e.response.headers["retry-after"]) >= 1
    assert (ok, refused) == (3, 5)
    assert len(stack.stub.requests) == 3  # refusals never reached the backend
    c.chat.completions.create(model="b", messages=[{"role": "user", "content": "x"}])  # b has its own bucket
    text = stack.call(lambda: stack.handler.metrics.render().decode())  # type: ignore[union-attr]
    assert 'flexinfer_proxy_rate_limited_total{model="a",scope="model"} 5.0' in text


def test_global_first_then_model() -> None:
    clock = Clock()
    s = ProxySettings(rate_limit_enabled=True, rate_limit_global=10, rate_limit_global_burst=2,
                      rate_limit_per_model=100, rate_limit_burst=100)
    lim = Limiter(s, ProxyMetrics(), clock)
    lim.check("a")
    lim.check("b")
    with pytest.raises(RateLimited) as ei:
        lim.check("a")
    assert ei.value.retry_after == 1
    clock.t += 0.1
    lim.check("a")


@pytest.mark.parametrize(("rate", "burst"), [(50.0, 10), (5.0, 3)])
def test_admits_rate_times_t_plus_burst(rate: float, burst: int) -> None:
    clock = Clock()
    s = ProxySettings(rate_limit_enabled=True, rate_limit_global=1e6, rate_limit_global_burst=10**6,
                      rate_limit_per_model=rate, rate_limit_burst=burst)
    lim = Limiter(s, ProxyMetrics(), clock)
    rng = random.Random(7)
    admitted, seconds, end = 0, 60.0, clock.t + 60.0
    while clock.t < end:  # arrivals at twice the rate, jittered off the refill boundaries
        try:
            lim.check("m")
            admitted += 1
        except RateLimited:
            pass
        clock.t += rng.uniform(0.8, 1.2) / (2 * rate)
    expected = rate * seconds + burst
    assert abs(admitted - expected) <= 0.02 * expected
