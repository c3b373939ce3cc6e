"""EngineScraper against real stub engines over sockets: good, slow, huge, failing and absent ones."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from flexinfer.proxy.scrape import EngineScraper, ScrapeError, http_get
from tests.proxy.test_enginemetrics import vllm_v1
from tests.stub_engine import StubEngine


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait (polling) until ``cond()`` holds; fail the test after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.005)


def key(stub: StubEngine) -> str:
    return f"127.0.0.1:{stub.port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def stubs() -> AsyncIterator[list[StubEngine]]:
    started: list[StubEngine] = []

    async def make() -> StubEngine:
        s = await StubEngine().start()
        started.append(s)
        return s

    for _ in range(4):
        await make()
    yield started
    for s in started:
        await s.stop()


async def test_good_scraped_on_schedule_while_slow_huge_failing_ones_are_counted(stubs: list[StubEngine]) -> None:
    good, slow, huge, broken = stubs
    good.metrics_text = vllm_v1(waiting=4, running=3, kv=0.5)
    good.lora_adapters = ["sql-lora"]
    slow.metrics_text = vllm_v1()
    slow.metrics_delay = 3600  # never answers in time
    huge.metrics_text = "vllm:request_prompt_tokens_bucket{le=\"1\"} 1\n" * (5 * 1024 * 1024 // 44)
    broken.metrics_text = vllm_v1()
    broken.metrics_status = 500
    absent = f"127.0.0.1:{free_port()}"
    sc = EngineScraper(interval=0.05, timeout=1.5)
    sc.set_endpoints([key(s) for s in stubs] + [absent])
    await sc.start()
    try:
        await until(lambda: sc.state(key(good)) is not None)
        st = sc.state(key(good))
        assert st is not None and (st.engine, st.waiting, st.running, st.kv_usage) == ("vllm", 4.0, 3.0, 0.5)
        assert st.adapters == frozenset({"sql-lora"})

        # the slow engine's scrape hangs; the good one keeps its schedule meanwhile
        await until(lambda: sc.in_flight(key(slow)))
        base = sc.scrapes.get(key(good), 0)
        await until(lambda: sc.scrapes.get(key(good), 0) >= base + 5)
        assert sc.in_flight(key(slow)) and sc.errors.get("timeout", 0) == 0  # still the first slow scrape
        assert sc.skipped.get(key(slow), 0) > 0

        await until(lambda: all(sc.errors.get(r, 0) >= 1 for r in ("timeout", "too_large", "http_status", "connect")))
        assert sc.endpoint_errors[key(slow)] == {"timeout": sc.endpoint_errors[key(slow)]["timeout"]}
        assert set(sc.endpoint_errors[key(huge)]) == {"too_large"}
        assert set(sc.endpoint_errors[key(broken)]) == {"http_status"}
        assert set(sc.endpoint_errors[absent]) == {"connect"}
        assert key(good) not in sc.endpoint_errors
        for k in (key(slow), key(huge), key(broken), absent):
            assert sc.state(k) is None  # unknown, never a zero-load state
        assert huge.metrics_hits >= 1 and sc.state(key(good)) is not None
    finally:
        await sc.stop()
    assert not any(sc.in_flight(key(s)) for s in stubs)
    await until(lambda: all(s.open_connections == 0 for s in stubs))  # every scrape connection closed
    n = sc.scrapes[key(good)]
    await asyncio.sleep(0.2)  # stopped means stopped: no scrape in four intervals
    assert sc.scrapes[key(good)] == n and good.open_connections == 0


async def test_deltas_adapters_and_staleness_with_a_clock(stubs: list[StubEngine]) -> None:
    good = stubs[0]
    now = [100.0]
    sc = EngineScraper(clock=lambda: now[0])
    sc.set_endpoints([key(good)])
    good.metrics_text = vllm_v1(ttft=(10.0, 10.0), itl=(5.0, 100.0))
    await sc.scrape(key(good))
    st = sc.state(key(good))
    assert st is not None and st.ttft_s == pytest.approx(1.0) and st.adapters == frozenset()

    good.metrics_text = vllm_v1(ttft=(10.4, 14.0), itl=(6.0, 200.0))
    good.lora_adapters = ["a", "b"]
    now[0] = 101.0
    await sc.scrape(key(good))
    st = sc.state(key(good))
    assert st is not None and st.ttft_s == pytest.approx(0.1) and st.tpot_s == pytest.approx(0.01)
    assert st.adapters == frozenset({"a", "b"}) and st.at == 101.0

    good.metrics_status = 500  # a failed scrape keeps the good one while it is fresh
    now[0] = 102.0
    await sc.scrape(key(good))
    last = sc.last(key(good))
    assert last is not None and last.error == "http_status" and last.adapters == frozenset({"a", "b"})
    assert sc.state(key(good)) is st
    now[0] = 103.5  # 2.5 s after the last good scrape: unknown
    assert sc.state(key(good)) is None
    assert sc.errors == {"http_status": 1}


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
async def test_framings_and_the_byte_limit(stubs: list[StubEngine], framing: str) -> None:
    stub = stubs[0]
    stub.metrics_framing = framing
    stub.metrics_text = vllm_v1(waiting=9)
    body = await http_get("127.0.0.1", stub.port, "/metrics", 2.0, 1 << 20)
    assert body == stub.metrics_text.encode()
    with pytest.raises(ScrapeError) as e:
        await http_get("127.0.0.1", stub.port, "/metrics", 2.0, len(body) - 1)
    assert e.value.reason == "too_large"
    sc = EngineScraper(max_bytes=len(body) - 1)
    sc.set_endpoints([key(stub)])
    await sc.scrape(key(stub))
    assert sc.errors == {"too_large": 1} and sc.state(key(stub)) is None


async def test_malformed_page_and_no_metrics_page(stubs: list[StubEngine]) -> None:
    garbled, plain = stubs[0], stubs[1]
    garbled.metrics_text = "<html>oops</html>\n"
    # ``plain`` serves no metrics page: its GET /metrics gets the stub's chat answer (JSON)
    sc = EngineScraper()
    sc.set_endpoints([key(garbled), key(plain)])
    await sc.scrape(key(garbled))
    await sc.scrape(key(plain))
    assert sc.errors == {"malformed": 2}
    assert sc.state(key(garbled)) is None and sc.state(key(plain)) is None


async def test_garbage_http_answers_are_errors() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(replies.pop(0))
        await writer.drain()
        writer.close()

    replies = [b"HTTX/9.9 what\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort",
               b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
               b"HTTP/1.1 200 OK\r\nx: " + b"a" * 20_000 + b"\r\n\r\n"]
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for _ in range(4):
            with pytest.raises(ScrapeError) as e:
                await http_get("127.0.0.1", port, "/metrics", 2.0, 1 << 20)
            assert e.value.reason == "malformed"
    finally:
        server.close()
        await server.wait_closed()


async def test_dropped_endpoints_are_forgotten_and_their_scrape_cancelled(stubs: list[StubEngine]) -> None:
    good, slow = stubs[0], stubs[1]
    good.metrics_text = slow.metrics_text = vllm_v1()
    slow.metrics_delay = 3600
    sc = EngineScraper(interval=0.05, timeout=30.0)
    sc.set_endpoints([key(good), key(slow)])
    await sc.start()
    try:
        await until(lambda: sc.state(key(good)) is not None and sc.in_flight(key(slow)))
        sc.set_endpoints([key(slow)])
        assert sc.state(key(good)) is None and key(good) not in sc.scrapes and sc.endpoints == [key(slow)]
        sc.set_endpoints([key(good)])  # the hanging scrape is cancelled, its connection closed
        assert not sc.in_flight(key(slow))
        await until(lambda: slow.open_connections == 0)
        await until(lambda: sc.state(key(good)) is not None)
        assert key(slow) not in sc.scrapes and sc.errors == {}
    finally:
        await sc.stop()
    await sc.start()  # start after stop works
    try:
        n = sc.scrapes.get(key(good), 0)
        await until(lambda: sc.scrapes.get(key(good), 0) > n)
    finally:
        await sc.stop()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        EngineScraper(interval=0)
    with pytest.raises(ValueError):
        EngineScraper().set_endpoints(["no-port"])
