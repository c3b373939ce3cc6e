"""KV-cache usage: the Prometheus text parser and the async scraper (2 s timeout)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import pytest

from flexinfer.agent.kv import parse_kv_usage, pod_targets, scrape_kv_usage

VLLM = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3-8B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3-8B"} 0.75
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3-8B"} 3.0
"""
VLLM_OLD = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.4 1712345678000\n'
LLAMACPP = "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.1\n"


@pytest.mark.parametrize(("text", "expected"), [
    (VLLM, 0.5),
    (VLLM_OLD, 0.4),
    (LLAMACPP, 0.1),
    ("llamacpp_kv_cache_usage_ratio 0.3\n", 0.3),
    (VLLM + LLAMACPP, (0.25 + 0.75 + 0.1) / 3),
    ('vllm:kv_cache_usage_perc{model_name="a b}\\"c",x="{"} 0.9\n', 0.9),  # braces/quotes inside labels
    ("vllm:kv_cache_usage_perc NaN\nvllm:kv_cache_usage_perc +Inf\n", None),
    ("vllm:kv_cache_usage_perc 7\n", 1.0),  # clamped
    ("vllm:kv_cache_usage_perc{broken 0.5\nvllm:kv_cache_usage_perc\n", None),
    ("vllm:kv_cache_usage_perc_other 0.5\nvllm:num_requests_running 1\n", None),
    ("", None),
    ("\x00\xff garbage {{{ \n", None),
])
def test_parse(text: str, expected: float | None) -> None:
    got = parse_kv_usage(text)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_pod_targets() -> None:
    pod = {"metadata": {}, "status": {"phase": "Running", "podIP": "10.1.2.3"},
           "spec": {"containers": [{"ports": [{"containerPort": 8080}, {"containerPort": 9999, "protocol": "UDP"}]},
                                   {"ports": [{"containerPort": 5000, "name": "http"}]}]}}
    assert pod_targets(pod) == ("10.1.2.3", [8080, 5000, 8000, 11434])
    assert pod_targets({**pod, "status": {"phase": "Pending", "podIP": "10.1.2.3"}}) is None
    assert pod_targets({**pod, "status": {"phase": "Running"}}) is None
    assert pod_targets({**pod, "metadata": {"deletionTimestamp": "now"}}) is None
    assert pod_targets({}) is None


async def _serve(handler: Any) -> tuple[aiohttp.web.AppRunner, int]:
    app = aiohttp.web.Application()
    app.router.add_get("/metrics", handler)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


@pytest.fixture
async def servers() -> AsyncIterator[dict[str, int]]:
    async def vllm(_: Any) -> aiohttp.web.Response:
        return aiohttp.web.Response(text=VLLM)

    async def llamacpp(_: Any) -> aiohttp.web.Response:
        return aiohttp.web.Response(text=LLAMACPP)

    async def no_kv(_: Any) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="process_cpu_seconds_total 1\n")

    release = asyncio.Event()

    async def hang(_: Any) -> aiohttp.web.Response:
        await release.wait()
        return aiohttp.web.Response(text=VLLM)

    async def error(_: Any) -> aiohttp.web.Response:
        return aiohttp.web.Response(status=500, text=VLLM)

    started = {name: await _serve(h) for name, h in
               (("vllm", vllm), ("llamacpp", llamacpp), ("no_kv", no_kv), ("hang", hang), ("error", error))}
    yield {name: port for name, (_, port) in started.items()}
    release.set()
    for runner, _ in started.values():
        await runner.cleanup()


def pod(*ports: int) -> dict[str, Any]:
    return {"metadata": {}, "status": {"phase": "Running", "podIP": "127.0.0.1"},
            "spec": {"containers": [{"ports": [{"containerPort": p} for p in ports]}]}}


async def test_scrape_average_over_pods(servers: dict[str, int]) -> None:
    pods = [pod(servers["vllm"]), pod(servers["llamacpp"]), pod(servers["no_kv"]), pod(servers["error"])]
    got = await scrape_kv_usage(pods, default_ports=())
    assert got == pytest.approx((0.5 + 0.1) / 2)


async def test_scrape_tries_ports_in_order(servers: dict[str, int]) -> None:
    got = await scrape_kv_usage([pod(servers["no_kv"], 1, servers["llamacpp"])], default_ports=())
    assert got == pytest.approx(0.1)


async def test_scrape_timeout_bounds_the_round(servers: dict[str, int]) -> None:
    t0 = time.monotonic()
    got = await scrape_kv_usage([pod(servers["hang"]), pod(servers["vllm"])], timeout=0.3, default_ports=())
    assert got == pytest.approx(0.5)
    assert time.monotonic() - t0 < 4.0  # the hang server never answers
    t0 = time.monotonic()
    assert await scrape_kv_usage([pod(servers["hang"], servers["hang"], servers["hang"])], timeout=0.3,
                                 default_ports=(), deadline=0.5) is None
    assert time.monotonic() - t0 < 3.0


async def test_scrape_nothing() -> None:
    assert await scrape_kv_usage([]) is None
    assert await scrape_kv_usage([pod(1)], default_ports=(), timeout=0.5) is None  # connection refused
