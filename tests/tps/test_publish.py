"""Publishing bench results: the ConfigMap writer (pure retry logic with an injected API, then
against the Kubernetes emulator)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from flexinfer import labels, tps
from flexinfer.tps import BenchError, BenchResult, Sample, publish
from flexinfer.tps.publish import Conflict

# ---- ConfigMaps: pure logic with an injected API ------------------------------------------------------


def a_result(**kw: Any) -> BenchResult:
    samples = (Sample(10, 10, 1.0, 0.1, 0.9), Sample(10, 10, 1.2, 0.1, 0.9))
    base: dict[str, Any] = {"model": "smol", "base_url": "http://x/v1", "stream": True, "warmup": 2, "samples": samples,
            "duration_seconds": 2.2, "backend": "llamacpp", "timestamp": "2026-01-01T00:00:00Z"}
    base.update(kw)
    return BenchResult(**base)


@dataclass
class FakeAPI:
    """In-memory ConfigMaps; ``conflicts`` makes the next N writes fail with 409 after a concurrent change."""

    maps: dict[tuple[str, str], tuple[dict[str, str], int]] = field(default_factory=dict)
    conflicts: int = 0
    calls: list[str] = field(default_factory=list)

    async def read(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        self.calls.append("read")
        cur = self.maps.get((namespace, name))
        return None if cur is None else (dict(cur[0]), str(cur[1]))

    def _interfere(self, namespace: str, name: str) -> None:
        self.conflicts -= 1
        data, rv = self.maps.get((namespace, name), ({}, 0))
        self.maps[(namespace, name)] = ({**data, f"other{self.conflicts}": "x"}, rv + 1)
        raise Conflict("changed")

    async def create(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.calls.append("create")
        if self.conflicts:
            self._interfere(namespace, name)
        if (namespace, name) in self.maps:
            raise Conflict("exists")
        self.maps[(namespace, name)] = (dict(data), 1)

    async def update(self, namespace: str, name: str, data: dict[str, str], resource_version: str) -> None:
        self.calls.append("update")
        if self.conflicts:
            self._interfere(namespace, name)
        cur = self.maps[(namespace, name)]
        if str(cur[1]) != resource_version:
            raise Conflict("stale")
        self.maps[(namespace, name)] = (dict(data), cur[1] + 1)


async def test_upsert_creates_then_merges() -> None:
    api = FakeAPI()
    assert await publish.upsert_configmap(api, "ns", "g", {"a": "1"}) == 1
    api.maps[("ns", "g")] = ({"a": "1", "keep": "k"}, 5)
    assert await publish.upsert_configmap(api, "ns", "g", {"a": "2"}) == 1
    assert api.maps[("ns", "g")][0] == {"a": "2", "keep": "k"}


async def test_upsert_retries_conflicts_and_keeps_concurrent_keys() -> None:
    api = FakeAPI(maps={("ns", "g"): ({"x": "1"}, 1)}, conflicts=2)
    assert await publish.upsert_configmap(api, "ns", "g", {"bench_1": "9"}) == 3
    data = api.maps[("ns", "g")][0]
    assert data == {"x": "1", "other1": "x", "other0": "x", "bench_1": "9"}
    assert api.calls == ["read", "update"] * 3


async def test_upsert_create_race_then_update() -> None:
    api = FakeAPI(conflicts=1)
    assert await publish.upsert_configmap(api, "ns", "g", {"k": "v"}) == 2
    assert api.calls == ["read", "create", "read", "update"]
    assert api.maps[("ns", "g")][0] == {"other0": "x", "k": "v"}


async def test_upsert_gives_up_after_three_conflicts() -> None:
    api = FakeAPI(maps={("ns", "g"): ({}, 1)}, conflicts=3)
    with pytest.raises(BenchError, match="conflict on each of 3 attempts"):
        await publish.upsert_configmap(api, "ns", "g", {"k": "v"})


async def test_publish_writes_both_configmaps() -> None:
    api = FakeAPI()
    node = {"flexinfer.ai/gpu.vendor": "NVIDIA", "flexinfer.ai/gpu.arch": "sm_86", "flexinfer.ai/gpu.vram": "24Gi",
            "flexinfer.ai/gpu.count": "1", "flexinfer.ai/gpu.int4": "true", "other": "x"}
    cfg = tps.load_config({}, configmap="smol-benchmark-results", namespace="ns")
    res = a_result()
    entries = await publish.publish(res, cfg, api, node_labels=node)
    dc = "vendor=NVIDIA,arch=sm_86,vram=24Gi,count=1,int4=true"
    h = hashlib.sha256(f"llamacpp|smol|{dc}".encode()).hexdigest()[:16]
    assert set(entries) == {f"bench_{h}", f"meta_{h}"}
    glob = api.maps[("ns", "flexinfer-benchmark-results")][0]
    assert glob[f"bench_{h}"] == f"{res.tokens_per_second:.2f}"
    meta = json.loads(glob[f"meta_{h}"])
    assert meta["deviceClass"] == dc and meta["model"] == "smol" and meta["backend"] == "llamacpp"
    per = api.maps[("ns", "smol-benchmark-results")][0]
    assert set(per) == {"tokensPerSecond", "model", "backend", "iterations", "batchSize", "completionTokens",
                        "durationSeconds", "samples", "timestamp"}
    assert per["iterations"] == "2" and per["completionTokens"] == "20" and per["model"] == "smol"
    assert json.loads(per["samples"]) == [round(s.tokens_per_second, 2) for s in res.samples]


# ---- ConfigMaps against the Kubernetes emulator ---------------------------------------------------------

try:
    from tests.kube_emulator import KubeEnv, kube_fixture  # noqa: F401  (the fixture)

    HAVE_KUBE = True
except ImportError:  # pragma: no cover - the emulator needs the kube and test extras
    HAVE_KUBE = False


@pytest.mark.skipif(not HAVE_KUBE, reason="tests/kube_emulator.py (kmock) not available")
async def test_publish_against_emulator_with_conflicts(kube: KubeEnv) -> None:
    kube.seed("v1/configmaps", {"metadata": {"name": "flexinfer-benchmark-results", "namespace": "ns"},
                                "data": {"bench_other": "12.5"}})
    kube.seed("v1/nodes", {"metadata": {"name": "n1", "labels": {
        "flexinfer.ai/gpu.vendor": "NVIDIA", "flexinfer.ai/gpu.arch": "sm_89", "flexinfer.ai/gpu.vram": "24Gi",
        "flexinfer.ai/gpu.count": "2", "flexinfer.ai/gpu.int4": "true"}}})
    kube.inject("PATCH", r"/configmaps/flexinfer-benchmark-results$", status=409, times=2)
    cfg = tps.load_config({}, configmap="smol-benchmark-results", namespace="ns", node_name="n1",
                          kubeconfig=str(kube.kubeconfig_path))
    entries = await publish.publish(a_result(), cfg)
    dc = "vendor=NVIDIA,arch=sm_89,vram=24Gi,count=2,int4=true"
    key = labels.bench_key("llamacpp", "smol", dc)
    glob = kube.get("v1/configmaps", "ns", "flexinfer-benchmark-results")
    assert glob is not None and key in entries
    assert glob["data"]["bench_other"] == "12.5" and glob["data"][key] == entries[key]
    per = kube.get("v1/configmaps", "ns", "smol-benchmark-results")
    assert per is not None and per["data"]["model"] == "smol"
    assert per["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "flexinfer"
    assert kube.write_count("configmaps", "PATCH") == 3  # 2 injected conflicts + the one that landed
    # a second run replaces our keys in place, keeping the others
    await publish.publish(a_result(backend="llamacpp", duration_seconds=9.0), cfg)
    per2 = kube.get("v1/configmaps", "ns", "smol-benchmark-results")
    assert per2 is not None and per2["data"]["durationSeconds"] == "9.00"


@pytest.mark.skipif(not HAVE_KUBE, reason="tests/kube_emulator.py (kmock) not available")
async def test_stale_resource_version_is_a_conflict(kube: KubeEnv) -> None:
    kube.seed("v1/configmaps", {"metadata": {"name": "g", "namespace": "ns"}, "data": {"a": "1"}})
    async with kube.api_client() as client:
        from kubernetes_asyncio.client import CoreV1Api

        api = publish.KubeConfigMaps(CoreV1Api(client))
        got = await api.read("ns", "g")
        assert got is not None and got[0] == {"a": "1"}
        await api.update("ns", "g", {"a": "2"}, got[1])
        with pytest.raises(Conflict):
            await api.update("ns", "g", {"a": "3"}, got[1])  # stale now
        with pytest.raises(Conflict):
            await api.create("ns", "g", {"a": "4"})
        assert await api.read("ns", "missing") is None
