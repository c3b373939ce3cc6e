"""The ``scored`` strategy through ``flexinfer proxy`` as a process: engine metrics scraped from the
engines' ``/metrics`` pages steer the scheduler chain (Kthena's defaults)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from tests.harness import free_port
from tests.proxy._procs import ROOT, env, proxy, request
from tests.proxy.conftest import Stack

PAGE = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {waiting}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} 0.5
"""
FAST = {"PROXY_ENGINE_SCRAPE_INTERVAL": "0.1", "PROXY_ENGINE_SCRAPE_TIMEOUT": "0.1",
        "PROXY_ENGINE_METRICS_MAX_AGE": "0.5"}


def _inventory(tmp: Path, ports: list[int], scheduler: str | None = None) -> Path:
    eps = ", ".join(f"http://127.0.0.1:{p}" for p in ports)
    text = f"models:\n  - name: m\n    routing: scored\n    endpoints: [{eps}]\n"
    if scheduler is not None:
        text += f"    scheduler: {scheduler!r}\n"
    path = tmp / "inv.yaml"
    path.write_text(text)
    return path


async def _route(port: int) -> str:
    status, headers, _ = await request(port, "POST", "/v1/chat/completions", b'{"model":"m","messages":[]}')
    assert status == 200
    strategy, _, ep = headers["x-flexinfer-route"].split(";")
    assert strategy == "scored"
    return ep


def test_a_deep_queue_sends_traffic_to_the_other_engine_and_back(tmp_path: Path) -> None:
    stack = Stack()
    try:
        a, b = stack.add_stub(), stack.add_stub()
        a.metrics_text = PAGE.format(waiting=20, running=4)  # a deep queue: the least-request filter drops it
        b.metrics_text = PAGE.format(waiting=0, running=1)
        keys = {f"127.0.0.1:{s.port}": s for s in (a, b)}
        with proxy(_inventory(tmp_path, [a.port, b.port]), **FAST) as port:

            async def scenario() -> tuple[list[str], list[str]]:
                end = time.monotonic() + 10
                while a.metrics_hits < 2 or b.metrics_hits < 2:  # both pages scraped
                    assert time.monotonic() < end, "the engines were never scraped"
                    await asyncio.sleep(0.05)
                first = [await _route(port) for _ in range(10)]
                a.metrics_text = PAGE.format(waiting=0, running=0)
                b.metrics_text = PAGE.format(waiting=30, running=4)
                hits = b.metrics_hits
                while b.metrics_hits < hits + 2:  # the flipped pages were read
                    assert time.monotonic() < end + 10, "no new scrape"
                    await asyncio.sleep(0.05)
                return first, [await _route(port) for _ in range(10)]

            first, then = asyncio.run(scenario())
        assert [keys[k] is b for k in first] == [True] * 10, first
        assert [keys[k] is a for k in then] == [True] * 10, then
    finally:
        stack.close()


def test_a_bad_scheduler_is_refused_at_start(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, [1234], scheduler="least-request:1,fastest:2")
    out = subprocess.run([sys.executable, "-m", "flexinfer.cli", "proxy", "-c", str(inv), "--port", str(free_port())], cwd=ROOT,
                         env=env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "model 'm': scheduler:" in out.stderr and "fastest" in out.stderr, out.stderr
