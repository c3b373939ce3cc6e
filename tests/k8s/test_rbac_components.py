"""Least privilege, proven: every component runs its normal scenarios against the emulator with RBAC on,
each as its own ServiceAccount, under the policy of :func:`chart_rbac` (the Helm chart's rendered RBAC
when ``charts/flexinfer`` exists, else ``tests/k8s/rbac_expected.yaml``).

A test fails on any denied request (a rule is missing) and, once all components ran, on any policy
rule no request used unless the rule carries a ``# needed because:`` comment (excess privilege).

The scenarios are the existing tests of each component, run through their own harnesses on an
``as_user`` view of the emulator (the component talks as its ServiceAccount, the test's own setup
stays admin): ``tests/operator`` (the Model of ``examples/v1alpha2/model-cpu.yaml`` plus the Model,
ModelDeployment, ModelCache, GPUGroup and LoRAAdapter lifecycles, the Cluster and FederatedModel examples on a
member emulator, a ModelCatalog sync), ``tests/runtime/kube`` (``proxy --kube``:
listing, routing to endpoints, wake-ups), ``tests/scheduler`` (the extender's node/pod/ConfigMap
inventory), ``tests/agent`` (the node agent) and ``tests/tps`` (the bench publisher).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from tests.kube_emulator import KubeEnv
from tests.kube_rbac import Authorizer, Policy, Rule

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "flexinfer"
FIXTURE = Path(__file__).with_name("rbac_expected.yaml")
RELEASE = "flexinfer"
RELEASE_NS = "default"  # the namespace the chart is rendered for: the existing scenarios' namespace
# chart values turning on what the scenarios exercise: the extender's tenant fair share (pods) and the
# bench publisher reading its node's GPU labels (NODE_NAME set)
CHART_VALUES: dict[str, Any] = {"extender": {"tenantFairShare": {"enabled": True}}, "bench": {"readNodes": True}}
COMPONENTS = ("operator", "proxy", "extender", "agent", "bench")
# chart file names (``templates/rbac-<name>.yaml``) that mean one of our components
ALIASES = {"operator": ("operator",), "proxy": ("proxy",),
           "extender": ("extender", "scheduler-extender"), "agent": ("agent", "node-agent"),
           "bench": ("bench", "tps", "benchmark", "bench-publisher")}


# ---- the policy under test ------------------------------------------------------------------------


def chart_rbac() -> tuple[str, dict[str, str]]:
    """(where the policy comes from, component → its RBAC manifests as YAML text).

    The Helm chart's ``templates/rbac-<component>.yaml`` rendered with ``helm_python`` (default values
    plus :data:`CHART_VALUES`, release ``flexinfer`` in ``default``) when ``charts/flexinfer`` exists; until then the fixture
    ``tests/k8s/rbac_expected.yaml``, whose documents carry ``app.kubernetes.io/component``.
    """
    if CHART.exists():
        import helm_python as helm

        with helm.Chart.load(str(CHART)) as chart:
            rendered = chart.render(copy.deepcopy(CHART_VALUES), name=RELEASE, namespace=RELEASE_NS, is_install=True)
        out: dict[str, str] = {}
        for path, text in sorted(rendered.items()):
            base = Path(path).name
            if not (base.startswith("rbac-") and base.endswith((".yaml", ".yml"))) or not text.strip():
                continue
            stem = base[len("rbac-"):].rsplit(".", 1)[0]
            comp = next((c for c, names in ALIASES.items() if stem in names), stem)
            out[comp] = out.get(comp, "") + "\n---\n" + text
        return f"chart {CHART.relative_to(ROOT)}", out
    docs: dict[str, list[str]] = {}
    for chunk in FIXTURE.read_text().split("\n---\n"):
        doc = yaml.safe_load(chunk)
        if doc:
            comp = doc["metadata"]["labels"]["app.kubernetes.io/component"]
            docs.setdefault(comp, []).append(chunk)
    return f"fixture {FIXTURE.relative_to(ROOT)}", {c: "\n---\n".join(t) for c, t in docs.items()}


def service_accounts(policy: Policy, texts: dict[str, str]) -> dict[str, tuple[str, str]]:
    """component → (namespace, name) of the ServiceAccount its bindings name."""
    out: dict[str, tuple[str, str]] = {}
    for comp, text in texts.items():
        for doc in yaml.safe_load_all(text):
            if not doc or doc.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            for s in doc.get("subjects") or ():
                if s.get("kind") == "ServiceAccount":
                    ns = s.get("namespace") or doc["metadata"].get("namespace") or RELEASE_NS
                    out.setdefault(comp, (ns, s["name"]))
    return out


def load_policy() -> tuple[str, Policy, dict[str, tuple[str, str]], set[str]]:
    """(source, policy, component → ServiceAccount, ids of the rules of components not run here).

    Files for other components (``rbac-scheduler.yaml``: the second kube-scheduler profile, an
    upstream binary) are part of the policy but never reported unused: nothing here runs them."""
    source, texts = chart_rbac()
    policy = Policy.from_objects(())
    foreign: set[str] = set()
    for comp, text in texts.items():
        before = {r.id for r in policy.all_rules()}
        policy.add_yaml(_with_namespace(text))
        if comp not in COMPONENTS:
            foreign |= {r.id for r in policy.all_rules()} - before
    return source, policy, service_accounts(policy, texts), foreign


def _with_namespace(text: str) -> str:
    """Rendered templates may leave ``metadata.namespace`` to ``helm install -n``: fill in the release's."""
    chunks = []
    for chunk in text.split("\n---\n"):
        doc = yaml.safe_load(chunk)
        if isinstance(doc, dict) and doc.get("kind") in ("Role", "RoleBinding") and \
                not (doc.get("metadata") or {}).get("namespace"):
            chunk = chunk.replace("\nmetadata:\n", f"\nmetadata:\n  namespace: {RELEASE_NS}\n", 1) \
                if "\nmetadata:\n" in chunk else chunk
        chunks.append(chunk)
    return "\n---\n".join(chunks)


