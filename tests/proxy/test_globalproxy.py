"""``flexinfer proxy --global``: real processes end to end (docs/globalproxy.md).

Two member clusters, each a real ``flexinfer proxy`` in front of its own stub engine (the stubs run
in this process, so the test sees every POST that reached an engine), and the global proxy (a real
``flexinfer proxy --global FILE``) in front of the two member proxies; clients are the real
``openai`` client. Each request carries a unique prompt, so a duplicated POST would show at a stub.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.harness import LoopThread, free_port, wait_port
from tests.proxy._procs import ROOT, env, samples, stop
from tests.stub_engine import StubEngine

MODELS = ("m", "rr", "w")


class Engines(LoopThread):
    """The two stub engines, and a relay adding latency in front of one member proxy."""

    def __init__(self) -> None:
        super().__init__()
        self.stubs = [self.run(StubEngine().start()) for _ in range(2)]
        self._relays: list[asyncio.Server] = []

    def prompts(self, i: int, model: str | None = None) -> list[str]:
        import json

        out = []
        for r in self.stubs[i].requests:
            if r.method == "POST":
                body = json.loads(r.body)
                if model is None or body.get("model") == model:
                    out.append(body["messages"][0]["content"])
        return out

    def relay(self, target: int, delay: float) -> int:
        """A TCP relay to ``target`` that holds each answer's first bytes ``delay`` seconds (a far cluster)."""
        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, hold: float) -> None:
            try:
                first = True
                while data := await r.read(65536):
                    if first and hold:
                        await asyncio.sleep(hold)
                    first = False
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()

        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            try:
                ur, uw = await asyncio.open_connection("127.0.0.1", target)
            except OSError:
                cw.close()
                return
            await asyncio.gather(pipe(cr, uw, 0.0), pipe(ur, cw, delay))

        async def start() -> int:
            srv = await asyncio.start_server(handle, "127.0.0.1", 0)
            self._relays.append(srv)
            return int(srv.sockets[0].getsockname()[1])
        return self.run(start())

    async def stop_extra(self) -> None:
        for s in self._relays:
            s.close()
        for st in self.stubs:
            await st.stop()


class Member:
    """One member cluster's proxy (a real process) on a fixed port, stoppable and restartable."""

    def __init__(self, tmp: Path, name: str, engine_port: int) -> None:
        self.port = free_port()
        self.inv = tmp / f"{name}.yaml"
        self.inv.write_text("models:\n" + "".join(
            f"  - name: {m}\n    endpoints: [http://127.0.0.1:{engine_port}]\n" for m in MODELS))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy",
                                      "-c", str(self.inv), "--port", str(self.port)], cwd=ROOT, env=env())
        wait_port(self.port, timeout=30)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


def global_file(tmp: Path, name: str, ports: list[int], strategy: str, extra: str = "") -> Path:
    clusters = "".join(f"    - name: c{i}\n      endpoint: http://127.0.0.1:{p}\n" for i, p in enumerate(ports))
    order = "  failoverOrder: [c0, c1]\n" if strategy == "Failover" else ""
    path = tmp / name
    path.write_text(f"""apiVersion: ai.flexinfer/v1alpha2
kind: GlobalProxy
metadata: {{name: global}}
spec:
  strategy: {strategy}
  clusters:
{clusters}{order}  probe: {{path: /healthz, timeout: 1s, interval: 200ms}}
{extra}""")
    return path


def federated(name: str, routing: str) -> str:
    return f"""---
apiVersion: ai.flexinfer/v1alpha2
kind: FederatedModel
metadata: {{name: {name}}}
spec:
  template: {{backend: vllm, source: hf://org/model, gpu: {{}}}}
  placement: {{clusters: [c0, c1]}}
  routing: {routing}
"""


