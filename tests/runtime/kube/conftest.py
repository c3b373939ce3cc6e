"""Fixtures: the Kubernetes API emulator, the real proxy wired to the ``kube`` runtime, stub engines.

Everything runs in the test's event loop on 127.0.0.1: the emulator (kmock), the proxy's HTTP server,
and stub engines whose address/port are published as EndpointSlice endpoints. Objects are written
with ``kube.upsert`` (what the operator would do: status included, watch events emitted); the proxy
itself talks to the emulator only through ``kubernetes_asyncio``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest_asyncio
import yaml

from flexinfer.cmd.proxy import build_kube
from flexinfer.http.server import HTTPServer
from flexinfer.runtime.kube import KubeRuntime, KubeTimings
from flexinfer.settings import ProxySettings, with_changes
from tests.api.helpers import CRDS
from tests.kube_emulator import KubeEnv, kube_fixture  # noqa: F401  (the `kube` fixture)
from tests.stub_engine import StubEngine

MODELS = "ai.flexinfer/v1alpha2/models"
DEPLOYMENTS = "ai.flexinfer/v1alpha1/modeldeployments"
ADAPTERS = "ai.flexinfer/v1alpha2/loraadapters"
GROUPS = "ai.flexinfer/v1alpha1/gpugroups"
SERVICES = "v1/services"
SLICES = "discovery.k8s.io/v1/endpointslices"
NODES = "v1/nodes"
NS = "default"
MSG = [{"role": "user", "content": "hi"}]

FAST = KubeTimings(heartbeat_tick=0.05, queue_refresh=0.05, patch_backoff=0.02, patch_backoff_cap=0.1,
                   failure_cooldown=0.2, request_timeout=5.0, watch_backoff=0.05, watch_backoff_cap=0.4,
                   watch_timeout=60.0, watch_min_stream=0.2, sync_timeout=5.0)

READY = [{"type": "Ready", "status": "True", "reason": "BackendReady", "message": "",
          "lastTransitionTime": "2025-01-01T00:00:00Z"}]
NOT_READY = [{"type": "Ready", "status": "False", "reason": "WaitingForActivation", "message": "",
              "lastTransitionTime": "2025-01-01T00:00:00Z"}]


def fast_settings(**changes: Any) -> ProxySettings:
    s = ProxySettings()
    http = with_changes(s.http, header_timeout=5.0, body_timeout=5.0, keepalive_timeout=5.0)
    up = with_changes(s.upstream, connect_timeout=1.0, response_timeout=10.0, stream_idle_timeout=10.0)
    return with_changes(s, http=http, upstream=up, **changes)


def model_obj(name: str, *, ready: bool = False, phase: str | None = None, ns: str = NS,
              annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"backend": "vllm", "source": f"HF://org/{name}", "gpu": {}}
    body.update(spec)
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
            "spec": body,
            "status": {"phase": phase or ("Ready" if ready else "Idle"), "conditions": READY if ready else NOT_READY}}


def slice_obj(name: str, service: str, endpoints: Iterable[tuple[str, int | StubEngine]], *,
              ns: str = NS, ready: bool = True, node: str | None = None) -> dict[str, Any]:
    eps = list(endpoints)
    port = eps[0][1] if eps else 0
    port = port.port if isinstance(port, StubEngine) else port
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
            "endpoints": [{"addresses": [addr], "conditions": {"ready": ready},
                           **({"nodeName": node} if node else {})} for addr, _ in eps],
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}


def service_obj(name: str, *, model: str | None = None, ns: str = NS,
                annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": {"flexinfer.ai/model": model or name},
                         "annotations": annotations or {}},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8000}]}}


class KubeStack:
    """The emulator, the proxy with its kube runtime, and stub engines."""

    def __init__(self, env: KubeEnv, api: Any) -> None:
        self.kube = env
        self.api = api
        self.runtime: KubeRuntime | None = None
        self.handler: Any = None
        self.server: HTTPServer | None = None
        self.stubs: list[StubEngine] = []
        self._clients: list[openai.AsyncOpenAI] = []

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self, settings: ProxySettings | None = None, timings: KubeTimings = FAST,
                    all_namespaces: bool = False) -> KubeRuntime:
        settings = settings or fast_settings()
        runtime, handler = build_kube(settings, all_namespaces=all_namespaces, api_client=self.api,
                                      timings=timings)
        self.runtime, self.handler = runtime, handler
        self.server = HTTPServer(handler, settings.http, host="127.0.0.1", port=0)
        await self.server.start()
        await runtime.start()
        return runtime

    async def close(self) -> None:
        for c in self._clients:
            await c.close()
        if self.server is not None:
            await self.server.drain_and_close(0.5)
        if self.handler is not None:
            await self.handler.pools.close_all()
        if self.runtime is not None:
            await self.runtime.stop()
        for s in self.stubs:
            await s.stop()

    async def stub(self) -> StubEngine:
        s = await StubEngine().start()
        self.stubs.append(s)
        return s

    # -- clients ---------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    def client(self, api_key: str = "k") -> openai.AsyncOpenAI:
        c = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=30)
        self._clients.append(c)
        return c

    async def get_json(self, path: str) -> Any:
        async with aiohttp.ClientSession() as s, s.get(self.url + path) as r:
            return await r.json(content_type=None)

    async def chat(self, model: str, headers: dict[str, str] | None = None,
                   **body: Any) -> tuple[int, dict[str, Any], Mapping[str, str]]:
        async with aiohttp.ClientSession() as s, s.post(
                self.url + "/v1/chat/completions", json={"model": model, "messages": MSG, **body},
                headers=headers or {}) as r:
            return r.status, json.loads(await r.read() or b"{}"), r.headers.copy()  # case-insensitive

    # -- objects ---------------------------------------------------------------------------------------
    def obj(self, resource: str, name: str, ns: str | None = NS) -> dict[str, Any]:
        """The current object in the emulator (it must exist)."""
        got = self.kube.get(resource, ns, name)
        assert got is not None, f"{resource} {name} missing"
        return got

    async def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.kube.upsert(resource, obj)

    async def edit(self, resource: str, name: str, fn: Callable[[dict[str, Any]], None], ns: str | None = NS) -> None:
        obj = self.kube.get(resource, ns, name)
        assert obj is not None, f"{resource} {name} missing"
        obj = copy.deepcopy(obj)
        fn(obj)
        await self.kube.upsert(resource, obj)

    async def set_ready(self, name: str, ready: bool = True, resource: str = MODELS) -> None:
        def f(o: dict[str, Any]) -> None:
            st = o.setdefault("status", {})
            st["conditions"] = READY if ready else NOT_READY
            if resource == MODELS:
                st["phase"] = "Ready" if ready else "Idle"
            else:
                st["phase"] = "Running" if ready else "Pending"
        await self.edit(resource, name, f)

    async def serve(self, name: str, stubs: Iterable[StubEngine], *, annotations: dict[str, str] | None = None,
                    service: bool = True) -> None:
        """A Service for ``name`` and one EndpointSlice per stub (ready, on 127.0.0.1)."""
        if service:
            await self.put(SERVICES, service_obj(name, annotations=annotations))
        for i, s in enumerate(stubs):
            await self.put(SLICES, slice_obj(f"{name}-{i}", name, [("127.0.0.1", s)]))

    # -- waiting ---------------------------------------------------------------------------------------
    @staticmethod
    async def until(cond: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
        end = time.monotonic() + timeout
        while True:
            v = cond()
            if v:
                return v
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.01)


async def load_crds(env: KubeEnv) -> None:
    for plural in ("models", "modeldeployments", "loraadapters", "gpugroups"):
        env.register_crd(yaml.safe_load((CRDS / f"ai.flexinfer_{plural}.yaml").read_text()))


@pytest_asyncio.fixture
async def ks(kube: KubeEnv) -> AsyncIterator[KubeStack]:
    """A KubeStack on a fresh emulator with the CRDs registered (call ``await ks.start()``)."""
    await load_crds(kube)
    async with kube.api_client() as api:
        st = KubeStack(kube, api)
        try:
            yield st
        finally:
            await st.close()


@contextlib.asynccontextmanager
async def proxy_process(kubeconfig: Path | str, namespace: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """``flexinfer proxy --kube`` as a process on a free port, with ``KUBECONFIG`` and ``POD_NAMESPACE``
    set as in a pod (no in-cluster service env); killed on exit if the test did not stop it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": namespace}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flexinfer.cli", "proxy", "--kube", "--port", str(port), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        yield proc, port
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
