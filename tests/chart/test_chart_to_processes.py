"""Chart to processes: the chart's wiring (args, env, ports, names, RBAC) run as the real processes.

The chart is rendered (release ``flexinfer`` in ``flexinfer-system``, a mirror registry, a custom tag,
a pull policy and a pull secret) and everything it renders is applied to the Kubernetes emulator, the
CRDs of ``charts/flexinfer/crds`` registered and applied, the authorizer turned on with the rendered
RBAC and a bearer token for each ServiceAccount. The operator and the proxy (``--kube``) Deployments'
containers are then started as subprocesses with their exact ``command`` + ``args`` + ``env`` (field
references resolved as the kubelet would, for a made-up pod) and a kubeconfig carrying their
ServiceAccount's token, as in-cluster config would give them. Only what cannot work outside a cluster
is replaced: listen addresses (``0.0.0.0`` -> ``127.0.0.1``) and ports (each rendered containerPort
mapped to a free local port).

Then ``examples/v1alpha2/model-cpu.yaml`` is applied as the admin (into the release namespace, the one
the proxy serves), and the test checks that the operator creates the model's Deployment and Service
with the images, pull policy and pull secrets the chart configured, that the proxy lists the model,
that neither process was denied anything, and that both exit 0 on SIGTERM with no traceback.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
import pytest_asyncio
import yaml

from tests.chart.helpers import CHART, NAMESPACE, RELEASE, ROOT, container, one, pod_spec, render
from tests.kube_emulator import KubeEnv, start_kube
from tests.kube_rbac import Authorizer, Policy

pytestmark = pytest.mark.timeout(120)

REGISTRY = "mirror.example.test:5000"
TAG = "9.9.9-e2e"
FLEXINFER_IMAGE = f"{REGISTRY}/flexinfer/flexinfer:{TAG}"
LLAMACPP_IMAGE = f"{REGISTRY}/ggml-org/llama.cpp:server"
VALUES: dict[str, Any] = {
    "global": {"imageRegistry": REGISTRY, "imagePullSecrets": ["regcred"]},
    "image": {"tag": TAG, "pullPolicy": "Always"},
    "operator": {"extraEnv": {
        # the SharedPVC cache of model-cpu.yaml is persistent: worth a flash-loader init container
        "DEFAULT_FLASH_LOADER_ENABLED": "true",
        # the llama.cpp CPU image from the same mirror (operator.extraEnv -> the backend registry)
        "DEFAULT_LLAMACPP_IMAGE_CPU": LLAMACPP_IMAGE,
    }},
    "proxy": {"kube": True},
}
NODE_NAME, POD_IP = "node-e2e-1", "127.0.0.1"
DEADLINE_S = 30.0
ADMIN_TOKEN = "dummy"  # the emulator's default kubeconfig: system:masters


# ---- what the kubelet would do -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _field_ref(path: str, pod: Mapping[str, Any]) -> str:
    if path.startswith("metadata.labels['") or path.startswith("metadata.annotations['"):
        section, key = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path).groups()  # type: ignore[union-attr]
        return str(pod["metadata"].get(section, {}).get(key, ""))
    where = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
             "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": NODE_NAME,
             "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
             "status.podIP": POD_IP, "status.hostIP": POD_IP, "status.podIPs": POD_IP}
    if path not in where:
        raise AssertionError(f"fieldRef {path!r}: not a field the kubelet resolves")
    return where[path]


def _key_ref(kube: KubeEnv, resource: str, ns: str, ref: Mapping[str, Any]) -> str | None:
    obj = kube.get(resource, ns, ref["name"])
    data = (obj or {}).get("data") or {}
    if ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise AssertionError(f"{resource} {ns}/{ref['name']} has no key {ref['key']!r}: the pod would not start")
    value = data[ref["key"]]
    if resource == "v1/secrets":
        import base64

        value = base64.b64decode(value).decode()
    return str(value)


def container_env(kube: KubeEnv, c: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env (in order, with
    ``$(VAR)`` expansion of earlier variables), field references and Secret/ConfigMap keys resolved."""
    ns = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for src in c.get("envFrom") or ():
        prefix = src.get("prefix", "")
        for kind, resource in (("configMapRef", "v1/configmaps"), ("secretRef", "v1/secrets")):
            if kind in src:
                obj = kube.get(resource, ns, src[kind]["name"])
                if obj is None and not src[kind].get("optional"):
                    raise AssertionError(f"envFrom {resource} {ns}/{src[kind]['name']} does not exist")
                for k in ((obj or {}).get("data") or {}):
                    v = _key_ref(kube, resource, ns, {"name": src[kind]["name"], "key": k})
                    env[prefix + k] = v or ""
    for e in c.get("env") or ():
        if "value" in e or "valueFrom" not in e:
            env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                    lambda m: env.get(m.group(1), m.group(0)), str(e.get("value", "")))
            continue
        vf = e["valueFrom"]
        value: str | None
        if "fieldRef" in vf:
            value = _field_ref(vf["fieldRef"]["fieldPath"], pod)
        elif "secretKeyRef" in vf:
            value = _key_ref(kube, "v1/secrets", ns, vf["secretKeyRef"])
        elif "configMapKeyRef" in vf:
            value = _key_ref(kube, "v1/configmaps", ns, vf["configMapKeyRef"])
        else:
            raise AssertionError(f"env {e['name']}: valueFrom {vf} not resolved by this test")
        if value is not None:
            env[e["name"]] = value
    return env


