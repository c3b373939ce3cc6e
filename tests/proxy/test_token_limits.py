"""Token-based rate limits through the real proxy, the stub engine and the real ``openai`` client:
the charge settled before the response's last byte (usage of the JSON answer, the final SSE usage chunk, the SSE event
count without one, what a client saw before it left) is what exhausts a bucket, per model and per
API key; limits off set no tap; the Redis ``CHARGE`` script and a proxy whose token buckets live in a
real redis-server; the usage parser and the estimate."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client import CollectorRegistry

from flexinfer._speedups import parse_usage
from flexinfer.proxy.limits import LocalBuckets
from flexinfer.proxy.redisshare import RedisShare
from flexinfer.proxy.tokenlimits import estimate_tokens
from flexinfer.proxy.usage import UsageTap
from flexinfer.settings import ProxySettings, with_changes
from tests.harness import reach
from tests.proxy.conftest import Stack, fast_settings, model
from tests.redis_server import REDIS_SERVER, RedisServer

MSG = [{"role": "user", "content": "hi"}]  # 2 characters: an estimate of 0.5 -> 1 token


def chat(c: openai.OpenAI, usage: str | None = None, **kw: Any) -> Any:
    headers = {"x-stub-usage": usage} if usage else {}
    return c.chat.completions.create(model="m", messages=MSG, extra_headers=headers, **kw)  # type: ignore[arg-type]


def refused(c: openai.OpenAI) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as ei:
        chat(c)
    return ei.value


def metrics(stack: Stack) -> str:
    return stack.call(lambda: stack.handler.metrics.render().decode())


def available(stack: Stack, key: str) -> float:
    lim = stack.handler.token_limiter
    assert lim is not None and isinstance(lim.buckets, LocalBuckets)
    rate, burst = lim.model if key.startswith("tokens:model:") else lim.key  # type: ignore[misc]
    return stack.call(lambda: lim.buckets._token_table().available(key, rate, burst))  # type: ignore[union-attr]


@pytest.fixture
def connect(stack: Stack) -> Iterator[Callable[..., openai.OpenAI]]:
    """Make openai clients of the started proxy (closed at the end)."""
    made: list[openai.OpenAI] = []

    def make(api_key: str = "k") -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=stack.base_url, api_key=api_key, max_retries=0))
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_the_charged_output_tokens_exhaust_the_model_bucket(stack: Stack, connect: Callable[..., openai.OpenAI]) -> None:
    # 600 tokens/min = 10/s, burst 100: a 1-token estimate is nothing, 500 charged tokens are 10 s of debt
    stack.start_proxy([model("m", stack.stub)], fast_settings(token_limit_model_tpm=600, token_limit_model_burst=100))
    client = connect()
    for _ in range(3):
        chat(client)  # usage 5 + 4 each: 3 x 9 = 27 of 100
    assert 70 < available(stack, "tokens:model:m") < 75
    chat(client, usage="5,500")  # admitted (the estimate fits), then 505 charged: the bucket owes a burst
    err = refused(client)
    assert err.code == "rate_limit_exceeded" and err.type == "rate_limit_error"
    retry = int(err.response.headers["retry-after"])
    assert retry == 11  # debt capped at one burst (100 tokens / 10 per s) + the 1 token asked
    assert 10000 < int(err.response.headers["retry-after-ms"]) <= 10100
    assert len(stack.stub.requests) == 4  # the refusal never reached the engine
    assert 'flexinfer_proxy_rate_limited_total{model="m",scope="tokens-model"} 1.0' in metrics(stack)


def test_per_key_limit_one_key_exhausted_the_other_admitted(stack: Stack) -> None:
    s = fast_settings(auth_enabled=True, auth_tokens=("key-a", "key-b"), token_limit_key_tpm=600,
                      token_limit_key_burst=100)
    stack.start_proxy([model("m", stack.stub)], s)
    a = openai.OpenAI(base_url=stack.base_url, api_key="key-a", max_retries=0)
    b = openai.OpenAI(base_url=stack.base_url, api_key="key-b", max_retries=0)
    try:
        chat(a, usage="10,300")
        assert refused(a).code == "rate_limit_exceeded"
        for _ in range(3):
            chat(b)  # b's bucket is its own
        assert stack.handler.token_limiter.model is None  # type: ignore[union-attr]
        text = metrics(stack)
        assert 'flexinfer_proxy_rate_limited_total{model="m",scope="tokens-key"} 1.0' in text
        assert "key-a" not in text  # the bucket ids are digests, never the key
    finally:
        a.close()
        b.close()


def test_streaming_usage_chunk_is_charged(stack: Stack, connect: Callable[..., openai.OpenAI]) -> None:
    stack.start_proxy([model("m", stack.stub)], fast_settings(token_limit_model_tpm=600, token_limit_model_burst=100))
    client = connect()
    t = time.monotonic()
    stream = chat(client, usage="5,20", stream=True, stream_options={"include_usage": True},
                  extra_body={}, timeout=10)
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20  # the client got it too
    # the charge lands before the client's last byte: no wait for it
    # 25 charged, not the 32 events; the bucket refills 10 tokens/s meanwhile (a loaded box is slow)
    assert 74 < available(stack, "tokens:model:m") < 76 + 10 * (time.monotonic() - t)
    stream = chat(client, usage="5,500", stream=True, stream_options={"include_usage": True}, timeout=10)
    list(stream)
    assert available(stack, "tokens:model:m") == 0.0
    assert refused(client).code == "rate_limit_exceeded"


def test_streaming_without_usage_counts_content_events(stack: Stack, connect: Callable[..., openai.OpenAI]) -> None:
    # PROXY_STREAM_USAGE off: the stream carries no usage chunk, the events are counted
    stack.start_proxy([model("m", stack.stub)], fast_settings(token_limit_model_tpm=600, token_limit_model_burst=100,
                                                              stream_usage=False))
    client = connect()
    t = time.monotonic()
    list(client.chat.completions.create(model="m", messages=MSG, stream=True,  # type: ignore[arg-type]
                                        extra_headers={"x-stub-chunks": "40"}))
    # 1 (estimate) + 40 content events; the role chunk ("content":"") and the finish chunk are not counted
    assert 58 < available(stack, "tokens:model:m") < 60 + 10 * (time.monotonic() - t)  # + the refill meanwhile


def test_client_leaving_mid_stream_is_charged_for_what_it_saw(stack: Stack) -> None:
    # 1 token/s: the refill during the test is small next to the charge
    stack.start_proxy([model("m", stack.stub)], fast_settings(token_limit_model_tpm=60, token_limit_model_burst=1000))
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    stream = c.chat.completions.create(model="m", messages=MSG, stream=True, timeout=10,  # type: ignore[arg-type]
                                       extra_headers={"x-stub-chunks": "1000", "x-stub-interval": "0.01"})
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
            if seen == 20:
                break
    stream.close()
    c.close()
    asyncio.run(reach(lambda: available(stack, "tokens:model:m") < 985))
    asyncio.run(reach(lambda: stack.handler.metrics.client_aborts.labels("m").value == 1))
    left = available(stack, "tokens:model:m")
    assert 900 < left < 985  # 1 + the 20 events read (+ those in flight when the close was seen), not 1000


def _spy_taps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the relayed reads a UsageTap sees. UsageTap is an extension type in the compiled
    build (its methods cannot be patched), so the spy is a subclass put where taps are made."""
    seen: list[int] = []

    class SpyTap(UsageTap):
        def observe(self, buf: bytes, end: bool) -> list[bytes] | None:
            seen.append(1)
            return super().observe(buf, end)

    from flexinfer.proxy import forward, tokenlimits
    monkeypatch.setattr(forward, "UsageTap", SpyTap)
    monkeypatch.setattr(tokenlimits, "UsageTap", SpyTap)
    return seen


