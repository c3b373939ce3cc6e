"""``flexinfer proxy --global --kube``: the GlobalProxy read from the hub (a Kubernetes API emulator)
and its status written back by the global proxy itself (runtime.kubeglobal; docs/globalproxy.md).

The members here are stub engines answering ``/health`` and ``/v1/models`` (what the runtime probes);
the request path through real member proxies is tests/proxy/test_globalproxy.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from flexinfer.runtime.globalrt import GlobalRuntime, empty_config
from flexinfer.runtime.kubeglobal import KubeGlobalSource
from tests.api.helpers import CRDS
from tests.kube_emulator import KubeEnv
from tests.stub_engine import StubEngine

GPROXIES = "ai.flexinfer/v1alpha2/globalproxies"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "v1alpha2" / "globalproxy.yaml"


def _setup(kube: KubeEnv) -> None:
    for name in ("globalproxies", "federatedmodels"):
        kube.register_crd(yaml.safe_load((CRDS / f"ai.flexinfer_{name}.yaml").read_text()))


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")


async def test_example_reaches_a_status(kube: KubeEnv) -> None:
    """The example as shipped: its https endpoints (unreachable here) are probed and reported, not
    crashed on: 0 of 2 healthy."""
    _setup(kube)
    obj = yaml.safe_load(EXAMPLE.read_text())
    kube.seed(GPROXIES, {**obj, "metadata": {**obj["metadata"], "namespace": "default"}})
    runtime = GlobalRuntime(empty_config())
    async with kube.api_client() as api:
        source = KubeGlobalSource(runtime, api, "default")
        await source.sync()
        assert [m.name for m in runtime.members.values()] == ["core", "edge-1"]
        await runtime.probe_all()
        await source.write_status()
    got = kube.get(GPROXIES, "default", "global")
    assert got is not None
    st = got["status"]
    assert (st["healthyClusters"], st["totalClusters"]) == (0, 2)
    ready = _ready(got)
    assert (ready["status"], ready["reason"]) == ("False", "NoHealthyCluster")
    assert "core" in ready["message"] and "edge-1" in ready["message"]
    assert "not supported" not in ready["message"]  # https members are dialled (docs/tls.md)
    # its tls.secretRef names a Secret that does not exist here: said so, nothing crashed
    tls = next(c for c in got["status"]["conditions"] if c["type"] == "TLSReady")
    assert (tls["status"], tls["reason"]) == ("False", "SecretNotFound")
    assert "default/global-proxy-tls not found" in tls["message"]


async def test_status_follows_the_members(kube: KubeEnv) -> None:
    _setup(kube)
    stubs = [await StubEngine().start() for _ in range(2)]
    try:
        kube.seed(GPROXIES, {
            "apiVersion": "ai.flexinfer/v1alpha2", "kind": "GlobalProxy",
            "metadata": {"name": "global", "namespace": "default"},
            "spec": {"strategy": "Failover", "failoverOrder": ["core", "edge-1"],
                     "clusters": [{"name": "core", "endpoint": stubs[0].url},
                                  {"name": "edge-1", "endpoint": stubs[1].url}],
                     "probe": {"path": "/health", "timeout": "1s", "interval": "1s"}}})
        runtime = GlobalRuntime(empty_config())
        async with kube.api_client() as api:
            source = KubeGlobalSource(runtime, api, "default", "global")
            await source.sync()
            await runtime.probe_all()
            await source.write_status()
            got = kube.get(GPROXIES, "default", "global")
            assert got is not None
            assert got["status"]["healthyClusters"] == 2 and got["status"]["activeCluster"] == "core"
            assert _ready(got)["reason"] == "AllClustersHealthy"
            view = runtime.resolve("stub")  # the model the stubs list, routed core first
            assert view is not None and view.routing == "failover" and view.endpoints[0].port == stubs[0].port
            writes = source.status_writes
            await runtime.probe_all()  # a steady round: nothing to write
            await source.write_status()
            assert source.status_writes == writes
            await stubs[0].stop()  # core refuses connections: out at once
            await runtime.probe_all()
            await source.write_status()
            got = kube.get(GPROXIES, "default", "global")
            assert got is not None
            assert (got["status"]["healthyClusters"], got["status"]["activeCluster"]) == (1, "edge-1")
            assert _ready(got)["reason"] == "Degraded" and "core: out" in _ready(got)["message"]
            view = runtime.resolve("stub")
            assert view is not None and [e.port for e in view.endpoints] == [stubs[1].port]
            await stubs[0].start(port=stubs[0].port)  # back on the same port
            await runtime.probe_all()
            await source.write_status()
            got = kube.get(GPROXIES, "default", "global")
            assert got is not None and got["status"]["activeCluster"] == "core"
            assert got["status"]["observedGeneration"] == got["metadata"]["generation"]
    finally:
        for s in stubs:
            await s.stop()
