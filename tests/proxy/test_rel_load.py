"""Rows F4, F6 and F7 of the reliability plan against a REAL ``flexinfer proxy`` process in front of
a stub engine process, with every load generator in its own process (:mod:`tests.proxy._rel_load`),
so the latencies are the proxy's and not the test's; as in bench/gate.py the proxy runs alone on
core 0, the backend and the load generators on core 1.

F4 (R1, slowloris): legitimate open-loop chat traffic alone (the baseline), then the same traffic
while N slow connections drip one header line per INTERVAL and never finish. Pass: every slow
connection closed at the header deadline (PROXY_HEADER_TIMEOUT) +- 1 s, legitimate success >=
99.9 %, legitimate p99 <= 2x the baseline of the same run. CI: 100 slow connections, deadline 1 s
(the p99 ratio is printed, asserted only in the full run); full: 2,000 connections, deadline 5 s.
F6 (throughput): wrk at c=100 and c=1,000 straight to the backend (bench/gate_backend.py, the
zero-latency backend of the plan) and through the proxy (rps,
p50/p99/p99.9), and the latency the proxy adds at an open-loop 1,000 req/s (p99 through minus
direct). Full run only (a benchmark).
F7: IDLE keep-alive connections held open plus STREAMS concurrent SSE streams (an event every
INTERVAL): 0 errors, inter-event delay beyond the interval (full run: p99 through the proxy less
p99 of the same streams straight to the stub, the proxy's forwarding delay, <= 5 ms), the proxy's
RSS per idle connection (RSS growth / IDLE).
CI: 200 + 20; full: 5,000 + 500.
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


#: As bench/gate.py: the proxy alone on core 0, the backend and the load generators on core 1 (when
#: taskset is there and the box has two cores), so the proxy's figures are not its load's.
_PIN = shutil.which("taskset") is not None and (psutil.cpu_count() or 1) >= 2


def pinned(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if _PIN else []


@contextmanager
def stack(backend: str = "stub", **settings: str) -> Iterator[tuple[int, int, subprocess.Popen[bytes]]]:
    """(backend port, proxy port, proxy process). ``backend``: ``stub`` (tests/stub_engine.py: SSE
    pacing, usage) or ``gate`` (bench/gate_backend.py: prebuilt answers, the cheap zero-latency
    backend of the benchmark gate, for throughput)."""
    sport, pport = free_port(), free_port()
    cmd = (["-m", "tests.stub_engine", "--port", str(sport)] if backend == "stub"
           else [str(ROOT / "bench" / "gate_backend.py"), "--port", str(sport)])
    stub = subprocess.Popen([*pinned(1), sys.executable, *cmd], cwd=ROOT, env=env(), stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inv.yaml"
        inv.write_text(f"models:\n  - name: m\n    endpoints: [http://127.0.0.1:{sport}]\n")
        proxy = subprocess.Popen([*pinned(0), sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy",
                                  "-c", str(inv), "--port", str(pport)], cwd=ROOT, env=env(**settings))
        try:
            wait_port(sport)
            wait_port(pport, timeout=30)
            yield sport, pport, proxy
        finally:
            stop(proxy, stub)


def gen(*args: object, core: int = 1) -> subprocess.Popen[str]:
    return subprocess.Popen([*pinned(core), sys.executable, "-m", "tests.proxy._rel_load", *map(str, args)], cwd=ROOT,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p: subprocess.Popen[str], timeout: float = 300) -> dict:  # type: ignore[type-arg]
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out)  # type: ignore[no-any-return]


def slowloris(n: int, deadline: float, rate: float, seconds: float, *, assert_ratio: bool) -> dict[str, float]:
    with stack(PROXY_HEADER_TIMEOUT=str(deadline)) as (sport, port, proxy):
        cpu = psutil.Process(proxy.pid).cpu_times
        result(gen("legit", port, rate, min(1.0, seconds / 4)))  # warm-up
        c0 = cpu()
        base = result(gen("legit", port, rate, seconds))
        c1 = cpu()
        slow = gen("slow", port, n, deadline / 4, seconds + deadline + 3, )
        time.sleep(min(2.0, deadline / 2))  # the slow connections are open before the load starts
        c2 = cpu()
        under = result(gen("legit", port, rate, seconds))
        c3 = cpu()
        closed = result(slow, timeout=seconds + deadline + 60)["closed_after"]
        if assert_ratio:  # the same two phases with the legit load straight to the backend
            dbase = result(gen("legit", sport, rate, seconds))
            slow2 = gen("slow", port, n, deadline / 4, seconds + deadline + 3)
            time.sleep(min(2.0, deadline / 2))
            dunder = result(gen("legit", sport, rate, seconds))
            result(slow2, timeout=seconds + deadline + 60)
    off = [c - deadline for c in closed if c is not None and c >= 0]
    never = sum(1 for c in closed if c is None)
    refused = sum(1 for c in closed if c is not None and c < 0)
    out = {"slow": n, "deadline_s": deadline, "closed": len(off), "never_closed": never, "refused": refused,
           "close_minus_deadline_min_s": min(off), "close_minus_deadline_max_s": max(off),
           "legit_sent": under["sent"], "legit_ok_pct": 100.0 * under["ok"] / under["sent"],
           "legit_fail": under["fail"], "base_ok_pct": 100.0 * base["ok"] / base["sent"],
           "base_p99_ms": _p(base["lat"], 0.99) * 1e3, "under_p99_ms": _p(under["lat"], 0.99) * 1e3,
           # the proxy's CPU (user+sys) over each legit window: its own cost of the slow connections
           "proxy_cpu_base_s": c1.user + c1.system - c0.user - c0.system,
           "proxy_cpu_under_s": c3.user + c3.system - c2.user - c2.system}
    out["p99_ratio"] = out["under_p99_ms"] / out["base_p99_ms"]
    if assert_ratio:
        # what the slow connections' generator does to the same load on the backend's core when the
        # proxy is not in the path: the part of the ratio that is the box's, not the proxy's
        out["direct_base_p99_ms"] = _p(dbase["lat"], 0.99) * 1e3
        out["direct_under_p99_ms"] = _p(dunder["lat"], 0.99) * 1e3
        out["direct_p99_ratio"] = out["direct_under_p99_ms"] / out["direct_base_p99_ms"]
    print(f"\nF4 slowloris: {out}\nslowest legit (latency, sent at) base {base['slowest']}, "
          f"under {under['slowest']}")
    assert never == 0 and refused == 0, out
    assert all(abs(x) <= 1.0 for x in off), out
    assert out["legit_ok_pct"] >= 99.9, out
    if assert_ratio:
        assert out["p99_ratio"] <= 2.0, out
    return out


def test_f4_slowloris_ci() -> None:
    slowloris(100, 1.0, 40, 1.5, assert_ratio=False)


@pytest.mark.reliability
def test_f4_slowloris_full() -> None:
    slowloris(2000, 5.0, 100, 10.0, assert_ratio=True)


def keepalive_sse(idle: int, streams: int, interval: float, events: int, direct: bool = False) -> dict[str, float]:
    with stack(PROXY_KEEPALIVE_TIMEOUT="120") as (sport, port, proxy):
        proc = psutil.Process(proxy.pid)
        rss0 = proc.memory_info().rss
        g = gen("sse", port, idle, streams, interval, events)
        assert g.stderr is not None
        line = g.stderr.readline()  # blocks until the idle connections are open
        assert "idle-ready" in line, line
        time.sleep(0.5)
        rss1 = proc.memory_info().rss
        r = result(g)
        # the same streams straight to the stub: the delay the stub and the client add without the proxy
        d = result(gen("sse", sport, 0, streams, interval, events)) if direct else None
    gaps = r["gaps"]
    out = {"idle": idle, "idle_ok": r["idle_ok"], "idle_open_after": r["idle_open_after"], "streams": streams,
           "stream_errors": r["errors"]["stream"], "events_measured": len(gaps),
           "gap_p50_ms": _p(gaps, 0.5) * 1e3, "gap_p99_ms": _p(gaps, 0.99) * 1e3,
           "rss_per_idle_kib": (rss1 - rss0) / idle / 1024}
    if d is not None:
        out["direct_gap_p50_ms"] = _p(d["gaps"], 0.5) * 1e3
        out["direct_gap_p99_ms"] = _p(d["gaps"], 0.99) * 1e3
    print(f"\nF7 keep-alive + SSE: {out}")
    assert out["idle_ok"] == idle and out["idle_open_after"] == idle and out["stream_errors"] == 0, out
    return out


def test_f7_keepalive_sse_ci() -> None:
    keepalive_sse(200, 20, 0.05, 20)


@pytest.mark.reliability
def test_f7_keepalive_sse_full() -> None:
    out = keepalive_sse(5000, 500, 0.1, 50, direct=True)
    # the forwarding delay (plan U8) is the proxy's: the chain's p99 less what the stub and the
    # client show without the proxy, in the same run
    assert out["gap_p99_ms"] - out["direct_gap_p99_ms"] <= 5.0, out
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
    p = subprocess.run([*pinned(1), "wrk", "-t", "1", "-c", str(conns), "-d", f"{seconds:g}s", "-s", script,
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
    with stack("gate") as (sport, pport, proxy):
        cpu = psutil.Process(proxy.pid).cpu_times
        for c in (100, 1000):
            wrk(pport, c, 2, str(script))  # warm-up
            rows[f"direct c={c}"] = wrk(sport, c, 8, str(script))
            c0 = cpu()
            rows[f"proxy c={c}"] = r = wrk(pport, c, 8, str(script))
            c1 = cpu()
            # the proxy's CPU per request, and the share of its core it got (under 1: the core is shared)
            spent = c1.user + c1.system - c0.user - c0.system
            r["proxy_cpu_us_per_req"] = spent / (r["rps"] * 8) * 1e6
            r["proxy_core_share"] = spent / 8
        d = result(gen("legit", sport, 1000, 8, "keepalive"))
        p = result(gen("legit", pport, 1000, 8, "keepalive"))
    added = {q: (_p(p["lat"], q) - _p(d["lat"], q)) * 1e3 for q in (0.5, 0.99, 0.999)}
    print(f"\nF6 throughput: {json.dumps(rows)}\nF6 added latency at 1k rps (ms): {added} "
          f"(ok direct {d['ok']}/{d['sent']}, proxy {p['ok']}/{p['sent']})")
    # c=1000 is reported, not judged (the plan's targets are c=100 and 1k rps): there the single
    # backend's accept queue refuses some of the 1,000 connections, straight (154 errors in one run)
    # or through the proxy (then 503s: one replica, nothing to retry on)
    assert rows["proxy c=100"]["errors"] == 0 and rows["direct c=100"]["errors"] == 0, rows
    # the plan's 5k rps is "about 1/8 of the 39.8k single-hop ceiling measured here": on a slower
    # box the same run's ceiling (straight to the backend) sets the bar, never above 5k
    assert rows["proxy c=100"]["rps"] >= min(5000.0, rows["direct c=100"]["rps"] / 8), rows
    assert added[0.99] <= 5.0, added


