"""The agent loop against the Kubernetes emulator: first publication, no write when nothing changed,
only changed keys, stale keys removed, faults survived, KV usage from model pods, metrics, CLI."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client import generate_latest

from flexinfer import labels as L
from flexinfer.agent.discovery import Discovery
from flexinfer.agent.main import Agent, AgentSettings, amain, configure, load_agent_settings, run
from flexinfer.settings import SettingsError
from tests.agent.test_discovery import GiB, fake_nvml, make_card
from tests.kube_emulator import KubeEnv, kube_fixture  # noqa: F401

H100 = {"name": "NVIDIA H100", "total": 80 * GiB, "used": 10 * GiB, "util": 63, "cc": (9, 0), "temp": 51}


def seed_node(kube: KubeEnv, name: str = "gpu-1") -> None:
    kube.seed("v1/nodes", {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                                        "annotations": {"keep/me": "1"}}})


def settings(**kw: Any) -> AgentSettings:
    return AgentSettings(**{"node_name": "gpu-1", "interval": 0.05, "metrics_port": 0, **kw})


async def no_kv(pods: list[dict[str, Any]]) -> float | None:
    return None


async def test_publish_then_no_write_then_only_changes(kube: KubeEnv, tmp_path: Path) -> None:
    seed_node(kube)
    gpus = [dict(H100)]
    nvml = fake_nvml(gpus)
    d = Discovery(root=tmp_path, nvml=nvml, amdsmi=None)
    async with kube.api_client() as api:
        agent = Agent(settings(), d, k8s.CoreV1Api(api), kv_scraper=no_kv)
        patch = await agent.tick()
        assert patch and set(patch["metadata"]["labels"]) == {L.GPU_VENDOR, L.GPU_COUNT, L.GPU_INT4, L.GPU_VRAM,
                                                             L.GPU_ARCH, L.CPU_AVX512}
        node = kube.get("v1/nodes", None, "gpu-1")
        assert node is not None
        lab, ann = node["metadata"]["labels"], node["metadata"]["annotations"]
        assert (lab[L.GPU_VENDOR], lab[L.GPU_VRAM], lab[L.GPU_ARCH], lab[L.GPU_COUNT], lab[L.GPU_INT4]) == (
            "NVIDIA", "80Gi", "sm_90", "1", "true")
        assert ann == {"keep/me": "1", L.GPU_FREE_MEMORY: "71680", L.GPU_UTIL: "63"}
        assert lab["kubernetes.io/hostname"] == "gpu-1"
        assert kube.write_count("nodes") == 1

        for _ in range(3):  # nothing changed: a read, no write
            assert await agent.tick() == {}
        assert kube.write_count("nodes") == 1

        gpus[0]["util"] = 20  # only the changed key is sent
        assert await agent.tick() == {"metadata": {"annotations": {L.GPU_UTIL: "20"}}}
        assert kube.write_count("nodes") == 2

        nvml.nvmlDeviceGetCount = lambda: 0  # the GPU disappears: owned keys removed, others kept
        await agent.tick()
        node = kube.get("v1/nodes", None, "gpu-1")
        assert node is not None
        assert node["metadata"]["labels"] == {"kubernetes.io/hostname": "gpu-1", L.CPU_AVX512: "false"}
        assert node["metadata"]["annotations"] == {"keep/me": "1"}


async def test_no_gpu_node_keeps_running(kube: KubeEnv, tmp_path: Path) -> None:
    seed_node(kube)
    d = Discovery(root=tmp_path, nvml=fake_nvml([], init_error="NVML Shared Library Not Found"), amdsmi=None)
    async with kube.api_client() as api:
        agent = Agent(settings(), d, k8s.CoreV1Api(api), kv_scraper=no_kv)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(task, 2)
    node = kube.get("v1/nodes", None, "gpu-1")
    assert node is not None and node["metadata"]["labels"][L.CPU_AVX512] == "false"
    assert kube.write_count("nodes") == 1  # several iterations, one write
    assert kube.request_count("nodes", "GET") >= 3


async def test_faults_do_not_stop_the_loop(kube: KubeEnv, tmp_path: Path) -> None:
    seed_node(kube)
    make_card(tmp_path, 0, "0x1002", total=24 * GiB, used=GiB, busy=5)
    d = Discovery(root=tmp_path, nvml=None, amdsmi=None)
    kube.inject("PATCH", r"/api/v1/nodes/gpu-1$", status=409, times=1)
    kube.inject("GET", r"/api/v1/nodes/gpu-1$", status=503, retry_after=1, times=1)
    async with kube.api_client() as api:
        agent = Agent(settings(), d, k8s.CoreV1Api(api), kv_scraper=no_kv)
        assert await agent.tick() is None  # GET 503
        assert await agent.tick() is None  # PATCH 409
        patch = await agent.tick()  # then it lands
        assert patch and patch["metadata"]["labels"][L.GPU_VENDOR] == "AMD"
        text = generate_latest(agent.metrics.registry).decode()
    assert 'flexinfer_agent_node_writes_total{result="error"} 2.0' in text
    assert 'flexinfer_agent_node_writes_total{result="written"} 1.0' in text
    node = kube.get("v1/nodes", None, "gpu-1")
    assert node is not None and node["metadata"]["annotations"][L.GPU_FREE_MEMORY] == str(23 * 1024)


async def test_missing_node_is_an_error_not_a_crash(kube: KubeEnv, tmp_path: Path) -> None:
    async with kube.api_client() as api:
        agent = Agent(settings(node_name="ghost"), Discovery(root=tmp_path, nvml=None, amdsmi=None),
                      k8s.CoreV1Api(api), kv_scraper=no_kv)
        assert await agent.tick() is None


async def test_kv_from_model_pods_on_this_node(kube: KubeEnv, tmp_path: Path) -> None:
    import aiohttp.web

    app = aiohttp.web.Application()

    async def metrics(_: Any) -> aiohttp.web.Response:
        return aiohttp.web.Response(text='vllm:kv_cache_usage_perc{model_name="m"} 0.42\n')

    app.router.add_get("/metrics", metrics)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def model_pod(name: str, node: str, managed: bool = True) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "models",
                             "labels": {L.MANAGED_BY: L.MANAGED_BY_VALUE} if managed else {}},
                "spec": {"nodeName": node, "containers": [{"name": "m", "ports": [{"containerPort": port}]}]},
                "status": {"phase": "Running", "podIP": "127.0.0.1"}}

    seed_node(kube)
    kube.seed("v1/pods", model_pod("mine", "gpu-1"))
    kube.seed("v1/pods", model_pod("elsewhere", "gpu-2"))
    kube.seed("v1/pods", model_pod("unmanaged", "gpu-1", managed=False))
    seen: list[list[str]] = []

    async def spy(pods: list[dict[str, Any]]) -> float | None:
        from flexinfer.agent.kv import scrape_kv_usage
        seen.append(sorted(p["metadata"]["name"] for p in pods))
        return await scrape_kv_usage(pods, default_ports=())

    try:
        async with kube.api_client() as api:
            agent = Agent(settings(), Discovery(root=tmp_path, nvml=None, amdsmi=None), k8s.CoreV1Api(api),
                          kv_scraper=spy)
            await agent.tick()
    finally:
        await runner.cleanup()
    assert seen == [["mine"]]
    node = kube.get("v1/nodes", None, "gpu-1")
    assert node is not None and node["metadata"]["annotations"][L.KV_CACHE_USAGE] == "0.4200"


async def test_gpu_gauges_follow_the_gpus(kube: KubeEnv, tmp_path: Path) -> None:
    seed_node(kube)
    gpus = [dict(H100), dict(H100, name="NVIDIA H100 b")]
    nvml = fake_nvml(gpus)
    async with kube.api_client() as api:
        agent = Agent(settings(), Discovery(root=tmp_path, nvml=nvml, amdsmi=None), k8s.CoreV1Api(api),
                      kv_scraper=no_kv)
        await agent.tick()
        text = generate_latest(agent.metrics.registry).decode()
        assert 'flexinfer_gpu_memory_total_bytes{gpu="nvidia1",model="NVIDIA H100 b",vendor="NVIDIA"} 8.589934592e+10' in text
        assert 'flexinfer_gpu_utilization_ratio{gpu="nvidia0",model="NVIDIA H100",vendor="NVIDIA"} 0.63' in text
        assert 'flexinfer_agent_discovery_backend_up{backend="nvml"} 1.0' in text
        nvml.nvmlDeviceGetCount = lambda: 1
        await agent.tick()
        text = generate_latest(agent.metrics.registry).decode()
    assert 'gpu="nvidia1"' not in text and 'gpu="nvidia0"' in text
    assert "flexinfer_node_gpus 1.0" in text


def test_settings_and_cli() -> None:
    with pytest.raises(SettingsError):
        load_agent_settings(env={})
    p = argparse.ArgumentParser()
    configure(p)
    args = p.parse_args(["--interval", "10s", "--label-prefix", "x.io/", "--metrics-port", "0"])
    s = load_agent_settings(args, env={"NODE_NAME": "n1", "FLEXINFER_AMD_MIN_DISCRETE_VRAM_MB": "2048"})
    assert (s.node_name, s.interval, s.label_prefix, s.metrics_port, s.amd_min_discrete_vram_mb) == (
        "n1", 10.0, "x.io/", 0, 2048)
    assert load_agent_settings(None, env={"NODE_NAME": "n"}).interval == 30.0


def test_run_without_node_name_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    p = argparse.ArgumentParser()
    configure(p)
    assert run(p.parse_args([])) == 2


async def test_amain_once_against_the_emulator(kube: KubeEnv, tmp_path: Path) -> None:
    seed_node(kube)
    s = settings(host_root=str(tmp_path))
    assert await amain(s, str(kube.kubeconfig_path), once=True) == 0
    node = kube.get("v1/nodes", None, "gpu-1")
    assert node is not None and L.CPU_AVX512 in node["metadata"]["labels"]


async def test_agent_process_end_to_end(kube: KubeEnv, tmp_path: Path) -> None:
    """``flexinfer agent`` as a process: publishes, serves /metrics, stops on SIGTERM."""
    import os
    import signal
    import socket
    import sys

    import aiohttp

    seed_node(kube)
    make_card(tmp_path, 0, "0x1002", total=24 * GiB, used=2 * GiB, busy=9)
    env = {**os.environ, "NODE_NAME": "gpu-1", "POD_NAMESPACE": "flexinfer-system"}

    async def launch() -> tuple[asyncio.subprocess.Process, int]:
        """The agent on a free port; again on another one if something took the port between the
        probe's close and the agent's bind (the agent then exits with EADDRINUSE)."""
        for _ in range(5):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            p = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "agent", "--interval", "200ms",
                "--metrics-port", str(port), "--host-root", str(tmp_path), "--kubeconfig",
                str(kube.kubeconfig_path), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            end = asyncio.get_running_loop().time() + 30
            while p.returncode is None and asyncio.get_running_loop().time() < end:
                try:
                    _, w = await asyncio.open_connection("127.0.0.1", port)
                    w.close()
                    await w.wait_closed()
                    return p, port
                except OSError:
                    await asyncio.sleep(0.05)
            if p.returncode is None:
                return p, port  # not listening in 30 s: the checks below say why
            assert p.stdout is not None
            out = (await p.stdout.read()).decode(errors="replace")
            if "in use" not in out.lower():
                raise AssertionError(f"the agent exited with {p.returncode}:\n{out[-3000:]}")
        raise AssertionError("no free metrics port in 5 tries")

    proc, mport = await launch()
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while True:
            node = kube.get("v1/nodes", None, "gpu-1")
            if node and node["metadata"]["labels"].get(L.GPU_VENDOR) == "AMD":
                break
            assert loop.time() < end and proc.returncode is None, "the agent never published"
            await asyncio.sleep(0.1)
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{mport}/metrics") as r:
            text = await r.text()
        assert 'flexinfer_gpu_memory_used_bytes{gpu="amd0"' in text
        await asyncio.sleep(0.6)  # a few more iterations: nothing changes, nothing is written
        assert kube.write_count("nodes") == 1
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    except Exception as exc:  # say what the agent printed and what was written to the node
        if proc.returncode is None:
            proc.kill()
        assert proc.stdout is not None
        out = (await asyncio.wait_for(proc.stdout.read(), 10)).decode(errors="replace")
        writes = dict(kube.emulator.writes)
        raise AssertionError(f"{exc!r}\nagent output:\n{out[-3000:]}\nwrites: {writes}") from exc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_taken_metrics_port_is_a_clear_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The metrics port in use: exit status 2 and one error line that names the port (was a traceback)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level("ERROR", logger="flexinfer.agent.main"):
            assert await amain(settings(host_root=str(tmp_path), metrics_port=port), "/nonexistent") == 2
    assert f"cannot serve metrics on port {port}" in caplog.text and "in use" in caplog.text