# ---- one authorizer for the whole module, so that "unused" sees every component -------------------


class Session:
    def __init__(self) -> None:
        self.source, self.policy, self.accounts, self.foreign = load_policy()
        # FLEXINFER_RBAC_AUDIT=1: serve denied requests anyway and print the rules they needed (to write
        # a policy from what the components do; the tests still fail on every denial)
        self.authorizer = Authorizer(self.policy, enforce=not os.environ.get("FLEXINFER_RBAC_AUDIT"))
        for comp, (ns, name) in self.accounts.items():
            self.authorizer.add_service_account(f"token-{comp}", ns, name)
        self.ran: set[str] = set()


SESSION: Session | None = None


def session() -> Session:
    global SESSION
    if SESSION is None:
        SESSION = Session()
    return SESSION


@pytest_asyncio.fixture
async def as_component(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[
        Callable[[str, bool], Awaitable[tuple[KubeEnv, KubeEnv]]]]:
    """``await as_component(name, bounded)`` → (admin env, the component's view) on a fresh emulator that
    authorizes with the module's shared :class:`Authorizer`."""
    from tests.kube_emulator import start_kube
    from tests.operator.harness import start_bounded_kube

    stack: list[Any] = []

    async def make(component: str, bounded: bool = False) -> tuple[KubeEnv, KubeEnv]:
        s = session()
        if component not in s.accounts:
            pytest.fail(f"{s.source} has no ServiceAccount binding for the {component} (rbac-{component}.yaml)")
        cm = start_bounded_kube(tmp_path) if bounded else start_kube(tmp_path)
        kube = await cm.__aenter__()
        stack.append(cm)
        monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
        kube.emulator.authorizer = s.authorizer
        view = kube.as_user(kube.kubeconfig_for(f"token-{component}", tmp_path / f"{component}.kubeconfig"))
        s.ran.add(component)
        return kube, view

    yield make
    for cm in reversed(stack):
        await cm.__aexit__(None, None, None)


def _denied_since(start: int, user: str) -> list[str]:
    az = session().authorizer
    return [f"{d.attributes.describe()} -> add {d.needed_rule}" for d in az.decisions[start:]
            if not d.allowed and d.attributes.user.name == user]


async def _run_scenario(component: str, fn: Callable[..., Awaitable[None]], kwargs: dict[str, Any]) -> None:
    s = session()
    ns, name = s.accounts[component]
    start = len(s.authorizer.decisions)
    params = inspect.signature(fn).parameters
    error: BaseException | None = None
    try:
        await fn(**{k: v for k, v in kwargs.items() if k in params})
    except (TimeoutError, Exception) as exc:  # a denial usually shows as a timeout: report it first
        error = exc
    denied = sorted(set(_denied_since(start, f"system:serviceaccount:{ns}:{name}")))
    if denied:
        pytest.fail(f"{component} ({s.source}) was denied:\n" + "\n".join(denied) +
                    (f"\n(the scenario then failed: {error!r})" if error else ""))
    if error is not None:
        raise error


# ---- the operator ---------------------------------------------------------------------------------


async def _operator_model_cpu(kube: KubeEnv) -> None:
    from tests.operator.harness import DEPLOYMENTS, MODELS, SERVICES, run_operator

    manifest = yaml.safe_load((ROOT / "examples/v1alpha2/model-cpu.yaml").read_text())
    manifest["metadata"]["namespace"] = "default"
    async with run_operator(kube) as env:
        await env.create(MODELS, manifest)
        name = manifest["metadata"]["name"]
        await env.wait_for(lambda: env.get(DEPLOYMENTS, name), what="Deployment")
        await env.wait_for(lambda: env.get(SERVICES, name), what="Service")
        await env.wait_for(lambda: env.status(name).get("phase"), what="a phase")
        await env.delete(MODELS, "default", name)
        await env.wait_for(lambda: env.get(MODELS, name) is None, what="Model gone")


async def _operator_federation(kube: KubeEnv) -> None:
    import tempfile

    from tests.operator.test_federation import examples_scenario

    with tempfile.TemporaryDirectory() as d:
        await examples_scenario(kube, Path(d))


async def _operator_catalog(kube: KubeEnv) -> None:
    from tests.operator.hub_servers import HubServer, OllamaServer, ollama_model
    from tests.operator.test_catalog import test_failing_registry_is_a_condition_others_still_sync

    hubsrv = await HubServer([], token="t").start()
    ollama = await OllamaServer([ollama_model("llama3.2:3b-instruct-q4_K_M", 2019393189),
                                 ollama_model("gemma3:4b", 3338801804, family="gemma")]).start()
    try:  # a sync that reads a registry's Secret (missing) and writes the catalog's status
        await test_failing_registry_is_a_condition_others_still_sync(kube, (None, hubsrv, ollama))
    finally:
        await hubsrv.stop()
        await ollama.stop()


def _operator_scenarios() -> list[Any]:
    from tests.operator import test_gpugroup, test_lora, test_model, test_modelcache, test_modeldeployment

    return [_operator_model_cpu, test_model.test_lifecycle_create_ready_delete,
            test_model.test_cache_gating_and_alias_conflicts, test_modeldeployment.test_modeldeployment,
            test_modelcache.test_modelcache, test_gpugroup.test_gpugroup_anti_thrashing,
            test_lora.test_lora_adapter, _operator_federation, _operator_catalog]


@pytest.mark.parametrize("index", range(9))
async def test_operator_under_rbac(as_component: Any, index: int) -> None:
    fn = _operator_scenarios()[index]
    _, view = await as_component("operator", True)
    await _run_scenario("operator", fn, {"kube": view})


# ---- proxy --kube ---------------------------------------------------------------------------------


async def _proxy_process(ks: Any) -> None:
    """``flexinfer proxy --kube`` as a process (composition root ``flexinfer.cmd.proxy``): lists the models,
    sees endpoints."""
    from tests.runtime.kube.conftest import MODELS, SLICES, model_obj, proxy_process, service_obj, slice_obj

    stub = await ks.stub()
    await ks.put(MODELS, model_obj("m", ready=True))
    await ks.put("v1/services", service_obj("m"))
    await ks.put(SLICES, slice_obj("m-abc", "m", [("127.0.0.1", stub)]))
    async with proxy_process(ks.kube.kubeconfig_path, "default") as (proc, port):
        ids: list[str] = []
        status = 0
        end = time.monotonic() + 20
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < end and (ids != ["m"] or status != 200):
                try:
                    async with s.get(f"http://127.0.0.1:{port}/v1/models") as r:
                        ids = [d["id"] for d in json.loads(await r.read())["data"]]
                    async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}) as r:
                        status = r.status
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        assert ids == ["m"] and status == 200
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0