def container_port(c: Mapping[str, Any], port: int | str) -> int:
    """A probe's/Service's ``port`` (a number or a containerPort name) as a number."""
    if isinstance(port, int):
        return port
    (n,) = [p["containerPort"] for p in c.get("ports") or () if p.get("name") == port]
    return int(n)


def localize(args: Sequence[str], flag: str, new: Callable[[str], str]) -> tuple[list[str], str]:
    """Replace the value of ``flag`` (``--flag=value`` or ``--flag value``) by ``new(value)``; return the
    new args and the rendered value."""
    out, old = list(args), None
    for i, a in enumerate(out):
        if a.startswith(flag + "="):
            old = a[len(flag) + 1:]
            out[i] = f"{flag}={new(old)}"
        elif a == flag and i + 1 < len(out):
            old = out[i + 1]
            out[i + 1] = new(old)
    assert old is not None, f"{flag} not in the rendered args {list(args)}"
    return out, old


# ---- the emulator as the chart's cluster ---------------------------------------------------------


def _resource_of(kube: KubeEnv, obj: Mapping[str, Any]) -> str:
    group, _, version = obj["apiVersion"].rpartition("/")
    for res, info in kube.emulator.resources.items():
        r: Any = res
        if (r.group, r.version, getattr(info, "kind", None)) == (group, version, obj["kind"]):
            return f"{obj['apiVersion']}/{r.plural}"
    raise KeyError(f"{obj['apiVersion']} {obj['kind']}")


def _namespaced(kube: KubeEnv, resource: str) -> bool:
    return bool(kube.emulator.resources[kmock.resource(resource)].namespaced)


