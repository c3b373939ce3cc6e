"""Latency of the scheduler extender for 5,000 nodes (reliability plan E2/F20: p99 < 100 ms in both modes).

Measures, per request, ``/score`` and ``/filter`` with NodeNames (``nodeCacheCapable: true``, nodes
from the in-memory inventory) and with a full NodeList (``nodeCacheCapable: false``, the Node objects
as kube-scheduler sends them: labels, annotations, taints, capacity/allocatable, conditions, addresses,
nodeInfo, images; ~2 KiB each):

1. logic only: ``ExtenderApp.dispatch`` (JSON parse, lookup, filter/score, JSON encode);
2. through a socket: a keep-alive HTTP/1.1 client against the ``flexinfer.http`` core.

NodeList rounds change ``--churn`` of the nodes between calls (new resourceVersion and agent
annotations, as the GPU agent's 30 s publications do), so the extender's facts cache is measured with
misses, not only hits. ``--churn 1`` makes every node new on every call (the worst case).

Usage: ``python bench/bench_extender.py [--nodes 5000] [--rounds 200] [--churn 0.01] [--json out.json]
[--check]``. ``--check`` exits 1 when the p99 of ``/score`` (NodeNames, logic only) is over
``--target-ms`` or any socket p99 is over ``--socket-target-ms``.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flexinfer import labels
from flexinfer.labels import bench_key
from flexinfer.scheduler import logic, wire
from flexinfer.scheduler.server import ExtenderHandler, make_app
from flexinfer.scheduler.settings import ExtenderSettings

ARCHES = ["sm_80", "sm_86", "sm_89", "sm_90", "gfx1100", "gfx906"]


def _images(rnd: random.Random) -> list[dict[str, Any]]:
    base = ["vllm/vllm-openai", "ghcr.io/ggerganov/llama.cpp", "registry.k8s.io/kube-proxy",
            "docker.io/calico/node", "nvcr.io/nvidia/k8s-device-plugin", "ghcr.io/flexinfer/agent",
            "registry.k8s.io/pause", "quay.io/prometheus/node-exporter"]
    return [{"names": [f"{b}@sha256:{rnd.getrandbits(256):064x}", f"{b}:v{rnd.randint(1, 30)}.{rnd.randint(0, 9)}"],
             "sizeBytes": rnd.randint(700_000, 9_000_000_000)} for b in base]


def make_cluster(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` realistic nodes: GPU labels, agent annotations, system labels, a full v1.NodeStatus."""
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
        lab.update({"beta.kubernetes.io/arch": "amd64", "kubernetes.io/arch": "amd64",
                    "beta.kubernetes.io/os": "linux", "topology.kubernetes.io/region": "eu-west-1",
                    "node-role.kubernetes.io/gpu": "", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
        ann.update({"node.alpha.kubernetes.io/ttl": "0",
                    "csi.volume.kubernetes.io/nodeid": f'{{"ebs.csi.aws.com":"i-{rnd.getrandbits(68):017x}"}}',
                    "projectcalico.org/IPv4Address": f"10.0.{i // 250}.{i % 250}/16"})
        t = f"2026-11-30T10:{i % 60:02d}:{(i * 7) % 60:02d}Z"
        res = {"cpu": "64", "ephemeral-storage": "1044416Mi", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
               "memory": "528012340Ki", "nvidia.com/gpu": str(count), "pods": "110"}
        conds = [{"type": c, "status": "False", "lastHeartbeatTime": t, "lastTransitionTime": t,
                  "reason": f"KubeletHas{r}", "message": f"kubelet has {m}"}
                 for c, r, m in (("MemoryPressure", "SufficientMemory", "sufficient memory available"),
                                 ("DiskPressure", "NoDiskPressure", "no disk pressure"),
                                 ("PIDPressure", "SufficientPID", "sufficient PID available"))]
        conds.append({"type": "Ready", "status": "True", "lastHeartbeatTime": t, "lastTransitionTime": t,
                      "reason": "KubeletReady", "message": "kubelet is posting ready status"})
        nodes.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": f"node-{i:05d}", "labels": lab, "annotations": ann,
                                   "uid": f"{rnd.getrandbits(128):032x}", "resourceVersion": str(1000 + i),
                                   "creationTimestamp": "2026-11-01T08:00:00Z"},
                      "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24",
                               "podCIDRs": [f"10.{i // 250}.{i % 250}.0/24"],
                               "providerID": f"aws:///eu-west-1a/i-{rnd.getrandbits(68):017x}",
                               "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
                      "status": {"capacity": res, "allocatable": dict(res, cpu="63500m", pods="110"),
                                 "conditions": conds,
                                 "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"},
                                               {"type": "Hostname", "address": f"node-{i:05d}"}],
                                 "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                                 "nodeInfo": {"machineID": f"{rnd.getrandbits(128):032x}",
                                              "systemUUID": f"{rnd.getrandbits(128):032x}",
                                              "bootID": f"{rnd.getrandbits(128):032x}",
                                              "kernelVersion": "6.8.0-1015-aws", "osImage": "Ubuntu 24.04.1 LTS",
                                              "containerRuntimeVersion": "containerd://1.7.22",
                                              "kubeletVersion": "v1.31.2", "kubeProxyVersion": "v1.31.2",
                                              "operatingSystem": "linux", "architecture": "amd64"},
                                 "images": _images(rnd)}})
    return nodes


