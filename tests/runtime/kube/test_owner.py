"""One inventory owner per machine: ``flexinfer proxy --kube --workers 2`` as real processes against the
emulator (one set of watches, one demand patch, models reach every worker, the owner killed and
restarted, wakes and GPUGroup queues through the workers), and the owner/worker protocol in-process
(the mirrored index is the owner's, removals included; depths sum over workers; a wake error carries
the runtime's reason; a new owner hands out a fresh snapshot)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from kubernetes_asyncio import client as k8s

from flexinfer.runtime.base import ModelView
from flexinfer.runtime.kube import KubeRuntime
from flexinfer.runtime.kubeowner import InventoryOwner, OwnerLoad
from flexinfer.runtime.kuberemote import RemoteKubeInventory, view_from_dict, view_to_dict
from tests.harness import free_port, reach
from tests.runtime.kube.conftest import (
    ADAPTERS,
    DEPLOYMENTS,
    FAST,
    GROUPS,
    MODELS,
    MSG,
    NS,
    KubeStack,
    model_obj,
)

ROOT = Path(__file__).resolve().parents[3]
STATUS = "models.ai.flexinfer/status"
WATCHED = ("models.ai.flexinfer", "modeldeployments.ai.flexinfer", "loraadapters.ai.flexinfer",
           "gpugroups.ai.flexinfer", "services", "endpointslices.discovery.k8s.io", "nodes")


@pytest.fixture
def sock_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="fi-owner-")  # short: a Unix socket path has at most 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


# -- the proxy as processes -------------------------------------------------------------------------

class Proxy:
    """``flexinfer proxy --kube --workers 2`` with its stderr collected line by line."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc = proc
        self.port = port
        self.lines: list[str] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.lines.append(line.decode(errors="replace").rstrip())

    def matches(self, pattern: str) -> list[re.Match[str]]:
        return [m for line in self.lines if (m := re.search(pattern, line))]

    async def wait_for(self, pattern: str, n: int = 1, timeout: float = 20.0) -> list[re.Match[str]]:
        try:
            await reach(lambda: len(self.matches(pattern)) >= n, timeout)
        except AssertionError:
            raise AssertionError(f"{n} x {pattern!r} not logged:\n" + "\n".join(self.lines[-40:])) from None
        return self.matches(pattern)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def get(self, path: str) -> Any:
        """A GET on a fresh connection (SO_REUSEPORT spreads fresh connections over the workers)."""
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s, \
                s.get(self.url + path) as r:
            assert r.status == 200, r.status
            return orjson.loads(await r.read())

    async def model_ids(self) -> list[str]:
        return [d["id"] for d in (await self.get("/v1/models"))["data"]]

    async def chat(self, model: str) -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s, \
                s.post(self.url + "/v1/chat/completions", json={"model": model, "messages": MSG}) as r:
            return r.status, orjson.loads(await r.read() or b"{}")

    async def everywhere(self, model: str, tries: int = 20) -> bool:
        """``model`` is listed by ``tries`` fresh connections in a row (so by every worker)."""
        for _ in range(tries):
            if model not in await self.model_ids():
                return False
        return True


@contextlib.asynccontextmanager
async def proxy_workers(ks: KubeStack, workers: int = 2) -> AsyncIterator[Proxy]:
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(ks.kube.kubeconfig_path), "POD_NAMESPACE": NS,
           "PYTHONPATH": str(ROOT)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flexinfer.cli", "proxy", "--kube", "--port", str(port), "--workers", str(workers),
        env=env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    proxy = Proxy(proc, port)
    try:
        yield proxy
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the workers and the owner too, whatever happened
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await asyncio.wait_for(proxy._reader, 10)


async def until_async(cond: Any, timeout: float = 15.0, what: str = "condition") -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not await cond():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def stop(proxy: Proxy) -> None:
    proxy.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proxy.proc.wait(), 30) == 0
    await asyncio.wait_for(proxy._reader, 10)
    text = "\n".join(proxy.lines)
    assert "Traceback" not in text, text


