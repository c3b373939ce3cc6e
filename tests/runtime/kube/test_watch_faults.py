"""Watch faults on the emulator: dropped streams, 410 Gone and 500s. The inventory recovers, never
loses a model on the way, and sends a bounded number of requests (no storm)."""

from __future__ import annotations

import asyncio
import time

import yaml

from tests.kube_emulator import KubeEnv
from tests.runtime.kube.conftest import CRDS, MODELS, KubeStack, model_obj

MODEL_KEY = "models.ai.flexinfer"


async def test_dropped_expired_and_failing_watches_recover_without_losing_models(ks: KubeStack) -> None:
    kube = ks.kube
    await ks.put(MODELS, model_obj("a"))  # there before the proxy starts
    rt = await ks.start()
    assert rt.resolve("a") is not None
    watches = len(rt.watches)
    w = rt.watches["Model"]
    lost: list[float] = []

    async def monitor() -> None:
        while True:
            if rt.resolve("a") is None:
                lost.append(time.monotonic())
            await asyncio.sleep(0.002)

    mon = asyncio.create_task(monitor())

    def gets(resource: str | None = MODEL_KEY) -> int:
        return kube.request_count(resource, "GET")

    await ks.until(lambda: gets(None) == 2 * watches, what="every watch open")  # one list + one watch each
    await asyncio.sleep(0.3)
    assert (gets(), w.stats.lists) == (2, 1)

    # 1) the apiserver ends every watch: each resumes from its resourceVersion (no list)
    all0, m0 = gets(None), gets()
    await kube.close_watches()
    await ks.put(MODELS, model_obj("b"))
    await ks.until(lambda: rt.resolve("b"), what="b after the drop")
    await asyncio.sleep(0.3)
    assert gets() - m0 == 1 and w.stats.lists == 1
    assert gets(None) - all0 == watches  # one new watch per resource

    # 2) 410 Gone: list again, keep every model meanwhile
    all0, m0 = gets(None), gets()
    await ks.put("v1/configmaps", {"metadata": {"name": "bump", "namespace": "default"}})  # a newer version
    kube.expire_resource_versions()  # ... and everything older is compacted away
    await kube.close_watches()
    await ks.until(lambda: w.stats.lists == 2 and w.stats.expired == 1, what="the re-list")
    await ks.put(MODELS, model_obj("c"))
    await ks.until(lambda: rt.resolve("c"), what="c after the re-list")
    assert rt.resolve("a") and rt.resolve("b")
    await ks.until(lambda: gets() - m0 >= 3, what="the new watch")
    await asyncio.sleep(0.3)
    assert gets() - m0 == 3  # watch (410), list, watch
    assert gets(None) - all0 <= 3 * watches

    # 3) the watch answers 500 four times: backoff, then resume (still no list)
    m0, e0 = gets(), w.stats.errors
    kube.inject("GET", r"/models$", status=500, times=4, query="watch")
    t0 = time.monotonic()
    await kube.close_watches()
    await ks.put(MODELS, model_obj("d"))
    await ks.until(lambda: rt.resolve("d"), timeout=10, what="d after the 500s")
    assert w.stats.errors - e0 == 4 and w.stats.lists == 2
    await asyncio.sleep(0.2)
    assert gets() - m0 == 5  # four refused, one that worked
    assert time.monotonic() - t0 >= 0.05 * (1 + 2 + 4 + 8) * 0.5 * 0.9  # the backoff was honoured

    # 4) expired, and the re-list fails twice with 503 + Retry-After: waits, lists, watches
    m0 = gets()
    kube.inject("GET", r"/models$", status=503, times=2, retry_after=0, query="^(?!.*watch)")
    await ks.put("v1/configmaps", {"metadata": {"name": "bump", "namespace": "default"}, "data": {"n": "2"}})
    kube.expire_resource_versions()
    await kube.close_watches()
    await ks.until(lambda: w.stats.lists == 3, timeout=10, what="the re-list after 503s")
    await ks.put(MODELS, model_obj("e"))
    await ks.until(lambda: rt.resolve("e"), what="e")
    await ks.until(lambda: gets() - m0 >= 5, what="the new watch")
    await asyncio.sleep(0.2)
    assert gets() - m0 == 5  # watch (410), 2 refused lists, list, watch
    assert all(rt.resolve(n) for n in "abcde")

    # 5) a model deleted while the watch was failing: the resumed watch replays the DELETED
    kube.inject("GET", r"/models$", status=500, times=1, query="watch")
    await kube.close_watches()
    obj = ks.obj(MODELS, "b")
    assert obj is not None
    async with kube.api_client() as api:
        from kubernetes_asyncio import client as k8s

        await k8s.CustomObjectsApi(api).delete_namespaced_custom_object(
            "ai.flexinfer", "v1alpha2", "default", "models", "b")
    await ks.until(lambda: rt.resolve("b") is None, what="b deleted")
    mon.cancel()
    await asyncio.gather(mon, return_exceptions=True)
    assert not lost, "a model vanished from the inventory during the faults"


async def test_missing_crd_and_forbidden_nodes_neither_block_start_nor_storm(kube: KubeEnv) -> None:
    for plural in ("models", "modeldeployments", "loraadapters"):  # no GPUGroup CRD installed
        kube.register_crd(yaml.safe_load((CRDS / f"ai.flexinfer_{plural}.yaml").read_text()))
    kube.inject("GET", r"^/api/v1/nodes$", status=403, times=1000)  # a namespaced Role: nodes forbidden
    await kube.upsert(MODELS, model_obj("m"))
    async with kube.api_client() as api:
        ks = KubeStack(kube, api)
        try:
            t0 = time.monotonic()
            rt = await ks.start()
            assert time.monotonic() - t0 < 2.0  # not FAST.sync_timeout (5 s): refusals are not waited for
            assert rt.resolve("m") is not None
            groups = rt.watches["GPUGroup"]
            assert not groups.synced.is_set() and groups.stats.errors >= 1
            await asyncio.sleep(1.5)
            assert kube.request_count("nodes", "GET") <= 12  # bounded, jittered backoff (cap 0.4 s here)
            assert kube.request_count("gpugroups.ai.flexinfer", "GET") <= 12
        finally:
            await ks.close()
