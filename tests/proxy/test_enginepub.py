"""One engine scraper per machine (:mod:`flexinfer.proxy.enginepub`): worker 0's scrapes published in the
machine's shared mapping and read by the other processes, across real forks; then ``flexinfer proxy
--workers 2`` as a process: each engine's /metrics is read about once per interval, not once per worker,
and the scored routing of both workers follows it."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from flexinfer.proxy.enginemetrics import EngineState
from flexinfer.proxy.enginepub import HEADER, RETRIES, EnginePublisher, EngineStateReader
from flexinfer.proxy.machine import MachineState
from flexinfer.proxy.scrape import EngineScraper
from tests.proxy._procs import proxy
from tests.proxy.conftest import Stack
from tests.stub_engine import StubEngine

_FORK = multiprocessing.get_context("fork")

PAGE = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {waiting}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
"""


def _st(waiting: float, at: float, *, error: str | None = None, adapters: frozenset[str] = frozenset()) -> EngineState:
    if error is not None:
        return EngineState(None, None, None, None, None, "unknown", at, adapters, error)
    return EngineState(waiting, 2.0, 0.25, 0.1, 0.02, "vllm", at, adapters)


def _in_child(target: Callable[[], None]) -> None:
    """Run ``target`` in a forked process (it inherits the mapping) and require a clean exit."""

    def body() -> None:
        target()
        os._exit(0)

    p = _FORK.Process(target=body)
    p.start()
    p.join(30)
    assert p.exitcode == 0, p.exitcode
    p.close()


def _publish(region: memoryview, states: dict[str, tuple[EngineState | None, EngineState | None]]) -> None:
    def write() -> None:
        EnginePublisher(region, dict).publish(states)

    _in_child(write)


def _comparable(st: EngineState | None) -> tuple[object, ...] | None:
    if st is None:
        return None
    return (st.waiting, st.running, st.kv_usage, st.ttft_s, st.tpot_s, st.engine, st.at, st.adapters, st.error)


def test_a_state_written_in_one_process_is_read_in_another() -> None:
    machine = MachineState(2)
    region = machine.engine_region()
    now = time.monotonic()
    good = _st(7, now, adapters=frozenset({"lora-b", "lora-a"}))
    bad = _st(0, now + 0.1, error="timeout")
    older = _st(3, now - 0.5)
    reader = EngineStateReader(region)
    assert reader.state("10.0.0.1:8000") is None and reader.last("10.0.0.1:8000") is None  # nothing yet
    _publish(region, {"10.0.0.1:8000": (good, good), "[::1]:9000": (older, bad), "10.0.0.3:1": (None, bad)})

    got = reader.state("10.0.0.1:8000")
    assert _comparable(got) == _comparable(good)
    assert got is not None and got.adapters == frozenset({"lora-a", "lora-b"})
    assert reader.last("10.0.0.1:8000") is got  # the latest attempt was the good one
    # a failed latest attempt does not erase a good one still fresh; last() shows the failure
    assert _comparable(reader.state("[::1]:9000")) == _comparable(older)
    assert _comparable(reader.last("[::1]:9000")) == _comparable(bad)
    assert reader.state("10.0.0.3:1") is None  # never scraped well: unknown
    assert reader.state("10.0.0.9:1") is None  # not published at all
    assert reader.decodes == 1
    for _ in range(100):  # the sequence did not move: no decode again
        reader.state("10.0.0.1:8000")
    assert reader.decodes == 1

    # and the other way round: a child reads what this process wrote
    EnginePublisher(region, dict).publish({"10.0.0.1:8000": (_st(42, time.monotonic()), None)})

    def check() -> None:
        st = EngineStateReader(region).state("10.0.0.1:8000")
        assert st is not None and st.waiting == 42
        assert EngineStateReader(region).state("[::1]:9000") is None  # gone from the publication

    _in_child(check)


def test_stale_data_reads_as_unknown_never_idle() -> None:
    region = MachineState(2).engine_region()
    now = time.monotonic()
    written = _st(20, now)
    _publish(region, {"e:1": (written, written)})
    clock = [now + 0.5]
    reader = EngineStateReader(region, max_age=2.0, clock=lambda: clock[0])
    st = reader.state("e:1")
    assert st is not None and st.waiting == 20
    clock[0] = now + 2.5  # nobody published since: the writer is gone (or its engine unreachable)
    assert reader.state("e:1") is None
    assert reader.last("e:1") is not None  # still shown on the debug page, with its age


