"""LLM metrics through the real proxy over real sockets: tokens from the responses' ``usage`` (JSON
and the final SSE chunk), the usage chunk the proxy asks for on a stream's behalf and removes again
byte-exact (the stub engine, and a raw backend in this file that splits the stream across reads at
chosen offsets: the stub writes one event per chunk and cannot), time to first token and
inter-token latency observation counts, the ``endpoint`` label with two replicas of which one
refuses connections, and the RequestContext fields the access log reads. Scrapes are real
``GET /metrics`` requests, parsed with ``prometheus_client``'s parser."""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flexinfer._speedups import sse_scan
from flexinfer.proxy.usage import UsageTap, ask_usage
from tests.harness import free_port, reach
from tests.proxy.conftest import Stack, fast_settings, model

MSG = [{"role": "user", "content": "hi"}]


def scrape(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``GET /metrics`` of the proxy: sample name + sorted labels -> value."""
    conn = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def post_raw(port: int, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    """The de-chunked response body of one POST, as bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, json.dumps(body).encode(),
                     {"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read()
    finally:
        conn.close()


@pytest.fixture
def client(stack: Stack) -> Iterator[Callable[[], openai.OpenAI]]:
    made: list[openai.OpenAI] = []

    def make() -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0, timeout=10))
        return made[-1]

    yield make
    for c in made:
        c.close()


# ---- tokens, the asked-for usage chunk, stripping --------------------------------------------------------

def test_tokens_counted_and_usage_chunk_only_when_asked(stack: Stack, client: Callable[[], openai.OpenAI]) -> None:
    stack.start_proxy([model("m", stack.stub)], fast_settings())
    c = client()
    hdr = {"x-stub-usage": "7,11", "x-stub-chunks": "6"}
    chunks = list(c.chat.completions.create(model="m", messages=MSG, stream=True,  # type: ignore[arg-type]
                                            extra_headers=hdr))
    assert all(ch.usage is None for ch in chunks) and all(ch.choices for ch in chunks)  # no usage chunk
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "".join(f"tok{i} " for i in range(6))
    sent = json.loads(stack.stub.requests[-1].body)
    assert sent["stream_options"] == {"include_usage": True}  # asked upstream on the client's behalf
    asked = list(c.chat.completions.create(model="m", messages=MSG, stream=True,  # type: ignore[arg-type]
                                           stream_options={"include_usage": True},
                                           extra_headers={"x-stub-usage": "3,4"}))
    assert asked[-1].usage is not None and asked[-1].usage.prompt_tokens == 3  # passed through unchanged
    out = c.chat.completions.create(model="m", messages=MSG, extra_headers={"x-stub-usage": "100,200"})  # type: ignore[arg-type]
    assert out.usage is not None and out.usage.completion_tokens == 200
    m: dict[Any, float] = {}

    def counted() -> bool:
        m.update(scrape(stack))
        return sample(m, "flexinfer_proxy_completion_tokens_total", model="m") == 11 + 4 + 200

    asyncio.run(reach(counted))
    assert sample(m, "flexinfer_proxy_prompt_tokens_total", model="m") == 7 + 3 + 100


def test_setting_off_sends_the_body_untouched(stack: Stack, client: Callable[[], openai.OpenAI]) -> None:
    stack.start_proxy([model("m", stack.stub)], fast_settings(stream_usage=False))
    list(client().chat.completions.create(model="m", messages=MSG, stream=True))  # type: ignore[arg-type]
    assert "stream_options" not in json.loads(stack.stub.requests[-1].body)
    assert sample(scrape(stack), "flexinfer_proxy_completion_tokens_total", model="m") == 0  # unknown: nothing


def test_asking_for_usage_keeps_the_model_rewrite(stack: Stack, client: Callable[[], openai.OpenAI]) -> None:
    # stream_options present without include_usage: the body is re-encoded, with the served name
    stack.start_proxy([model("m", stack.stub, served_name="engine-m")], fast_settings())
    list(client().chat.completions.create(model="m", messages=MSG, stream=True,  # type: ignore[arg-type]
                                          stream_options={"include_usage": False}))
    sent = json.loads(stack.stub.requests[-1].body)
    assert sent["model"] == "engine-m" and sent["stream_options"] == {"include_usage": True}