class GlobalProxy:
    def __init__(self, path: Path, **settings: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy",
                                      "--global", str(path), "--port", str(self.port)], cwd=ROOT,
                                     env=env(**settings))
        try:
            wait_port(self.port, timeout=30)
        except RuntimeError:
            stop(self.proc)
            raise
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="k", max_retries=0)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return samples(r.read().decode())

    def ready(self) -> dict[str, float]:
        return {dict(k[1])["cluster"]: v for k, v in self.metrics().items() if k[0] == "flexinfer_global_cluster_ready"}

    def wait_ready(self, want: dict[str, float], timeout: float = 15.0) -> None:
        end = time.monotonic() + timeout
        while (got := self.ready()) != want:
            if time.monotonic() > end:
                raise AssertionError(f"cluster readiness {got}, expected {want}")
            time.sleep(0.05)

    def ask(self, model: str, prompt: str) -> str:
        out = self.client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}])
        return out.model

    def close(self) -> None:
        self.client.close()
        stop(self.proc)
        assert self.proc.returncode == 0, f"global proxy exited {self.proc.returncode}"


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engines, list[Member]]]:
    tmp = tmp_path_factory.mktemp("global")
    engines = Engines()
    members = [Member(tmp, f"c{i}", s.port) for i, s in enumerate(engines.stubs)]
    try:
        for m in members:
            m.start()
        yield engines, members
    finally:
        for m in members:
            m.stop()
        engines.close()


