"""bench runner client (one timed request) against a fake OpenAI streaming server: TTFT, the decode
window and the tokens, usage chunks, the non-stream path, the request body and auth."""

from __future__ import annotations

import json

import pytest

from flexinfer import tps
from flexinfer.tps import BenchError
from flexinfer.tps.client import request_body
from tests.tps.fake_openai import FakeOpenAI, bench_cfg

# ---- timing --------------------------------------------------------------------------------------


def server_rate(fake: FakeOpenAI, tokens_per_chunk: float = 1.0) -> float:
    """tokens/s as the server actually sent them (first to last content chunk)."""
    decode = sum(last - first for _, first, last in fake.sent)
    return sum(tokens_per_chunk * (fake.chunks - 1) for _ in fake.sent) / decode


def test_stream_tokens_per_second_and_ttft(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay, fake.ttft = 11, 0.02, 0.06
    res = tps.run_bench(bench_cfg(fake, backend="x"))
    assert res.iterations == 3 and fake.chat_requests == 3 and len(fake.sent) == 3
    # 11 chunks, 10 intervals of 20 ms: 50 tokens/s as scheduled; compare with what the server really
    # did (robust on a loaded machine) and loosely with the schedule
    assert res.tokens_per_second == pytest.approx(server_rate(fake), rel=0.12)
    assert 30 <= res.tokens_per_second <= 62, res.tokens_per_second
    for s, (recv, first, last) in zip(res.samples, fake.sent, strict=True):
        assert s.tokens == 11 and s.chunks == 11 and not s.usage
        assert s.decode_seconds is not None and s.decode_seconds == pytest.approx(last - first, abs=0.025)
        assert s.ttft is not None and first - recv - 0.002 <= s.ttft <= first - recv + 0.05
        assert s.latency >= s.ttft + s.decode_seconds
    assert res.ttft_p50 is not None and 0.058 <= res.ttft_p50 <= 0.2
    assert res.completion_tokens == 33
    assert res.e2e_tokens_per_second < res.tokens_per_second


def test_usage_chunk_counts_tokens(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay, fake.usage = 6, 0.02, 12  # 2 tokens per chunk
    res = tps.run_bench(bench_cfg(fake))
    assert all(s.tokens == 12 and s.usage for s in res.samples)
    assert fake.bodies[0]["stream_options"] == {"include_usage": True}
    # 12 tokens over 6 chunks, 5 intervals of 20 ms: 10 tokens in 0.1 s = 100 tokens/s
    assert res.tokens_per_second == pytest.approx(server_rate(fake, 2.0), rel=0.15)
    assert 60 <= res.tokens_per_second <= 125, res.tokens_per_second


def test_non_stream_uses_usage_and_wall_time(fake: FakeOpenAI) -> None:
    fake.chunks, fake.delay, fake.ttft, fake.usage = 6, 0.02, 0.1, 40  # ~0.2 s per request
    res = tps.run_bench(bench_cfg(fake, stream=False))
    assert fake.bodies[0]["stream"] is False and "stream_options" not in fake.bodies[0]
    assert all(s.tokens == 40 and s.ttft is None and s.decode_seconds is None for s in res.samples)
    assert 150 <= res.tokens_per_second <= 205, res.tokens_per_second  # 40 / 0.2 s
    assert res.ttft_p50 is None


def test_non_stream_without_usage_is_an_error(fake: FakeOpenAI) -> None:
    with pytest.raises(BenchError, match=r"usage\.completion_tokens"):
        tps.run_bench(bench_cfg(fake, stream=False))


def test_request_body_and_auth(fake: FakeOpenAI) -> None:
    tps.run_bench(bench_cfg(fake, iterations=1, api_key="sekret", max_tokens=64, prompt="hi"))
    body = fake.bodies[0]
    assert body["model"] == "fake" and body["max_tokens"] == 64 and body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert fake.headers_seen[0]["authorization"] == "Bearer sekret"


def test_default_prompt_and_max_tokens() -> None:
    cfg = tps.load_config({"MODEL_NAME": "m"})
    body = json.loads(request_body(cfg, "m"))
    assert body["messages"][0]["content"] == "Write a long story about a space adventure to Mars."
    assert body["max_tokens"] == 128
    assert (cfg.warmup, cfg.iterations, cfg.min_duration) == (2, 5, 30.0)