async def test_two_workers_one_set_of_watches_one_demand_patch(ks: KubeStack) -> None:
    stub = await ks.stub()
    await ks.put(MODELS, model_obj("m", ready=True))
    await ks.serve("m", [stub])
    async with proxy_workers(ks) as proxy:
        synced = await proxy.wait_for(r"kube inventory from the owner: (\d+) models \(pid (\d+)\)", 2)
        assert [m[1] for m in synced] == ["1", "1"] and len({m[2] for m in synced}) == 2  # both workers
        # up means synced: every worker lists the model at once
        for _ in range(20):
            assert await proxy.model_ids() == ["m"]
        for _ in range(20):
            status, body = await proxy.chat("m")
            assert status == 200 and body["choices"][0]["message"]["content"] == "hello from stub"
        assert len(stub.requests) == 20
        await ks.put(MODELS, model_obj("n"))
        await until_async(lambda: proxy.everywhere("n"), what="n on every worker")
        assert ks.kube.write_count(STATUS, "PATCH") == 1  # one demand patch, whichever worker served
        for resource in WATCHED:  # one list and one watch per resource: the owner's
            assert ks.kube.request_count(resource, "GET") == 2, resource
        assert ks.kube.request_count(None, "GET") == 2 * len(WATCHED)
        await stop(proxy)
    assert proxy.matches(r"sidecar kube-inventory started")
    assert len(proxy.matches(r"worker \d started")) == 2


async def test_owner_killed_workers_keep_serving_and_take_the_new_owners_inventory(ks: KubeStack) -> None:
    stub = await ks.stub()
    await ks.put(MODELS, model_obj("m", ready=True))
    await ks.serve("m", [stub])
    async with proxy_workers(ks) as proxy:
        await proxy.wait_for(r"kube inventory from the owner: 1 models", 2)
        (owner,) = await proxy.wait_for(r"sidecar kube-inventory started \(pid (\d+)\)")
        os.kill(int(owner[1]), signal.SIGKILL)
        answers: list[int] = []
        # served from the workers' last inventory while the owner is away and after it is back
        while len(proxy.matches(r"inventory owner back")) < 2:
            status, _ = await proxy.chat("m")
            answers.append(status)
            assert len(answers) < 2000, "\n".join(proxy.lines[-30:])
        for _ in range(10):
            answers.append((await proxy.chat("m"))[0])
        assert set(answers) == {200}
        assert proxy.matches(r"sidecar kube-inventory \(pid \d+\) was killed by signal SIGKILL; restarting")
        assert len(proxy.matches(r"sidecar kube-inventory started")) == 2
        await ks.put(MODELS, model_obj("late"))
        await until_async(lambda: proxy.everywhere("late"), what="late on every worker")
        assert ks.kube.request_count("models.ai.flexinfer", "GET") == 4  # the new owner's list + watch, only
        await stop(proxy)