def test_stripping_is_byte_exact_against_the_stub(stack: Stack) -> None:
    stack.start_proxy([model("m", stack.stub)], fast_settings())
    body = {"model": "m", "messages": MSG, "stream": True}
    hdr = {"x-stub-chunks": "5", "x-stub-usage": "2,5"}
    direct = post_raw(stack.stub.port, "/v1/chat/completions",
                      {**body, "stream_options": {"include_usage": True}}, hdr)
    usage_event = next(e for e in direct.split(b"\n\n") if b'"usage"' in e) + b"\n\n"
    assert b'"choices":[]' in usage_event
    proxied = post_raw(stack.port, "/v1/chat/completions", body, hdr)
    assert proxied == direct.replace(usage_event, b"")
    assert proxied.endswith(b"data: [DONE]\n\n")


# A stream shaped like vLLM's with include_usage, written by a raw backend in pieces split at chosen
# offsets (each piece its own chunk, a pause between writes so that they arrive in separate reads).
_EV = [b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":'
       b'{"role":"assistant","content":""},"finish_reason":null}]}\n\n']
_EV += [b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":'
        b'{"content":"t%d"},"finish_reason":null}]}\n\n' % i for i in range(3)]
_EV += [b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},'
        b'"finish_reason":"stop"}]}\n\n']
USAGE_EV = (b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[],'
            b'"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}\n\n')
STREAM = b"".join(_EV) + USAGE_EV + b"data: [DONE]\n\n"
U = STREAM.index(USAGE_EV)
SPLITS = {
    "whole": [],
    "inside-usage-key": [U + USAGE_EV.index(b'"usage"') + 3],
    "after-data": [U + 6],
    "between-newlines": [U + len(USAGE_EV) - 1],
    "before-choices": [U + 20, U + 40],
    "content-split": [STREAM.index(b't1"') + 1, U + 90],
    "every-64": list(range(64, len(STREAM), 64)),
}


class RawBackend:
    """One-shot-per-connection SSE backend: answers every POST with STREAM cut at ``cuts``."""

    def __init__(self, cuts: list[int], crlf: bool = False) -> None:
        self.cuts = cuts
        self.stream = STREAM.replace(b"\n", b"\r\n") if crlf else STREAM
        self.bodies: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            n = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            self.bodies.append(await reader.readexactly(n))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                         b"connection: close\r\n\r\n")
            edges = [0, *self.cuts, len(self.stream)]
            for a, b in itertools.pairwise(edges):
                writer.write(b"%x\r\n%s\r\n" % (b - a, self.stream[a:b]))
                await writer.drain()
                await asyncio.sleep(0.005)  # pacing only (separate reads); nothing is asserted on time
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()


@pytest.mark.parametrize("name", list(SPLITS))
def test_stripping_split_across_reads(stack: Stack, name: str) -> None:
    backend = RawBackend(SPLITS[name])
    port = stack.run(backend.start())
    try:
        stack.start_proxy([model("m", port)], fast_settings())
        got = post_raw(stack.port, "/v1/chat/completions", {"model": "m", "messages": MSG, "stream": True})
        assert got == STREAM.replace(USAGE_EV, b"")
        assert b'"stream_options":{"include_usage":true}' in backend.bodies[-1]
        asyncio.run(reach(lambda: sample(scrape(stack), "flexinfer_proxy_prompt_tokens_total", model="m") == 9))
        # the client asked: nothing is removed
        asked = post_raw(stack.port, "/v1/chat/completions",
                         {"model": "m", "messages": MSG, "stream": True, "stream_options": {"include_usage": True}})
        assert asked == STREAM
    finally:
        assert backend.server is not None
        backend.server.close()


