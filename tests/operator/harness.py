"""Test harness: the real operator (kopf + our registry) running in-process against the emulator.

``OperatorEnv`` starts ``kopf.operator(registry=app.build_registry(op), standalone=True,
clusterwide=True)`` as a task on the test's event loop, with settings tuned for tests (short
backoff, 5 s request timeout, sub-second resync), and offers helpers to create objects, wait for
conditions and count the emulator's writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attrs
import kmock
import kopf
import yaml

from flexinfer.operator.app import build_registry
from flexinfer.operator.config import OperatorSettings
from flexinfer.operator.context import Operator
from tests.api.helpers import CRDS
from tests.kube_emulator import FlexEmulator, KubeEnv, write_kubeconfig

MODELS = "ai.flexinfer/v1alpha2/models"
LORAS = "ai.flexinfer/v1alpha2/loraadapters"
MDS = "ai.flexinfer/v1alpha1/modeldeployments"
CACHES = "ai.flexinfer/v1alpha1/modelcaches"
GROUPS = "ai.flexinfer/v1alpha1/gpugroups"
DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
PVCS = "v1/persistentvolumeclaims"
JOBS = "batch/v1/jobs"
NODES = "v1/nodes"
ENDPOINTS = "v1/endpoints"
CONFIGMAPS = "v1/configmaps"
EVENTS = "v1/events"

TEST_SETTINGS = OperatorSettings(resync_s=0.5, failed_requeue_s=1.0, retry_base_s=0.3, retry_max_s=2.0,
                                 request_timeout_s=5.0, api_retries=2, workers=4, lora_requeue_s=1.0,
                                 lora_pending_requeue_s=0.3, gpugroup_requeue_s=0.5, metrics_port=0)


@attrs.define(kw_only=True)
class BoundedEmulator(FlexEmulator):
    """The emulator with kmock's request history bounded: kmock matches every request against the whole
    history (O(requests) per request), which makes hundreds of objects crawl. No reaction of the
    Kubernetes emulator depends on old requests; requests still being served are never dropped."""

    history: int = 8
    _inflight: set[int] = attrs.field(factory=set, init=False)

    async def _handle(self, request: Any) -> Any:
        reqs = self._requests
        if len(reqs) > 2 * self.history:
            keep = [r for r in reqs[: -self.history] if id(r) in self._inflight]
            reqs[:] = keep + reqs[-self.history:]
        self._inflight.add(id(request))
        try:
            return await super()._handle(request)
        finally:
            self._inflight.discard(id(request))


@contextlib.asynccontextmanager
async def start_bounded_kube(directory: Path | str) -> AsyncIterator[KubeEnv]:
    """Like ``tests.kube_emulator.start_kube``, with a :class:`BoundedEmulator`."""
    import warnings

    emulator = BoundedEmulator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        emulator.resources.load_bundled()
    async with emulator, kmock.Server(emulator, host="127.0.0.1") as server:
        env = KubeEnv(emulator=emulator, server=server, kubeconfig_path=Path(directory) / "kubeconfig")
        write_kubeconfig(env.kubeconfig_path, env.url)
        yield env


def register_crds(kube: KubeEnv) -> None:
    for path in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                kube.register_crd(doc)


def model(name: str, ns: str = "default", **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": name, "namespace": ns},
            "spec": {"backend": "ollama", "source": "ollama://llama3:8b"}}
    body["spec"].update(spec)
    return body


def md(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"backend": "ollama", "model": "llama3:8b", **spec}}


def gpu_node(name: str, vendor: str = "nvidia", *, major: str = "8", minor: str = "9", vram: str = "24Gi",
             ready: bool = True, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    lbl = {"kubernetes.io/hostname": name, "flexinfer.ai/gpu.vram": vram, **(extra_labels or {})}
    if vendor == "nvidia":
        lbl.update({"nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor})
        cap = {"nvidia.com/gpu": "1"}
    else:
        lbl["gpu.amd.com/gpu-architecture"] = "gfx1100"
        cap = {"amd.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lbl},
            "status": {"capacity": {"cpu": "16", "memory": "64Gi", **cap},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


class FakeClock:
    """The operator's clock in tests: starts at 2025-07-01T12:00Z and moves only when told."""

    def __init__(self) -> None:
        from datetime import UTC, datetime

        self.now = datetime(2025, 7, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> Any:
        return self.now

    def advance(self, seconds: float) -> None:
        from datetime import timedelta

        self.now += timedelta(seconds=seconds)


@dataclass
class OperatorEnv:
    kube: KubeEnv
    op: Operator
    task: asyncio.Task[None]
    stop_flag: asyncio.Event
    api: Any = None  # one kubernetes_asyncio ApiClient for the test's own requests

    async def _call(self, path: str, method: str, body: Any = None, content_type: str = "application/json") -> Any:
        if self.api is None:
            from kubernetes_asyncio import config

            self.api = await config.new_client_from_config(config_file=str(self.kube.admin_kubeconfig))
        return await self.api.call_api(path, method, body=body, header_params={"Content-Type": content_type},
                                       response_types_map={200: "object", 201: "object"},
                                       auth_settings=["BearerToken"], _return_http_data_only=True)

    # -- objects -------------------------------------------------------------------------------------

    async def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """POST through the API (as kubectl would)."""
        group_version, plural = resource.rsplit("/", 1)
        ns = obj.get("metadata", {}).get("namespace", "default")
        prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        path = f"{prefix}/namespaces/{ns}/{plural}" if resource not in (NODES,) else f"{prefix}/{plural}"
        return await self._call(path, "POST", copy.deepcopy(obj))  # type: ignore[no-any-return]

    async def patch(self, resource: str, ns: str | None, name: str, patch: dict[str, Any], *,
                    sub: str | None = None) -> dict[str, Any]:
        group_version, plural = resource.rsplit("/", 1)
        prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        path = f"{prefix}/namespaces/{ns}/{plural}/{name}" if ns else f"{prefix}/{plural}/{name}"
        if sub:
            path += f"/{sub}"
        return await self._call(path, "PATCH", patch, "application/merge-patch+json")  # type: ignore[no-any-return]

    async def delete(self, resource: str, ns: str | None, name: str) -> None:
        group_version, plural = resource.rsplit("/", 1)
        prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        path = f"{prefix}/namespaces/{ns}/{plural}/{name}" if ns else f"{prefix}/{plural}/{name}"
        await self._call(path, "DELETE")

    def get(self, resource: str, name: str, ns: str | None = "default") -> dict[str, Any] | None:
        return self.kube.get(resource, ns, name)

    async def set_deployment_ready(self, name: str, ready: int = 1, ns: str = "default") -> None:
        await self.patch(DEPLOYMENTS, ns, name, {"status": {"replicas": ready, "readyReplicas": ready,
                                                            "availableReplicas": ready}}, sub="status")

    # -- waiting -------------------------------------------------------------------------------------

    async def wait_for(self, pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                v = pred()
            except (KeyError, TypeError, IndexError):
                v = None
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            await asyncio.sleep(0.05)

    async def settle(self, quiet: float = 0.4, timeout: float = 15.0) -> None:
        """Wait until no write reached the emulator for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        last = self.kube.write_count()
        since = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            now = self.kube.write_count()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
        raise AssertionError("the operator did not settle")

    def status(self, name: str, ns: str = "default", resource: str = MODELS) -> dict[str, Any]:
        return (self.get(resource, name, ns) or {}).get("status") or {}

    def condition(self, name: str, type_: str, ns: str = "default", resource: str = MODELS) -> dict[str, Any]:
        for c in self.status(name, ns, resource).get("conditions") or ():
            if c.get("type") == type_:
                return c  # type: ignore[no-any-return]
        return {}

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        import kmock

        res = kmock.resource("", "v1", "events")
        out = []
        for (r, _ns, _n), obj in self.kube.emulator.objects.items():
            if r == res and not obj.deleted:
                raw = obj.raw
                if name is None or raw.get("involvedObject", {}).get("name") == name:
                    out.append(raw)
        return out


def phase(env: OperatorEnv, resource: str, name: str) -> Any:
    return env.status(name, resource=resource).get("phase")


@contextlib.asynccontextmanager
async def run_operator(kube: KubeEnv, settings: OperatorSettings = TEST_SETTINGS, *,
                       setup: Callable[[Operator], None] | None = None,
                       http_post: Callable[..., Awaitable[tuple[int, str]]] | None = None,
                       clock: Callable[[], Any] | None = None) -> AsyncIterator[OperatorEnv]:
    register_crds(kube)
    op = Operator(settings=settings)
    if http_post is not None:
        op.http_post = http_post
    if clock is not None:
        op.clock = clock
    if setup is not None:
        setup(op)
    # the operator runs as the user of ``kube.kubeconfig_path`` (a ServiceAccount on a ``kube.as_user``
    # view; kopf's own login reads KUBECONFIG); the test's requests (``env.create``...) stay admin
    registry = build_registry(op, kubeconfig=str(kube.kubeconfig_path))
    old_kubeconfig = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(kube.kubeconfig_path)
    try:
        stop = asyncio.Event()
        ready = asyncio.Event()
        task = asyncio.create_task(kopf.operator(registry=registry, standalone=True, clusterwide=True,
                                                 stop_flag=stop, ready_flag=ready))
        await asyncio.wait_for(ready.wait(), 10)
        env = OperatorEnv(kube=kube, op=op, task=task, stop_flag=stop)
        await env.wait_for(lambda: op.queues and op.writer is not None, 10, "operator start")
        try:
            yield env
        finally:
            if env.api is not None:
                await env.api.close()
            stop.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 10)
    finally:
        if old_kubeconfig is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old_kubeconfig