async def test_wakes_and_group_queues_go_through_the_owner(ks: KubeStack) -> None:
    await ks.put(DEPLOYMENTS, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
                               "metadata": {"name": "md", "namespace": NS},
                               "spec": {"backend": "ollama", "model": "llama3:8b", "replicas": 0},
                               "status": {"phase": "Pending"}})
    bad = model_obj("bad", phase="Failed")
    bad["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "NoMatchingNodes",
                                    "message": "no GPU node matches", "lastTransitionTime": "2025-01-01T00:00:00Z"}]
    await ks.put(MODELS, bad)
    for name in ("md-a", "md-b"):
        await ks.put(DEPLOYMENTS, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
                                   "metadata": {"name": name, "namespace": NS},
                                   "spec": {"backend": "ollama", "model": f"{name}:1b", "replicas": 0,
                                            "gpuGroupRef": "g"}})
    await ks.put(GROUPS, {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
                          "metadata": {"name": "g", "namespace": NS},
                          "spec": {"models": [{"name": "md-a"}, {"name": "md-b"}]},
                          "status": {"phase": "Active", "activeModel": "md-b"}})

    def ann() -> dict[str, str]:
        return ks.obj(GROUPS, "g")["metadata"].get("annotations") or {}

    async with proxy_workers(ks) as proxy:
        await proxy.wait_for(r"kube inventory from the owner: 4 models", 2)
        status, body = await proxy.chat("bad")  # the runtime's reason crosses the socket
        assert status == 503 and body["error"]["code"] == "activation_failed"
        assert "NoMatchingNodes" in body["error"]["message"]

        held = [asyncio.create_task(proxy.chat("md")) for _ in range(4)]
        await ks.until(lambda: ks.obj(DEPLOYMENTS, "md")["spec"]["replicas"] == 1, timeout=15, what="replicas=1")
        assert not any(t.done() for t in held)
        queued = [asyncio.create_task(proxy.chat("md-a")) for _ in range(6)]
        # the owner's queue annotation counts the waiters of both workers
        await ks.until(lambda: ann().get("flexinfer.ai/queue.md-a") == "6", timeout=15, what="queue depth 6")
        for t in (*held, *queued):
            t.cancel()
        await asyncio.gather(*held, *queued, return_exceptions=True)
        await ks.until(lambda: not any(k.startswith("flexinfer.ai/queue") for k in ann()), timeout=15,
                       what="queue cleared once nobody waits")
        await stop(proxy)
    # one demand patch each for md and md-a, although both workers woke them
    assert ks.kube.write_count("modeldeployments.ai.flexinfer/status", "PATCH") == 2


# -- the protocol in-process ----------------------------------------------------------------------------

async def _owner(ks: KubeStack, path: str) -> InventoryOwner:
    load = OwnerLoad()
    owner = InventoryOwner(KubeRuntime(NS, api_client=ks.api, timings=FAST, load=load), load, path)
    await owner.start()
    return owner


def _same(remote: RemoteKubeInventory, owner: InventoryOwner) -> bool:
    ours, theirs = remote._index, owner.runtime.index
    return (ours.by_name == theirs.by_name and ours.names_of == theirs.names_of
            and ours.ordered == theirs.ordered)


async def test_the_mirror_is_the_owners_index_and_follows_changes_and_removals(ks: KubeStack, sock_dir: str) -> None:
    path = os.path.join(sock_dir, "s")
    await ks.put(MODELS, model_obj("m2", ready=True, litellm={"servedModelName": "big", "aliases": ["a2"]},
                                   serviceLabels=["textgen"]))
    await ks.put(ADAPTERS, {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "LoRAAdapter",
                            "metadata": {"name": "sql", "namespace": NS},
                            "spec": {"modelRef": "m2", "adapterName": "sql-lora",
                                     "source": {"type": "HuggingFace", "uri": "org/sql-lora"}}})
    owner = await _owner(ks, path)
    assert (os.stat(path).st_mode & 0o777) == 0o600
    remotes = [RemoteKubeInventory(path, sync_wait=5.0, queue_refresh=0.05) for _ in range(2)]
    seen: list[str] = []
    remotes[0].subscribe(lambda v: seen.append(v.name))
    try:
        for r in remotes:
            await r.start()
        for r in remotes:
            assert _same(r, owner)
            sql = r.resolve("sql-lora")
            assert sql is not None and sql.name == "m2" and sql.rewrite_model is False
            assert r.resolve("textgen") is r.resolve("big") is r.resolve("m2")
        # a change of one view (same names): readiness and endpoints
        stub = await ks.stub()
        await ks.serve("m2", [stub])
        await reach(lambda: all(bool(v and v.endpoints) for v in (r.resolve("m2") for r in remotes)))
        assert all(_same(r, owner) for r in remotes) and "m2" in seen
        # a new model, then its removal
        await ks.put(MODELS, model_obj("n"))
        await reach(lambda: all(r.resolve("n") for r in remotes))
        co = k8s.CustomObjectsApi(ks.api)
        await co.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", NS, "models", "n")
        await reach(lambda: not any(r.resolve("n") for r in remotes))
        await co.delete_namespaced_custom_object("ai.flexinfer", "v1alpha2", NS, "loraadapters", "sql")
        await reach(lambda: not any(r.resolve("sql-lora") for r in remotes))
        assert all(_same(r, owner) for r in remotes)
        assert [v.name for v in remotes[0].models()] == ["m2"]
    finally:
        for r in remotes:
            await r.stop()
        await owner.stop()
    assert not os.path.exists(path)


