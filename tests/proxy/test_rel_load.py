"""Rows F4, F6 and F7 of the reliability plan against a REAL ``flexinfer proxy`` process in front of
a stub engine process, with every load generator in its own process (:mod:`tests.proxy._rel_load`),
so the latencies are the proxy's and not the test's.

F4 (R1, slowloris): legitimate open-loop chat traffic alone (the baseline), then the same traffic
while N slow connections drip one header line per INTERVAL and never finish. Pass: every slow
connection closed at the header deadline (PROXY_HEADER_TIMEOUT) +- 1 s, legitimate success >=
99.9 %, legitimate p99 <= 2x the baseline of the same run. CI: 200 slow connections, deadline 2 s
(the p99 ratio is printed, asserted only in the full run); full: 2,000 connections, deadline 5 s.
F6 (throughput): wrk at c=100 and c=1,000 straight to the stub and through the proxy (rps,
p50/p99/p99.9), and the latency the proxy adds at an open-loop 1,000 req/s (p99 through minus
direct). Full run only (a benchmark).
F7: IDLE keep-alive connections held open plus STREAMS concurrent SSE streams (an event every
INTERVAL): 0 errors, inter-event delay beyond the interval p99 <= 5 ms (this bounds the whole
chain: stub, proxy and client), the proxy's RSS per idle connection (RSS growth / IDLE).
CI: 500 + 50; full: 5,000 + 500.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tests.harness import free_port, wait_port
from tests.proxy._procs import env, stop

ROOT = Path(__file__).resolve().parents[2]


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


@contextmanager
def stack(**settings: str) -> Iterator[tuple[int, int, subprocess.Popen[bytes]]]:
    """(stub port, proxy port, proxy process)."""
    sport, pport = free_port(), free_port()
    stub = subprocess.Popen([sys.executable, "-m", "tests.stub_engine", "--port", str(sport)], cwd=ROOT, env=env(),
                            stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inv.yaml"
        inv.write_text(f"models:\n  - name: m\n    endpoints: [http://127.0.0.1:{sport}]\n")
        proxy = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy", "-c",
                                  str(inv), "--port", str(pport)], cwd=ROOT, env=env(**settings))
        try:
            wait_port(sport)
            wait_port(pport, timeout=30)
            yield sport, pport, proxy
        finally:
            stop(proxy, stub)


def gen(*args: object, timeout: float = 300) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.proxy._rel_load", *map(str, args)], cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p: subprocess.Popen[str], timeout: float = 300) -> dict:  # type: ignore[type-arg]
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out)  # type: ignore[no-any-return]


def slowloris(n: int, deadline: float, rate: float, seconds: float, *, assert_ratio: bool) -> dict[str, float]:
    with stack(PROXY_HEADER_TIMEOUT=str(deadline)) as (_, port, _proxy):
        result(gen("legit", port, rate, 1.0))  # warm-up
        base = result(gen("legit", port, rate, seconds))
        slow = gen("slow", port, n, deadline / 4, seconds + deadline + 3)
        time.sleep(min(2.0, deadline / 2))  # the slow connections are open before the load starts
        under = result(gen("legit", port, rate, seconds))
        closed = result(slow, timeout=seconds + deadline + 60)["closed_after"]
    off = [c - deadline for c in closed if c is not None and c >= 0]
    never = sum(1 for c in closed if c is None)
    refused = sum(1 for c in closed if c is not None and c < 0)
    out = {"slow": n, "deadline_s": deadline, "closed": len(off), "never_closed": never, "refused": refused,
           "close_minus_deadline_min_s": min(off), "close_minus_deadline_max_s": max(off),
           "legit_sent": under["sent"], "legit_ok_pct": 100.0 * under["ok"] / under["sent"],
           "legit_fail": under["fail"], "base_ok_pct": 100.0 * base["ok"] / base["sent"],
           "base_p99_ms": _p(base["lat"], 0.99) * 1e3, "under_p99_ms": _p(under["lat"], 0.99) * 1e3}
    out["p99_ratio"] = out["under_p99_ms"] / out["base_p99_ms"]
    print(f"\nF4 slowloris: {out}")
    assert never == 0 and refused == 0, out
    assert all(abs(x) <= 1.0 for x in off), out
    assert out["legit_ok_pct"] >= 99.9, out
    if assert_ratio:
        assert out["p99_ratio"] <= 2.0, out
    return out


def test_f4_slowloris_ci() -> None:
    slowloris(200, 2.0, 50, 4.0, assert_ratio=False)


@pytest.mark.reliability
def test_f4_slowloris_full() -> None:
    slowloris(2000, 5.0, 100, 10.0, assert_ratio=True)


def keepalive_sse(idle: int, streams: int, interval: float, events: int) -> dict[str, float]:
    with stack(PROXY_KEEPALIVE_TIMEOUT="120") as (_, port, proxy):
        proc = psutil.Process(proxy.pid)
        rss0 = proc.memory_info().rss
        g = gen("sse", port, idle, streams, interval, events)
        assert g.stderr is not None
        line = g.stderr.readline()  # blocks until the idle connections are open
        assert "idle-ready" in line, line
        time.sleep(1.0)
        rss1 = proc.memory_info().rss
        r = result(g)
    gaps = r["gaps"]
    out = {"idle": idle, "idle_ok": r["idle_ok"], "idle_open_after": r["idle_open_after"], "streams": streams,
           "stream_errors": r["errors"]["stream"], "events_measured": len(gaps),
           "gap_p50_ms": _p(gaps, 0.5) * 1e3, "gap_p99_ms": _p(gaps, 0.99) * 1e3,
           "rss_per_idle_kib": (rss1 - rss0) / idle / 1024}
    print(f"\nF7 keep-alive + SSE: {out}")
    assert out["idle_ok"] == idle and out["idle_open_after"] == idle and out["stream_errors"] == 0, out
    return out


def test_f7_keepalive_sse_ci() -> None:
    keepalive_sse(500, 50, 0.05, 30)


@pytest.mark.reliability
def test_f7_keepalive_sse_full() -> None:
    out = keepalive_sse(5000, 500, 0.1, 50)
    assert out["gap_p99_ms"] <= 5.0, out
    assert out["rss_per_idle_kib"] <= 10.0, out


_LUA = """wrk.method = "POST"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %f %f %f\\n", summary.requests, summary.errors.status +
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
"""


def wrk(port: int, conns: int, seconds: float, script: str) -> dict[str, float]:
    p = subprocess.run(["wrk", "-t", "2", "-c", str(conns), "-d", f"{seconds:g}s", "-s", script,
                        f"http://127.0.0.1:{port}/v1/chat/completions"], capture_output=True, text=True, timeout=120)
    m = re.search(r"RESULT (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+) ([\d.]+)", p.stdout)
    assert m is not None, p.stdout + p.stderr
    n, err, dur_us = int(m[1]), int(m[2]), int(m[3])
    return {"rps": n / (dur_us / 1e6), "errors": err, "p50_ms": float(m[4]) / 1e3, "p99_ms": float(m[5]) / 1e3,
            "p999_ms": float(m[6]) / 1e3}


@pytest.mark.reliability
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (make wrk)")
def test_f6_throughput_full(tmp_path: Path) -> None:
    script = tmp_path / "chat.lua"
    script.write_text(_LUA)
    rows: dict[str, dict[str, float]] = {}
    with stack() as (sport, pport, _):
        for c in (100, 1000):
            wrk(pport, c, 2, str(script))  # warm-up
            rows[f"direct c={c}"] = wrk(sport, c, 8, str(script))
            rows[f"proxy c={c}"] = wrk(pport, c, 8, str(script))
        d = result(gen("legit", sport, 1000, 8, "keepalive"))
        p = result(gen("legit", pport, 1000, 8, "keepalive"))
    added = {q: (_p(p["lat"], q) - _p(d["lat"], q)) * 1e3 for q in (0.5, 0.99, 0.999)}
    print(f"\nF6 throughput: {json.dumps(rows)}\nF6 added latency at 1k rps (ms): {added} "
          f"(ok direct {d['ok']}/{d['sent']}, proxy {p['ok']}/{p['sent']})")
    assert all(r["errors"] == 0 for r in rows.values()), rows
    assert rows["proxy c=100"]["rps"] >= 5000, rows
    assert added[0.99] <= 5.0, added


