"""Latency of the scheduler extender for 5,000 nodes (reliability plan E2/F20: p99 < 100 ms in both modes).

Measures, per request, ``/score`` and ``/filter`` with NodeNames (``nodeCacheCapable: true``, nodes
from the in-memory inventory) and with a full NodeList (``nodeCacheCapable: false``, the Node objects
as kube-scheduler sends them: labels, annotations, taints, capacity/allocatable, conditions, addresses,
nodeInfo, images; ~4 KiB each, 20.7 MiB for 5,000 nodes):

1. logic only: ``ExtenderApp.dispatch`` in this process (JSON parse, lookup, filter/score, JSON encode),
   wall and CPU time per call;
2. through a socket: the extender runs in its OWN process (``--serve``: the ``flexinfer.http`` core on
   uvloop, as ``flexinfer extender`` serves), and this process is a blocking keep-alive HTTP/1.1
   client that sends each body and reads the whole answer. Per call: the wall time the client sees,
   and the server process's CPU time (``time.process_time`` of the server, sent back in an
   ``x-bench-cpu-ns`` header at each answer; a call's CPU is the difference to the previous answer:
   reading the body, the verb, and the tail of the previous answer's write), plus the box's 1-minute
   load average sampled during the case.

``--before-src DIR`` first runs the socket cases against a second server process that imports
``flexinfer`` from DIR (e.g. an export of the previous commit): before and after in the same run,
under the same box load. NodeList rounds change ``--churn`` of the nodes between calls (new
resourceVersion and agent annotations, as the GPU agent's 30 s publications do), so the extender's
facts cache is measured with misses, not only hits; the next body is built before the timer starts.

Usage: ``python bench/bench_extender.py [--nodes 5000] [--rounds 200] [--churn 0.01] [--json out.json]
[--before-src DIR] [--check]``. ``--check`` exits 1 when a socket case's server-CPU p50 is over
``--socket-target-ms``, or its server-CPU p99 or wall p99 is while the box was not oversubscribed
(the highest load average seen in the case below the core count): on a box busy with other work the
wall clock and the tail of the CPU time (shared cores and caches) measure the box; the median CPU is
what the extender itself spends.
"""


from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

# FLEXINFER_BENCH_SRC: import flexinfer from another tree (the --before-src server process)
sys.path.insert(0, os.environ.get("FLEXINFER_BENCH_SRC") or str(Path(__file__).resolve().parents[1]))

from flexinfer import labels
from flexinfer.labels import bench_key
from flexinfer.scheduler import logic
from flexinfer.scheduler.server import make_app
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


def summary(name: str, xs: list[float], cpu: list[float] | None = None,
            load: list[float] | None = None) -> dict[str, Any]:
    """Wall-clock percentiles, plus the CPU time per call when given (robust to a busy box) and the
    1-minute load averages seen during the case."""
    ms = [x * 1000 for x in xs]
    out: dict[str, Any] = {"name": name, "rounds": len(ms), "p50_ms": round(pct(ms, 50), 3),
                           "p99_ms": round(pct(ms, 99), 3), "mean_ms": round(statistics.fmean(ms), 3),
                           "max_ms": round(max(ms), 3)}
    if cpu:
        cms = [x * 1000 for x in cpu]
        out.update(cpu_p50_ms=round(pct(cms, 50), 3), cpu_p99_ms=round(pct(cms, 99), 3),
                   cpu_mean_ms=round(statistics.fmean(cms), 3))
    if load:
        out.update(load_min=min(load), load_max=max(load), load_mean=round(statistics.fmean(load), 2))
    return out


Body = Callable[[], bytes]
"""Gives the next request body (a fixed one, or the next churned NodeList); not timed."""

