"""Load benchmark of the proxy against the stub engine, direct and through the proxy, in one run.

The stub engine and wrk share core 1; the proxy runs alone on core 0 (``taskset``), one worker.
Each scenario is measured directly against the engine and through the proxy back to back, so the
figures are ratios and differences taken on the same machine minutes apart. Reported per scenario:
requests/s, p50/p99 latency (wrk ``--latency``), the proxy's CPU time per request (user+sys of the
proxy process over the window / completed requests) and its peak RSS (VmHWM); plus the latency the
proxy adds at c=1 (p50/p99 through the proxy minus direct).

Writes ``bench/results/proxy.json`` and ``bench/results/proxy.md``.
Usage: ``python bench/load_proxy.py [--duration 10] [--connections 64]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.harness import free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

SCENARIOS = {
    # name: (model, message characters, extra body, extra headers)
    "chat": ("bench", 1000, "", {}),
    "chat-stream-35": ("bench", 1000, ',"stream":true', {"x-stub-chunks": "32"}),  # role + 32 + finish + [DONE]
    # 220 KB prompts sharing a long system prompt, routed by prefix-cache over two engines
    "chat-220k-prefix-cache": ("bench-pc", 220_000, "", {}),
}


def lua_script(body: str, headers: dict[str, str]) -> str:
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(body)}",
             'wrk.headers["Content-Type"] = "application/json"']
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
    return "\n".join(lines) + "\n"


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _dur(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out: str) -> dict[str, float]:
    res: dict[str, float] = {}
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}(?:\.000)?%\s+(\S+)", out, re.M)
        if m:
            res[f"p{pct}_ms"] = _dur(m.group(1)) * 1000
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+)", out)
    if m:
        res["requests"] = int(m.group(1))
        res["seconds"] = _dur(m.group(2) + m.group(3))
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    res["rps"] = float(m.group(1)) if m else 0.0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    res["errors"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        res["errors"] += sum(int(x) for x in m.groups())
    return res


def run_wrk(url: str, script: Path, connections: int, duration: float, core: str) -> tuple[dict[str, float], str]:
    cmd = ["taskset", "-c", core, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency",
           "-s", str(script), url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return parse_wrk(out), out


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wrk_cores() -> tuple[str, str] | None:
    """The (proxy, load) cores of a wrk run: the proxy alone on core 0, wrk and the stub engines on core 1
    (both on core 0 on a one-core machine); None, said on stderr, when wrk is missing."""
    if not shutil.which("wrk"):
        print("wrk is missing: `apt-get install wrk` (make bench does it)", file=sys.stderr)
        return None
    return ("0", "1") if (os.cpu_count() or 1) >= 2 else ("0", "0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--c1-duration", type=float, default=5.0)
    args = ap.parse_args()
    cores = wrk_cores()
    if cores is None:
        return 2
    proxy_core, load_core = cores
    tmp = Path(tempfile.mkdtemp(prefix="flexinfer-bench-"))
    engine_port, engine2_port, proxy_port = free_port(), free_port(), free_port()
    (tmp / "inv.yaml").write_text(
        f"models:\n  - name: bench\n    endpoints: [http://127.0.0.1:{engine_port}]\n"
        f"  - name: bench-pc\n    routing: prefix-cache\n"
        f"    endpoints: [http://127.0.0.1:{engine_port}, http://127.0.0.1:{engine2_port}]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    py = sys.executable
    engine = subprocess.Popen(["taskset", "-c", load_core, py, "-m", "tests.stub_engine", "--port",
                               str(engine_port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    engine2 = subprocess.Popen(["taskset", "-c", load_core, py, "-m", "tests.stub_engine", "--port",
                                str(engine2_port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    proxy = subprocess.Popen(["taskset", "-c", proxy_core, py, "-m", "flexinfer.cli", "--log-level", "warning",
                              "proxy", "-c", str(tmp / "inv.yaml"), "--port", str(proxy_port)],
                             cwd=ROOT, env=env)
    results: dict[str, object] = {"connections": args.connections, "duration_s": args.duration,
                                  "scenarios": {}}
    try:
        wait_port(engine_port)
        wait_port(engine2_port)
        wait_port(proxy_port)
        pp = psutil.Process(proxy.pid)
        for name, (model_name, chars, extra, headers) in SCENARIOS.items():
            messages = [{"role": "user", "content": "x" * chars}]
            if chars > 10_000:  # a shared system prompt, then the user's text
                messages = [{"role": "system", "content": "You are a careful assistant. " * 300},
                            {"role": "user", "content": "y" * (chars - 8700)}]
            body = json.dumps({"model": model_name, "messages": messages})
            body = body[:-1] + extra + "}"
            script = tmp / f"{name}.lua"
            script.write_text(lua_script(body, headers))
            run_wrk(f"http://127.0.0.1:{proxy_port}/v1/chat/completions", script, 8, 1.0, load_core)  # warm
            direct, _ = run_wrk(f"http://127.0.0.1:{engine_port}/v1/chat/completions", script,  # same body
                                args.connections, args.duration, load_core)
            c0 = cpu_seconds(pp)
            via, _ = run_wrk(f"http://127.0.0.1:{proxy_port}/v1/chat/completions", script,
                             args.connections, args.duration, load_core)
            cpu = cpu_seconds(pp) - c0
            via["cpu_us_per_request"] = cpu / max(1.0, via.get("requests", 0)) * 1e6
            via["cpu_busy_fraction"] = cpu / max(1e-9, via.get("seconds", args.duration))
            d1, _ = run_wrk(f"http://127.0.0.1:{engine_port}/v1/chat/completions", script, 1,
                            args.c1_duration, load_core)
            v1, _ = run_wrk(f"http://127.0.0.1:{proxy_port}/v1/chat/completions", script, 1,
                            args.c1_duration, load_core)
            added = {"p50_ms": v1["p50_ms"] - d1["p50_ms"], "p99_ms": v1["p99_ms"] - d1["p99_ms"]}
            results["scenarios"][name] = {"direct": direct, "proxy": via, "c1_direct": d1, "c1_proxy": v1,  # type: ignore[index]
                                          "added_latency_c1": added,
                                          # VmHWM is a running peak: scenarios run in order, light ones first
                                          "proxy_peak_rss_mib_so_far": peak_rss_mib(proxy.pid)}
        results["proxy_peak_rss_mib"] = peak_rss_mib(proxy.pid)
    finally:
        for p in (proxy, engine, engine2):
            p.terminate()
        for p in (proxy, engine, engine2):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "proxy.json").write_text(json.dumps(results, indent=2) + "\n")
    md = ["| scenario | path | req/s | p50 ms | p99 ms | proxy CPU µs/req | errors |", "|---|---|---|---|---|---|---|"]
    for name, sc in results["scenarios"].items():  # type: ignore[attr-defined]
        for label, key in (("direct", "direct"), ("proxy", "proxy")):
            r = sc[key]
            cpu_cell = f"{r['cpu_us_per_request']:.0f}" if "cpu_us_per_request" in r else ""
            md.append(f"| {name} | {label} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {cpu_cell} | "
                      f"{r['errors']:.0f} |")
        a = sc["added_latency_c1"]
        md.append(f"| {name} | added at c=1 | | {a['p50_ms']:.3f} | {a['p99_ms']:.3f} | | |")
        md.append(f"| {name} | proxy peak RSS so far | | | | {sc['proxy_peak_rss_mib_so_far']:.1f} MiB | |")
    md.append(f"\nProxy peak RSS: {results['proxy_peak_rss_mib']:.1f} MiB")
    (RESULTS / "proxy.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