def test_a_writer_killed_mid_write_leaves_the_previous_state_which_then_goes_stale() -> None:
    region = MachineState(2).engine_region()
    now = time.monotonic()
    _publish(region, {"e:1": (_st(5, now), None)})
    clock = [now + 0.1]
    reader = EngineStateReader(region, clock=lambda: clock[0])
    assert reader.state("e:1") is not None

    def die_mid_write() -> None:  # worker 0 killed between "sequence odd" and "sequence even"
        (seq,) = struct.unpack_from("<Q", region, 0)
        struct.pack_into("<Q", region, 0, seq + 1)
        region[HEADER:HEADER + 9] = b'{"x:9":[['
        os.kill(os.getpid(), signal.SIGKILL)

    p = _FORK.Process(target=die_mid_write)
    p.start()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    p.close()
    (seq,) = struct.unpack_from("<Q", region, 0)
    assert seq % 2 == 1
    st = reader.state("e:1")  # the half-written payload is not read: what the reader had stays
    assert st is not None and st.waiting == 5
    clock[0] = now + 2.5
    assert reader.state("e:1") is None  # ... and goes unknown like any old state

    # the restarted worker 0 publishes again from the odd sequence it found
    _publish(region, {"e:1": (_st(9, now + 2.4), None)})
    (after,) = struct.unpack_from("<Q", region, 0)
    assert after % 2 == 0 and after > seq
    st = reader.state("e:1")
    assert st is not None and st.waiting == 9


def test_a_torn_copy_is_retried_then_the_previous_state_kept() -> None:
    """A payload that does not match its CRC under an even sequence (what a reader sees when the
    writer's stores reach it out of order) is never decoded."""
    region = MachineState(2).engine_region()
    now = time.monotonic()
    pub = EnginePublisher(region, dict)
    pub.publish({"e:1": (_st(1, now), None)})
    reader = EngineStateReader(region, clock=lambda: now)
    assert reader.state("e:1") is not None
    pub.publish({"e:1": (_st(2, now), None)})
    seq, length, crc = struct.unpack_from("<QII", region, 0)
    struct.pack_into("<QII", region, 0, seq, length, crc ^ 1)  # the CRC of another payload
    st = reader.state("e:1")
    assert st is not None and st.waiting == 1
    assert reader.torn == RETRIES
    st = reader.state("e:1")  # tried again on the next call, not remembered as read
    assert st is not None and st.waiting == 1 and reader.torn == 2 * RETRIES
    struct.pack_into("<QII", region, 0, seq, length, zlib.crc32(bytes(region[HEADER:HEADER + length])))
    st = reader.state("e:1")
    assert st is not None and st.waiting == 2


def test_concurrent_writes_are_never_read_half_done() -> None:
    """A child publishes as fast as it can while this process reads: every state read is one the
    child wrote whole (its ``waiting`` and ``running`` are written equal)."""
    region = MachineState(2).engine_region()
    now = time.monotonic()
    n = 3000
    keys = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(40)]

    def writer() -> None:
        pub = EnginePublisher(region, dict)
        for i in range(1, n + 1):
            st = EngineState(float(i), float(i), 0.5, 0.1, 0.01, "vllm", now)
            pub.publish(dict.fromkeys(keys, (st, st)))

    p = _FORK.Process(target=writer)
    p.start()
    reader = EngineStateReader(region, clock=lambda: now)
    seen: list[float] = []
    try:
        while p.is_alive():
            st = reader.state(keys[-1])
            if st is not None:
                assert st.waiting == st.running
                assert reader.state(keys[0]) is not None
                seen.append(float(st.waiting or 0))
    finally:
        p.join(60)
    assert p.exitcode == 0
    p.close()
    st = reader.state(keys[-1])
    assert st is not None and st.waiting == n
    assert seen == sorted(seen)  # never an older payload after a newer one
    assert reader.decodes >= 2


def test_a_publication_too_big_for_the_region_keeps_the_endpoints_that_fit() -> None:
    region = MachineState(2, engine_bytes=1024).engine_region()
    now = time.monotonic()
    states = {f"10.0.0.{i}:8000": (_st(i, now), None) for i in range(10, 40)}
    pub = EnginePublisher(region, dict)
    size = pub.publish(states)
    assert size <= pub.capacity
    assert 0 < pub.dropped < len(states)
    reader = EngineStateReader(region, clock=lambda: now)
    known = [k for k in sorted(states) if reader.state(k) is not None]
    assert known == sorted(states)[:len(states) - pub.dropped]  # in key order; the rest unknown
    pub.publish(dict(list(states.items())[:2]))
    assert pub.dropped == 0