@pytest.fixture(scope="module")
def gproxy(clusters: tuple[Engines, list[Member]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GlobalProxy]:
    """Failover c0 -> c1 for ``m``; FederatedModel routing for ``rr`` (RoundRobin) and ``w`` (Weighted 3:1)."""
    _, members = clusters
    extra = federated("rr", "{strategy: RoundRobin}") + federated("w", "{strategy: Weighted, weights: {c0: 3, c1: 1}}")
    # the first refusal ejects a member for 30 s (the router's passive ejector): coming back must
    # re-admit it at the probe that sees it back, not 30 s later
    gp = GlobalProxy(global_file(tmp_path_factory.mktemp("g"), "global.yaml", [m.port for m in members],
                                 "Failover", extra), PROXY_EJECT_CONSECUTIVE="1")
    try:
        gp.wait_ready({"c0": 1.0, "c1": 1.0})
        yield gp
    finally:
        gp.close()


def test_openai_client_and_streaming(gproxy: GlobalProxy, clusters: tuple[Engines, list[Member]]) -> None:
    engines, _ = clusters
    assert {m.id for m in gproxy.client.models.list().data} >= set(MODELS)
    assert gproxy.ask("m", "plain-1") == "m"
    stream = gproxy.client.chat.completions.create(model="m", stream=True,
                                                   messages=[{"role": "user", "content": "stream-1"}])
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("tok0 ") and text.count("tok") == 32
    assert engines.prompts(0).count("stream-1") == 1 and "stream-1" not in engines.prompts(1)
    with pytest.raises(openai.NotFoundError):
        gproxy.ask("nope", "x")


def test_round_robin_spreads(gproxy: GlobalProxy, clusters: tuple[Engines, list[Member]]) -> None:
    engines, _ = clusters
    for i in range(20):
        gproxy.ask("rr", f"rr-{i}")
    assert (len(engines.prompts(0, "rr")), len(engines.prompts(1, "rr"))) == (10, 10)


def test_weighted_follows_weights(gproxy: GlobalProxy, clusters: tuple[Engines, list[Member]]) -> None:
    engines, _ = clusters
    for i in range(40):
        gproxy.ask("w", f"w-{i}")
    assert (len(engines.prompts(0, "w")), len(engines.prompts(1, "w"))) == (30, 10)  # smooth WRR: exact per cycle


def test_failover_and_back(gproxy: GlobalProxy, clusters: tuple[Engines, list[Member]]) -> None:
    engines, members = clusters
    for i in range(5):
        gproxy.ask("m", f"before-{i}")
    assert sum(p.startswith("before-") for p in engines.prompts(0)) == 5
    members[0].stop()  # c0's proxy is gone: its port refuses connections
    errors: Counter[str] = Counter()
    sent = []
    for i in range(30):  # every request starts after the stop: none may fail, the first ones included
        try:
            gproxy.ask("m", f"after-{i}")
            sent.append(f"after-{i}")
        except openai.APIError as exc:
            errors[type(exc).__name__] += 1
    assert not errors, errors
    gproxy.wait_ready({"c0": 0.0, "c1": 1.0})
    at1 = Counter(p for p in engines.prompts(1) if p.startswith("after-"))
    assert sorted(at1) == sorted(sent) and set(at1.values()) == {1}  # each POST reached c1 exactly once
    assert not any(p.startswith("after-") for p in engines.prompts(0))
    members[0].start()  # restarted on the same port
    gproxy.wait_ready({"c0": 1.0, "c1": 1.0})
    for i in range(5):
        gproxy.ask("m", f"back-{i}")
    assert sum(p.startswith("back-") for p in engines.prompts(0)) == 5
    m = gproxy.metrics()
    assert m[("flexinfer_global_cluster_transitions_total", (("cluster", "c0"),))] >= 2  # out, and back


def test_latency_prefers_the_faster(clusters: tuple[Engines, list[Member]], tmp_path: Path) -> None:
    engines, members = clusters
    far = engines.relay(members[0].port, 0.05)  # c0 is 50 ms away, c1 next door
    gp = GlobalProxy(global_file(tmp_path, "lat.yaml", [far, members[1].port], "Latency"))
    try:
        gp.wait_ready({"c0": 1.0, "c1": 1.0})
        lat = {dict(k[1])["cluster"]: v for k, v in gp.metrics().items()
               if k[0] == "flexinfer_global_cluster_probe_latency_seconds"}
        assert lat["c0"] > lat["c1"]
        for i in range(10):
            gp.ask("m", f"lat-{i}")
        assert sum(p.startswith("lat-") for p in engines.prompts(1)) == 10
        assert not any(p.startswith("lat-") for p in engines.prompts(0))
    finally:
        gp.close()


def test_bad_file_is_refused_with_its_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(global_file(tmp_path, "g.yaml", [1], "RoundRobin").read_text().replace("http://", "https://"))
    out = subprocess.run([sys.executable, "-m", "flexinfer.cli", "proxy", "--global", str(bad)], cwd=ROOT, env=env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "https towards the clusters is not supported" in out.stderr, out.stderr


def test_kube_mode_serves_and_writes_the_status(clusters: tuple[Engines, list[Member]], tmp_path: Path) -> None:
    """``--global --kube``: the process reads the GlobalProxy from a Kubernetes API emulator, serves
    through the member proxies and writes the resource's status itself."""
    import contextlib

    import yaml

    from tests.api.helpers import CRDS
    from tests.kube_emulator import KubeEnv, start_kube

    engines, members = clusters
    stack = contextlib.AsyncExitStack()
    kube: KubeEnv = engines.run(stack.enter_async_context(start_kube(tmp_path)))
    try:
        crds = [yaml.safe_load((CRDS / f"ai.flexinfer_{n}.yaml").read_text()) for n in ("globalproxies", "federatedmodels")]
        engines.call(lambda: [kube.register_crd(c) for c in crds])
        doc = yaml.safe_load(global_file(tmp_path, "k.yaml", [m.port for m in members], "Failover").read_text())
        doc["metadata"]["namespace"] = "default"
        engines.call(lambda: kube.seed("ai.flexinfer/v1alpha2/globalproxies", doc))
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy", "--global",
                                 "--kube", "--port", str(port)], cwd=ROOT,
                                env=env(KUBECONFIG=str(kube.kubeconfig_path), POD_NAMESPACE="default"))
        try:
            wait_port(port, timeout=30)
            end = time.monotonic() + 15
            while True:
                got = engines.call(lambda: kube.get("ai.flexinfer/v1alpha2/globalproxies", "default", "global"))
                st = (got or {}).get("status") or {}
                if st.get("healthyClusters") == 2:
                    break
                assert time.monotonic() < end, st
                time.sleep(0.05)
            assert st["activeCluster"] == "c0" and st["conditions"][0]["reason"] == "AllClustersHealthy"
            with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0) as client:
                out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "kube-1"}])
            assert out.model == "m" and engines.prompts(0).count("kube-1") == 1
        finally:
            stop(proc)
        assert proc.returncode == 0
    finally:
        engines.run(stack.aclose())
