"""Proxy CPU per request with the ``scored`` chain against ``default`` routing, in one run.

Eight stub engines serving a vLLM metrics page, one model over all of them; the same wrk load
(chat, 1000-character prompt, ``--connections`` connections) through ``flexinfer proxy`` (one worker,
alone on core 0), once with ``routing: default`` (round-robin) and once with ``routing: scored``
(Kthena's default chain: least-request, least-latency, prefix-cache; the least-request filter),
alternated for ``--rounds`` rounds. The figure is the proxy process's user+sys CPU over the load
window divided by the requests answered: for ``scored`` it includes scraping the eight engines'
pages every second, the whole cost of the strategy. Reported: the medians and their ratio (the
issue's target: scored within +15 % of default).

Writes ``bench/results/scored_cpu.json`` and ``bench/results/scored_cpu.md``.
Usage: ``python bench/bench_scored_cpu.py [--duration 5] [--rounds 3] [--connections 32]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_sharing import RESULTS, _cpu, _env, _proxy, _wrk
from bench.load_proxy import lua_script, parse_wrk, wrk_cores
from tests.harness import free_port, wait_port
from tests.proxy._procs import stop as _stop

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
ENGINES = 8
PAGE = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="bench"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="bench"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="bench"} 0.3
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{model_name="bench"} 12.5
vllm:time_to_first_token_seconds_count{model_name="bench"} 100
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_sum{model_name="bench"} 2.0
vllm:inter_token_latency_seconds_count{model_name="bench"} 100
"""


def cpu_args(doc: str) -> argparse.ArgumentParser:
    """The knobs of an alternated CPU-per-request run: ``--duration``, ``--rounds``, ``--connections``."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=32)
    return ap


def cpu_per_request(proxy: subprocess.Popen[bytes], port: int, script: Path, connections: int, duration: float,
                    load_core: str) -> tuple[float, float]:
    """Once the proxy listens on ``port``: a 2 s warm-up, then the wrk load on ``load_core``; the proxy
    process's user+sys CPU µs per answered request over the load window, and the requests/s."""
    wait_port(port)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    _wrk(url, script, 8, 2, load_core).communicate()  # warm (and two scrapes for a scored chain)
    c0 = _cpu(proxy.pid)
    out, _ = _wrk(url, script, connections, duration, load_core).communicate()
    used = _cpu(proxy.pid) - c0
    res = parse_wrk(out)
    n = max(1.0, res.get("requests", 0) - res.get("errors", 0))
    return used / n * 1e6, res["rps"]


def main() -> int:
    ap = cpu_args(__doc__)
    ap.add_argument("--scheduler", default="", help="the scored chain (default: Kthena's)")
    ap.add_argument("--out", default="scored_cpu", help="results file stem in bench/results")
    args = ap.parse_args()
    cores = wrk_cores()
    if cores is None:
        return 2
    proxy_core, load_core = cores
    tmp = Path(tempfile.mkdtemp(prefix="flexinfer-bench-scored-"))
    page = tmp / "metrics.txt"
    page.write_text(PAGE)
    ports = [free_port() for _ in range(ENGINES)]
    eps = ", ".join(f"http://127.0.0.1:{p}" for p in ports)
    invs = {}
    for mode in ("default", "scored"):
        invs[mode] = tmp / f"{mode}.yaml"
        sched = f"    scheduler: {args.scheduler!r}\n" if mode == "scored" and args.scheduler else ""
        invs[mode].write_text(f"models:\n  - name: bench\n    routing: {mode}\n    endpoints: [{eps}]\n{sched}")
    body = json.dumps({"model": "bench", "messages": [{"role": "system", "content": "You are terse. " * 20},
                                                      {"role": "user", "content": "x" * 1000}]})
    script = tmp / "chat.lua"
    script.write_text(lua_script(body, {}))
    engines = [subprocess.Popen(["taskset", "-c", load_core, PY, "-m", "tests.stub_engine", "--port", str(p),
                                 "--metrics-file", str(page)], cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL)
               for p in ports]
    cpu: dict[str, list[float]] = {"default": [], "scored": []}
    rps: dict[str, list[float]] = {"default": [], "scored": []}
    try:
        for p in ports:
            wait_port(p)
        for _ in range(args.rounds):
            for mode in ("default", "scored"):
                port = free_port()
                proxy = _proxy(invs[mode], port, 1, proxy_core)
                try:
                    us, r = cpu_per_request(proxy, port, script, args.connections, args.duration, load_core)
                    cpu[mode].append(us)
                    rps[mode].append(r)
                finally:
                    _stop(proxy)
    finally:
        _stop(*engines)
        shutil.rmtree(tmp, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in cpu.items()}
    ratio = med["scored"] / med["default"]
    results = {"engines": ENGINES, "scheduler": args.scheduler or "default chain", "duration_s": args.duration, "rounds": args.rounds,
               "connections": args.connections, "cpu_us_per_request": cpu, "rps": rps,
               "median_default_us": med["default"], "median_scored_us": med["scored"], "ratio_scored_default": ratio}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(results, indent=2) + "\n")
    md = ["# Proxy CPU per request: scored vs default (one run)", "",
          f"{ENGINES} stub engines with a vLLM metrics page, {args.rounds} alternated rounds of {args.duration:g} s, "
          f"wrk -c{args.connections}, one proxy worker on its own core.", "",
          "| routing | CPU µs/request (median) | rounds | requests/s (median) |", "|---|---|---|---|"]
    for m in ("default", "scored"):
        md.append(f"| {m} | {med[m]:.1f} | {', '.join(f'{x:.1f}' for x in cpu[m])} | {statistics.median(rps[m]):.0f} |")
    md += ["", f"scored / default: **{ratio:.3f}** (target <= 1.15)", ""]
    (RESULTS / f"{args.out}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