class ChurningNodeList:
    """The NodeList body of a live cluster: each :meth:`next_body` changes ``churn`` of the nodes
    (a new resourceVersion and new agent annotations), re-encoding only those."""

    def __init__(self, pod: dict[str, Any], nodes: list[dict[str, Any]], churn: float, seed: int = 11) -> None:
        self.nodes = nodes
        self.rnd = random.Random(seed)
        self.k = max(0, min(len(nodes), round(churn * len(nodes))))
        self.rv = 1_000_000
        self.encoded = [orjson.dumps(n) for n in nodes]
        self.head = orjson.dumps({"Pod": pod})[:-1] + b',"Nodes":{"metadata":{"resourceVersion":"1"},"items":['

    def body(self) -> bytes:
        return self.head + b",".join(self.encoded) + b"]}}"

    def next_body(self) -> bytes:
        for i in self.rnd.sample(range(len(self.nodes)), self.k):
            node = self.nodes[i]
            self.rv += 1
            node["metadata"]["resourceVersion"] = str(self.rv)
            node["metadata"]["annotations"][labels.GPU_UTIL] = f"{self.rnd.uniform(0, 100):.1f}"
            node["metadata"]["annotations"][labels.KV_CACHE_USAGE] = f"{self.rnd.random():.4f}"
            self.encoded[i] = orjson.dumps(node)
        return self.body()


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


Body = Callable[[], bytes]
"""Gives the next request body (a fixed one, or the next churned NodeList); not timed."""