def test_limits_off_charge_nothing(stack: Stack, connect: Callable[..., openai.OpenAI], monkeypatch: pytest.MonkeyPatch) -> None:
    # the usage tap watches every relay for the token metrics (docs/llm-metrics.md); without token
    # limits there is no charge to settle
    seen = _spy_taps(monkeypatch)
    stack.start_proxy([model("m", stack.stub)], fast_settings(rate_limit_enabled=True))
    client = connect()
    chat(client)
    list(chat(client, stream=True))
    assert stack.handler.token_limiter is None
    asyncio.run(reach(lambda: sum(seen) >= 2))
    # a per-key limit without auth has no key to limit: off as well
    assert not ProxySettings(token_limit_key_tpm=100).auth_enabled
    from flexinfer.proxy.tokenlimits import TokenLimiter
    assert not TokenLimiter.enabled(ProxySettings(token_limit_key_tpm=100))
    assert TokenLimiter.enabled(ProxySettings(token_limit_model_tpm=100))


def test_limits_on_tap_every_relay(stack: Stack, connect: Callable[..., openai.OpenAI], monkeypatch: pytest.MonkeyPatch) -> None:
    # the relay starts from the upstream read of the head (start_relay), before the client has a byte:
    # the tap is set by then and sees the body of both kinds of answer
    seen = _spy_taps(monkeypatch)
    stack.start_proxy([model("m", stack.stub)], fast_settings(token_limit_model_tpm=6000))
    client = connect()
    # the client (another thread) may read the answer before the relay's callback reaches the tap
    chat(client)
    asyncio.run(reach(lambda: sum(seen) >= 1))
    del seen[:]
    list(chat(client, stream=True))
    asyncio.run(reach(lambda: sum(seen) >= 1))


