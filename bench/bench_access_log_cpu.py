"""Proxy CPU per request with the access log off, on in JSON and on in text, in one run.

One stub engine, one model; the same wrk load (chat, ``--connections`` connections) through
``flexinfer proxy`` (one worker, alone on core 0), once per mode, alternated for ``--rounds`` rounds.
The proxy's stderr goes to a file (as a container runtime's log pipe would take it). The figure is
the proxy process's user+sys CPU over the load window divided by the requests answered; reported:
the medians, and each mode's extra CPU per request over ``off``.

Writes ``bench/results/access_log_cpu.json`` and ``bench/results/access_log_cpu.md``.
Usage: ``python bench/bench_access_log_cpu.py [--duration 5] [--rounds 3] [--connections 32]``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_scored_cpu import cpu_args, cpu_per_request
from bench.bench_sharing import RESULTS, _env
from bench.load_proxy import lua_script, wrk_cores
from tests.harness import free_port, wait_port
from tests.proxy._procs import stop as _stop

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
MODES = {"off": ("text", {}), "json": ("json", {"PROXY_ACCESS_LOG": "1"}), "text": ("text", {"PROXY_ACCESS_LOG": "1"})}


def main() -> int:
    args = cpu_args(__doc__).parse_args()
    cores = wrk_cores()
    if cores is None:
        return 2
    proxy_core, load_core = cores
    tmp = Path(tempfile.mkdtemp(prefix="flexinfer-bench-accesslog-"))
    eport = free_port()
    inv = tmp / "inv.yaml"
    inv.write_text(f"models:\n  - name: bench\n    endpoints: [http://127.0.0.1:{eport}]\n")
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "x" * 200}]})
    script = tmp / "chat.lua"
    script.write_text(lua_script(body, {"User-Agent": "OpenAI/Python 1.50.0"}))
    engine = subprocess.Popen(["taskset", "-c", load_core, PY, "-m", "tests.stub_engine", "--port", str(eport)],
                              cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL)
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    rps: dict[str, list[float]] = {m: [] for m in MODES}
    lines: dict[str, int] = {m: 0 for m in MODES}
    try:
        wait_port(eport)
        for _ in range(args.rounds):
            for mode, (fmt, env) in MODES.items():
                port = free_port()
                log = tmp / f"{mode}.log"
                with open(log, "wb") as err:
                    proxy = subprocess.Popen(
                        ["taskset", "-c", proxy_core, PY, "-m", "flexinfer.cli", "--log-level", "warning",
                         "--log-format", fmt, "proxy", "-c", str(inv), "--port", str(port)],
                        cwd=ROOT, env=_env(**env), stderr=err)
                    try:
                        us, r = cpu_per_request(proxy, port, script, args.connections, args.duration, load_core)
                        cpu[mode].append(us)
                        rps[mode].append(r)
                    finally:
                        _stop(proxy)
                lines[mode] = max(lines[mode], log.read_bytes().count(b"\n"))
    finally:
        _stop(engine)
        shutil.rmtree(tmp, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in cpu.items()}
    load = os.getloadavg()[0]
    results = {"load_average_1m": load, "duration_s": args.duration, "rounds": args.rounds, "connections": args.connections,
               "cpu_us_per_request": cpu, "rps": rps, "median_us": med, "log_lines_last_round": lines,
               "extra_us_per_request": {m: med[m] - med["off"] for m in MODES}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "access_log_cpu.json").write_text(json.dumps(results, indent=2) + "\n")
    md = ["# Proxy CPU per request: access log off / JSON / text (one run)", "",
          f"One stub engine, {args.rounds} alternated rounds of {args.duration:g} s, wrk -c{args.connections}, "
          f"one proxy worker on its own core, stderr to a file; load average at the end {load:.1f} on {os.cpu_count() or 1} cores "
          "(a figure taken on a busy machine is inflated: compare the modes, not runs).", "",
          "| access log | CPU µs/request (median) | rounds | extra over off | requests/s (median) |",
          "|---|---|---|---|---|"]
    for m in MODES:
        md.append(f"| {m} | {med[m]:.1f} | {', '.join(f'{x:.1f}' for x in cpu[m])} | "
                  f"{med[m] - med['off']:+.1f} µs ({(med[m] / med['off'] - 1) * 100:+.1f} %) | "
                  f"{statistics.median(rps[m]):.0f} |")
    md.append("")
    (RESULTS / "access_log_cpu.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