def test_tap_strips_at_every_split_point() -> None:
    """The tap alone, every 2-way split and random many-way splits, for LF and CRLF streams: the
    output is the stream without the usage event, byte for byte."""
    rnd = random.Random(16)
    for stream in (STREAM, STREAM.replace(b"\n", b"\r\n")):
        usage_ev = USAGE_EV if stream is STREAM else USAGE_EV.replace(b"\n", b"\r\n")
        want = stream.replace(usage_ev, b"")
        cuts_list = [[i] for i in range(1, len(stream))]
        cuts_list += [sorted(rnd.sample(range(1, len(stream)), rnd.randint(2, 30))) for _ in range(200)]
        for cuts in cuts_list:
            tap = UsageTap()
            tap.start(200, True, True, 0.0, None)
            edges = [0, *cuts, len(stream)]
            pieces = [stream[a:b] for a, b in itertools.pairwise(edges)]
            out = b""
            i = 0
            while i < len(pieces):  # reads of 1-3 pieces
                k = rnd.randint(1, 3)
                batch = pieces[i:i + k]
                i += k
                buf = b"".join(batch)
                got = tap.observe(buf, i >= len(pieces))
                out += buf if got is None else b"".join(got)
            assert out == want, cuts
            assert tap.stripped == 1 and tap.usage() == (9, 3)
    # content events are counted per piece: exact when pieces hold whole events (a "content" marker cut
    # in two by a read may be missed or miscounted: documented)
    tap = UsageTap()
    tap.start(200, True, True, 0.0, None)
    for ev in [*_EV, USAGE_EV, b"data: [DONE]\n\n"]:
        tap.observe(ev, False)
    assert tap.events == 3


def test_ask_usage_rules() -> None:
    body = b'{"model":"m","stream":true}'
    assert ask_usage(body, json.loads(body)) == b'{"stream_options":{"include_usage":true},"model":"m","stream":true}'
    assert ask_usage(b' {"stream":true}', {"stream": True}) == b' {"stream_options":{"include_usage":true},"stream":true}'
    nested = b'{"stream":true,"messages":[{"role":"user","content":"{}"}]}'  # only the opening brace
    assert ask_usage(nested, json.loads(nested)) == b'{"stream_options":{"include_usage":true},' + nested[1:]
    assert ask_usage(b"{}", {}) is None  # nothing to put a comma after
    assert ask_usage(b"[]", {"stream": True}) is None  # no object to splice into
    for opts in ({"include_usage": True}, {"continuous_usage_stats": True}, "bogus"):
        data = {"stream": True, "stream_options": opts}
        assert ask_usage(json.dumps(data).encode(), data) is None  # asked already / would change every event
    data = {"model": "alias", "stream": True, "stream_options": {"include_usage": False}}
    out = json.loads(ask_usage(json.dumps(data).encode(), data, "served") or b"")
    assert out["stream_options"] == {"include_usage": True} and out["model"] == "served"


def content_events(p: bytes) -> int:
    return sse_scan(p) >> 2


