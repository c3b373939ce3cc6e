"""F18 (reliability plan LC1): SIGTERM with many open streams on a real ``flexinfer proxy`` process.

S streams shorter than the grace period and L streams longer than it are open (their first bytes
received) when the proxy gets SIGTERM; the stub engine runs in this process and timestamps each
request it receives. During the drain a prober keeps trying new work: new connections, and a
request on a keep-alive connection opened before the signal. Pass: every in-grace stream ends
complete (``[DONE]`` and the terminal chunk) (100 %); the long ones end without a terminal chunk;
0 requests reach the engine after the signal (new work refused: connection refused or 503); exit 0
within the grace period + 2 s. The plan's 30 s grace is scaled (x 0.05 in make test, x 0.1 under
the ``reliability`` marker).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.harness import LoopThread, free_port, wait_port
from tests.proxy._procs import ROOT, env, inventory
from tests.proxy._rel import figure
from tests.stub_engine import StubEngine


async def open_stream(port: int, chunks: int, interval: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()
    w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
            b"x-stub-chunks: %d\r\nx-stub-interval: %g\r\nContent-Length: %d\r\n\r\n%s"
            % (chunks, interval, len(body), body))
    await r.readuntil(b"data: ")  # the stream is open
    return r, w


async def finish(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> str:
    try:
        rest = await asyncio.wait_for(r.read(), 30)
    except ConnectionError:
        rest = b""
    finally:
        w.close()
    if rest.endswith(b"0\r\n\r\n") and b"[DONE]" in rest:
        return "complete"
    return "cut" if b"0\r\n\r\n" not in rest[-7:] else "terminal-chunk-without-done"


async def probe(port: int, idle: tuple[asyncio.StreamReader, asyncio.StreamWriter], until: float) -> Counter[str]:
    out: Counter[str] = Counter()
    r, w = idle
    w.write(b"GET /readyz HTTP/1.1\r\nHost: a\r\n\r\n")
    head = await r.read(4096)
    out["keepalive-" + (head[9:12].decode() if head else "closed")] += 1
    w.close()
    while time.monotonic() < until:
        try:
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            out["new-refused"] += 1
        else:
            w2.write(b'POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n'
                     b'Content-Length: 16\r\n\r\n{"model":"m"}   ')
            try:
                data = await r2.read(4096)
            except ConnectionError:
                data = b""
            out["new-" + (data[9:12].decode() if data else "closed")] += 1
            w2.close()
        await asyncio.sleep(0.02)
    return out


def drain(tmp: Path, short: int, long: int, grace: float) -> None:
    engine = LoopThread()
    stub = engine.run(StubEngine().start())
    try:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy", "-c",
                                 str(inventory(tmp, [stub.port])), "--port", str(port)], cwd=ROOT,
                                env=env(PROXY_GRACEFUL_SHUTDOWN_TIMEOUT=str(grace)), stderr=subprocess.PIPE)
        try:
            wait_port(port, timeout=30)

            async def scenario() -> tuple[list[str], list[str], Counter[str], float, int]:
                idle_conn = await asyncio.open_connection("127.0.0.1", port)
                shorts = await asyncio.gather(*(open_stream(port, 10, grace * 0.4 / 10) for _ in range(short)))
                longs = await asyncio.gather(*(open_stream(port, 100, grace * 3 / 100) for _ in range(long)))
                before = engine.call(lambda: len(stub.requests))
                t_sig = time.monotonic()
                os.kill(proc.pid, signal.SIGTERM)
                await asyncio.sleep(0.05)
                prober = asyncio.ensure_future(probe(port, idle_conn, t_sig + grace * 0.8))
                s_out = await asyncio.gather(*(finish(*s) for s in shorts))
                l_out = await asyncio.gather(*(finish(*s) for s in longs))
                return list(s_out), list(l_out), await prober, t_sig, before

            s_out, l_out, probes, t_sig, before = asyncio.run(scenario())
            rc = proc.wait(grace + 10)
            exit_after = time.monotonic() - t_sig
            after = engine.call(lambda: sum(1 for c in stub.requests if c.at > t_sig))
            err = proc.stderr.read().decode() if proc.stderr else ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        sc, lc = Counter(s_out), Counter(l_out)
        figure("F18", grace_s=grace, in_grace_streams=short, completed=sc["complete"],
               completed_pct=sc["complete"] / short * 100, long_streams=long, long_outcomes=dict(lc),
               probes=dict(probes), engine_requests_after_sigterm=after, streams_before=before, exit_code=rc,
               exit_after_s=exit_after)
        assert sc["complete"] == short, sc
        assert lc["cut"] == long, lc
        assert after == 0, after
        assert set(probes) <= {"new-refused", "new-503", "new-closed", "keepalive-503", "keepalive-closed"}, probes
        assert rc == 0 and "Traceback" not in err, err[-2000:]
        assert exit_after <= grace + 2.0
    finally:
        if stub.server is not None:
            engine.run(stub.stop())
        engine.close()


def test_drain_ci(tmp_path: Path) -> None:
    drain(tmp_path, short=20, long=2, grace=1.5)


@pytest.mark.reliability
def test_drain_full(tmp_path: Path) -> None:
    drain(tmp_path, short=100, long=10, grace=3.0)