class _Depths:
    def __init__(self) -> None:
        self.n: dict[str, int] = {}

    def in_flight(self, endpoint: str) -> int:
        return 0

    def queue_depth(self, model: str) -> int | None:
        return self.n.get(model, 0)


async def test_depths_sum_over_workers_wake_errors_and_a_new_owner(ks: KubeStack, sock_dir: str) -> None:
    path = os.path.join(sock_dir, "s")
    bad = model_obj("bad", phase="Failed")
    await ks.put(MODELS, bad)
    await ks.put(MODELS, model_obj("cold"))
    owner = await _owner(ks, path)
    loads = [_Depths(), _Depths()]
    remotes = [RemoteKubeInventory(path, load=ld, sync_wait=5.0, queue_refresh=0.02, reconnect_cap=0.1)
               for ld in loads]
    try:
        for r in remotes:
            await r.start()
        view = remotes[0].resolve("bad")
        assert view is not None
        with pytest.raises(RuntimeError, match="model 'bad' has failed"):
            await remotes[0].wake(view)
        with pytest.raises(RuntimeError, match="no longer in the cluster"):
            await remotes[1].wake(ModelView(name="gone"))
        # depths: reported on wake, then on change; summed by the owner; gone with the connection
        loads[0].n["cold"], loads[1].n["cold"] = 2, 3
        cold = remotes[0].resolve("cold")
        assert cold is not None
        await asyncio.gather(remotes[0].wake(cold), remotes[1].wake(cold))
        assert owner.load.queue_depth("cold") == 5
        loads[1].n["cold"] = 1
        await reach(lambda: owner.load.queue_depth("cold") == 3)
        assert ks.kube.write_count(STATUS, "PATCH") == 1  # both wakes: one demand patch
        # demand: at most one message per model per second from a worker
        heard: list[str] = []
        record = owner.runtime.record_demand
        owner.runtime.record_demand = lambda v: (heard.append(v.name), record(v))[1]  # type: ignore[method-assign]
        for _ in range(50):
            remotes[0].record_demand(cold)
            remotes[1].record_demand(cold)
        await asyncio.gather(remotes[0].wake(cold), remotes[1].wake(cold))  # answered after the demands
        assert heard == ["cold", "cold"]
        # a new owner: the workers reconnect, report their depths again, take its snapshot
        await owner.stop()
        await ks.put(MODELS, model_obj("later"))
        owner = await _owner(ks, path)
        await reach(lambda: all(r.resolve("later") for r in remotes) and all(r.snapshots == 2 for r in remotes))
        await reach(lambda: owner.load.queue_depth("cold") == 3)
        # ... and the models they still hold requests for are woken again at the new owner (re-armed)
        await reach(lambda: ks.kube.write_count(STATUS, "PATCH") == 2)
        loads[0].n["cold"] = loads[1].n["cold"] = 0
        await reach(lambda: owner.load.queue_depth("cold") == 0)
        assert all(_same(r, owner) for r in remotes)
    finally:
        for r in remotes:
            await r.stop()
        await owner.stop()


def test_view_codec_round_trip() -> None:
    from types import MappingProxyType

    from flexinfer.runtime.base import Endpoint

    v = ModelView(name="m", endpoints=(Endpoint("10.0.0.1", 8000), Endpoint("::1", 9)), ready=False,
                  served_name="s", aliases=("a", "b"), routing="prefix", cold_start_timeout=12.5,
                  context_window=4096, rewrite_model=False, owned_by="x", created=7,
                  metadata=MappingProxyType({"kind": "Model", "lora_adapters": ["l"], "replicas": 2}))
    back = view_from_dict(orjson.loads(orjson.dumps(view_to_dict(v))))
    assert back == v and back.endpoints[1].key == "::1:9"
    assert view_from_dict(view_to_dict(ModelView(name="plain"))) == ModelView(name="plain")