def _proxy_scenarios() -> list[Any]:
    from tests.runtime.kube import test_activation, test_routing

    return [_proxy_process,
            test_activation.test_model_appears_then_a_cold_burst_is_held_patched_once_and_released,
            test_activation.test_heartbeat_while_a_request_is_open,
            test_activation.test_model_deployment_wake_sets_replicas_and_access_time,
            test_activation.test_gpugroup_member_wake_writes_then_clears_the_queue,
            test_routing.test_aliases_labels_adapters_and_clamp_route_to_the_right_model,
            test_routing.test_shared_group_label_goes_to_the_active_member,
            test_routing.test_only_ready_addresses_off_spot_nodes_count]


@pytest.mark.parametrize("index", range(8))
async def test_proxy_under_rbac(as_component: Any, index: int) -> None:
    from tests.runtime.kube.conftest import KubeStack, load_crds

    fn = _proxy_scenarios()[index]
    kube, view = await as_component("proxy")
    await load_crds(kube)
    async with view.api_client() as api:
        ks = KubeStack(view, api)
        try:
            await _run_scenario("proxy", fn, {"ks": ks})
        finally:
            await ks.close()


# ---- the scheduler extender -----------------------------------------------------------------------


async def _extender_inventory(kube: KubeEnv) -> None:
    """Nodes, model pods (fair share) and the benchmark ConfigMaps reach the inventory; changes too."""
    from flexinfer import labels
    from flexinfer.scheduler.inventory import Inventory
    from flexinfer.scheduler.settings import ExtenderSettings
    from tests.scheduler.helpers import make_node, make_pod

    kube.seed("v1/nodes", make_node("n1", util=5))
    kube.seed("v1/pods", make_pod("r", "team-a", gpus=2, node_name="n1", phase="Running"))
    kube.seed("v1/configmaps", {"metadata": {"name": labels.BENCHMARK_CONFIGMAP, "namespace": "team-a"},
                                "data": {"bench_1": "9"}})
    inv = Inventory(ExtenderSettings(tenant_fairshare_enabled=True), namespace="")
    async with kube.api_client() as api:
        watchers = inv.make_watchers(api)
        tasks = [asyncio.create_task(w.run()) for w in watchers]
        try:
            await _until(lambda: inv.synced)
            assert set(inv.nodes.facts) == {"n1"} and inv.bench("team-a") == {"bench_1": "9"}
            await kube.upsert("v1/nodes", make_node("n2"))
            await _until(lambda: "n2" in inv.nodes.facts)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _until(cond: Callable[[], Any], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


def _extender_scenarios() -> list[Any]:
    from tests.scheduler import test_inventory

    return [_extender_inventory, test_inventory.test_pod_watch_only_with_fairshare]


@pytest.mark.parametrize("index", range(2))
async def test_extender_under_rbac(as_component: Any, index: int) -> None:
    _, view = await as_component("extender")
    await _run_scenario("extender", _extender_scenarios()[index], {"kube": view})


# ---- the node agent and the bench publisher -------------------------------------------------------


def _agent_scenarios() -> list[Any]:
    from tests.agent import test_main

    return [test_main.test_amain_once_against_the_emulator, test_main.test_publish_then_no_write_then_only_changes,
            test_main.test_kv_from_model_pods_on_this_node, test_main.test_agent_process_end_to_end]


@pytest.mark.parametrize("index", range(4))
async def test_agent_under_rbac(as_component: Any, index: int, tmp_path: Path) -> None:
    _, view = await as_component("agent")
    work = tmp_path / "agent"
    work.mkdir()
    await _run_scenario("agent", _agent_scenarios()[index], {"kube": view, "tmp_path": work})


async def _bench_publish(kube: KubeEnv) -> None:
    """``tests/tps/test_publish.py``'s emulator scenario in the release namespace (where the bench Job
    and its ServiceAccount run): both results ConfigMaps created, then merged, device class from the node."""
    from flexinfer import labels, tps
    from flexinfer.tps import publish
    from tests.tps.test_publish import a_result

    ns = RELEASE_NS
    kube.seed("v1/configmaps", {"metadata": {"name": "flexinfer-benchmark-results", "namespace": ns},
                                "data": {"bench_other": "12.5"}})
    kube.seed("v1/nodes", {"metadata": {"name": "n1", "labels": {
        "flexinfer.ai/gpu.vendor": "NVIDIA", "flexinfer.ai/gpu.arch": "sm_89", "flexinfer.ai/gpu.vram": "24Gi",
        "flexinfer.ai/gpu.count": "2", "flexinfer.ai/gpu.int4": "true"}}})
    kube.inject("PATCH", r"/configmaps/flexinfer-benchmark-results$", status=409, times=1)
    cfg = tps.load_config({}, configmap="smol-benchmark-results", namespace=ns, node_name="n1",
                          kubeconfig=str(kube.kubeconfig_path))
    entries = await publish.publish(a_result(), cfg)
    key = labels.bench_key("llamacpp", "smol", "vendor=NVIDIA,arch=sm_89,vram=24Gi,count=2,int4=true")
    glob = kube.get("v1/configmaps", ns, "flexinfer-benchmark-results")
    assert glob is not None and glob["data"][key] == entries[key] and glob["data"]["bench_other"] == "12.5"
    await publish.publish(a_result(duration_seconds=9.0), cfg)
    per = kube.get("v1/configmaps", ns, "smol-benchmark-results")
    assert per is not None and per["data"]["durationSeconds"] == "9.00"


def _bench_scenarios() -> list[Any]:
    return [_bench_publish]


async def test_bench_under_rbac(as_component: Any) -> None:
    _, view = await as_component("bench")
    await _run_scenario("bench", _bench_scenarios()[0], {"kube": view})


# ---- excess privilege: after every component ran --------------------------------------------------


def _unjustified(rules: list[Rule]) -> list[Rule]:
    return [r for r in rules if not r.justified]


def test_zz_no_unused_rules() -> None:
    """Runs last in this module (pytest keeps definition order): every rule of the policy was used by
    some request of the scenarios above, or says why it is needed anyway."""
    s = session()
    missing = set(COMPONENTS) - s.ran
    if missing:
        pytest.skip(f"not every component ran in this session ({sorted(missing)}): unused rules unknowable")
    assert not s.policy.errors, s.policy.errors
    needed = s.authorizer.needed_rules()
    if needed:
        print("\nneeded:\n" + "\n".join(f"{u} {scope}: {g or 'core'} {r} {sorted(v)}" for u, m in sorted(needed.items())
                                        for (scope, g, r), v in sorted(m.items())))
    unused = [r for r in _unjustified(s.authorizer.unused_rules()) if r.id not in s.foreign]
    lines = [f"{r.id}: {r.as_dict()}" for r in unused]
    print(f"\nRBAC report against {s.source}:\n{s.authorizer.report()}\n")
    print("usage:\n" + json.dumps({u: {f"{g or 'core'}/{r}": sorted(v) for (g, r), v in m.items()}
                                   for u, m in s.authorizer.usage().items()}, indent=1))
    assert not unused, f"rules of {s.source} no request used (remove them or add '# needed because:'):\n" + \
        "\n".join(lines)


def copy_policy() -> Policy:  # for debugging from a REPL
    return copy.deepcopy(session().policy)
