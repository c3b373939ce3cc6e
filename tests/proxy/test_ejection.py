"""Outlier ejection (reliability plan U11/F13) and the active health check.

The :class:`Ejector` runs on a hand-driven clock; the :class:`HealthChecker` dials real sockets: the
stub engine (answers 200), a bound port that is not listening (refuses), a listener that never
answers (hangs), and a raw server answering 503.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from flexinfer.proxy.ejection import Ejector, HealthChecker
from tests.stub_engine import StubEngine


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fail(e: Ejector, key: str, n: int, kind: str = "5xx") -> list[bool]:
    return [e.record(key, False, kind) for _ in range(n)]


# ---------------------------------------------------------------------------- Ejector (pure logic)

def test_ejected_after_exactly_n_consecutive_5xx() -> None:
    e = Ejector(clock=Clock())
    assert fail(e, "a:1", 5) == [False, False, False, False, True]
    assert e.ejected("a:1")
    assert e.usable(["a:1", "b:1"]) == ["b:1"]  # traffic share 0 while ejected
    assert e.ejections_total == {"a:1": 1}


@pytest.mark.parametrize("kind", ["connect", "5xx", "timeout"])
def test_each_failure_kind_counts(kind: str) -> None:
    e = Ejector(consecutive=3, clock=Clock())
    fail(e, "a:1", 3, kind)
    assert e.ejected("a:1")
    assert e.state("a:1")["last_error"] == kind


def test_success_resets_the_run_and_other_failures_do_not_count() -> None:
    e = Ejector(clock=Clock())
    fail(e, "a:1", 4)
    e.record("a:1", True, "ok")
    assert e.state("a:1")["consecutive_failures"] == 0
    fail(e, "a:1", 4, "connect")
    for kind in ("4xx", "client_gone"):  # not the upstream's fault: neither counts nor resets
        assert not e.record("a:1", False, kind)
    assert e.state("a:1")["consecutive_failures"] == 4
    assert not e.ejected("a:1")
    assert e.record("a:1", False, "timeout")  # the fifth counting failure in a row
    assert e.ejected("a:1")


def test_duration_grows_with_times_ejected_and_is_capped() -> None:
    clock = Clock()
    e = Ejector(consecutive=1, base_s=30.0, max_ejection_s=100.0, clock=clock)
    durations = []
    for _ in range(5):
        assert e.record("a:1", False, "5xx")
        until = e.state("a:1")["ejected_until"]
        durations.append(until - clock.t)
        clock.t = until  # back exactly when its time is up
        assert not e.ejected("a:1")
    assert durations == [30.0, 60.0, 90.0, 100.0, 100.0]
    assert e.state("a:1")["times_ejected"] == 5
    assert e.ejections_total["a:1"] == 5


def test_multiplier_starts_over_after_a_long_healthy_stretch() -> None:
    clock = Clock()
    e = Ejector(consecutive=1, base_s=30.0, max_ejection_s=300.0, clock=clock)
    e.record("a:1", False, "5xx")
    clock.t += 30.0
    assert not e.ejected("a:1")
    clock.t += 10.0
    e.record("a:1", False, "5xx")  # soon after coming back: doubled
    assert e.state("a:1")["ejected_for_s"] == 60.0
    clock.t += 60.0 + 300.0  # then in rotation for max_ejection_s
    assert not e.ejected("a:1")
    e.record("a:1", False, "5xx")
    assert e.state("a:1")["ejected_for_s"] == 30.0
    assert e.state("a:1")["times_ejected"] == 1


def test_failures_while_ejected_do_not_extend_it() -> None:
    clock = Clock()
    e = Ejector(consecutive=2, clock=clock)
    fail(e, "a:1", 2)
    until = e.state("a:1")["ejected_until"]
    clock.t += 10
    assert fail(e, "a:1", 10) == [False] * 10  # in-flight stragglers
    assert e.state("a:1")["ejected_until"] == until
    assert e.ejections_total["a:1"] == 1


def test_automatic_return_is_lazy_and_exact() -> None:
    clock = Clock()
    e = Ejector(clock=clock)
    fail(e, "a:1", 5)
    keys = ["a:1", "b:1", "c:1"]
    clock.t += 29.999
    assert e.usable(keys) == ["b:1", "c:1"]
    clock.t += 0.001
    assert e.usable(keys) == keys
    st = e.state("a:1")
    assert (st["ejected"], st["ejected_until"], st["consecutive_failures"]) == (False, None, 0)


@pytest.mark.parametrize(("n", "share", "most_out"), [
    (4, 0.5, 2), (5, 0.5, 2), (3, 0.5, 1), (2, 0.5, 1), (1, 0.5, 0), (4, 0.1, 0), (3, 1.0, 2), (10, 0.3, 3),
])
def test_max_share_is_never_exceeded(n: int, share: float, most_out: int) -> None:
    clock = Clock()
    e = Ejector(consecutive=1, max_share=share, clock=clock)
    keys = [f"h{i}:80" for i in range(n)]
    for k in keys:  # every endpoint fails
        clock.t += 1
        e.record(k, False, "connect")
        got = e.usable(keys)
        assert len(got) >= n - most_out and len(got) >= 1
    assert len(e.usable(keys)) == n - most_out


def test_over_the_share_the_oldest_ejections_come_back_first() -> None:
    clock = Clock()
    e = Ejector(consecutive=1, clock=clock)
    keys = ["a:1", "b:1", "c:1", "d:1"]
    for k in keys:
        e.record(k, False, "5xx")
        clock.t += 1
    # all four ejected, two may be out: the two most recent (c, d) stay out; order is kept
    assert e.usable(keys) == ["a:1", "b:1"]
    assert all(e.ejected(k) for k in keys)
    # the share is per model: a pool of other endpoints is not capped by these
    assert e.usable(["c:1", "d:1", "x:1", "y:1"]) == ["x:1", "y:1"]
    assert e.usable(["x:1"]) == ["x:1"]


def test_readmit_ends_an_ejection_early() -> None:
    e = Ejector(clock=Clock())
    assert not e.readmit("a:1")
    fail(e, "a:1", 5)
    assert e.readmit("a:1")
    assert not e.ejected("a:1")
    assert e.usable(["a:1", "b:1"]) == ["a:1", "b:1"]


def test_forget_drops_state_but_keeps_the_counter() -> None:
    e = Ejector(clock=Clock())
    fail(e, "a:1", 5)
    e.forget("a:1")
    e.forget("never:1")
    assert e.usable(["a:1", "b:1"]) == ["a:1", "b:1"]
    assert not e.ejected("a:1")
    assert e.state("a:1")["times_ejected"] == 0
    assert e.keys() == []
    assert e.ejections_total == {"a:1": 1}


def test_skipping_successes_outside_unsettled_changes_nothing() -> None:
    """The forwarder reports a success only on a key in ``unsettled`` (forward.py ``_outcome``):
    driven alike, an ejector that hears every success and one that hears only those agree on every
    key's state, the usable keys and every return of record, over random runs of outcomes, clock
    steps, readmissions and forgotten keys."""
    import random

    rng = random.Random(15)
    keys = ["a:1", "b:1", "c:1"]
    for _ in range(200):
        ca, cb = Clock(), Clock()
        every, skipping = Ejector(consecutive=3, base_s=5.0, clock=ca), Ejector(consecutive=3, base_s=5.0, clock=cb)
        for _ in range(60):
            key, roll = rng.choice(keys), rng.random()
            if roll < 0.45:
                got = every.record(key, True, "ok")
                if key in skipping.unsettled:
                    assert skipping.record(key, True, "ok") == got
                else:
                    assert got is False
            elif roll < 0.85:
                kind = rng.choice(["5xx", "connect", "timeout", "4xx"])
                assert every.record(key, False, kind) == skipping.record(key, False, kind)
            elif roll < 0.93:
                step = rng.choice([1.0, 4.0, 6.0, 30.0])
                ca.t += step
                cb.t += step
            elif roll < 0.97:
                assert every.readmit(key) == skipping.readmit(key)
            else:
                every.forget(key)
                skipping.forget(key)
            for k in keys:
                assert every.state(k) == skipping.state(k), k
            assert every.usable(keys) == skipping.usable(keys)


def test_state_shape() -> None:
    clock = Clock()
    e = Ejector(clock=clock)
    assert e.state("a:1") == {"consecutive_failures": 0, "ejected": False, "ejected_until": None,
                              "ejected_for_s": 0.0, "times_ejected": 0, "ejections_total": 0,
                              "last_error": None}
    fail(e, "a:1", 2, "timeout")
    assert e.state("a:1")["consecutive_failures"] == 2
    fail(e, "a:1", 3, "connect")
    assert e.state("a:1") == {"consecutive_failures": 0, "ejected": True, "ejected_until": clock.t + 30.0,
                              "ejected_for_s": 30.0, "times_ejected": 1, "ejections_total": 1,
                              "last_error": "connect"}


def test_bad_settings_are_refused() -> None:
    for kw in ({"consecutive": 0}, {"base_s": 0}, {"max_share": 1.5}, {"max_ejection_s": -1}):
        with pytest.raises(ValueError):
            Ejector(**kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- HealthChecker (real sockets)

@pytest.fixture
async def stub() -> AsyncIterator[StubEngine]:
    s = await StubEngine().start()
    yield s
    await s.stop()


@pytest.fixture
def refusing() -> Iterator[socket.socket]:
    """A bound port that does not listen: connecting is refused (and the port stays ours)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