def test_engine_error_gives_the_estimate_back(stack: Stack, connect: Callable[..., openai.OpenAI]) -> None:
    stack.start_proxy([model("m", stack.stub)], fast_settings(token_limit_model_tpm=600, token_limit_model_burst=100))
    client = connect()
    big = [{"role": "user", "content": "x" * 200}]  # 50 estimated tokens
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=big,  # type: ignore[arg-type]
                                       extra_headers={"x-stub-mode": "status:500"})
    asyncio.run(reach(lambda: available(stack, "tokens:model:m") > 99))


# ---- the usage parser, the tap and the estimate --------------------------------------------------------

def test_parse_usage() -> None:
    assert parse_usage(b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}}') == (7, 9)
    nested = b'"usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 1}, "completion_tokens": 2}'
    assert parse_usage(nested) == (3, 2)
    sse = (b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
           b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":4}}\n\ndata: [DONE]\n\n')
    assert parse_usage(sse) == (1, 4)
    assert parse_usage(b'{"usage":{"prompt_tokens":99999999999999}}') == (10**9, 0)  # clamped
    assert parse_usage(b'{"usage":{"total_tokens":3}}') is None
    assert parse_usage(b'{"usage":"lots"}') is None
    assert parse_usage(b"\xff" * 1000 + b'"usage":{') is None  # cut off: no object
    assert parse_usage(b"") is None


def test_tap_is_bounded_and_counts_content_events() -> None:
    tap = UsageTap()
    tap.start(200, True, False, time.perf_counter(), None)
    ev = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    tap.observe(role + ev * 1000, False)
    tap.observe(ev * 5000, False)
    assert tap.events == 6000
    assert len(tap.tail) <= 2 * 16 * 1024
    tap.observe(b"x" * 100_000, False)
    assert len(tap.tail) == 16 * 1024


def test_estimate() -> None:
    assert estimate_tokens({"messages": [{"role": "user", "content": "abcdefgh"}]}, 0, 4.0) == 2.0
    parts = {"messages": [{"content": [{"type": "text", "text": "abcd"}, {"type": "image_url", "image_url": {}}]}]}
    assert estimate_tokens(parts, 0, 4.0) == 1.0
    assert estimate_tokens({"prompt": ["abcd", "efgh"]}, 0, 2.0) == 4.0
    assert estimate_tokens({"input": "abcdefgh"}, 0, 4.0) == 2.0
    assert estimate_tokens(None, 40, 4.0) == 10.0
    assert estimate_tokens({"messages": "bogus", "prompt": 3}, 0, 4.0) == 0.0


# ---- Redis ------------------------------------------------------------------------------------------------

needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server not installed (make redis-server)")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def redis_settings(url: str, **kw: Any) -> ProxySettings:
    return with_changes(fast_settings(redis_url=url, redis_timeout=0.5, redis_sync_interval=0.05), **kw)


@needs_redis
async def test_redis_charge_makes_every_replica_wait(redis_server: RedisServer) -> None:
    s = redis_settings(redis_server.url)
    a = RedisShare(s, CollectorRegistry(), machine_id="A", worker_id="0", local_load=dict)
    b = RedisShare(s, CollectorRegistry(), machine_id="B", worker_id="0", local_load=dict)
    await a.start()
    await b.start()
    try:
        rate, burst = 10.0, 100.0
        async def take(share: RedisShare, n: float) -> float:
            r = share.take("tokens:model:m", rate, burst, n)
            return r if isinstance(r, float) else await r

        assert await take(a, 10.0) == 0.0
        a.charge("tokens:model:m", rate, burst, 500.0)  # background script call
        await reach(lambda: not a._tasks)
        wait = await take(b, 10.0)  # the other replica sees the debt
        assert 10.5 < wait <= 11.0  # 100 owed + 10 wanted at 10/s
        a.charge("tokens:model:m", rate, burst, -1e9)  # a refund, however big: full, not fuller
        await reach(lambda: not a._tasks)
        assert await take(a, 100.0) == 0.0  # (b still refuses until the wait it was told: its cache)
    finally:
        await a.stop()
        await b.stop()


@needs_redis
async def test_redis_charge_falls_back_locally_while_redis_is_away(redis_server: RedisServer) -> None:
    charged: list[tuple[str, float, float, float]] = []
    s = redis_settings(redis_server.url)
    share = RedisShare(s, CollectorRegistry(), machine_id="A", worker_id="0", local_load=dict,
                       charge_fallback=lambda *a: charged.append(a))
    await share.start()
    try:
        redis_server.stop()
        share.charge("tokens:key:x", 10.0, 100.0, 50.0)  # up still believed: the call fails, then local
        await reach(lambda: bool(charged))
        assert charged == [("tokens:key:x", 10.0, 100.0, 50.0)]
        assert not share.up
        share.charge("tokens:key:x", 10.0, 100.0, 5.0)  # down: local at once
        assert charged[-1] == ("tokens:key:x", 10.0, 100.0, 5.0)
    finally:
        await share.stop()


@needs_redis
def test_proxy_token_buckets_in_redis(stack: Stack, redis_server: RedisServer, connect: Callable[..., openai.OpenAI]) -> None:
    s = redis_settings(redis_server.url, token_limit_model_tpm=600, token_limit_model_burst=100)
    share = RedisShare(s, CollectorRegistry(), machine_id="A", worker_id="0", local_load=dict)
    other = RedisShare(s, CollectorRegistry(), machine_id="B", worker_id="0", local_load=dict)
    stack.run(share.start())
    stack.run(other.start())
    try:
        stack.start_proxy([model("m", stack.stub)], s, token_buckets=share)
        client = connect()
        chat(client, usage="5,500")
        stack.run(reach(lambda: not share._tasks))

        async def other_take() -> float:
            r = other.take("tokens:model:m", 10.0, 100.0, 1.0)
            return r if isinstance(r, float) else await r

        assert stack.run(other_take()) > 9.0  # replica B is refused by A's charge
    finally:
        stack.run(share.stop())
        stack.run(other.stop())


# ---- exact counts from the engine's tokenizer --------------------------------------------------------------

@pytest.mark.parametrize(("delay", "expected"), [(0.0, 200 + 5), (1.0, 100 + 5)])
def test_tokenizer_count_else_the_estimate(stack: Stack, connect: Callable[..., openai.OpenAI],
                                           delay: float, expected: int) -> None:
    """400 characters of 200 words: the estimate says 100, the stub's /tokenize 200; a stream without
    a usage chunk charges the admitted count + 5 events. A /tokenize slower than the timeout: the estimate."""
    stack.stub.tokenize_delay = delay
    s = fast_settings(token_limit_model_tpm=60, token_limit_model_burst=1000, token_count="tokenizer",
                      token_count_timeout=0.3, stream_usage=False)  # no usage chunk: the events are counted
    stack.start_proxy([model("m", stack.stub)], s)
    client = connect()
    list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a " * 200}],
                                        stream=True, extra_headers={"x-stub-chunks": "5"}))  # type: ignore[arg-type]
    asyncio.run(reach(lambda: available(stack, "tokens:model:m") < 1000 - expected + 3))
    assert 1000 - expected <= available(stack, "tokens:model:m") < 1000 - expected + 3
    tok = [r for r in stack.stub.requests if r.path == "/tokenize"]
    assert len(tok) == 1 and tok[0].body and b'"prompt"' in tok[0].body