async def apply(http: aiohttp.ClientSession, kube: KubeEnv, obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """POST ``obj`` as the admin, as ``kubectl apply -n namespace`` would create it."""
    resource = _resource_of(kube, obj)
    body = copy.deepcopy(dict(obj))
    gv, plural = resource.rsplit("/", 1)
    prefix = f"/apis/{gv}" if "/" in gv else f"/api/{gv}"
    if _namespaced(kube, resource):
        ns = body["metadata"].setdefault("namespace", namespace)
        path = f"{prefix}/namespaces/{ns}/{plural}"
    else:
        path = f"{prefix}/{plural}"
    async with http.post(kube.url + path, json=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
        text = await r.text()
        assert r.status == 201, f"create {obj['kind']} {obj['metadata']['name']}: {r.status} {text}"
        return dict(yaml.safe_load(text))


def crds() -> list[dict[str, Any]]:
    out = []
    for path in sorted((CHART / "crds").glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


# ---- the processes -------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    proc: asyncio.subprocess.Process
    stderr_path: Path
    stdout_path: Path

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace") + self.stderr_path.read_text(errors="replace")


async def start_container(name: str, c: Mapping[str, Any], args: Sequence[str], env: Mapping[str, str],
                          kubeconfig: Path, tmp: Path) -> Proc:
    """``command`` + ``args`` of a container as a process of this tree's code."""
    command = list(c["command"])
    assert command[0] == "flexinfer", f"{name}: command {command} is not the flexinfer console script"
    home = tmp / f"{name}-home"
    home.mkdir()
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
                "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **env, "KUBECONFIG": str(kubeconfig)}
    out, err = tmp / f"{name}.stdout", tmp / f"{name}.stderr"
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flexinfer.cli", *command[1:], *args, cwd=str(ROOT), env=full_env,
            stdin=asyncio.subprocess.DEVNULL, stdout=fo, stderr=fe)
    return Proc(name, proc, err, out)


async def until(what: str, cond: Callable[[], Awaitable[Any]], procs: Sequence[Proc]) -> Any:
    """Poll ``cond`` until it is truthy; fail at the deadline or as soon as a process died."""
    end = time.monotonic() + DEADLINE_S
    while True:
        for p in procs:
            if p.proc.returncode is not None:
                raise AssertionError(f"{p.name} exited {p.proc.returncode} while waiting for {what}:\n{p.output()}")
        v = await cond()
        if v:
            return v
        if time.monotonic() > end:
            logs = "\n".join(f"--- {p.name}\n{p.output()[-4000:]}" for p in procs)
            raise AssertionError(f"timed out after {DEADLINE_S}s waiting for {what}\n{logs}")
        await asyncio.sleep(0.1)


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[KubeEnv]:
    async with start_kube(tmp_path) as kube:
        yield kube


async def test_chart_to_processes(cluster: KubeEnv, tmp_path: Path) -> None:
    kube = cluster
    objs = render(copy.deepcopy(VALUES), name=RELEASE, namespace=NAMESPACE)
    op_dep, px_dep = one(objs, "Deployment", "operator"), one(objs, "Deployment", "proxy")

    async with aiohttp.ClientSession() as http:
        # -- install: CRDs, then every rendered object (namespaced ones into the release namespace)
        await apply(http, kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, NAMESPACE)
        for crd in crds():
            kube.register_crd(crd)
            await apply(http, kube, crd, NAMESPACE)
        for obj in objs:
            await apply(http, kube, obj, NAMESPACE)

        # -- RBAC: the rendered policy, one token per rendered ServiceAccount
        rbac = [o for o in objs if o["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
        for o in rbac:
            if o["kind"] in ("Role", "RoleBinding"):
                o["metadata"].setdefault("namespace", NAMESPACE)
        az: Authorizer = kube.authorize(Policy.from_objects(rbac))
        tokens: dict[str, str] = {}
        for sa in (o for o in objs if o["kind"] == "ServiceAccount"):
            ns, name = sa["metadata"].get("namespace", NAMESPACE), sa["metadata"]["name"]
            tokens[name] = f"token-{name}"
            az.add_service_account(tokens[name], ns, name)

        procs: list[Proc] = []
        try:
            # -- the operator: its liveness endpoint is the port the livenessProbe names
            op_c = container(op_dep, "operator")
            op_port = _free_port()
            op_args, liveness = localize(op_c["args"], "--liveness",
                                         lambda url: f"http://127.0.0.1:{op_port}/healthz")
            m = re.fullmatch(r"http://0\.0\.0\.0:(\d+)(/\S*)", liveness)
            assert m, liveness
            probe = op_c["livenessProbe"]["httpGet"]
            assert int(m.group(1)) == container_port(op_c, probe["port"]) and m.group(2) == probe["path"], \
                f"--liveness {liveness} is not what livenessProbe {probe} probes"
            # the PodMonitor scrapes the port named "metrics": the one --metrics-port serves
            metrics_port = _free_port()
            op_args, rendered_metrics = localize(op_args, "--metrics-port", lambda _: str(metrics_port))
            assert int(rendered_metrics) == container_port(op_c, "metrics")
            # kubelet: localhost:<free> replaces 0.0.0.0:<containerPort> (no pod network namespace here)
            procs.append(await _start(kube, op_dep, op_c, op_args, tokens, tmp_path, "operator"))

            # -- the proxy: --port is the containerPort its probes and its Service's targetPort name
            px_c = container(px_dep, "proxy")
            px_port = _free_port()
            px_args, rendered_port = localize(px_c["args"], "--port", lambda _: str(px_port))
            px_args, host = localize(px_args, "--host", lambda _: "127.0.0.1")
            assert host == "0.0.0.0", host
            for kind in ("readinessProbe", "startupProbe", "livenessProbe"):
                if kind in px_c:
                    assert container_port(px_c, px_c[kind]["httpGet"]["port"]) == int(rendered_port), kind
            svc = next(o for o in objs if o["kind"] == "Service" and
                       o["metadata"]["labels"]["app.kubernetes.io/component"] == "proxy")
            pod_labels = px_dep["spec"]["template"]["metadata"]["labels"]
            assert svc["spec"]["selector"].items() <= pod_labels.items()
            assert {container_port(px_c, p["targetPort"]) for p in svc["spec"]["ports"]} == {int(rendered_port)}
            op_env = {e["name"]: e.get("value") for e in op_c["env"]}
            assert op_env["FLEXINFER_PROXY_URL"] == (
                f"http://{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{svc['spec']['ports'][0]['port']}")
            procs.append(await _start(kube, px_dep, px_c, px_args, tokens, tmp_path, "proxy"))

            async def ok(url: str) -> bool:
                try:
                    async with http.get(url) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await until("the operator's /healthz", lambda: ok(f"http://127.0.0.1:{op_port}/healthz"), procs)
            await until("the proxy's /readyz", lambda: ok(f"http://127.0.0.1:{px_port}/readyz"), procs)

            # -- kubectl apply -n flexinfer-system -f examples/v1alpha2/model-cpu.yaml
            model = yaml.safe_load((ROOT / "examples/v1alpha2/model-cpu.yaml").read_text())
            name = model["metadata"]["name"]
            await apply(http, kube, model, NAMESPACE)

            async def get(resource: str) -> dict[str, Any] | None:
                return kube.get(resource, NAMESPACE, name)

            dep = await until("the model's Deployment", lambda: get("apps/v1/deployments"), procs)
            await until("the model's Service", lambda: get("v1/services"), procs)
            spec = dep["spec"]["template"]["spec"]
            (init,) = spec["initContainers"]
            assert (init["name"], init["image"], init["imagePullPolicy"]) == ("flash-loader", FLEXINFER_IMAGE, "Always")
            assert init["command"][0] == "flexinfer"
            assert [c["image"] for c in spec["containers"]] == [LLAMACPP_IMAGE]
            assert spec["imagePullSecrets"] == [{"name": "regcred"}]

            # the cache prefetch Job (Hugging Face source into the SharedPVC) runs the chart's image too
            uid = (await get("ai.flexinfer/v1alpha2/models") or {})["metadata"]["uid"]

            async def owned_jobs() -> list[dict[str, Any]]:
                async with http.get(f"{kube.url}/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
                    items = (await r.json())["items"]
                return [j for j in items if uid in {o["uid"] for o in j["metadata"].get("ownerReferences") or ()}]

            (job,) = await until("the model's cache prefetch Job", owned_jobs, procs)
            job_pod = job["spec"]["template"]["spec"]
            assert [(c["image"], c["imagePullPolicy"]) for c in job_pod["containers"]] == [(FLEXINFER_IMAGE, "Always")]
            assert job_pod["imagePullSecrets"] == [{"name": "regcred"}]

            async def listed() -> bool:
                try:
                    async with http.get(f"http://127.0.0.1:{px_port}/v1/models") as r:
                        return r.status == 200 and name in [d["id"] for d in (await r.json())["data"]]
                except aiohttp.ClientError:
                    return False

            await until(f"{name} in the proxy's /v1/models", listed, procs)
            async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                assert r.status == 200 and 'flexinfer_operator_reconciles_total{kind="model"' in await r.text()

            # -- least privilege: both ServiceAccounts were used, nothing was refused
            users = {f"system:serviceaccount:{NAMESPACE}:{pod_spec(d)['serviceAccountName']}" for d in (op_dep, px_dep)}
            seen = {d.attributes.user.name for d in az.decisions if d.allowed}
            assert users <= seen, f"not every component talked as its ServiceAccount: {users - seen}"
            denied = [f"{d.attributes.describe()} -> {d.needed_rule}" for d in az.denied()]
            assert not denied, "denied:\n" + "\n".join(denied)

            # -- SIGTERM: both exit 0 with no traceback
            for p in procs:
                p.proc.send_signal(signal.SIGTERM)
            for p in procs:
                rc = await asyncio.wait_for(p.proc.wait(), DEADLINE_S)
                assert rc == 0, f"{p.name} exited {rc} on SIGTERM:\n{p.output()[-4000:]}"
                assert "Traceback" not in p.stderr_path.read_text(errors="replace"), p.output()[-4000:]
            denied = [f"{d.attributes.describe()} -> {d.needed_rule}" for d in az.denied()]
            assert not denied, "denied while stopping:\n" + "\n".join(denied)
        finally:
            for p in procs:
                if p.proc.returncode is None:
                    p.proc.kill()
                    await p.proc.wait()


async def _start(kube: KubeEnv, dep: Mapping[str, Any], c: Mapping[str, Any], args: Sequence[str],
                 tokens: Mapping[str, str], tmp: Path, name: str) -> Proc:
    """One container of a pod of ``dep`` (a made-up pod name), as its ServiceAccount."""
    spec = pod_spec(dep)
    sa = spec.get("serviceAccountName", "default")
    assert sa in tokens, f"{name}: serviceAccountName {sa!r} is not a rendered ServiceAccount"
    assert spec.get("automountServiceAccountToken", True) is not False, f"{name}: no token mounted"
    pod = {"metadata": {"name": f"{dep['metadata']['name']}-7d4b9c8f5-x2k9p", "namespace": NAMESPACE,
                        "uid": "00000000-0000-4000-8000-000000000001",
                        "labels": dep["spec"]["template"]["metadata"].get("labels", {}),
                        "annotations": dep["spec"]["template"]["metadata"].get("annotations", {})},
           "spec": spec}
    env = container_env(kube, c, pod)
    # in-cluster config: the pod's token and namespace (a kubeconfig here: no KUBERNETES_SERVICE_HOST)
    kubeconfig = kube.kubeconfig_for(tokens[sa], tmp / f"{name}.kubeconfig", namespace=NAMESPACE)
    return await start_container(name, c, args, env, kubeconfig, tmp)
