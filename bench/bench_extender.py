"""Latency of the scheduler extender for 5,000 nodes (reliability plan E2; target p99 ≤ 20 ms).

Measures, per request, ``/score`` and ``/filter`` with NodeNames (``nodeCacheCapable: true``, nodes
from the in-memory inventory) and with a full NodeList (``nodeCacheCapable: false``):

1. logic only: ``ExtenderApp.dispatch`` (JSON parse, lookup, filter/score, JSON encode);
2. through a socket: a keep-alive HTTP/1.1 client against the ``flexinfer.http`` core.

Usage: ``python bench/bench_extender.py [--nodes 5000] [--rounds 200] [--json out.json] [--check]``.
``--check`` exits 1 when the p99 of ``/score`` (NodeNames, logic only) is over ``--target-ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flexinfer import labels
from flexinfer.labels import bench_key
from flexinfer.scheduler import logic
from flexinfer.scheduler.server import ExtenderHandler, make_app
from flexinfer.scheduler.settings import ExtenderSettings

ARCHES = ["sm_80", "sm_86", "sm_89", "sm_90", "gfx1100", "gfx906"]


def make_cluster(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` realistic-ish nodes: GPU labels, agent annotations, some system labels."""
    rnd = random.Random(seed)
    nodes = []
    for i in range(n):
        arch = rnd.choice(ARCHES)
        vendor = "AMD" if arch.startswith("gfx") else "NVIDIA"
        count = rnd.choice([1, 2, 4, 8])
        vram = rnd.choice([16, 24, 48, 80])
        lab = {labels.GPU_VENDOR: vendor, labels.GPU_ARCH: arch, labels.GPU_VRAM: f"{vram}Gi",
               labels.GPU_COUNT: str(count), labels.GPU_INT4: "true",
               "kubernetes.io/hostname": f"node-{i:05d}", "kubernetes.io/os": "linux",
               "topology.kubernetes.io/zone": f"zone-{i % 3}", "node.kubernetes.io/instance-type": "gpu.large"}
        ann = {labels.GPU_FREE_MEMORY: str(rnd.randint(0, vram * 1024 * count)),
               labels.GPU_UTIL: f"{rnd.uniform(0, 100):.1f}", labels.KV_CACHE_USAGE: f"{rnd.random():.4f}",
               labels.COST: f"{rnd.uniform(0, 5):.2f}",
               "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
        nodes.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": f"node-{i:05d}", "labels": lab, "annotations": ann,
                                   "uid": f"uid-{i}", "resourceVersion": str(1000 + i)},
                      "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24"},
                      "status": {"capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(count)},
                                 "allocatable": {"cpu": "63", "memory": "500Gi", "nvidia.com/gpu": str(count)},
                                 "conditions": [{"type": "Ready", "status": "True"}],
                                 "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"}]}})
    return nodes


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def summary(name: str, xs: list[float], cpu: list[float] | None = None) -> dict[str, Any]:
    """Wall-clock percentiles, plus this process's CPU time per call when given (robust to a busy box)."""
    ms = [x * 1000 for x in xs]
    out = {"name": name, "rounds": len(ms), "p50_ms": round(pct(ms, 50), 3), "p99_ms": round(pct(ms, 99), 3),
           "mean_ms": round(statistics.fmean(ms), 3), "max_ms": round(max(ms), 3)}
    if cpu:
        cms = [x * 1000 for x in cpu]
        out.update(cpu_p50_ms=round(pct(cms, 50), 3), cpu_p99_ms=round(pct(cms, 99), 3))
    return out


async def _socket_rounds(port: int, body: bytes, path: str, rounds: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        writer.write(head + body)
        status_line = await reader.readline()
        length = 0
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        await reader.readexactly(length)
        times.append(time.perf_counter() - t0)
        assert status_line.split()[1] == b"200", status_line
    writer.close()
    return times


async def run_socket(app: Any, cases: list[tuple[str, str, bytes]], rounds: int) -> list[dict[str, Any]]:
    from flexinfer.http.server import HTTPServer
    from flexinfer.settings import HTTPSettings

    server = HTTPServer(ExtenderHandler(app), HTTPSettings(max_body_json=64 * 1024 * 1024), port=0)
    await server.start()
    try:
        out = []
        for name, path, body in cases:
            await _socket_rounds(server.port, body, path, 3)  # warm-up
            out.append(summary("socket " + name, await _socket_rounds(server.port, body, path, rounds)))
        return out
    finally:
        await server.drain_and_close(1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--target-ms", type=float, default=20.0)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--check", action="store_true", help="exit 1 when the /score p99 is over the target")
    ap.add_argument("--no-socket", action="store_true")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="skip gc.freeze() after setup (the extender freezes its heap once synced)")
    args = ap.parse_args(argv)

    nodes = make_cluster(args.nodes)
    app = make_app(ExtenderSettings(), "flexinfer-system")
    app.inventory.nodes.replace(nodes)
    pod = {"metadata": {"name": "p", "namespace": "team-a",
                        "annotations": {labels.BACKEND: "vllm", labels.MODEL: "llama3",
                                        labels.VRAM_ESTIMATE_MB: "16000"}},
           "spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    classes = {logic.node_facts(n).device_class for n in nodes}
    bench = {bench_key("vllm", "llama3", c): str(20 + i * 3) for i, c in enumerate(sorted(classes))}
    app.inventory.configmaps.replace([{"metadata": {"name": labels.BENCHMARK_CONFIGMAP, "namespace": "team-a"},
                                       "data": bench}])
    names = [n["metadata"]["name"] for n in nodes]
    by_names = orjson.dumps({"Pod": pod, "NodeNames": names})
    by_nodes = orjson.dumps({"Pod": pod, "Nodes": {"items": nodes}})
    if not args.no_gc_freeze:
        gc.collect()
        gc.freeze()
    cases = [("score NodeNames", "/score", by_names), ("filter NodeNames", "/filter", by_names),
             ("score NodeList", "/score", by_nodes), ("filter NodeList", "/filter", by_nodes)]

    results = []
    for name, path, body in cases:
        for _ in range(3):
            app.dispatch("POST", path, body)
        times, cpu = [], []
        for _ in range(args.rounds):
            c0, t0 = time.process_time(), time.perf_counter()
            reply = app.dispatch("POST", path, body)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            assert reply.status == 200
        results.append(summary("logic " + name, times, cpu))
    if not args.no_socket:
        results += asyncio.run(run_socket(app, cases, args.rounds))

    meta = {"nodes": args.nodes, "body_bytes": {"NodeNames": len(by_names), "NodeList": len(by_nodes)},
            "target_p99_ms": args.target_ms}
    for r in results:
        cpu = (f'   cpu p50 {r["cpu_p50_ms"]:7.2f} p99 {r["cpu_p99_ms"]:7.2f}' if "cpu_p50_ms" in r else "")
        print(f'{r["name"]:<26} p50 {r["p50_ms"]:8.2f} ms  p99 {r["p99_ms"]:8.2f} ms  '
              f'max {r["max_ms"]:8.2f} ms{cpu}  (n={r["rounds"]})')
    print(f"bodies: NodeNames {len(by_names) / 1024:.0f} KiB, NodeList {len(by_nodes) / 1024 / 1024:.1f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    key = next(r for r in results if r["name"] == "logic score NodeNames")
    if args.check and key["p99_ms"] > args.target_ms:
        print(f'FAIL: /score p99 {key["p99_ms"]} ms > {args.target_ms} ms')
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
