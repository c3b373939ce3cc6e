"""F14 (reliability plan RL1 + RL3): rate limits of ``flexinfer proxy --workers 2``, a real process.

One proxy process with two workers (SO_REUSEPORT; GCRA buckets in the machine's shared memory) in
front of the stub engine, which runs in this process so that every request reaching it is counted.
- RL3: N requests written at once against a full bucket of burst b: admitted <= b + r x (the span of
  the burst), i.e. no over-admission across the workers.
- RL1: then, after the bucket refilled, arrivals at 2r for T seconds (open loop, a fresh connection
  each so both workers answer): admitted = r x T + b within ± 2 %; each refusal is a 429 with
  Retry-After >= 1; the engine saw exactly the admitted requests (429s reach it 0 times).
RL2 (precedence; one model's limit leaves another's alone) is tests/proxy/test_limits.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.harness import LoopThread
from tests.proxy._procs import inventory, proxy, request
from tests.proxy._rel import chat_body, figure
from tests.stub_engine import StubEngine


def limit_env(rate: int, burst: int) -> dict[str, str]:
    return {"PROXY_RATE_LIMIT_ENABLED": "true", "PROXY_RATE_LIMIT_GLOBAL": str(rate),
            "PROXY_RATE_LIMIT_GLOBAL_BURST": str(burst),
            "PROXY_RATE_LIMIT_PER_MODEL": "100000", "PROXY_RATE_LIMIT_BURST": "100000"}


async def post(port: int, i: int) -> tuple[int, str]:
    status, headers, _ = await request(port, "POST", "/v1/chat/completions", chat_body("m", f"req-{i}"))
    return status, headers.get("retry-after", "")


async def all_at_once(port: int, n: int) -> tuple[list[tuple[int, str]], float]:
    t0 = time.monotonic()
    out = await asyncio.gather(*(post(port, i) for i in range(n)))
    return out, time.monotonic() - t0


async def paced(port: int, rate: float, seconds: float) -> tuple[list[tuple[int, str]], float]:
    tasks = []
    t0 = time.monotonic()
    i = 0
    while (t := t0 + i / rate) < t0 + seconds:
        await asyncio.sleep(max(0.0, t - time.monotonic()))
        tasks.append(asyncio.ensure_future(post(port, 10**6 + i)))
        i += 1
    window = time.monotonic() - t0  # the bucket refills over the span of the arrivals
    return await asyncio.gather(*tasks), window


def limits(tmp: Path, n_burst: int, seconds: float, rate: int = 100, burst: int = 100) -> None:
    engine = LoopThread()
    stub = engine.run(StubEngine().start())
    try:
        with proxy(inventory(tmp, [stub.port]), workers=2, **limit_env(rate, burst)) as port:
            b_out, span = asyncio.run(all_at_once(port, n_burst))
            time.sleep(1.5 * burst / rate)  # the bucket is full again
            engine.call(stub.requests.clear)
            p_out, window = asyncio.run(paced(port, 2 * rate, seconds))
            hits = engine.call(lambda: len(stub.requests))
        b_codes, p_codes = Counter(s for s, _ in b_out), Counter(s for s, _ in p_out)
        expected = rate * window + burst
        admitted = p_codes[200]
        retry_afters = [int(r) for s, r in b_out + p_out if s == 429]
        figure("F14-RL3", workers=2, sent=n_burst, admitted=b_codes[200], allowed=burst + rate * span,
               span_s=span, codes=dict(b_codes))
        figure("F14-RL1", workers=2, rate=rate, burst=burst, window_s=window, sent=len(p_out), admitted=admitted,
               expected=expected, error_pct=(admitted - expected) / expected * 100, backend_hits=hits,
               refused_429=p_codes[429], min_retry_after=min(retry_afters or [0]))
        assert set(b_codes) <= {200, 429} and set(p_codes) <= {200, 429}, (b_codes, p_codes)
        assert len(p_out) / window >= 1.5 * rate, (len(p_out), window)  # the client did overload the limit
        assert burst * 0.98 <= b_codes[200] <= burst + rate * span, (b_codes, span)  # RL3: no over-admission
        assert abs(admitted - expected) <= 0.02 * expected, (admitted, expected)  # RL1
        assert hits == admitted, (hits, admitted)  # 429s reach the backend 0 times
        assert retry_afters and min(retry_afters) >= 1
    finally:
        if stub.server is not None:
            engine.run(stub.stop())
        engine.close()


def test_two_workers_ci(tmp_path: Path) -> None:
    limits(tmp_path, n_burst=200, seconds=3.0, rate=50, burst=50)


@pytest.mark.reliability
def test_two_workers_full(tmp_path: Path) -> None:
    limits(tmp_path, n_burst=1000, seconds=60.0)
