"""The simulation benchmark's halves: the simulated engine (bench/simengine.py) and the open-loop load
(bench/simload.py), over real sockets, judged by the engine's own accounting, never wall-clock bounds."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.simengine import BLOCK_CHARS, PrefixCache, SimConfig, SimEngine, block_hashes
from bench.simload import Result, percentile, plan, prefix_counters, run_load, summarize


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def chat(s: aiohttp.ClientSession, eng: SimEngine, text: str, max_tokens: int = 4,
               stream: bool = False) -> Any:
    """The JSON answer, or the list of streamed events (without ``[DONE]``)."""
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "stream": stream, "stream_options": {"include_usage": True}}
    async with s.post(eng.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        if not stream:
            return await r.json()
        events = []
        async for raw in r.content:
            line = raw.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                events.append(json.loads(line[6:]))
        return events


async def stop(*engines: SimEngine) -> None:
    for e in engines:
        await e.stop()
    for e in engines:
        assert not e.errors, e.errors


def metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "le" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def test_capacity_one_queues_the_second_request(session: aiohttp.ClientSession) -> None:
    eng = await SimEngine(SimConfig(capacity=1, prefill_block_s=0.01, decode_token_s=0.01)).start()
    try:
        first = asyncio.create_task(chat(session, eng, "a" * 640, max_tokens=10))
        await eng.wait_for(lambda: eng.running == 1)
        second = asyncio.create_task(chat(session, eng, "b" * 640, max_tokens=10))
        await eng.wait_for(lambda: eng.waiting == 1)
        await asyncio.gather(first, second)
        r1, r2 = eng.records
        assert r1.arrived <= r2.arrived
        assert r2.admitted >= r1.finished  # it waited for the only slot
        # its TTFT includes the rest of the first's service time, then its own prefill
        assert r2.first_token - r2.arrived >= (r1.finished - r2.arrived) + r2.prefill_s - 1e-6
        assert r1.service >= r1.prefill_s + r1.decode_s - 1e-6
        assert r1.wait < r2.wait
        assert eng.running == 0 and eng.waiting == 0
    finally:
        await stop(eng)


async def test_waiting_request_whose_client_leaves_gives_up_its_place(session: aiohttp.ClientSession) -> None:
    eng = await SimEngine(SimConfig(capacity=1, decode_token_s=0.01)).start()
    try:
        first = asyncio.create_task(chat(session, eng, "x", max_tokens=30, stream=True))
        await eng.wait_for(lambda: eng.running == 1)
        gone = asyncio.create_task(chat(session, eng, "y", max_tokens=30))
        await eng.wait_for(lambda: eng.waiting == 1)
        gone.cancel()
        await eng.wait_for(lambda: eng.waiting == 0)
        events = await first
        assert eng.running == 0 and eng.records[1].admitted == 0.0  # never ran
        assert sum(1 for e in events if e["choices"] and e["choices"][0]["delta"].get("content")) == 30
    finally:
        await stop(eng)


async def test_repeated_prompt_hits_the_prefix_cache(session: aiohttp.ClientSession) -> None:
    eng = await SimEngine(SimConfig(prefill_block_s=0.001, decode_token_s=0.001)).start()
    try:
        prompt = "shared system prompt " * 40  # 840 chars = 14 blocks (last one partial)
        await chat(session, eng, prompt)
        await chat(session, eng, prompt)
        await chat(session, eng, prompt + "and a new question")
        a, b, c = eng.records
        assert a.blocks == b.blocks == 14 and a.cached_blocks == 0 and a.prefill_s > 0
        assert b.cached_blocks == 14 and b.prefill_s == 0.0 < a.prefill_s
        assert c.cached_blocks == 13 and 0 < c.prefill_s < a.prefill_s  # the partial last block differs
        m = metrics(await (await session.get(eng.url + "/metrics")).text())
        assert m["vllm:prefix_cache_queries_total"] == a.blocks + b.blocks + c.blocks
        assert m["vllm:prefix_cache_hits_total"] == 27
        assert m["vllm:kv_cache_usage_perc"] == len(eng.cache) / 2000
    finally:
        await stop(eng)


def test_prefix_cache_lru_is_bounded_and_counts_the_leading_run() -> None:
    cache = PrefixCache(4)
    a, b, c = (block_hashes(ch * 2 * BLOCK_CHARS) for ch in "abc")
    cache.insert(a)
    cache.insert(b)
    assert cache.lookup(a) == 2  # a is now the most recent
    cache.insert(c)  # evicts b, the least recent
    assert len(cache) == 4 and cache.usage == 1.0
    assert cache.lookup(b) == 0 and cache.lookup(a) == 2 and cache.lookup(c) == 2
    long = block_hashes("z" * 10 * BLOCK_CHARS)
    cache.insert(long)
    assert len(cache) == 4
    assert cache.lookup(long) == 0  # its first blocks were evicted: no leading run
    assert block_hashes("q" * 64 + "r")[0] == block_hashes("q" * 64 + "s")[0]  # chained: same first block
    assert block_hashes("p" + "q" * 64)[1] != block_hashes("o" + "q" * 64)[1]  # ...and the prefix counts


async def test_lru_bound_holds_through_http(session: aiohttp.ClientSession) -> None:
    eng = await SimEngine(SimConfig(cache_blocks=5, prefill_block_s=0.0, decode_token_s=0.0001)).start()
    try:
        for i in range(6):
            await chat(session, eng, f"prompt {i} " * 30)
            assert len(eng.cache) <= 5
        await chat(session, eng, "prompt 0 " * 30)
        assert eng.records[-1].cached_blocks == 0  # evicted long ago
    finally:
        await stop(eng)


async def test_metrics_page_parses_and_shows_running_and_waiting(session: aiohttp.ClientSession) -> None:
    eng = await SimEngine(SimConfig(capacity=1, decode_token_s=1.0, model="sim-m")).start()
    try:
        tasks = [asyncio.create_task(chat(session, eng, f"q{i}", max_tokens=100, stream=True)) for i in range(3)]
        await eng.wait_for(lambda: eng.running == 1 and eng.waiting == 2)
        text = await (await session.get(eng.url + "/metrics")).text()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        assert fams["vllm:time_to_first_token_seconds"].type == "histogram"
        assert fams["vllm:time_per_output_token_seconds"].type == "histogram"
        assert fams["vllm:prefix_cache_hits"].type == "counter"
        m = metrics(text)
        assert m["vllm:num_requests_running"] == 1 and m["vllm:num_requests_waiting"] == 2
        assert fams["vllm:num_requests_running"].samples[0].labels["model_name"] == "sim-m"
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await eng.wait_for(lambda: eng.running == 0 and eng.waiting == 0)  # the slot and places are freed
    finally:
        await stop(eng)


async def test_streaming_shape_and_histograms(session: aiohttp.ClientSession) -> None:
    eng = await SimEngine(SimConfig(prefill_block_s=0.001, decode_token_s=0.001)).start()
    try:
        events = await chat(session, eng, "hello " * 20, max_tokens=7, stream=True)
        assert isinstance(events, list)
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        content = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
        assert len(content) == 7 and content[-1]["choices"][0]["finish_reason"] == "length"
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 7
        body = await chat(session, eng, "hello", max_tokens=3)
        assert isinstance(body, dict) and body["usage"]["completion_tokens"] == 3
        r = eng.records[0]
        assert r.first_token - r.admitted >= r.prefill_s - 1e-6 and r.finished >= r.first_token
        m = metrics(await (await session.get(eng.url + "/metrics")).text())
        assert m["vllm:time_to_first_token_seconds_count"] == 2
        assert m["vllm:time_per_output_token_seconds_count"] == 2
        assert m["vllm:request_success_total"] == 2
    finally:
        await stop(eng)


async def test_slow_factor_multiplies_the_costs(session: aiohttp.ClientSession) -> None:
    cfg = {"prefill_block_s": 0.001, "decode_token_s": 0.001}
    fast = await SimEngine(SimConfig(**cfg)).start()  # type: ignore[arg-type]
    slow = await SimEngine(SimConfig(slow=3.0, **cfg)).start()  # type: ignore[arg-type]
    try:
        await chat(session, fast, "p" * 300, max_tokens=5)
        await chat(session, slow, "p" * 300, max_tokens=5)
        f, s = fast.records[0], slow.records[0]
        assert s.prefill_s == pytest.approx(3 * f.prefill_s) and s.decode_s == pytest.approx(3 * f.decode_s)
    finally:
        await stop(fast, slow)


def test_plan_is_seeded_open_loop_and_shares_prefixes() -> None:
    a, b, c = plan(7, 20, 5), plan(7, 20, 5), plan(8, 20, 5)
    assert a == b and a != c
    assert all(x.at < y.at for x, y in itertools.pairwise(a)) and a[-1].at < 5
    assert 50 <= len(a) <= 160  # ~100 Poisson arrivals
    assert len({p.system for p in a}) > 1
    grown = [p for p in a if p.turn > 1]
    assert grown  # conversations grow turn by turn, each turn extending the previous one
    for p in grown:
        prev = max((q for q in a if q.conversation == p.conversation and q.turn == p.turn - 1), key=lambda q: q.at)
        assert p.messages[:len(prev.messages)] == prev.messages
    assert len({p.max_tokens for p in a}) > 5 and len({len(p.messages[-1][1]) for p in a}) > 5


def test_summarize_percentiles_and_hit_rate() -> None:
    p = plan(1, 10, 1)[0]
    rs = [Result(p, "u", ttft=t / 100, e2e=t / 10) for t in range(1, 101)] + [Result(p, "u", error="timeout")]
    s = summarize(rs, 10.0, (10, 100), (40, 200))
    assert s.requests == 101 and s.ok == 100 and s.errors == 1 and s.error_kinds == {"timeout": 1}
    assert s.ttft_p50 == pytest.approx(0.505) and s.ttft_p99 == pytest.approx(0.9901)
    assert s.e2e_p99 == pytest.approx(9.901) and s.throughput_rps == 10.0
    assert s.hit_rate == pytest.approx(0.3)
    assert percentile([], 50) != percentile([], 50)  # NaN
    page = ('# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{engine="0"} 3\n'
            'vllm:prefix_cache_queries_total{engine="0"} 9\n')
    assert prefix_counters(page) == (3.0, 9.0)


async def test_load_against_two_engines() -> None:
    cfg = {"capacity": 2, "prefill_block_s": 0.002, "decode_token_s": 0.002, "cache_blocks": 500}
    engines = [await SimEngine(SimConfig(**cfg)).start() for _ in range(2)]  # type: ignore[arg-type]
    try:
        results: list[Result] = []
        s = await run_load([e.url for e in engines], "sim", rate=15, seconds=2, seed=3,
                           metrics_urls=[e.url + "/metrics" for e in engines], results=results,
                           max_tokens=(4, 16))
        sent = plan(3, 15, 2, max_tokens=(4, 16))
        assert [r.planned for r in results] == sent  # the seed fixes the sequence
        assert s.requests == len(sent) == sum(len(e.records) for e in engines) > 10
        assert s.errors == 0 and s.ok == s.requests, s.error_kinds
        assert all(r.tokens == r.planned.max_tokens for r in results)
        assert 0 < s.ttft_p50 <= s.ttft_p99 <= s.e2e_p99 and s.throughput_rps > 0 and s.tokens_per_s > 0
        hits = sum(e.hits for e in engines)
        queries = sum(e.queries for e in engines)
        assert s.hit_rate is not None and s.hit_rate == pytest.approx(hits / queries)
        assert 0 < s.hit_rate < 1  # shared system prompts hit
        assert {r.target for r in results} == {e.url for e in engines}
    finally:
        await stop(*engines)
