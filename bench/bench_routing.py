"""Routing strategies compared on simulated engines, through the real proxy, in one run.

8 simulated engines (``bench/simengine.py``: a concurrency capacity, a FIFO queue, a bounded prefix
cache whose hits cut prefill, a vLLM-shaped ``/metrics`` page), one of them 3x slow, behind one
``flexinfer proxy`` process that serves the same engines as four models, one per strategy:
``round-robin``, ``least-loaded``, ``prefix-cache`` and ``scored`` (Kthena's default chain over the
scraped metrics). Each strategy gets the same open-loop load (``bench/simload.py``: Poisson arrivals,
shared-prefix conversations, seeded) on freshly started engines (empty caches). Reported per
strategy: TTFT p50/p99, end-to-end p99, throughput, errors and the engines' prefix hit rate.

Writes ``bench/results/routing.json``, ``routing.md`` and ``routing.png``.
Usage: ``python bench/bench_routing.py [--seconds 20] [--rate 16] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.simengine import SimConfig, SimEngine
from bench.simload import run_load
from tests.harness import free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
STRATEGIES = ("round-robin", "least-loaded", "prefix-cache", "scored")
ENGINES = 8


def config(i: int, scale: float, cache_blocks: int) -> SimConfig:
    return SimConfig(capacity=4, cache_blocks=cache_blocks, slow=3.0 if i == 0 else 1.0, time_scale=scale,
                     name=f"sim{i}")


async def measure(strategy: str, ports: list[int], proxy_port: int, args: argparse.Namespace) -> dict[str, object]:
    engines = [await SimEngine(config(i, args.time_scale, args.cache_blocks)).start(port=p)
               for i, p in enumerate(ports)]
    try:
        await asyncio.sleep(1.0)  # the proxy's scraper has seen the fresh engines
        s = await run_load(f"http://127.0.0.1:{proxy_port}", strategy, args.rate, args.seconds, args.seed,
                           metrics_urls=[e.url + "/metrics" for e in engines], systems=args.systems)
        out = s.as_dict()
        out["per_engine_requests"] = [len(e.records) for e in engines]
        return out
    finally:
        for e in engines:
            await e.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=16.0, help="requests per second (open loop)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--systems", type=int, default=12, help="distinct shared system prompts")
    ap.add_argument("--cache-blocks", type=int, default=300, help="prefix cache size per engine (64-char blocks)")
    ap.add_argument("--time-scale", type=float, default=0.5)
    args = ap.parse_args()
    ports = [free_port() for _ in range(ENGINES)]
    proxy_port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="flexinfer-bench-routing-"))
    eps = ", ".join(f"http://127.0.0.1:{p}" for p in ports)
    (tmp / "inv.yaml").write_text("models:\n" + "".join(
        f"  - name: {s}\n    routing: {s}\n    served_name: sim\n    endpoints: [{eps}]\n" for s in STRATEGIES))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROXY_ENGINE_SCRAPE_INTERVAL": "0.25",
           "PROXY_ENGINE_SCRAPE_TIMEOUT": "0.2", "PROXY_ENGINE_METRICS_MAX_AGE": "1.0",
           "PROXY_RESPONSE_TIMEOUT": "120"}
    proxy = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy", "-c",
                              str(tmp / "inv.yaml"), "--port", str(proxy_port)], cwd=ROOT, env=env)
    results: dict[str, object] = {"args": vars(args), "strategies": {}}
    try:
        wait_port(proxy_port)
        for s in STRATEGIES:
            results["strategies"][s] = asyncio.run(measure(s, ports, proxy_port, args))  # type: ignore[index]
            print(s, json.dumps(results["strategies"][s]), flush=True)  # type: ignore[index]
    finally:
        proxy.terminate()
        proxy.wait(20)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "routing.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = results["strategies"]
    md = ["| strategy | TTFT p50 s | TTFT p99 s | e2e p99 s | req/s | errors | prefix hit rate | requests per engine (slow first) |",
          "|---|---:|---:|---:|---:|---:|---:|---|"]
    for s, r in rows.items():  # type: ignore[attr-defined]
        md.append(f"| {s} | {r['ttft_p50']:.3f} | {r['ttft_p99']:.3f} | {r['e2e_p99']:.3f} | {r['throughput_rps']:.1f} | "
                  f"{r['errors']} | {r['hit_rate']:.3f} | {' '.join(map(str, r['per_engine_requests']))} |")
    (RESULTS / "routing.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        names = list(rows)  # type: ignore[arg-type]
        ax1.bar(names, [rows[n]["ttft_p99"] for n in names], color="tab:red", label="p99")  # type: ignore[index]
        ax1.bar(names, [rows[n]["ttft_p50"] for n in names], color="tab:blue", label="p50")  # type: ignore[index]
        ax1.set_ylabel("TTFT (s)")
        ax1.legend()
        ax2.bar(names, [rows[n]["hit_rate"] for n in names], color="tab:green")  # type: ignore[index]
        ax2.set_ylabel("prefix-cache hit rate")
        for ax in (ax1, ax2):
            ax.tick_params(axis="x", rotation=20)
        fig.suptitle(f"8 simulated engines (one 3x slow), {args.rate:g} req/s open loop, {args.seconds:g} s each")
        fig.tight_layout()
        fig.savefig(RESULTS / "routing.png", dpi=100)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
