"""``flexinfer operator``: flags, settings from the environment, and the kopf settings it applies."""

from __future__ import annotations

import argparse
from typing import Any

import kopf
import pytest

from flexinfer.cli import build_parser
from flexinfer.operator import main
from flexinfer.operator.app import configure_kopf
from flexinfer.operator.config import load_settings
from flexinfer.operator.context import Operator
from flexinfer.settings import SettingsError


def test_flags() -> None:
    args = build_parser(["operator"]).parse_args(["operator", "-n", "team-a", "--resync", "10", "--peering", "p"])
    assert args.namespace == ["team-a"] and args.resync == 10 and args.peering == "p"
    assert args.liveness == "http://0.0.0.0:8081/healthz"


def test_settings_from_env() -> None:
    s = load_settings({"FLEXINFER_OPERATOR_RESYNC": "1m", "DEFAULT_SHM_SIZE_LIMIT": "16Gi",
                       "DEFAULT_FLASH_LOADER_ENABLED": "true", "DEFAULT_VLLM_IMAGE": "my/vllm:1",
                       "FLEXINFER_SHARED_DEMAND_WINDOW": "30s"}, workers=2)
    assert (s.resync_s, s.shm_size, s.flash_enabled, s.workers) == (60.0, "16Gi", True, 2)
    assert s.images == {"DEFAULT_VLLM_IMAGE": "my/vllm:1"} and s.windows.demand == 30.0
    with pytest.raises(SettingsError):
        load_settings({"FLEXINFER_OPERATOR_WORKERS": "0"})


def test_run_rejects_bad_settings(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEXINFER_OPERATOR_RESYNC", "soon")
    p = argparse.ArgumentParser()
    main.configure(p)
    assert main.run(p.parse_args([])) == 1
    assert "FLEXINFER_OPERATOR_RESYNC" in capsys.readouterr().out


def test_kopf_settings() -> None:
    settings = kopf.OperatorSettings()
    configure_kopf(settings, Operator())
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert isinstance(settings.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)
    assert settings.persistence.progress_storage.prefix == "flexinfer.ai"
    assert settings.persistence.finalizer != "flexinfer.ai/model-cleanup"  # ours, managed by the reconcilers
    assert settings.posting.enabled is False


def _status(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        return int(r.status)


def _text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


async def test_cli_runs_against_the_emulator(kube: Any) -> None:
    """``flexinfer operator`` as a process: it reconciles a Model, serves its liveness probe and its metrics."""
    import asyncio
    import os
    import socket
    import subprocess
    import sys

    from tests.operator.harness import DEPLOYMENTS, MODELS, model, register_crds

    register_crds(kube)
    from tests.dashboard import value
    from tests.harness import free_port

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mport = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "operator",
                             "--kubeconfig", str(kube.kubeconfig_path), "--liveness",
                             f"http://127.0.0.1:{port}/healthz", "--metrics-port", str(mport)], env={**os.environ, "FLEXINFER_OPERATOR_RESYNC": "1",
                                                                "FLEXINFER_OPERATOR_METRICS_HOST": "127.0.0.1"})
    try:
        async with kube.api_client() as api:
            await api.call_api("/apis/ai.flexinfer/v1alpha2/namespaces/default/models", "POST", body=model("cli"),
                               header_params={"Content-Type": "application/json"}, response_types_map={201: "object"},
                               auth_settings=["BearerToken"], _return_http_data_only=True)
        for _ in range(150):
            if kube.get(DEPLOYMENTS, "default", "cli") and (kube.get(MODELS, "default", "cli") or {}).get("status"):
                break
            await asyncio.sleep(0.1)
        assert kube.get(DEPLOYMENTS, "default", "cli") is not None
        assert kube.get(MODELS, "default", "cli")["status"]["phase"] == "Idle"
        url = f"http://127.0.0.1:{port}/healthz"
        code = 0
        for _ in range(20):
            try:
                code = await asyncio.to_thread(_status, url)
                break
            except OSError:
                await asyncio.sleep(0.2)
        assert code == 200
        # --metrics-port: the process serves its reconciles
        text = await asyncio.to_thread(_text, f"http://127.0.0.1:{mport}/metrics")
        assert value(text, "flexinfer_operator_reconciles_total", kind="model") >= 1
    finally:
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 20) == 0


def test_priority_flag() -> None:
    p = argparse.ArgumentParser()
    main.configure(p)
    assert p.parse_args([]).priority is None
    assert p.parse_args(["--priority", "7"]).priority == 7
    randoms = {p.parse_args(["--peering", "x", "--priority", "random"]).priority for _ in range(20)}
    assert len(randoms) > 1 and all(0 < r < 2**31 for r in randoms)  # replicas differ: no all-pause tie
    with pytest.raises(SystemExit):
        p.parse_args(["--priority", "high"])


def test_pull_settings_reach_the_pods_it_creates() -> None:
    from flexinfer.operator.jobs import benchmark_job

    s = load_settings({"FLEXINFER_IMAGE_PULL_POLICY": "Always", "FLEXINFER_IMAGE_PULL_SECRETS": "a, b"})
    s.validate()
    assert s.pull_secrets == ("a", "b")
    j = benchmark_job("md", "ns", backend="vllm", obj_labels={}, owner={"apiVersion": "v1", "kind": "X",
                      "metadata": {"name": "md", "uid": "u"}}, warmup=1, iterations=1, min_duration_s=1,
                      max_tokens=8, node_selector=None, settings=s)
    pod = j["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]
    assert pod["containers"][0]["imagePullPolicy"] == "Always"
    default = benchmark_job("md", "ns", backend="vllm", obj_labels={}, owner={"apiVersion": "v1", "kind": "X",
                            "metadata": {"name": "md", "uid": "u"}}, warmup=1, iterations=1, min_duration_s=1,
                            max_tokens=8, node_selector=None, settings=load_settings({}))
    assert "imagePullSecrets" not in default["spec"]["template"]["spec"]
    assert default["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    with pytest.raises(SettingsError, match="FLEXINFER_IMAGE_PULL_POLICY"):
        load_settings({"FLEXINFER_IMAGE_PULL_POLICY": "Sometimes"}).validate()
