"""Issue 18's combined scenario, as one test: the federation controllers and the global proxy together.

Three Kubernetes API emulators (the hub ``kube``, where the real operator runs, and the members
``east`` and ``west``: tests/operator/federation_env.py), each a real HTTP server. Each member also
has its "cluster proxy": a real ``flexinfer proxy`` process in front of a stub engine (the stubs run
on the test's loop, so every POST that reached an engine is seen; the member proxies serve a static
inventory, not the federated Model copy: no engine runs on an emulator). In front of them the real
global proxy, ``flexinfer proxy --global --kube``, reads the GlobalProxy (Failover east -> west) and
the FederatedModels from the hub and writes the GlobalProxy's status. Clients: the real ``openai``
client (``AsyncOpenAI``), four workers sending continuously; every request carries a unique prompt
and ``x-stub-delay`` (a 30 ms engine), so some are in flight when a member dies.

Then: clusters probed Ready; FederatedModel ``llama`` (selector ``serving=yes``) on both members,
``eu-only`` (selector ``region=eu``) on east only; east's proxy killed (SIGKILL: the cluster goes
away, nothing drains) and its emulator stopped -> Cluster east Unreachable, both FederatedModels
report it, the global proxy fails over to west: no failed request among those sent after east was
dead, and the failures (if any) only among the requests in flight at the kill; east restarted on its
ports -> Ready, and the traffic returns to east (Failover); deleting the FederatedModels removes the
copies from both members (the finalizer), then the objects.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import openai

from tests.harness import free_port
from tests.kube_emulator import KubeEnv
from tests.operator.federation_env import (
    CLUSTERS,
    FEDERATED,
    SECRETS,
    cluster,
    federated,
    kubeconfig_secret,
    members,
)
from tests.operator.harness import TEST_SETTINGS, OperatorEnv, run_operator
from tests.proxy._procs import ROOT, env, stop
from tests.stub_engine import StubEngine

SETTINGS = replace(TEST_SETTINGS, federation_resync_s=0.3, federation_cleanup_timeout_s=2.5)
GPROXIES = "ai.flexinfer/v1alpha2/globalproxies"
WORKERS = 4
DELAY = {"x-stub-delay": "0.03"}


async def port_open(port: int, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            await w.wait_closed()
            return
        except OSError:
            assert proc is None or proc.poll() is None, f"process exited {proc.returncode}"
            assert loop.time() < end, f"nothing listens on {port}"
            await asyncio.sleep(0.05)


class MemberProxy:
    """A member cluster's ``flexinfer proxy`` on a fixed port, killed and started again there."""

    def __init__(self, tmp: Path, name: str, engine_port: int) -> None:
        self.port = free_port()
        self.inv = tmp / f"{name}-inv.yaml"
        self.inv.write_text(f"models:\n  - name: llama\n    endpoints: [http://127.0.0.1:{engine_port}]\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy", "-c",
                                      str(self.inv), "--port", str(self.port)], cwd=ROOT, env=env())

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None


@dataclass
class Outcome:
    prompt: str
    t0: float
    t1: float
    error: str | None  # None: answered 200


@dataclass
class Load:
    """WORKERS clients sending one request after another until stopped; every outcome kept."""

    client: openai.AsyncOpenAI
    outcomes: list[Outcome] = field(default_factory=list)
    running: bool = True
    n: int = 0

    async def worker(self) -> None:
        loop = asyncio.get_running_loop()
        while self.running:
            self.n += 1
            prompt, t0 = f"p{self.n}", loop.time()
            try:
                await self.client.chat.completions.create(model="llama", extra_headers=DELAY,
                                                          messages=[{"role": "user", "content": prompt}])
                err = None
            except openai.APIStatusError as exc:
                err = f"{type(exc).__name__} {exc.status_code}"
            except openai.APIError as exc:
                err = type(exc).__name__
            self.outcomes.append(Outcome(prompt, t0, loop.time(), err))

    def ok_after(self, t: float) -> int:
        return sum(o.error is None and o.t0 > t for o in self.outcomes)


def prompts(stub: StubEngine) -> list[str]:
    return [json.loads(r.body)["messages"][0]["content"] for r in stub.requests if r.method == "POST"]


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or () if c.get("type") == type_), {})


