"""The one reflector on its own: decoded answers fed directly, then large events on the emulator."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flexinfer.k8s.backoff import Backoff
from flexinfer.k8s.errors import KubeAPIError
from flexinfer.k8s.reflector import Expired, ResourceWatch
from tests.harness import reach
from tests.kube_emulator import KubeEnv, kube_fixture  # noqa: F401  (the `kube` fixture)


def test_apply_list_and_apply_event() -> None:
    synced: list[list[dict[str, Any]]] = []
    events: list[tuple[str, str]] = []
    w = ResourceWatch("things", None, (), {}, on_sync=synced.append,
                      on_event=lambda typ, obj: events.append((typ, obj["metadata"]["name"])))
    w.apply_list({"metadata": {"resourceVersion": "7"}, "items": [{"metadata": {"name": "a"}}, "junk"]})
    assert synced == [[{"metadata": {"name": "a"}}]] and w.resource_version == "7" and w.synced.is_set()
    assert w.apply_event("ADDED", {"metadata": {"name": "b", "resourceVersion": "8"}})
    assert not w.apply_event("BOOKMARK", {"metadata": {"resourceVersion": "20"}})
    assert not w.apply_event("SOMETHING", {"metadata": {"name": "c", "resourceVersion": "21"}})
    assert events == [("ADDED", "b")] and w.resource_version == "20" and w.stats.events == 1
    with pytest.raises(Expired) as gone:
        w.apply_event("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"})
    assert gone.value.status == 410 and str(gone.value) == "too old resource version"
    with pytest.raises(KubeAPIError) as err:
        w.apply_event("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"})
    assert err.value.status == 500 and not isinstance(err.value, Expired)
    with pytest.raises(KubeAPIError):
        w.apply_list([])
    w.apply_list({"items": []})  # a server without list versions: watch from "now"
    assert w.resource_version == "" and synced[-1] == []


async def test_an_event_near_the_object_size_limit_arrives(kube: KubeEnv) -> None:
    """A ConfigMap of 1000 KiB (near the API server's object limit) is one watch line: it arrives
    (kubernetes_asyncio reads with a 2 MiB buffer, aiohttp's default would refuse lines over 128 KiB)
    and the watch goes on."""
    from kubernetes_asyncio import client as k8s

    seen: dict[str, int] = {}
    async with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        w = ResourceWatch("configmaps", core.list_namespaced_config_map, ("default",), {},
                          on_sync=lambda items: None,
                          on_event=lambda typ, obj: seen.__setitem__(obj["metadata"]["name"],
                                                                     len((obj.get("data") or {}).get("blob", ""))),
                          backoff=Backoff(0.01, 0.05))
        task = asyncio.create_task(w.run())
        try:
            await reach(w.synced.is_set)
            await core.create_namespaced_config_map("default", {"metadata": {"name": "big"},
                                                                "data": {"blob": "x" * (1000 * 1024)}})
            await core.create_namespaced_config_map("default", {"metadata": {"name": "small"}, "data": {}})
            await reach(lambda: "small" in seen)
            assert seen == {"big": 1000 * 1024, "small": 0} and w.stats.errors == 0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
