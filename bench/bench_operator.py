"""Operator benchmark: converge N Models on the Kubernetes API emulator; time and writes per Model.

The emulator (``tests.operator.harness.BoundedEmulator``, kmock with the shim) runs in a child process,
as an API server would; the real operator (kopf + ``flexinfer.operator.app``) runs in this process.
The benchmark creates N Models (``--concurrency`` at a time), waits until every one has its
Deployment and Service and a status for generation 1, waits for quiet, then lets the operator resync
every Model every 2 s for a few seconds and checks that those reconciles write nothing. The operator
runs with its production settings (30 s resync, 16 workers per kind) while converging.

Reported (stdout and ``bench/results/operator.json``, one entry per scenario): convergence time,
Models/s, API writes per Model by resource (the benchmark's own creates excluded), reconciles, writes
during the no-op phase (the exit status is 1 if there were any).

    .venv/bin/python bench/bench_operator.py            # 500 CPU (ollama) Models
    .venv/bin/python bench/bench_operator.py -n 100 --scenario gpu   # vLLM on a GPU node, HF cache Jobs
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "operator.json"


# ---- the emulator process ----------------------------------------------------------------------------

async def serve_emulator(directory: str) -> None:
    """Child process: the emulator plus a tiny stats endpoint; prints 'READY <kubeconfig> <stats url>'."""
    import aiohttp.web
    import kmock

    from tests.operator.harness import gpu_node, register_crds, start_bounded_kube

    async with start_bounded_kube(directory) as kube:
        register_crds(kube)
        kube.seed("v1/nodes", gpu_node("gpu-1"))
        res = {k: kmock.resource(*k.split("/")) if k.count("/") == 2 else kmock.resource("", *k.split("/"))
               for k in ("ai.flexinfer/v1alpha2/models", "apps/v1/deployments", "v1/services")}

        def alive(r: Any) -> list[dict[str, Any]]:
            return [o.raw for (rr, _, _), o in kube.emulator.objects.items() if rr == r and not o.deleted]

        async def stats(_: aiohttp.web.Request) -> aiohttp.web.Response:
            models = alive(res["ai.flexinfer/v1alpha2/models"])
            converged = sum(1 for m in models if (m.get("status") or {}).get("observedGeneration") == 1
                            and (m.get("status") or {}).get("phase"))
            return aiohttp.web.json_response({
                "models": len(models), "converged": converged,
                "deployments": len(alive(res["apps/v1/deployments"])), "services": len(alive(res["v1/services"])),
                "writes": [[m, k, n] for (m, k), n in kube.writes.items()],
                "requests": sum(kube.requests.values())})

        app = aiohttp.web.Application()
        app.router.add_get("/stats", stats)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"READY {kube.kubeconfig_path} http://127.0.0.1:{port}/stats", flush=True)
        await asyncio.Event().wait()


# ---- the benchmark ----------------------------------------------------------------------------------------

def model_body(i: int, scenario: str) -> dict[str, Any]:
    if scenario == "gpu":
        spec: dict[str, Any] = {"backend": "vllm", "source": f"HF://org/model-{i}", "gpu": {"vendor": "nvidia"},
                                "litellm": {"aliases": [f"alias-{i}"]}, "serviceLabels": ["textgen"]}
    else:
        spec = {"backend": "ollama", "source": f"ollama://model-{i}:8b", "litellm": {"aliases": [f"alias-{i}"]}}
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
            "metadata": {"name": f"m{i:04d}", "namespace": f"bench-{i % 4}"}, "spec": spec}


async def get_stats(url: str) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url) as r:
        out: dict[str, Any] = await r.json()
        return out


async def run_bench(n: int, scenario: str, concurrency: int, noop_s: float, workers: int) -> dict[str, Any]:
    import kopf
    from kubernetes_asyncio import config

    from flexinfer.operator.api_resources import MODEL
    from flexinfer.operator.app import build_registry
    from flexinfer.operator.config import OperatorSettings
    from flexinfer.operator.context import Operator

    tmp = tempfile.mkdtemp(prefix="flexinfer-bench-op-")
    proc = subprocess.Popen([sys.executable, __file__, "--serve-emulator", tmp], stdout=subprocess.PIPE, text=True,
                            cwd=str(ROOT))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line or line[0] != "READY":
            raise RuntimeError(f"the emulator did not start: {line}")
        kubeconfig, stats_url = line[1], line[2]
        os.environ["KUBECONFIG"] = kubeconfig
        settings = OperatorSettings(resync_s=30.0, workers=workers, request_timeout_s=30.0, metrics_port=0)
        op = Operator(settings=settings)
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(kopf.operator(registry=build_registry(op, kubeconfig=kubeconfig),
                                                 standalone=True, clusterwide=True, stop_flag=stop, ready_flag=ready))
        await ready.wait()
        api = await config.new_client_from_config(config_file=kubeconfig)
        sem = asyncio.Semaphore(concurrency)

        async def create(i: int) -> None:
            body = model_body(i, scenario)
            ns = body["metadata"]["namespace"]
            async with sem:
                await api.call_api(f"/apis/ai.flexinfer/v1alpha2/namespaces/{ns}/models", "POST", body=body,
                                   header_params={"Content-Type": "application/json"},
                                   response_types_map={201: "object"}, auth_settings=["BearerToken"],
                                   _return_http_data_only=True)

        while not op.queues:  # the operator's startup handler has run
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await asyncio.gather(*(create(i) for i in range(n)))
        t_created = time.monotonic() - t0
        while True:
            st = await get_stats(stats_url)
            if st["converged"] >= n and st["deployments"] >= n and st["services"] >= n:
                break
            await asyncio.sleep(0.25)
        t_converged = time.monotonic() - t0
        # quiet: no write for 2 s
        last, quiet_since = -1, time.monotonic()
        while time.monotonic() - quiet_since < 2.0:
            await asyncio.sleep(0.25)
            total = sum(c for _, _, c in (await get_stats(stats_url))["writes"])
            if total != last:
                last, quiet_since = total, time.monotonic()
        settled = await get_stats(stats_url)
        reconciles_converge = {name: q.reconciles for name, q in op.queues.items()}
        # no-op phase: resync every Model every 2 s; nothing may be written
        op.settings = dataclasses.replace(op.settings, resync_s=2.0)
        for ns, name in op.store.keys_of(MODEL):
            op.trigger("model", (ns, name), 0.0)
        reconciles_before = op.queues["model"].reconciles
        await asyncio.sleep(noop_s)
        after = await get_stats(stats_url)
        noop_reconciles = op.queues["model"].reconciles - reconciles_before
        await api.close()
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
    finally:
        proc.terminate()
        with contextlib.suppress(Exception):
            proc.wait(10)

    by_res: collections.Counter[str] = collections.Counter()
    for method, key, count in settled["writes"]:
        by_res[f"{method} {key}"] += count
    by_res["POST models.ai.flexinfer"] -= n  # the benchmark's own creates
    by_res = collections.Counter({k: v for k, v in by_res.items() if v})
    total_writes = sum(by_res.values())
    noop_writes = sum(c for _, _, c in after["writes"]) - sum(c for _, _, c in settled["writes"])
    return {
        "models": n, "scenario": scenario, "concurrency": concurrency, "workers": workers,
        "create_seconds": round(t_created, 2), "converge_seconds": round(t_converged, 2),
        "models_per_second": round(n / t_converged, 1),
        "writes_per_model": round(total_writes / n, 2),
        "writes_per_model_by_resource": {k: round(v / n, 2) for k, v in sorted(by_res.items())},
        "events_per_model": round(by_res.get("POST events", 0) / n, 2),
        "api_requests_total": settled["requests"],
        "reconciles_to_converge": {k: v for k, v in reconciles_converge.items() if v},
        "noop_phase": {"seconds": noop_s, "model_reconciles": noop_reconciles, "writes": noop_writes},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "note": "emulator (kmock + shim, bounded request history) in a child process; operator in-process",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=500, help="Models to converge (default 500)")
    ap.add_argument("--scenario", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--concurrency", type=int, default=20, help="creates in flight")
    ap.add_argument("--workers", type=int, default=16, help="concurrent reconciles per kind")
    ap.add_argument("--noop-seconds", type=float, default=6.0, help="idle resync phase that must write nothing")
    ap.add_argument("--out", default=str(RESULTS), help="JSON results file ('' for none)")
    ap.add_argument("--serve-emulator", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_emulator:
        asyncio.run(serve_emulator(args.serve_emulator))
        return 0
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kopf").setLevel(logging.ERROR)
    result = asyncio.run(run_bench(args.n, args.scenario, args.concurrency, args.noop_seconds, args.workers))
    print(json.dumps(result, indent=2))
    if args.out:  # one entry per scenario; the other scenario's last result is kept
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(out.read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict) or "models" in data:
            data = {}
        data[args.scenario] = result
        out.write_text(json.dumps(data, indent=2) + "\n")
    return 0 if result["noop_phase"]["writes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