POD = {"metadata": {"name": "p", "namespace": "team-a",
                    "annotations": {labels.BACKEND: "vllm", labels.MODEL: "llama3",
                                    labels.VRAM_ESTIMATE_MB: "16000"}},
       "spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}

CPU_HEADER = b"x-bench-cpu-ns"


def setup_app(nodes: list[dict[str, Any]]) -> Any:
    """An extender app whose inventory holds ``nodes`` and a benchmark ConfigMap for them."""
    app = make_app(ExtenderSettings(), "flexinfer-system")
    app.inventory.nodes.replace(nodes)
    classes = {logic.node_facts(x).device_class for x in nodes}
    bench = {bench_key("vllm", "llama3", c): str(20 + i * 3) for i, c in enumerate(sorted(classes))}
    app.inventory.configmaps.replace([{"metadata": {"name": labels.BENCHMARK_CONFIGMAP, "namespace": "team-a"},
                                       "data": bench}])
    return app


def make_cases(nodes: list[dict[str, Any]], churn: float) -> tuple[list[tuple[str, str, Body]], dict[str, int]]:
    """The four cases (name, path, body supplier) and the body sizes."""
    by_names = orjson.dumps({"Pod": POD, "NodeNames": [x["metadata"]["name"] for x in nodes]})
    live = ChurningNodeList(POD, nodes, churn)
    sizes = {"NodeNames": len(by_names), "NodeList": len(live.body())}
    cases: list[tuple[str, str, Body]] = [
        ("score NodeNames", "/score", lambda: by_names), ("filter NodeNames", "/filter", lambda: by_names),
        ("score NodeList", "/score", live.next_body), ("filter NodeList", "/filter", live.next_body)]
    return cases, sizes


def setup(n: int, churn: float) -> tuple[Any, list[tuple[str, str, Body]], dict[str, int]]:
    """An app whose inventory holds ``n`` nodes, and the four cases (name, path, body supplier)."""
    nodes = make_cluster(n)
    app = setup_app(nodes)
    cases, sizes = make_cases(nodes, churn)
    return app, cases, sizes


def run_logic(app: Any, cases: list[tuple[str, str, Body]], rounds: int) -> list[dict[str, Any]]:
    results = []
    for name, path, body in cases:
        for _ in range(3):
            app.dispatch("POST", path, body())
        times, cpu, load = [], [], []
        for _ in range(rounds):
            data = body()
            c0, t0 = time.process_time(), time.perf_counter()
            reply = app.dispatch("POST", path, data)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            load.append(os.getloadavg()[0])
            assert reply.status == 200
        results.append(summary("logic " + name, times, cpu, load))
    return results


# ---- the server process -------------------------------------------------------------------------------


class _CpuStampHandler:
    """Wraps the extender's handler: every answer carries the server's CPU time so far."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def on_headers(self, req: Any) -> Any:
        return self.inner.on_headers(req)

    async def handle(self, req: Any, resp: Any) -> None:
        reply = self.inner.app.dispatch(req.method, req.path, req.body)
        resp.send(reply.status, [(b"content-type", reply.content_type),
                                 (CPU_HEADER, b"%d" % time.process_time_ns())], reply.body)


def serve(n: int) -> int:
    """``--serve``: the extender with ``n`` nodes in its inventory on 127.0.0.1, port printed on
    stdout, until SIGTERM. The heap is frozen once loaded, as ``flexinfer extender`` does."""
    import uvloop

    from flexinfer.http.server import HTTPServer
    from flexinfer.scheduler.server import ExtenderHandler
    from flexinfer.settings import HTTPSettings

    app = setup_app(make_cluster(n))
    max_body = 32 * 1024 * 1024  # the default --max-body-mb
    try:  # as ``flexinfer extender`` does (absent in trees before F20's fix)
        from flexinfer.scheduler.memory import tune_malloc
    except ImportError:
        pass
    else:
        tune_malloc(max_body)
    gc.collect()
    gc.freeze()

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        server = HTTPServer(_CpuStampHandler(ExtenderHandler(app)),
                            HTTPSettings(max_body_json=max_body), port=0)
        await server.start()
        print(server.port, flush=True)
        await stop.wait()
        await server.drain_and_close(1.0)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    return 0


@contextlib.contextmanager
def server_process(n: int, src: str | None = None) -> Iterator[int]:
    """A ``--serve`` process (importing flexinfer from ``src`` when given); yields its port."""
    env = dict(os.environ)
    env.pop("FLEXINFER_BENCH_SRC", None)
    if src:
        env["FLEXINFER_BENCH_SRC"] = src
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", "--nodes", str(n)],
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip():
            raise RuntimeError(f"extender server process exited ({proc.wait()})")
        yield int(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# ---- the client (this process) ---------------------------------------------------------------------------


class Client:
    """A blocking keep-alive HTTP/1.1 client: one request at a time, the whole answer read."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(64 * 1024 * 1024)
        self.view = memoryview(self.buf)

    def close(self) -> None:
        self.view.release()
        self.sock.close()

    def call(self, message: bytes) -> tuple[int, int, int]:
        """Send one whole request; (status, answer length, the server's CPU stamp in ns)."""
        self.sock.sendall(message)
        got = 0
        while True:
            n = self.sock.recv_into(self.view[got:])
            if not n:
                raise ConnectionError("server closed the connection")
            got += n
            end = self.buf.find(b"\r\n\r\n", 0, got)
            if end != -1:
                break
        head = bytes(self.buf[:end]).split(b"\r\n")
        status = int(head[0].split()[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in head[1:])}
        length = int(fields.get(b"content-length", b"0"))
        total = end + 4 + length
        while got < total:
            n = self.sock.recv_into(self.view[got:total])
            if not n:
                raise ConnectionError("server closed the connection mid-answer")
            got += n
        return status, length, int(fields.get(CPU_HEADER, b"0"))


def socket_rounds(port: int, body: Body, path: str, rounds: int) -> tuple[list[float], list[float], list[float]]:
    """``rounds`` calls (after one warm-up): wall times, server CPU per call, load averages."""
    client = Client(port)
    times, cpu, load = [], [], []
    try:
        prev = -1
        for i in range(rounds + 1):
            data = body()
            message = (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(data)}\r\n\r\n").encode() + data
            t0 = time.perf_counter()
            status, _, stamp = client.call(message)
            wall = time.perf_counter() - t0
            assert status == 200, status
            if i:
                times.append(wall)
                cpu.append((stamp - prev) / 1e9)
                load.append(os.getloadavg()[0])
            prev = stamp
    finally:
        client.close()
    return times, cpu, load


def run_socket(n: int, cases: list[tuple[str, str, Body]], rounds: int, src: str | None = None,
               label: str = "socket") -> list[dict[str, Any]]:
    with server_process(n, src) as port:
        return [summary(f"{label} {name}", *socket_rounds(port, body, path, rounds)) for name, path, body in cases]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--churn", type=float, default=0.01, help="share of nodes changed between NodeList calls")
    ap.add_argument("--socket-target-ms", type=float, default=100.0)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--check", action="store_true", help="exit 1 when a p99 is over its target (see above)")
    ap.add_argument("--no-socket", action="store_true")
    ap.add_argument("--no-logic", action="store_true")
    ap.add_argument("--before-src", default=None,
                    help="first run the socket cases against a server importing flexinfer from this tree")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return serve(args.nodes)

    nodes = make_cluster(args.nodes)
    cases, sizes = make_cases(nodes, args.churn)
    results: list[dict[str, Any]] = []
    if args.before_src and not args.no_socket:
        results += run_socket(args.nodes, cases, args.rounds, args.before_src, "before socket")
    if not args.no_socket:
        results += run_socket(args.nodes, cases, args.rounds)
    cache: dict[str, int] = {}
    if not args.no_logic:
        app = setup_app(nodes)
        gc.collect()
        gc.freeze()
        results += run_logic(app, cases, args.rounds)
        cache = {"hits": app.node_cache.hits, "misses": app.node_cache.misses}

    cores = os.cpu_count() or 1
    meta = {"nodes": args.nodes, "body_bytes": sizes, "churn": args.churn, "rounds": args.rounds,
            "socket_target_p99_ms": args.socket_target_ms, "cores": cores, "cache": cache,
            "before_src": args.before_src}
    for r in results:
        cpu = f'  cpu p50 {r["cpu_p50_ms"]:7.2f} p99 {r["cpu_p99_ms"]:7.2f}' if "cpu_p50_ms" in r else ""
        load = f'  load {r["load_min"]:.1f}-{r["load_max"]:.1f}' if "load_max" in r else ""
        print(f'{r["name"]:<34} p50 {r["p50_ms"]:8.2f} ms  p99 {r["p99_ms"]:8.2f} ms  '
              f'max {r["max_ms"]:8.2f} ms{cpu}{load}  (n={r["rounds"]})')
    print(f"bodies: NodeNames {sizes['NodeNames'] / 1024:.0f} KiB, NodeList {sizes['NodeList'] / 1024 / 1024:.1f} MiB;"
          f" churn {args.churn:.0%}; {cores} cores; facts cache {cache}")
    failed: list[str] = []
    waived: list[str] = []
    target = args.socket_target_ms
    for r in results:
        if not r["name"].startswith("socket "):
            continue
        if r["cpu_p50_ms"] > target:
            failed.append(f'{r["name"]} server CPU p50 {r["cpu_p50_ms"]} ms > {target} ms')
        quiet = r["load_max"] < cores
        load = f'(load {r["load_min"]:.1f}-{r["load_max"]:.1f})'
        for key, what in (("cpu_p99_ms", "server CPU p99"), ("p99_ms", "wall p99")):
            if r[key] > target:
                (failed if quiet else waived).append(f'{r["name"]} {what} {r[key]} ms > {target} ms {load}')
    meta["failed"], meta["wall_waived_for_load"] = failed, waived
    if waived:
        print("not judged (the box was oversubscribed): " + "; ".join(waived))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    if args.check and failed:
        print("FAIL: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