# ---- the machine's shared memory (--workers N) ----------------------------------------------------------

@pytest.fixture
def tables() -> Iterator[tuple[Any, Any]]:
    """Two views of one shared mmap, as two workers have (set up before the stack: closed after it)."""
    import mmap

    from flexinfer._speedups import SharedBuckets

    m = mmap.mmap(-1, SharedBuckets.size(64))
    mine, other = SharedBuckets(m, 64), SharedBuckets(m, 64)
    yield mine, other
    mine.close()
    other.close()
    m.close()


def test_machine_buckets_share_the_charge_with_another_worker(tables: tuple[Any, Any], stack: Stack,
                                                              connect: Callable[..., openai.OpenAI]) -> None:
    """The proxy's token buckets in a shared mmap (as ``--workers N`` makes them): another worker's
    view of the same memory is refused after this proxy charged a large usage (forked processes
    sharing a charge: tests/speedups/test_shmcharge.py)."""
    from flexinfer.proxy.limits import MachineBuckets

    mine, other = tables
    stack.start_proxy([model("m", stack.stub)], fast_settings(token_limit_model_tpm=600, token_limit_model_burst=100),
                      token_buckets=MachineBuckets(mine))
    client = connect()
    chat(client)
    assert MachineBuckets(other).take("tokens:model:m", 10.0, 100.0, 1.0) == 0.0
    chat(client, usage="5,500")
    assert refused(client).code == "rate_limit_exceeded"
    assert 10.0 < MachineBuckets(other).take("tokens:model:m", 10.0, 100.0, 1.0) <= 10.1