def test_the_scrapers_hook_publishes_a_round_once_and_drops_forgotten_endpoints() -> None:
    """EngineScraper.on_change -> EnginePublisher.changed: the scrapes of one tick finish close together
    and are one write; an endpoint dropped from the scraper leaves the publication."""

    async def scenario() -> None:
        stubs = [await StubEngine().start() for _ in range(3)]
        scraper = EngineScraper(interval=10.0, timeout=1.0, models_every=0)
        try:
            for i, s in enumerate(stubs):
                s.metrics_text = PAGE.format(waiting=i, running=1)
            keys = [f"127.0.0.1:{s.port}" for s in stubs]
            region = MachineState(2).engine_region()
            pub = EnginePublisher(region, scraper.snapshot, coalesce=0.05)
            scraper.on_change = pub.changed
            scraper.set_endpoints(keys)
            await asyncio.gather(*(scraper.scrape(k) for k in keys))
            assert pub.writes == 0  # not yet: coalescing
            while pub.writes == 0:
                await asyncio.sleep(0.01)
            reader = EngineStateReader(region)
            assert [getattr(reader.state(k), "waiting", None) for k in keys] == [0, 1, 2]
            assert pub.writes == 1
            scraper.set_endpoints(keys[:1])
            while pub.writes == 1:
                await asyncio.sleep(0.01)
            assert reader.endpoints == keys[:1] and reader.state(keys[1]) is None
            pub.changed()
            pub.close()  # a publication scheduled at stop is dropped, not written after it
            await asyncio.sleep(0.1)
            assert pub.writes == 2
        finally:
            await scraper.stop()
            for s in stubs:
                await s.stop()

    asyncio.run(scenario())


# ---- through `flexinfer proxy --workers 2` ----------------------------------------------------------------

INTERVAL = 0.2
SETTINGS = {"PROXY_ENGINE_SCRAPE_INTERVAL": str(INTERVAL), "PROXY_ENGINE_SCRAPE_TIMEOUT": "0.15",
            "PROXY_ENGINE_METRICS_MAX_AGE": "1.0"}
CHAT = b'{"model":"m","messages":[]}'


