"""Two ``flexinfer proxy`` replicas sharing one real ``redis-server`` (``PROXY_REDIS_URL``).

Each replica is its own process, as two pods behind a Service would be: the limits hold across both,
least-loaded sees the other replica's open requests, and Redis killed and restarted in the middle of
a load run fails no request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.proxy._procs import Load, inventory, proxy, request, samples, stub_engines
from tests.proxy.test_workers_shared import LIMIT
from tests.redis_server import RedisServer


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:  # started
        yield server


def _replicas(stack: ExitStack, inv: Path, redis: RedisServer, **extra: str) -> list[int]:
    return [stack.enter_context(proxy(inv, PROXY_REDIS_URL=redis.url, PROXY_REPLICA_ID=rid, **extra))
            for rid in ("replica-a", "replica-b")]


async def _redis_up(port: int) -> float:
    _, _, body = await request(port, "GET", "/metrics")
    values = [v for (name, _), v in samples(body.decode()).items() if name == "flexinfer_proxy_redis_up"]
    assert values, "no flexinfer_proxy_redis_up series"
    return min(values)


async def _until_redis_up(ports: list[int], want: float, timeout: float) -> None:
    end = time.monotonic() + timeout
    while True:
        if all([await _redis_up(p) == want for p in ports]):
            return
        assert time.monotonic() < end, f"redis_up never became {want}"
        await asyncio.sleep(0.05)


def test_two_replicas_admit_r_t_plus_b(tmp_path: Path, redis: RedisServer) -> None:
    with stub_engines(1) as engines, ExitStack() as stack:
        ports = _replicas(stack, inventory(tmp_path, engines), redis, **LIMIT)
        asyncio.run(_until_redis_up(ports, 1.0, 10.0))
        load = asyncio.run(Load(ports, seconds=5.0, concurrency=8).run())
    expected = 100 * load.window + 100
    admitted = load.codes[200]
    assert set(load.codes) <= {200, 429}, load.codes
    assert load.codes[429] > admitted, load.codes
    assert abs(admitted - expected) <= 0.02 * expected, (admitted, expected, load.codes)


def test_least_loaded_moves_away_from_a_replica_busy_through_the_other(tmp_path: Path, redis: RedisServer) -> None:
    async def route(port: int) -> str:
        status, headers, _ = await request(port, "POST", "/v1/chat/completions", b'{"model":"m","messages":[]}')
        assert status == 200
        return headers["x-flexinfer-route"].rsplit(";", 1)[1]

    async def scenario(a: int, b: int) -> tuple[str, list[str]]:
        await _until_redis_up([a, b], 1.0, 10.0)
        before = await route(b)  # nothing open anywhere: the first endpoint
        slow = [asyncio.ensure_future(request(a, "POST", "/v1/chat/completions", b'{"model":"pin","messages":[]}',
                                              {"x-stub-delay": "3"})) for _ in range(6)]
        await asyncio.sleep(0.6)  # a few sync intervals (0.1 s): B has read A's counts
        during = [await route(b) for _ in range(20)]
        for s in slow:
            assert (await s)[0] == 200
        return before, during

    with stub_engines(2) as engines, ExitStack() as stack:
        a, b = _replicas(stack, inventory(tmp_path, engines, pin=True), redis)
        before, during = asyncio.run(scenario(a, b))
    first, second = (f"127.0.0.1:{p}" for p in engines)
    assert before == first
    assert during == [second] * 20, during


def test_redis_killed_and_restarted_mid_run_fails_no_request(tmp_path: Path, redis: RedisServer) -> None:
    high = {"PROXY_RATE_LIMIT_ENABLED": "true", "PROXY_RATE_LIMIT_GLOBAL": "100000",
            "PROXY_RATE_LIMIT_GLOBAL_BURST": "100000", "PROXY_RATE_LIMIT_PER_MODEL": "100000",
            "PROXY_RATE_LIMIT_BURST": "100000"}

    async def scenario(ports: list[int]) -> Load:
        await _until_redis_up(ports, 1.0, 10.0)
        load = asyncio.ensure_future(Load(ports, seconds=5.0, concurrency=8).run())
        await asyncio.sleep(1.0)
        redis.kill()
        await _until_redis_up(ports, 0.0, 2.0)  # noticed within a bounded time, while serving
        await asyncio.sleep(0.5)
        await asyncio.to_thread(redis.start)
        await _until_redis_up(ports, 1.0, 3.0)  # sharing again, still under load
        return await load

    with stub_engines(2) as engines, ExitStack() as stack:
        ports = _replicas(stack, inventory(tmp_path, engines), redis, **high)
        load = asyncio.run(scenario(ports))
    assert set(load.codes) == {200}, load.codes
    assert load.codes[200] > 100, load.codes
