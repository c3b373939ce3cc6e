"""Shared state benchmark: CPU per request with Redis sharing on vs off, and rate-limit accuracy.

In one run, against the stub engine (two endpoints, least-loaded, rate limits on):

1. **CPU per request**, sharing off (``--workers 1``) and on (``PROXY_REDIS_URL`` set), alternated
   for ``--rounds`` rounds of ``--duration`` seconds each with the same wrk load; the figure is the
   proxy process's user+sys CPU over the window divided by the requests answered (the Redis server's
   own CPU is reported beside it, not added). Reported: the medians and their ratio (target <= 1.10).
2. **Admitted-count accuracy** of a global limit of 100 rps, burst 20, under ~10x overload for
   ``--limit-seconds``: with ``--workers 2`` (shared memory) and with 2 replicas sharing one Redis.
   Expected: r·T + b with T the load window wrk reports; the figure is admitted / expected.

Writes ``bench/results/sharing.json`` and ``bench/results/sharing.md``.
Usage: ``python bench/bench_sharing.py [--duration 5] [--rounds 3] [--limit-seconds 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.load_proxy import lua_script, parse_wrk
from tests.harness import free_port, wait_port
from tests.proxy._procs import stop as _stop

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PY = sys.executable


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _proxy(inv: Path, port: int, workers: int, core: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["taskset", "-c", core, PY, "-m", "flexinfer.cli", "--log-level", "warning", "proxy",
                             "-c", str(inv), "--port", str(port), "--workers", str(workers)],
                            cwd=ROOT, env=_env(**env))


def _cpu(pid: int) -> float:
    p = psutil.Process(pid)
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _wrk(url: str, script: Path, connections: int, seconds: float, core: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["taskset", "-c", core, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
                             "-s", str(script), url], stdout=subprocess.PIPE, text=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--limit-seconds", type=float, default=5.0)
    args = ap.parse_args()
    for tool in ("wrk", "redis-server"):
        if not shutil.which(tool):
            print(f"{tool} is missing (make bench installs wrk; make test installs redis-server)", file=sys.stderr)
            return 2
    ncpu = os.cpu_count() or 1
    proxy_core, load_core = ("0", "1") if ncpu >= 2 else ("0", "0")
    tmp = Path(tempfile.mkdtemp(prefix="flexinfer-bench-sharing-"))
    e1, e2, rport = free_port(), free_port(), free_port()
    inv = tmp / "inv.yaml"
    inv.write_text(f"models:\n  - name: bench\n    routing: least-loaded\n"
                   f"    endpoints: [http://127.0.0.1:{e1}, http://127.0.0.1:{e2}]\n")
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "x" * 1000}]})
    script = tmp / "chat.lua"
    script.write_text(lua_script(body, {}))
    engines = [subprocess.Popen(["taskset", "-c", load_core, PY, "-m", "tests.stub_engine", "--port", str(p)],
                                cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL) for p in (e1, e2)]
    redis = subprocess.Popen(["taskset", "-c", load_core, "redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    redis_url = f"redis://127.0.0.1:{rport}/0"
    high = {"PROXY_RATE_LIMIT_ENABLED": "true", "PROXY_RATE_LIMIT_GLOBAL": "1000000",
            "PROXY_RATE_LIMIT_GLOBAL_BURST": "100000", "PROXY_RATE_LIMIT_PER_MODEL": "1000000",
            "PROXY_RATE_LIMIT_BURST": "100000"}
    results: dict[str, object] = {"duration_s": args.duration, "rounds": args.rounds, "connections": args.connections}
    try:
        for p in (e1, e2, rport):
            wait_port(p)
        # 1. CPU per request, off and on, alternated
        cpu: dict[str, list[float]] = {"off": [], "on": []}
        rps: dict[str, list[float]] = {"off": [], "on": []}
        redis_cpu: list[float] = []
        for _ in range(args.rounds):
            for mode in ("off", "on"):
                port = free_port()
                extra = dict(high, **({"PROXY_REDIS_URL": redis_url} if mode == "on" else {}))
                proxy = _proxy(inv, port, 1, proxy_core, **extra)
                try:
                    wait_port(port)
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
                    _wrk(url, script, 8, 1, load_core).communicate()  # warm
                    c0, r0 = _cpu(proxy.pid), _cpu(redis.pid)
                    out, _ = _wrk(url, script, args.connections, args.duration, load_core).communicate()
                    used, rused = _cpu(proxy.pid) - c0, _cpu(redis.pid) - r0
                    res = parse_wrk(out)
                    n = max(1.0, res.get("requests", 0) - res.get("errors", 0))
                    cpu[mode].append(used / n * 1e6)
                    rps[mode].append(res["rps"])
                    if mode == "on":
                        redis_cpu.append(rused / n * 1e6)
                finally:
                    _stop(proxy)
        med = {m: statistics.median(v) for m, v in cpu.items()}
        results["cpu_us_per_request"] = {"off": cpu["off"], "on": cpu["on"], "median_off": med["off"],
                                         "median_on": med["on"], "ratio_on_off": med["on"] / med["off"],
                                         "redis_server_us_per_request": statistics.median(redis_cpu),
                                         "rps": rps}
        # 2. accuracy of a global limit of 100 rps, burst 20
        limit = {"PROXY_RATE_LIMIT_ENABLED": "true", "PROXY_RATE_LIMIT_GLOBAL": "100",
                 "PROXY_RATE_LIMIT_GLOBAL_BURST": "20", "PROXY_RATE_LIMIT_PER_MODEL": "1000000",
                 "PROXY_RATE_LIMIT_BURST": "100000"}
        acc: dict[str, object] = {}
        for name, layout in (("2 workers", [(2, {})]),
                             ("2 replicas, one Redis", [(1, {"PROXY_REDIS_URL": redis_url, "PROXY_REPLICA_ID": "a"}),
                                                        (1, {"PROXY_REDIS_URL": redis_url, "PROXY_REPLICA_ID": "b"})])):
            subprocess.run(["redis-cli", "-p", str(rport), "flushall"], capture_output=True, check=False)
            ports = [free_port() for _ in layout]
            procs = [_proxy(inv, p, w, proxy_core, **dict(limit, **e)) for p, (w, e) in zip(ports, layout, strict=True)]
            try:
                for p in ports:
                    wait_port(p)
                time.sleep(0.5)  # Redis clients connected, buckets untouched
                loads = [_wrk(f"http://127.0.0.1:{p}/v1/chat/completions", script, 16, args.limit_seconds, load_core)
                         for p in ports]
                outs = [parse_wrk(w.communicate()[0]) for w in loads]
            finally:
                _stop(*procs)
            admitted = sum(int(o["requests"] - o["errors"]) for o in outs)
            seconds = max(o["seconds"] for o in outs)
            expected = 100 * seconds + 20
            acc[name] = {"admitted": admitted, "sent": sum(int(o["requests"]) for o in outs), "seconds": seconds,
                         "expected": expected, "ratio": admitted / expected}
        results["limit_accuracy"] = acc
    finally:
        _stop(*engines, redis)
        shutil.rmtree(tmp, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sharing.json").write_text(json.dumps(results, indent=2) + "\n")
    c = results["cpu_us_per_request"]
    md = ["| sharing | proxy CPU µs/req (median) | rounds |", "|---|---:|---|",
          f"| off (--workers 1) | {c['median_off']:.1f} | {', '.join(f'{x:.1f}' for x in c['off'])} |",  # type: ignore[index]
          f"| on (Redis) | {c['median_on']:.1f} | {', '.join(f'{x:.1f}' for x in c['on'])} |",  # type: ignore[index]
          "", f"ratio on/off: **{c['ratio_on_off']:.3f}** (target <= 1.10); redis-server CPU beside it: "  # type: ignore[index]
          f"{c['redis_server_us_per_request']:.1f} µs/req", "",  # type: ignore[index]
          "| limit 100 rps, burst 20 | admitted | sent | T (s) | r·T+b | admitted / expected |", "|---|---:|---:|---:|---:|---:|"]
    for name, a in acc.items():
        md.append(f"| {name} | {a['admitted']} | {a['sent']} | {a['seconds']:.2f} | {a['expected']:.0f} | "  # type: ignore[index]
                  f"{a['ratio']:.3f} |")  # type: ignore[index]
    (RESULTS / "sharing.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
