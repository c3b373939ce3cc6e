"""Rows F8 and F9 of the reliability plan: client aborts and upstream resets in the middle of an
SSE stream, through the real proxy (HTTP core + ProxyHandler) to the stub engine, on real sockets.

F8 (C1): the client reads the head and a first event, then closes. Measured per trial: the time
from the client's close to the stub engine seeing its upstream connection closed (the stub stamps
``time.monotonic()`` at ``connection_lost``); after all trials: upstream connections open at the
stub, proxy client connections, asyncio tasks of the proxy's loop, fds of the process (the proxy
and the stub share it) and the router's in-flight counts, each against its baseline.
F9 (U4/U5): the stub ends the stream after K events with a RST or a FIN and no terminal chunk; the
client must see the stream end without ``0\\r\\n\\r\\n`` and without ``[DONE]``, and the stub must
have received each request once (0 retries).
CI runs ``FLEXINFER_REL_TRIALS`` (default 50) trials; the ``reliability`` run 1,000.
"""

from __future__ import annotations

import gc
import os
import socket
import time

import pytest

from tests.proxy.conftest import Stack
from tests.proxy.test_faults import raw_request, read_head, tasks_in_flight

CI_TRIALS = int(os.environ.get("FLEXINFER_REL_TRIALS", "50"))


def _wait(cond, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return bool(cond())


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def abort_trials(proxy: Stack, n: int) -> dict[str, float]:
    stub = proxy.stub
    server = proxy.server  # type: ignore[attr-defined]

    def one() -> float:
        s = socket.create_connection(("127.0.0.1", proxy.port))
        try:
            s.sendall(raw_request(proxy.port, "m1", {"x-stub-interval": "0.01", "x-stub-chunks": "500"}, True))
            assert b" 200 " in read_head(s)
            before = len(stub.closed_at)
        finally:
            t0 = time.monotonic()
            s.close()
        assert _wait(lambda: len(stub.closed_at) > before, 5.0), "upstream never closed"
        return stub.closed_at[before] - t0

    one()  # warm the pools and the code paths
    assert _wait(lambda: stub.open_connections == 0)
    gc.collect()
    fds0, tasks0 = _fds(), proxy.call(tasks_in_flight)
    requests0 = len(stub.requests)
    delays = [one() for _ in range(n)]
    assert _wait(lambda: stub.open_connections == 0, 5), f"{stub.open_connections} upstream connections leaked"
    assert _wait(lambda: proxy.call(lambda: server.stats.connections_active) == 0, 5)
    assert _wait(lambda: proxy.call(tasks_in_flight) <= tasks0, 5), "tasks leaked"
    gc.collect()
    assert _wait(lambda: _fds() <= fds0 + 5, 5), (_fds(), fds0)
    assert len(stub.requests) - requests0 == n  # each stream sent upstream once
    inflight = proxy.call(lambda: dict(proxy.handler.router.in_flight))  # type: ignore[attr-defined]
    assert all(v == 0 for v in inflight.values()), inflight
    out = {"trials": n, "p50_ms": _p(delays, 0.5) * 1e3, "p99_ms": _p(delays, 0.99) * 1e3,
           "max_ms": max(delays) * 1e3, "fds_delta": _fds() - fds0,
           "tasks_delta": proxy.call(tasks_in_flight) - tasks0,
           "upstream_open": stub.open_connections}
    print(f"\nF8 client aborts: {out}")
    assert out["p99_ms"] <= 1000.0, out
    return out


def reset_trials(proxy: Stack, n: int) -> dict[str, int]:
    stub = proxy.stub
    requests0 = len(stub.requests)
    complete = events_total = 0
    for i in range(n):
        k = 2 + i % 5
        hdrs = {"x-stub-fail-after": str(k), "x-stub-chunks": "20"}
        if i % 2:
            hdrs["x-stub-fail-rst"] = "1"
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            s.sendall(raw_request(proxy.port, "m1", hdrs, True))
            buf = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                buf += chunk
        assert b" 200 " in buf.split(b"\r\n", 1)[0], buf[:200]
        body = buf.partition(b"\r\n\r\n")[2]
        events = body.count(b"data: ") - body.count(b'data: {"error"')  # an error event may end it
        events_total += events
        if body.endswith(b"0\r\n\r\n") or b"[DONE]" in body:
            complete += 1
        assert events == k, (k, events, body[-300:])
    retries = len(stub.requests) - requests0 - n
    out = {"trials": n, "reported_complete": complete, "retries": retries, "events": events_total}
    print(f"\nF9 upstream resets: {out}")
    assert complete == 0 and retries == 0, out
    assert _wait(lambda: stub.open_connections == 0, 5)
    return out


def test_f8_client_aborts_ci(proxy: Stack) -> None:
    abort_trials(proxy, CI_TRIALS)


def test_f9_upstream_resets_ci(proxy: Stack) -> None:
    reset_trials(proxy, CI_TRIALS)


@pytest.mark.reliability
def test_f8_client_aborts_full(proxy: Stack) -> None:
    abort_trials(proxy, 1000)


@pytest.mark.reliability
def test_f9_upstream_resets_full(proxy: Stack) -> None:
    reset_trials(proxy, 1000)