def entry(env_: OperatorEnv, fm: str, c: str) -> dict[str, Any]:
    st = env_.status(fm, resource=FEDERATED)
    return next((e for e in st.get("clusters") or () if e.get("cluster") == c), {})


async def test_federation_and_global_proxy_end_to_end(kube: KubeEnv, tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    stubs = {n: await StubEngine().start() for n in ("east", "west")}
    mproxies = {n: MemberProxy(tmp_path, n, stubs[n].port) for n in stubs}
    gport = free_port()
    gproc: subprocess.Popen[bytes] | None = None
    load: Load | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        # east started last: kmock's servers stop in the reverse order of their start (its resolver chain)
        async with members(tmp_path, "west", "east") as ms, run_operator(kube, SETTINGS) as op:
            east, west = ms["east"], ms["west"]

            async def wait(what: str, pred: Callable[[], Any], timeout: float = 15.0) -> Any:
                return await op.wait_for(pred, timeout, what)

            def cstatus(name: str) -> dict[str, Any]:
                return op.status(name, resource=CLUSTERS)

            def gstatus() -> dict[str, Any]:
                return dict((kube.get(GPROXIES, "default", "global") or {}).get("status") or {})

            for p in mproxies.values():
                p.spawn()
            kube.seed(GPROXIES, {
                "apiVersion": "ai.flexinfer/v1alpha2", "kind": "GlobalProxy",
                "metadata": {"name": "global", "namespace": "default"},
                "spec": {"strategy": "Failover", "failoverOrder": ["east", "west"],
                         "clusters": [{"name": n, "endpoint": f"http://127.0.0.1:{p.port}"} for n, p in mproxies.items()],
                         "probe": {"path": "/healthz", "timeout": "1s", "interval": "200ms"}}})
            gproc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy",
                                      "--global", "--kube", "--port", str(gport)], cwd=ROOT,
                                     env=env(KUBECONFIG=str(kube.kubeconfig_path), POD_NAMESPACE="default"))
            for m, labels in ((east, {"region": "eu", "serving": "yes"}), (west, {"region": "us", "serving": "yes"})):
                await op.create(SECRETS, kubeconfig_secret(f"{m.name}-kubeconfig", m.kubeconfig()))
                await op.create(CLUSTERS, cluster(m.name, f"{m.name}-kubeconfig", **labels))

            # -- clusters probed Ready; the selectors land the copies on the right members only
            for m in (east, west):
                await wait(f"{m.name} Ready", lambda m=m: cstatus(m.name).get("phase") == "Ready")
            llama = federated("llama", selector={"matchLabels": {"serving": "yes"}})
            llama["spec"]["routing"] = {"strategy": "Failover", "failoverOrder": ["east", "west"]}
            await op.create(FEDERATED, llama)
            await op.create(FEDERATED, federated("eu-only", selector={"matchLabels": {"region": "eu"}}))
            await wait("llama on both, eu-only on east",
                       lambda: east.model("llama") and west.model("llama") and east.model("eu-only"))
            await wait("the aggregates", lambda: op.status("llama", resource=FEDERATED).get("totalClusters") == 2
                       and op.status("eu-only", resource=FEDERATED).get("totalClusters") == 1)
            assert west.model("eu-only") is None

            # -- the global proxy in front of both member proxies; continuous load (Failover: east)
            for port in (gport, *(mp.port for mp in mproxies.values())):
                await port_open(port, proc=gproc if port == gport else None)
            await wait("global proxy: 2 healthy, east active",
                       lambda: gstatus().get("healthyClusters") == 2 and gstatus().get("activeCluster") == "east")
            load = Load(openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gport}/v1", api_key="k", max_retries=0,
                                           timeout=10))
            tasks = [loop.create_task(load.worker()) for _ in range(WORKERS)]
            await wait("20 answers", lambda: load.ok_after(0) >= 20)
            assert not prompts(stubs["west"]) and all(o.error is None for o in load.outcomes)

            # -- east goes away: its proxy killed, its API server stopped
            t_kill = loop.time()
            mproxies["east"].kill()
            t_dead = loop.time()  # from here east's port refuses: nothing sent after this may fail
            await east.stop()
            await wait("east Unreachable", lambda: cstatus("east").get("phase") == "Unreachable")
            assert cond(cstatus("east"), "Ready")["reason"] == "Unreachable" and cstatus("west")["phase"] == "Ready"
            for fm in ("llama", "eu-only"):
                await wait(f"{fm} reports east", lambda fm=fm: entry(op, fm, "east").get("phase") == "Unreachable")
            assert "east" in cond(op.status("llama", resource=FEDERATED), "Synced")["message"]
            await wait("global proxy: west active",
                       lambda: gstatus().get("healthyClusters") == 1 and gstatus().get("activeCluster") == "west")
            await wait("20 answers from west", lambda: load.ok_after(t_dead) >= 20)

            # -- east back on the same ports: Ready, reported, and the traffic returns to east
            await east.start()
            mproxies["east"].spawn()
            await port_open(mproxies["east"].port, proc=mproxies["east"].proc)
            await wait("east Ready again", lambda: cstatus("east").get("phase") == "Ready")
            await wait("llama sees east again", lambda: entry(op, "llama", "east").get("phase") == "Pending")
            await wait("global proxy: east active again",
                       lambda: gstatus().get("healthyClusters") == 2 and gstatus().get("activeCluster") == "east")
            at_east = len(prompts(stubs["east"]))
            await wait("traffic at east again", lambda: len(prompts(stubs["east"])) > at_east)
            t_back = loop.time()
            await wait("20 answers after the return", lambda: load.ok_after(t_back) >= 20)
            load.running = False
            await asyncio.gather(*tasks)

            # -- every client outcome accounted for
            east_p, west_p = prompts(stubs["east"]), prompts(stubs["west"])
            failed = [o for o in load.outcomes if o.error is not None]
            in_flight = [o for o in load.outcomes if o.t0 < t_dead and o.t1 >= t_kill]
            assert all(o.t0 < t_dead and o.t1 >= t_kill for o in failed), failed  # only those in flight
            assert len(failed) <= WORKERS
            # an OpenAI-shaped error from the global proxy (the member's connection died after the
            # request was written), never a 500 or a dropped client connection
            assert all(o.error in ("InternalServerError 502", "APIStatusError 503", "APIStatusError 504")
                       for o in failed), failed
            after = [o for o in load.outcomes if o.t0 >= t_dead]
            assert all(o.error is None for o in after)
            for o in after:  # each sent exactly once, to one engine
                assert (east_p.count(o.prompt), west_p.count(o.prompt)) in ((1, 0), (0, 1)), o
            outage = [o for o in after if o.t1 < t_back - 0.5 and o.prompt not in east_p]
            returned = [o for o in after if o.t0 > t_back]
            assert returned and all(east_p.count(o.prompt) == 1 for o in returned)  # Failover: east again
            dup = [o for o in in_flight if east_p.count(o.prompt) + west_p.count(o.prompt) > 1]
            report = (f"requests {len(load.outcomes)}; in flight at the kill {len(in_flight)}, of them failed "
                      f"{len(failed)} ({sorted({o.error or '' for o in failed})}), sent again after the kill "
                      f"{len(dup)}; served by west during the outage {len(outage)}; after the return {len(returned)}")
            print(report)
            (tmp_path / "report.txt").write_text(report)
            if os.environ.get("FLEXINFER_E2E_REPORT"):
                with open(os.environ["FLEXINFER_E2E_REPORT"], "a") as f:
                    f.write(report + "\n")

            # -- deleting the FederatedModels removes the copies on both members, then the objects
            for fm in ("llama", "eu-only"):
                await op.delete(FEDERATED, "default", fm)
            await wait("copies removed", lambda: not any(m.model(n) for m in (east, west) for n in ("llama", "eu-only")))
            await wait("FederatedModels gone", lambda: op.get(FEDERATED, "llama") is None
                       and op.get(FEDERATED, "eu-only") is None)
    finally:
        if load is not None:
            load.running = False
            await asyncio.gather(*tasks, return_exceptions=True)
            await load.client.close()
        procs = [p for p in (gproc, *(mp.proc for mp in mproxies.values())) if p is not None]
        await asyncio.to_thread(stop, *procs)
        for s in stubs.values():
            await s.stop()
    assert gproc is not None and gproc.returncode == 0, f"global proxy exited {gproc.returncode}"