class _KeepAlive:
    """One keep-alive connection to the proxy, so the worker that accepted it answers all its requests."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.r, self.w = reader, writer
        self.local_port = writer.get_extra_info("sockname")[1]

    @classmethod
    async def open(cls, port: int) -> _KeepAlive:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def route(self) -> str:
        self.w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT))
        head = (await self.r.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        assert head[0].split()[1] == "200", head
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head[1:] if ln)}
        await self.r.readexactly(int(hdrs["content-length"]))
        strategy, _, ep = hdrs["x-flexinfer-route"].split(";")
        assert strategy == "scored"
        return ep

    async def close(self) -> None:
        self.w.close()
        await self.w.wait_closed()


def _owner(workers: list[psutil.Process], proxy_port: int, client_port: int) -> int:
    """The index (in ``workers``) of the process holding the accepted end of our connection."""
    for i, w in enumerate(workers):
        for c in w.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == proxy_port and c.raddr and c.raddr.port == client_port:
                return i
    raise AssertionError(f"no worker holds the connection from port {client_port}")


def test_two_workers_scrape_each_engine_once_per_interval_and_both_route_on_it(tmp_path: Path) -> None:
    stack = Stack()
    try:
        a, b = stack.add_stub(), stack.add_stub()
        a.metrics_text = PAGE.format(waiting=20, running=4)  # a deep queue: the least-request filter drops it
        b.metrics_text = PAGE.format(waiting=0, running=1)
        keys = {f"127.0.0.1:{s.port}": s for s in (a, b)}
        inv = tmp_path / "inv.yaml"
        inv.write_text(f"models:\n  - name: m\n    routing: scored\n"
                       f"    endpoints: [http://127.0.0.1:{a.port}, http://127.0.0.1:{b.port}]\n")
        with proxy(inv, workers=2, **SETTINGS) as port:
            parent = next(p for p in psutil.Process().children() if any(
                c.laddr and c.laddr.port == port for ch in p.children() for c in ch.net_connections(kind="tcp")))
            workers = parent.children()
            assert len(workers) == 2

            async def scenario() -> tuple[dict[int, list[str]], dict[int, list[str]], float, int, int]:
                deadline = time.monotonic() + 20
                while a.metrics_hits < 2 or b.metrics_hits < 2:  # both pages scraped
                    assert time.monotonic() < deadline, "the engines were never scraped"
                    await asyncio.sleep(0.05)
                start_hits, t0 = a.metrics_hits + b.metrics_hits, time.monotonic()
                conns: dict[int, _KeepAlive] = {}
                spare: list[_KeepAlive] = []
                try:
                    first: dict[int, list[str]] = {0: [], 1: []}
                    for _ in range(64):  # fresh connections until each worker holds one
                        c = await _KeepAlive.open(port)
                        ep = await c.route()
                        i = _owner(workers, port, c.local_port)
                        first[i].append(ep)
                        if i in conns:
                            spare.append(c)
                        else:
                            conns[i] = c
                        if len(conns) == 2:
                            break
                    assert len(conns) == 2, "the kernel gave every connection to one worker"
                    for i, c in conns.items():
                        first[i] += [await c.route() for _ in range(10)]
                    a.metrics_text = PAGE.format(waiting=0, running=0)
                    b.metrics_text = PAGE.format(waiting=30, running=4)
                    hits = b.metrics_hits
                    while b.metrics_hits < hits + 3:  # the flipped page was read, and published
                        assert time.monotonic() < deadline + 10, "no new scrape"
                        await asyncio.sleep(0.05)
                    then = {i: [await c.route() for _ in range(10)] for i, c in conns.items()}
                    while time.monotonic() - t0 < 2.5:  # a window of some 12 intervals to count in
                        await asyncio.sleep(0.1)
                    return first, then, time.monotonic() - t0, start_hits, a.metrics_hits + b.metrics_hits
                finally:
                    for c in (*conns.values(), *spare):
                        await c.close()

            first, then, window, start_hits, end_hits = asyncio.run(scenario())
        for i in (0, 1):
            assert first[i] and all(keys[k] is b for k in first[i]), (i, first[i])
            assert all(keys[k] is a for k in then[i]), (i, then[i])
        one_scraper = 2 * window / INTERVAL  # two engines, one GET each per interval
        scraped = end_hits - start_hits
        assert scraped < 1.5 * one_scraper, (scraped, one_scraper)
        assert scraped > 0.4 * one_scraper, (scraped, one_scraper)  # and scraped all along
    finally:
        stack.close()


async def _conn_to(port: int, worker: psutil.Process, tries: int = 64) -> _KeepAlive:
    """A keep-alive connection that ``worker`` accepted (fresh connections until one lands there)."""
    for _ in range(tries):
        c = await _KeepAlive.open(port)
        await c.route()  # answered: accepted for sure
        if _held([worker], port, c.local_port):
            return c
        await c.close()
    raise AssertionError(f"no connection reached pid {worker.pid}")


def _held(workers: list[psutil.Process], proxy_port: int, client_port: int) -> bool:
    try:
        _owner(workers, proxy_port, client_port)
    except AssertionError:
        return False
    return True


def test_worker_0_killed_its_successor_scrapes_and_publishes_for_the_others(tmp_path: Path) -> None:
    """SIGKILL worker 0 (the scraper): the supervisor restarts it, the new one scrapes and publishes,
    and worker 1's routing follows the engines' pages changed after the restart."""
    stack = Stack()
    try:
        a, b = stack.add_stub(), stack.add_stub()
        a.metrics_text = PAGE.format(waiting=20, running=4)
        b.metrics_text = PAGE.format(waiting=0, running=1)
        keys = {f"127.0.0.1:{s.port}": s for s in (a, b)}
        inv = tmp_path / "inv.yaml"
        inv.write_text(f"models:\n  - name: m\n    routing: scored\n"
                       f"    endpoints: [http://127.0.0.1:{a.port}, http://127.0.0.1:{b.port}]\n")
        with proxy(inv, workers=2, **SETTINGS) as port:
            parent = next(p for p in psutil.Process().children() if p.children())
            first, second = sorted(parent.children(), key=lambda p: p.pid)  # forked in slot order

            async def wait_hits(n: int) -> None:
                start, deadline = b.metrics_hits, time.monotonic() + 20
                while b.metrics_hits < start + n:
                    assert time.monotonic() < deadline, "no scrapes"
                    await asyncio.sleep(0.05)

            async def scenario() -> tuple[list[str], list[str]]:
                await wait_hits(2)
                c = await _conn_to(port, second)
                try:
                    before = [await c.route() for _ in range(5)]
                finally:
                    await c.close()
                first.kill()
                first.wait(10)
                deadline = time.monotonic() + 20
                while len(parent.children()) < 2:  # the slot restarted
                    assert time.monotonic() < deadline, "worker 0 was not restarted"
                    await asyncio.sleep(0.05)
                a.metrics_text = PAGE.format(waiting=0, running=0)
                b.metrics_text = PAGE.format(waiting=30, running=4)
                await wait_hits(3)  # the new worker 0 read the flipped pages (and published them)
                c = await _conn_to(port, second)
                try:
                    return before, [await c.route() for _ in range(10)]
                finally:
                    await c.close()

            before, after = asyncio.run(scenario())
        assert all(keys[k] is b for k in before), before
        assert all(keys[k] is a for k in after), after
    finally:
        stack.close()


@pytest.mark.parametrize("size", [0, HEADER])
def test_a_region_without_room_is_refused(size: int) -> None:
    region = memoryview(bytearray(size))
    with pytest.raises(ValueError):
        EnginePublisher(region, dict)
    with pytest.raises(ValueError):
        EngineStateReader(region)