class Hanging:
    """Accepts and reads, never answers; notes when the checker closes its side."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.accepted = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        while await reader.read(4096):
            pass
        self.closed.set()

    async def start(self) -> Hanging:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.key = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        for w in self.writers:
            w.close()
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def hanging() -> AsyncIterator[Hanging]:
    h = await Hanging().start()
    yield h
    await h.stop()


def key_of(stub: StubEngine) -> str:
    return f"127.0.0.1:{stub.port}"


async def test_check_results_on_real_sockets(stub: StubEngine, refusing: socket.socket,
                                             hanging: Hanging) -> None:
    hc = HealthChecker(Ejector(), timeout=0.3)
    assert await hc.check(key_of(stub)) == "ok"
    assert await hc.check(f"127.0.0.1:{refusing.getsockname()[1]}") == "connect"
    assert await hc.check(hanging.key) == "timeout"
    await asyncio.wait_for(hanging.closed.wait(), 5)  # the timed-out connection was closed


async def test_non_2xx_answers_count() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        code = b"503" if b"/health" in line else b"404"
        writer.write(b"HTTP/1.1 " + code + b" X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    key = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        e = Ejector(consecutive=2)
        assert await HealthChecker(e, path="/health").check(key) == "5xx"
        hc = HealthChecker(e, path="/missing")
        assert await hc.check(key) == "health"
        hc.set_endpoints([key])
        await hc.tick()
        await hc.tick()
        assert e.ejected(key) and e.state(key)["last_error"] == "health"
    finally:
        server.close()
        await server.wait_closed()


async def test_refusing_gets_ejected_hanging_counts_recovered_is_readmitted(
        stub: StubEngine, refusing: socket.socket, hanging: Hanging) -> None:
    e = Ejector(consecutive=3)
    hc = HealthChecker(e, timeout=0.2, concurrency=2)
    port = refusing.getsockname()[1]
    bad, ok = f"127.0.0.1:{port}", key_of(stub)
    keys = [ok, bad, hanging.key]
    hc.set_endpoints(keys)
    await hc.tick()
    assert hc.last == {ok: "ok", bad: "connect", hanging.key: "timeout"}
    assert e.state(hanging.key)["consecutive_failures"] == 1
    await hc.tick()
    await hc.tick()
    assert e.ejected(bad) and e.ejected(hanging.key) and not e.ejected(ok)
    assert e.state(hanging.key)["last_error"] == "timeout"
    # 50 % of 3 -> one may be out: the latest ejected (the hanging one, timed out after the refusal)
    assert e.usable(keys) == [ok, bad]
    assert e.ejections_total == {bad: 1, hanging.key: 1}

    refusing.close()  # the endpoint comes back on the same port
    back = await StubEngine().start(port=port)
    try:
        await hc.tick()
        assert hc.last[bad] == "ok"
        assert not e.ejected(bad)  # readmitted early, long before its 30 s
        assert e.state(bad)["consecutive_failures"] == 0
        # 2 of 4 may be out, only the hanging one is: the readmitted one gets traffic again
        assert e.usable([ok, bad, hanging.key, "other:1"]) == [ok, bad, "other:1"]
    finally:
        await back.stop()


async def test_set_endpoints_replaces_the_set(stub: StubEngine, refusing: socket.socket) -> None:
    e = Ejector()
    hc = HealthChecker(e)
    bad = f"127.0.0.1:{refusing.getsockname()[1]}"
    hc.set_endpoints([bad, bad])
    await hc.tick()
    assert e.state(bad)["consecutive_failures"] == 1  # duplicates checked once
    hc.set_endpoints([key_of(stub)])
    await hc.tick()
    assert list(hc.last) == [key_of(stub)]
    assert e.state(bad)["consecutive_failures"] == 1
    with pytest.raises(ValueError):
        hc.set_endpoints(["no-port"])
    with pytest.raises(ValueError):
        HealthChecker(e, path="/h\r\nX: 1")


async def test_start_runs_rounds_and_stop_is_clean(stub: StubEngine, hanging: Hanging) -> None:
    e = Ejector(consecutive=2)
    hc = HealthChecker(e, interval=0.01, timeout=30.0)  # the hanging check outlives the test
    hc.set_endpoints([key_of(stub)])
    await hc.start()
    await hc.start()  # idempotent

    async def rounds(n: int) -> None:
        while hc.rounds < n:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(rounds(3), 10)
    hc.set_endpoints([key_of(stub), hanging.key])
    async def accepted() -> None:
        while not hanging.accepted:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(accepted(), 10)  # a check is now blocked on the hanging endpoint
    done = hc.rounds
    await asyncio.wait_for(hc.stop(), 5)
    await asyncio.wait_for(hanging.closed.wait(), 5)  # its connection was closed, not leaked
    assert hc.rounds == done
    assert not e.ejected(hanging.key) and hanging.key not in hc.last
    await hc.stop()  # twice is fine
    for t in asyncio.all_tasks():
        assert t.get_name() != "flexinfer-health"


async def test_a_key_removed_during_a_round_leaves_no_state(hanging: Hanging) -> None:
    e = Ejector()
    hc = HealthChecker(e, timeout=0.5)
    hc.set_endpoints([hanging.key])
    round_ = asyncio.ensure_future(hc.tick())

    async def accepted() -> None:
        while not hanging.accepted:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(accepted(), 10)  # its check is in flight
    hc.set_endpoints([])
    e.forget(hanging.key)
    await round_  # the check times out after the key left
    assert e.keys() == [] and hc.last == {}