def test_content_events() -> None:
    assert content_events(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n') == 0
    assert content_events(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[{"delta":{"content":"b"}}]}\n\n') == 2
    assert content_events(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n') == 1  # spaced JSON
    assert content_events(b'data: {"choices":[{"text":"x","index":0}]}\n\n') == 1  # /v1/completions
    assert content_events(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n') == 0


# ---- TTFT and ITL -----------------------------------------------------------------------------------------

def test_ttft_and_itl_observation_counts(stack: Stack, client: Callable[[], openai.OpenAI]) -> None:
    stack.start_proxy([model("m", stack.stub)], fast_settings())
    c = client()
    for n, interval in ((5, "0.002"), (8, "0")):  # events in separate reads, then (mostly) together
        list(c.chat.completions.create(model="m", messages=MSG, stream=True,  # type: ignore[arg-type]
                                       extra_headers={"x-stub-chunks": str(n), "x-stub-interval": interval}))
    list(c.completions.create(model="m", prompt="hi", stream=True, extra_headers={"x-stub-chunks": "4"}))
    c.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]  # JSON: no TTFT sample
    m: dict[Any, float] = {}

    def observed() -> bool:  # (a paced stub stream may end as 499: the client leaves at [DONE], before the
        m.clear()              # stub's last pause and terminating chunk; every event was relayed by then)
        m.update(scrape(stack))
        return sum(v for (name, _), v in m.items() if name == "flexinfer_proxy_requests_total") == 4

    asyncio.run(reach(observed))
    assert sample(m, "flexinfer_proxy_time_to_first_token_seconds_count", model="m") == 3
    # n content events give n - 1 gaps, however the reads grouped them (the role chunk is not content)
    assert sample(m, "flexinfer_proxy_inter_token_latency_seconds_count", model="m") == 4 + 7 + 3
    assert sample(m, "flexinfer_proxy_inter_token_latency_seconds_bucket", model="m", le="+Inf") == 14
    assert sample(m, "flexinfer_proxy_time_to_first_token_seconds_sum", model="m") > 0


# ---- the endpoint label, per-endpoint series, the RequestContext fields ------------------------------------

def test_endpoint_label_with_a_failing_replica(stack: Stack, client: Callable[[], openai.OpenAI]) -> None:
    dead = free_port()  # nothing listens: connect refused, then the retry on the live replica
    live = stack.stub.port
    stack.start_proxy([model("m", dead, stack.stub)], fast_settings(route_header=True))
    seen: list[Any] = []
    fwd = stack.handler.forwarder

    class Spy:  # the forwarder, with each request's context kept (the compiled one's methods are fixed)
        def __getattr__(self, name: str) -> Any:
            return getattr(fwd, name)

        async def forward(self, req: Any, resp: Any, ctx: Any, *rest: Any) -> None:
            try:
                await fwd.forward(req, resp, ctx, *rest)
            finally:
                seen.append(ctx)

    stack.handler.forwarder = Spy()  # type: ignore[assignment]
    c = client()
    for _ in range(6):
        list(c.chat.completions.create(model="m", messages=MSG, stream=True,  # type: ignore[arg-type]
                                       extra_headers={"x-stub-usage": "2,3", "x-stub-chunks": "3"}))
    c.chat.completions.create(model="m", messages=MSG, extra_headers={"x-stub-usage": "4,1"})  # type: ignore[arg-type]
    asyncio.run(reach(lambda: len(seen) == 7))
    m = scrape(stack)
    dead_ep, live_ep = f"127.0.0.1:{dead}", f"127.0.0.1:{live}"
    assert sample(m, "flexinfer_proxy_upstream_errors_total", reason="connect_refused", endpoint=dead_ep) >= 1
    assert sample(m, "flexinfer_proxy_upstream_errors_total", reason="connect_refused", endpoint=live_ep) == 0
    assert sample(m, "flexinfer_proxy_endpoint_request_duration_seconds_count", model="m", endpoint=live_ep) == 7
    assert sample(m, "flexinfer_proxy_endpoint_request_duration_seconds_count", model="m", endpoint=dead_ep) == 0
    assert ("flexinfer_proxy_endpoint_in_flight", (("endpoint", dead_ep), ("model", "m"))) in m
    assert sample(m, "flexinfer_proxy_endpoint_in_flight", model="m", endpoint=live_ep) == 0
    for ctx in seen:  # what the access log reads at the end of the request
        assert ctx.endpoint == live_ep and ctx.ttft > 0 and ctx.queue_wait == 0.0
    assert [(x.prompt_tokens, x.completion_tokens) for x in seen] == [(2, 3)] * 6 + [(4, 1)]


def test_endpoint_in_flight_during_a_stream(stack: Stack, client: Callable[[], openai.OpenAI]) -> None:
    stack.start_proxy([model("m", stack.stub)], fast_settings())
    ep = f"127.0.0.1:{stack.stub.port}"
    stream = client().chat.completions.create(model="m", messages=MSG, stream=True,  # type: ignore[arg-type]
                                              extra_headers={"x-stub-mode": "hang-mid"})
    try:
        next(iter(stream))
        assert sample(scrape(stack), "flexinfer_proxy_endpoint_in_flight", model="m", endpoint=ep) == 1
    finally:
        stream.close()
    asyncio.run(reach(lambda: sample(scrape(stack), "flexinfer_proxy_endpoint_in_flight", model="m", endpoint=ep) == 0))