async def _socket_rounds(port: int, body: Body, path: str, rounds: int) -> tuple[list[float], list[float]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times, cpu = [], []
    for _ in range(rounds):
        data = body()
        head = (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        c0, t0 = time.process_time(), time.perf_counter()
        writer.write(head + data)
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
        cpu.append(time.process_time() - c0)
        assert status_line.split()[1] == b"200", status_line
    writer.close()
    await writer.wait_closed()
    return times, cpu


async def run_socket(app: Any, cases: list[tuple[str, str, Body]], rounds: int) -> list[dict[str, Any]]:
    from flexinfer.http.server import HTTPServer
    from flexinfer.settings import HTTPSettings

    server = HTTPServer(ExtenderHandler(app), HTTPSettings(max_body_json=64 * 1024 * 1024), port=0)
    await server.start()
    try:
        out = []
        for name, path, body in cases:
            await _socket_rounds(server.port, body, path, 3)  # warm-up
            out.append(summary("socket " + name, *await _socket_rounds(server.port, body, path, rounds)))
        return out
    finally:
        await server.drain_and_close(1.0)


POD = {"metadata": {"name": "p", "namespace": "team-a",
                    "annotations": {labels.BACKEND: "vllm", labels.MODEL: "llama3",
                                    labels.VRAM_ESTIMATE_MB: "16000"}},
       "spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def setup(n: int, churn: float) -> tuple[Any, list[tuple[str, str, Body]], dict[str, int]]:
    """An app whose inventory holds ``n`` nodes, and the four cases (name, path, body supplier)."""
    nodes = make_cluster(n)
    app = make_app(ExtenderSettings(), "flexinfer-system")
    app.inventory.nodes.replace(nodes)
    classes = {logic.node_facts(x).device_class for x in nodes}
    bench = {bench_key("vllm", "llama3", c): str(20 + i * 3) for i, c in enumerate(sorted(classes))}
    app.inventory.configmaps.replace([{"metadata": {"name": labels.BENCHMARK_CONFIGMAP, "namespace": "team-a"},
                                       "data": bench}])
    by_names = orjson.dumps({"Pod": POD, "NodeNames": [x["metadata"]["name"] for x in nodes]})
    live = ChurningNodeList(POD, nodes, churn)
    sizes = {"NodeNames": len(by_names), "NodeList": len(live.body())}
    cases: list[tuple[str, str, Body]] = [
        ("score NodeNames", "/score", lambda: by_names), ("filter NodeNames", "/filter", lambda: by_names),
        ("score NodeList", "/score", live.next_body), ("filter NodeList", "/filter", live.next_body)]
    return app, cases, sizes


def run_logic(app: Any, cases: list[tuple[str, str, Body]], rounds: int) -> list[dict[str, Any]]:
    results = []
    for name, path, body in cases:
        for _ in range(3):
            app.dispatch("POST", path, body())
        times, cpu = [], []
        for _ in range(rounds):
            data = body()
            c0, t0 = time.process_time(), time.perf_counter()
            reply = app.dispatch("POST", path, data)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            assert reply.status == 200
        results.append(summary("logic " + name, times, cpu))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--churn", type=float, default=0.01, help="share of nodes changed between NodeList calls")
    ap.add_argument("--target-ms", type=float, default=20.0)
    ap.add_argument("--socket-target-ms", type=float, default=100.0)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--check", action="store_true", help="exit 1 when a p99 is over its target")
    ap.add_argument("--no-socket", action="store_true")
    ap.add_argument("--before", action="store_true",
                    help="also run the NodeList cases the old way (full orjson decode, no facts cache) first")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="skip gc.freeze() after setup (the extender freezes its heap once synced)")
    args = ap.parse_args(argv)

    app, cases, sizes = setup(args.nodes, args.churn)
    if not args.no_gc_freeze:
        gc.collect()
        gc.freeze()
    results = []
    if args.before:  # the same app and bodies, with the msgspec fast path and the facts cache off
        wire.FAST = False
        before = run_logic(app, cases[2:], args.rounds)
        if not args.no_socket:
            before += asyncio.run(run_socket(app, cases[2:], args.rounds))
        wire.FAST = True
        results += [dict(r, name="before " + r["name"]) for r in before]
    results += run_logic(app, cases, args.rounds)
    if not args.no_socket:
        results += asyncio.run(run_socket(app, cases, args.rounds))

    meta = {"nodes": args.nodes, "body_bytes": sizes, "churn": args.churn, "target_p99_ms": args.target_ms,
            "socket_target_p99_ms": args.socket_target_ms, "cache": {"hits": app.node_cache.hits,
                                                                     "misses": app.node_cache.misses}}
    for r in results:
        cpu = (f'   cpu p50 {r["cpu_p50_ms"]:7.2f} p99 {r["cpu_p99_ms"]:7.2f}' if "cpu_p50_ms" in r else "")
        print(f'{r["name"]:<33} p50 {r["p50_ms"]:8.2f} ms  p99 {r["p99_ms"]:8.2f} ms  '
              f'max {r["max_ms"]:8.2f} ms{cpu}  (n={r["rounds"]})')
    print(f"bodies: NodeNames {sizes['NodeNames'] / 1024:.0f} KiB, NodeList {sizes['NodeList'] / 1024 / 1024:.1f} MiB;"
          f" churn {args.churn:.0%}; facts cache {meta['cache']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    failed = [f'{r["name"]} p99 {r["p99_ms"]} ms > {args.socket_target_ms} ms'
              for r in results if r["name"].startswith("socket ") and r["p99_ms"] > args.socket_target_ms]
    key = next(r for r in results if r["name"] == "logic score NodeNames")
    if key["p99_ms"] > args.target_ms:
        failed.append(f'/score NodeNames (logic) p99 {key["p99_ms"]} ms > {args.target_ms} ms')
    if args.check and failed:
        print("FAIL: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