def test_the_tap_settles_the_charge_once_when_the_body_is_complete(tables: tuple[Any, Any]) -> None:
    """The relay tells the tap the body is complete before its last write (tests/http/test_head_relay.py);
    the tap settles the request's charge there, with the body's usage, once: the pipeline's own
    settle at the end of the request, or the tap told again, changes nothing."""
    from flexinfer.proxy.limits import MachineBuckets
    from flexinfer.proxy.tokenlimits import TokenCharge

    mine, other = tables
    key, rate, burst = "tokens:model:m", 10.0, 100.0
    assert MachineBuckets(mine).take(key, rate, burst, 1.0) == 0.0  # what admission took
    charge = TokenCharge(MachineBuckets(mine), [(key, rate, burst)], 1.0, 1.0)
    tap = charge.tap
    assert tap.charge is charge
    tap.start(200, False, False, time.perf_counter(), None)
    assert tap.observe(b'{"id":"x","usage":{"prompt_tokens":5,"completion_tokens":500}}', True) is None
    assert 98.5 < other.available(key, rate, burst) <= 100.0  # observing does not charge
    tap.complete()
    assert charge.settled == 505.0 and tap.charge is None  # (the cycle tap <-> charge is broken)
    # the other worker's view, at once: a burst of debt (the charge is capped there), so a token waits
    # 100 / 10 tokens/s to be back at zero, and 1 / 10 more for itself
    assert 10.0 < MachineBuckets(other).take(key, rate, burst, 1.0) <= 10.1
    charge.settle()
    tap.complete()
    assert 9.9 < MachineBuckets(other).take(key, rate, burst, 1.0) <= 10.1 and charge.settled == 505.0


def test_settings_are_checked() -> None:
    from flexinfer.settings import SettingsError

    for bad in ({"token_limit_model_tpm": -1.0}, {"token_estimate_divisor": 0.0}, {"token_count": "exact"},
                {"token_count_timeout": 0.0}):
        with pytest.raises(SettingsError):
            with_changes(ProxySettings(), **bad).validate()
    ProxySettings(token_limit_model_tpm=1000, token_count="tokenizer").validate()


def test_two_workers_share_the_token_charge(tmp_path: Path) -> None:
    """``--workers 2``, request limits off: one worker's 505-token charge makes both refuse (the
    token buckets are the machine's shared GCRA table). Without sharing, the other worker (about
    half of 20 fresh connections) would still admit. The charge is settled before the response's
    last byte is written, so the 20 requests start as soon as the first response is read."""
    from tests.proxy._procs import CHAT, inventory, proxy, request, stub_engines

    with stub_engines(1) as engines, proxy(inventory(tmp_path, engines), workers=2,
                                           PROXY_TOKEN_LIMIT_MODEL_TPM="600",
                                           PROXY_TOKEN_LIMIT_MODEL_BURST="100") as port:

        async def scenario() -> list[int]:
            status, _, _ = await request(port, "POST", "/v1/chat/completions", CHAT % b"m",
                                         {"x-stub-usage": "5,500"})
            assert status == 200
            return [(await request(port, "POST", "/v1/chat/completions", CHAT % b"m"))[0] for _ in range(20)]

        codes = asyncio.run(scenario())
    assert codes == [429] * 20, codes
