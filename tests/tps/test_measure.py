"""bench runner measuring loop: warm-up, the iteration/duration rules, readiness, errors, model and
backend discovery."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer import tps
from flexinfer.tps import BenchConfig, BenchError
from flexinfer.tps.config import HTTPStatusError
from tests.tps.fake_openai import FakeOpenAI, bench_cfg

# ---- iteration and duration rules ------------------------------------------------------------------


def test_iterations_and_warmup(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay = 3, 0.001
    res = tps.run_bench(bench_cfg(fake, warmup=2, iterations=4))
    assert res.iterations == 4 and fake.chat_requests == 6


def test_min_duration_extends_iterations(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay, fake.ttft = 5, 0.02, 0.01  # ~0.09 s per request
    res = tps.run_bench(bench_cfg(fake, iterations=2, min_duration=0.5))
    assert res.duration_seconds >= 0.5
    assert res.iterations >= 4
    assert res.duration_seconds >= sum(s.latency for s in res.samples) * 0.99


def test_readiness_wait_retries_503(fake: FakeOpenAI) -> None:
    fake.fail_first = 2
    res = tps.run_bench(replace_cfg(bench_cfg(fake, warmup=1, iterations=2), ready_poll=0.01))
    assert res.iterations == 2 and fake.chat_requests == 5  # 2 refused + 1 warm-up + 2 measured


def test_readiness_timeout(fake: FakeOpenAI) -> None:
    fake.fail_first = 100
    cfg = replace_cfg(bench_cfg(fake, warmup=1, ready_timeout=0.05), ready_poll=0.02)
    with pytest.raises(BenchError, match=r"not ready after 0.05 s: HTTP 503: model is loading"):
        tps.run_bench(cfg)


def test_non_retryable_status_fails_at_once(fake: FakeOpenAI) -> None:
    fake.fail_first, fake.fail_status = 5, 401
    with pytest.raises(HTTPStatusError, match="HTTP 401"):
        tps.run_bench(bench_cfg(fake, warmup=1))
    assert fake.chat_requests == 1


def replace_cfg(cfg: BenchConfig, **kw: Any) -> BenchConfig:
    import dataclasses

    return dataclasses.replace(cfg, **kw)


# ---- model discovery ---------------------------------------------------------------------------------


def test_model_and_backend_discovered(fake: FakeOpenAI) -> None:
    fake.models = [{"id": "smol", "object": "model", "metadata": {"backend": "llamacpp"}}]
    res = tps.run_bench(bench_cfg(fake, model="", iterations=1))
    assert res.model == "smol" and res.backend == "llamacpp" and fake.bodies[0]["model"] == "smol"


def test_model_required_when_ambiguous(fake: FakeOpenAI) -> None:
    fake.models = [{"id": "a"}, {"id": "b"}]
    with pytest.raises(BenchError, match="lists 2 models: a, b"):
        tps.run_bench(bench_cfg(fake, model=""))
