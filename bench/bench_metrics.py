"""Cost of /metrics across workers: the tick's publish and a merged scrape, against today's render.

Two ProxyMetrics of this process are workers 0 and 1 of one snapshot directory (the merge reads the
other's file exactly as across processes). ``--models`` models (50 by default) each get the
per-request series (requests by code, duration and ttfb histograms, in flight) and the per-request
labelled counters (routing decisions, retries, rate limits, aborts); ``--woken`` adds, for every
model, the scale-from-zero series (queue wait and activation histograms, activations, queue depth).
Reported: the best of a few rounds, ms per call, of a single-process render (``generate_latest``),
of one publish (what the tick pays once a second) and of a merged render (what a scrape pays).
Informal figures, printed only. Usage: ``python bench/bench_metrics.py [--models 50] [--woken]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import generate_latest  # noqa: E402

from flexinfer.proxy.metrics import ProxyMetrics  # noqa: E402


def fill(m: ProxyMetrics, models: int, woken: bool, rng: random.Random) -> None:
    for k in range(models):
        name = f"model-{k}"
        st = m.model(name)
        for _ in range(20):
            st.observe_duration(rng.random() * 3)
            st.observe_ttfb(rng.random() / 10)
        for code in (200, 429, 502):
            m.count(name, code)
        m.routing_decisions.labels(name, "least_loaded", "none").inc()
        m.upstream_retries.labels(name).inc()
        m.rate_limited.labels(name, "model").inc()
        m.client_aborts.labels(name).inc()
        if woken:
            m.queue_wait.labels(name).observe(rng.random() * 20)
            m.activations.labels(name, "success").inc()
            m.activation_duration.labels(name, "success").observe(rng.random() * 60)
            m.queue_depth.labels(name).set(0)


def best(fn: object, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e3  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--woken", action="store_true")
    ap.add_argument("--number", type=int, default=10)
    args = ap.parse_args()
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as d:
        workers = []
        for i in range(2):
            m = ProxyMetrics()
            fill(m, args.models, args.woken, rng)
            m.share_across_workers(d, i, 2)
            workers.append(m)
        w0 = workers[0]
        merged = w0.render()
        print(f"{args.models} models{' (woken)' if args.woken else ''}: "
              f"{len(generate_latest(w0.registry))} bytes single, {len(merged)} bytes merged")
        print(f"  single-process render  {best(lambda: generate_latest(w0.registry), args.number):7.2f} ms")
        print(f"  publish (the tick)     {best(lambda: w0.publish(force=True), args.number):7.2f} ms")
        print(f"  merged render, 2 wkrs  {best(w0.render, args.number):7.2f} ms")


if __name__ == "__main__":
    main()
