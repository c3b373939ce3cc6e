"""The chart rendered by the real Helm engine for a matrix of values: every manifest is valid for two
Kubernetes versions (kubernetes-validate, strict), lint is clean, and each value reaches its object."""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.chart.helpers import (
    CHART,
    KUBE_VERSIONS,
    MONITORING,
    NAMESPACE,
    ROOT,
    container,
    containers,
    env_of,
    notes,
    of_kind,
    one,
    pod_spec,
    render,
)

ALL_ON: dict[str, Any] = {
    "operator": {"replicas": 2},
    "proxy": {"autoscaling": {"enabled": True}, "podDisruptionBudget": {"enabled": True},
              "auth": {"existingSecret": "proxy-tokens"}},
    "extender": {"benchmarkNamespace": "flexinfer-system", "tenantFairShare": {"enabled": True},
                 "scheduler": {"replicas": 2, "extenderConfig": {
                     "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]}}},
    "bench": {"namespaces": ["team-a"], "readNodes": True},
    "monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
    "networkPolicy": {"enabled": True, "proxyFrom": [{"namespaceSelector": {}}]},
    "grafana": {"dashboards": {"enabled": True}},
}
REGISTRY = "registry.example.com:5000/mirror"
MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all-on": ALL_ON,
    "ha": {"operator": {"replicas": 2}, "proxy": {"replicas": 3, "podDisruptionBudget": {"enabled": True}}},
    "monitoring": {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
    "custom-registry": {"global": {"imageRegistry": REGISTRY, "imagePullSecrets": ["regcred"]},
                        "image": {"tag": "1.2.3-rc1", "pullPolicy": "Always"}},
    "extender-off": {"extender": {"enabled": False}},
    "agent-off": {"agent": {"enabled": False}},
    "kube-all-namespaces": {"proxy": {"allNamespaces": True}},
    "static-proxy": {"proxy": {"kube": False, "staticConfig": {"models": {"m": {"url": "http://m:8000"}}}}},
    "redis-deploy": {"redis": {"deploy": True}, "networkPolicy": {"enabled": True},
                     "proxy": {"replicas": 3}},
    "global-proxy": {"globalProxy": {"enabled": True, "name": "global"}},
    "redis-external": {"redis": {"url": "rediss://redis.example.com:6380/2", "prefix": "prod"},
                       "proxy": {"autoscaling": {"enabled": True}}},
}
#: the matrix entries that also get monitoring.coreos.com/v1 in .Capabilities.APIVersions
WITH_MONITORING = {"all-on", "monitoring"}


def _render(case: str, **kw: Any) -> list[dict[str, Any]]:
    api = MONITORING if case in WITH_MONITORING else ()
    return render(MATRIX[case], api_versions=api, **kw)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {case: _render(case) for case in MATRIX}


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in (CHART / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for v in crd["spec"]["versions"]:
            out[(f'{crd["spec"]["group"]}/{v["name"]}', crd["spec"]["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return out


def _strip_k8s(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_k8s(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if isinstance(schema, list):
        return [_strip_k8s(v) for v in schema]
    return schema


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("case", list(MATRIX))
def test_every_manifest_is_valid(rendered: dict[str, list[dict[str, Any]]], case: str, version: str) -> None:
    crds = _crd_schemas()
    checked = 0
    for obj in rendered[case]:
        api, kind = obj["apiVersion"], obj["kind"]
        if (api, kind) in crds:  # our CRs (kopf peering): against the CRD's schema
            jsonschema.validate(obj, _strip_k8s(crds[(api, kind)]))
            continue
        if api.startswith("monitoring.coreos.com/"):  # no bundled schema: the fields we set
            assert kind in ("ServiceMonitor", "PodMonitor")
            assert obj["spec"]["selector"]["matchLabels"] and obj["spec"]["namespaceSelector"]["matchNames"]
            continue
        kubernetes_validate.validate(obj, version, strict=True)
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("case", list(MATRIX))
def test_lint_is_clean(case: str) -> None:
    for version in KUBE_VERSIONS:
        report = helm.lint(str(CHART), MATRIX[case], strict=True, kube_version=f"v{version}")
        assert report["errors"] == [], report
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_defaults_render_every_component(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["defaults"]
    kinds = {(o["kind"], o["metadata"]["labels"]["app.kubernetes.io/component"]) for o in objs}
    for want in [("Deployment", "operator"), ("Deployment", "proxy"), ("Service", "proxy"),
                 ("Deployment", "extender"), ("Service", "extender"), ("Deployment", "scheduler"),
                 ("ConfigMap", "scheduler"), ("DaemonSet", "agent"), ("ServiceAccount", "bench"),
                 ("Role", "bench"), ("RoleBinding", "bench")]:
        assert want in kinds, want
    for absent in ("HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor",
                   "PodMonitor", "ClusterKopfPeering"):
        assert not of_kind(objs, absent), absent
    for c in ("operator", "proxy", "extender", "scheduler", "agent", "bench"):
        assert one(objs, "ServiceAccount", c)["metadata"]["name"] == f"flexinfer-{c}"


# ---- security -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["defaults", "all-on", "custom-registry", "static-proxy", "redis-deploy"])
def test_every_workload_is_locked_down(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    workloads = [o for o in rendered[case] if o["kind"] in ("Deployment", "DaemonSet")]
    assert workloads
    for w in workloads:
        spec = pod_spec(w)
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        mounts_tmp = False
        for c in containers(w):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["runAsNonRoot"] is True and not sc.get("privileged")
            assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
            assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
            assert c["resources"]["limits"]["memory"]
            mounts_tmp |= any(m["mountPath"] == "/tmp" for m in c.get("volumeMounts") or [])
        assert mounts_tmp, w["metadata"]["name"]
        assert any(v.get("emptyDir") is not None and v["name"] == "tmp" for v in spec["volumes"])
        host = [v for v in spec["volumes"] if "hostPath" in v]
        if w["kind"] == "DaemonSet":  # the agent: only what discovery reads, read-only
            assert sorted(v["hostPath"]["path"] for v in host) == ["/proc/cpuinfo", "/sys"]
            mounts = {m["name"]: m for m in container(w, "agent")["volumeMounts"]}
            assert all(mounts[v["name"]]["readOnly"] is True for v in host)
        else:
            assert host == []


def test_agent_gets_node_name_gpu_placement_and_host_root(rendered: dict[str, list[dict[str, Any]]]) -> None:
    ds = one(rendered["defaults"], "DaemonSet", "agent")
    env = env_of(container(ds, "agent"))
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["FLEXINFER_HOST_ROOT"] == "/host"
    mounts = {m["mountPath"] for m in container(ds, "agent")["volumeMounts"]}
    assert {"/host/sys", "/host/proc/cpuinfo"} <= mounts
    spec = pod_spec(ds)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert any(t["matchExpressions"][0]["key"] == "nvidia.com/gpu.present" for t in terms)
    assert {t["key"] for t in spec["tolerations"]} >= {"nvidia.com/gpu", "amd.com/gpu", "dedicated"}
    # no GPU is requested: the agent must not take a GPU away from the models
    assert not any("gpu" in k for k in container(ds, "agent")["resources"].get("limits", {}))
    # the code reads what the chart sets
    from flexinfer.agent.main import AgentSettings
    from flexinfer.settings import from_env

    s = from_env(AgentSettings, {k: v for k, v in env.items() if isinstance(v, str)} | {"NODE_NAME": "n1"})
    assert (s.host_root, s.interval, s.metrics_port) == ("/host", 30.0, 9100)


# ---- names ----------------------------------------------------------------------------------------------

def test_names_fit_63_characters_with_a_long_release_name() -> None:
    long = "a-very-long-release-name-for-flexinfer-that-goes-on-and-on-and-on"[:53]  # Helm's limit: 53
    objs = render(ALL_ON, name=long, api_versions=MONITORING)
    seen: set[tuple[str, str, str]] = set()
    for o in objs:
        md = o["metadata"]
        assert len(md["name"]) <= 63, md["name"]
        key = (o["kind"], md.get("namespace", ""), md["name"])
        assert key not in seen, key  # truncation never merges two objects
        seen.add(key)
        for v in md.get("labels", {}).values():
            assert len(str(v)) <= 63
    # every component keeps its suffix
    for sa in of_kind(objs, "ServiceAccount"):
        assert sa["metadata"]["name"].endswith("-" + sa["metadata"]["labels"]["app.kubernetes.io/component"])


def test_fullname_override_and_release_containing_chart_name() -> None:
    objs = render({"fullnameOverride": "fi"})
    assert one(objs, "Service", "proxy")["metadata"]["name"] == "fi-proxy"
    objs = render({}, name="prod-flexinfer")
    assert one(objs, "Service", "proxy")["metadata"]["name"] == "prod-flexinfer-proxy"
    objs = render({}, name="prod")
    assert one(objs, "Service", "proxy")["metadata"]["name"] == "prod-flexinfer-proxy"


# ---- images --------------------------------------------------------------------------------------------

def test_custom_registry_tag_and_pull_secret_reach_every_image(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["custom-registry"]
    workloads = [o for o in objs if o["kind"] in ("Deployment", "DaemonSet")]
    assert len(workloads) == 5
    image_envs = 0
    for w in workloads:
        assert pod_spec(w)["imagePullSecrets"] == [{"name": "regcred"}]
        for c in containers(w):
            assert c["image"].startswith(REGISTRY + "/"), c["image"]
            assert c["imagePullPolicy"] == "Always"
            if c["name"] != "kube-scheduler":
                assert c["image"] == f"{REGISTRY}/flexinfer/flexinfer:1.2.3-rc1"
            for k, v in env_of(c).items():
                if "IMAGE" in k and k != "FLEXINFER_IMAGE_PULL_POLICY" and k != "FLEXINFER_IMAGE_PULL_SECRETS":
                    assert isinstance(v, str) and v.startswith(REGISTRY + "/"), (k, v)
                    image_envs += 1
    assert image_envs == 8  # bench, flash-loader and the six Job images
    op_env = env_of(container(one(objs, "Deployment", "operator"), "operator"))
    assert op_env["FLEXINFER_BENCH_IMAGE"] == op_env["DEFAULT_FLASH_LOADER_IMAGE"] == \
        f"{REGISTRY}/flexinfer/flexinfer:1.2.3-rc1"
    assert op_env["FLEXINFER_IMAGE_PULL_SECRETS"] == "regcred"
    assert op_env["FLEXINFER_IMAGE_PULL_POLICY"] == "Always"


def test_default_images_use_app_version_and_cluster_version(rendered: dict[str, list[dict[str, Any]]]) -> None:
    import flexinfer

    objs = rendered["defaults"]
    assert container(one(objs, "Deployment", "proxy"), "proxy")["image"] == \
        f"ghcr.io/flexinfer/flexinfer:{flexinfer.__version__}"
    assert container(one(objs, "Deployment", "scheduler"), "kube-scheduler")["image"] == \
        "registry.k8s.io/kube-scheduler:v1.33.0"
    objs = render({}, kube_version="v1.30.4+k3s1")
    assert container(one(objs, "Deployment", "scheduler"), "kube-scheduler")["image"] == \
        "registry.k8s.io/kube-scheduler:v1.30.4"
    assert "imagePullSecrets" not in pod_spec(one(objs, "Deployment", "proxy"))


# ---- what the code is told -----------------------------------------------------------------------------

def test_operator_env_is_read_by_its_settings(rendered: dict[str, list[dict[str, Any]]]) -> None:
    from dataclasses import fields

    from flexinfer.operator.config import OperatorSettings, load_settings

    known = {f.metadata.get("env") for f in fields(OperatorSettings)} | {"POD_ID", "POD_NAMESPACE"}
    for case in ("defaults", "custom-registry", "ha"):
        objs = rendered[case]
        env = env_of(container(one(objs, "Deployment", "operator"), "operator"))
        assert set(env) <= known, set(env) - known  # nothing the code ignores
        s = load_settings({k: v for k, v in env.items() if isinstance(v, str)})
        s.validate()
        proxy_svc = one(objs, "Service", "proxy")
        port = proxy_svc["spec"]["ports"][0]["port"]
        assert s.proxy_url == f'http://{proxy_svc["metadata"]["name"]}.{NAMESPACE}.svc.cluster.local:{port}'
        assert s.bench_service_account == one(objs, "ServiceAccount", "bench")["metadata"]["name"]
        assert s.bench_image == s.flash_image == container(one(objs, "Deployment", "proxy"), "proxy")["image"]


def test_operator_jobs_carry_the_charts_image_account_and_pull_settings(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    from flexinfer.operator.config import load_settings
    from flexinfer.operator.jobs import benchmark_job

    objs = rendered["custom-registry"]
    env = env_of(container(one(objs, "Deployment", "operator"), "operator"))
    s = load_settings({k: v for k, v in env.items() if isinstance(v, str)})
    j = benchmark_job("md", "team-a", backend="vllm", obj_labels={}, owner={"apiVersion": "v1", "kind": "X",
                      "metadata": {"name": "md", "uid": "u"}}, warmup=1, iterations=1, min_duration_s=1,
                      max_tokens=8, node_selector=None, settings=s)
    pod = j["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "flexinfer-bench"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    (c,) = pod["containers"]
    assert c["image"] == f"{REGISTRY}/flexinfer/flexinfer:1.2.3-rc1" and c["imagePullPolicy"] == "Always"
    assert f"http://flexinfer-proxy.{NAMESPACE}.svc.cluster.local:80/v1" in c["args"]
    # Hugging Face prefetch Jobs run the FlexInfer image too: huggingface_hub is in it, no pip at run time
    assert s.prefetch_image == f"{REGISTRY}/flexinfer/flexinfer:1.2.3-rc1"


def test_bench_url_rule_matches_the_chart_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """tps/config.py's last-resort URL is the chart's default proxy Service; the Jobs get it explicitly."""
    from flexinfer.tps.config import load_config

    svc = one(rendered["defaults"], "Service", "proxy")
    assert load_config({"BENCHMARK_PROXY_NAMESPACE": NAMESPACE}).base_url == \
        f'http://{svc["metadata"]["name"]}.{NAMESPACE}.svc.cluster.local:{svc["spec"]["ports"][0]["port"]}/v1'


def test_proxy_flags_env_and_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    from dataclasses import fields

    from flexinfer.settings import HTTPSettings, ProxySettings, UpstreamSettings, load_proxy_settings

    dep = one(rendered["defaults"], "Deployment", "proxy")
    c = container(dep, "proxy")
    assert c["args"][:2] == ["proxy", "--kube"] and "--all-namespaces" not in c["args"]
    assert "--host=0.0.0.0" in c["args"] and "--port=8080" in c["args"]
    env = env_of(c)
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    known = {f.metadata.get("env") for cls in (ProxySettings, HTTPSettings, UpstreamSettings) for f in fields(cls)}
    assert set(env) <= known, set(env) - known
    s = load_proxy_settings({k: v for k, v in env.items() if isinstance(v, str)})
    assert s.http.drain_timeout == 30.0
    assert pod_spec(dep)["terminationGracePeriodSeconds"] > s.http.drain_timeout
    svc = one(rendered["defaults"], "Service", "proxy")
    assert svc["spec"]["ports"][0]["targetPort"] == "http" and svc["spec"]["ports"][0]["port"] == 80
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and "livenessProbe" not in c
    # auth from a Secret file
    dep = one(rendered["all-on"], "Deployment", "proxy")
    env = env_of(container(dep, "proxy"))
    assert set(env) <= known
    assert env["PROXY_AUTH_ENABLED"] == "true" and env["PROXY_AUTH_TOKEN_FILE"] == "/etc/flexinfer/auth/token"
    assert {"name": "auth", "secret": {"secretName": "proxy-tokens", "items": [{"key": "token", "path": "token"}]}} \
        in pod_spec(dep)["volumes"]
    assert "replicas" not in dep["spec"]  # the HPA owns it
    hpa = one(rendered["all-on"], "HorizontalPodAutoscaler", "proxy")
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]


def test_static_proxy_mounts_its_inventory(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["static-proxy"]
    c = container(one(objs, "Deployment", "proxy"), "proxy")
    assert "--kube" not in c["args"] and "--config=/etc/flexinfer/static.yaml" in c["args"]
    cm = one(objs, "ConfigMap", "proxy")
    assert yaml.safe_load(cm["data"]["static.yaml"]) == MATRIX["static-proxy"]["proxy"]["staticConfig"]
    assert not [o for o in objs if o["kind"] in ("Role", "ClusterRole")
                and o["metadata"]["labels"]["app.kubernetes.io/component"] == "proxy"]
    assert pod_spec(one(objs, "Deployment", "proxy"))["automountServiceAccountToken"] is False
    with pytest.raises(helm.HelmError, match=r"set proxy\.staticConfig"):
        render({"proxy": {"kube": False}})


def test_kube_proxy_for_all_namespaces(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["kube-all-namespaces"]
    assert "--all-namespaces" in container(one(objs, "Deployment", "proxy"), "proxy")["args"]
    proxy_rbac = [o for o in objs if o["metadata"]["labels"]["app.kubernetes.io/component"] == "proxy"
                  and o["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]
    assert sorted(o["kind"] for o in proxy_rbac) == ["ClusterRole", "ClusterRole", "ClusterRoleBinding",
                                                       "ClusterRoleBinding"]
    # namespaced by default: a Role in the models' namespace
    objs = render({"proxy": {"watchNamespace": "models"}})
    role = one(objs, "Role", "proxy")
    assert role["metadata"]["namespace"] == "models"
    assert env_of(container(one(objs, "Deployment", "proxy"), "proxy"))["POD_NAMESPACE"] == "models"


def test_ha_operator_peers_through_a_cluster_kopf_peering(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["ha"]
    dep = one(objs, "Deployment", "operator")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "Recreate"
    args = container(dep, "operator")["args"]
    (peering,) = of_kind(objs, "ClusterKopfPeering")
    assert f'--peering={peering["metadata"]["name"]}' in args and "--priority=random" in args
    # the flags parse as `flexinfer operator` takes them
    from flexinfer.cli import build_parser

    ns = build_parser(args).parse_args(args)
    assert ns.peering == peering["metadata"]["name"] and ns.priority > 0
    rules = one(objs, "ClusterRole", "operator")["rules"]
    assert {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"],
            "verbs": ["get", "list", "watch", "patch"]} in rules
    assert env_of(container(dep, "operator"))["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert one(objs, "Deployment", "proxy")["spec"]["replicas"] == 3
    assert one(objs, "PodDisruptionBudget", "proxy")["spec"]["minAvailable"] == 1
    # one replica: standalone, no peering object, no kopf.dev rule
    objs = rendered["defaults"]
    assert not any(a.startswith("--peering") for a in container(one(objs, "Deployment", "operator"), "operator")["args"])
    assert all("kopf.dev" not in r["apiGroups"] for r in one(objs, "ClusterRole", "operator")["rules"])


def test_scheduler_profile_calls_the_extender(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for case in ("defaults", "all-on"):
        objs = rendered[case]
        cfg = yaml.safe_load(one(objs, "ConfigMap", "scheduler")["data"]["config.yaml"])
        assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
        assert [p["schedulerName"] for p in cfg["profiles"]] == ["flexinfer-scheduler"]
        (ext,) = cfg["extenders"]
        svc = one(objs, "Service", "extender")
        port = svc["spec"]["ports"][0]["port"]
        assert port == 8082
        assert ext["urlPrefix"] == f'http://{svc["metadata"]["name"]}.{NAMESPACE}.svc.cluster.local:{port}'
        assert (ext["filterVerb"], ext["prioritizeVerb"]) == ("filter", "score")  # POST /filter, /score
        assert ext["weight"] == 1 and ext["nodeCacheCapable"] is True and ext["ignorable"] is True
        assert "--port=8082" in container(one(objs, "Deployment", "extender"), "extender")["args"]
        sched = one(objs, "Deployment", "scheduler")
        assert cfg["leaderElection"]["leaderElect"] is (sched["spec"]["replicas"] > 1)
    (ext,) = yaml.safe_load(one(rendered["all-on"], "ConfigMap", "scheduler")["data"]["config.yaml"])["extenders"]
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    # the extender dispatches on these verbs (the last path segment of POST <urlPrefix>/<verb>)
    text = (ROOT / "flexinfer" / "scheduler" / "server.py").read_text()
    assert 'if verb in ("filter", "score", "prioritize")' in text


def test_extender_off_and_agent_off(rendered: dict[str, list[dict[str, Any]]]) -> None:
    comps = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in rendered["extender-off"]}
    assert "extender" not in comps and "scheduler" not in comps and "operator" in comps
    comps = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in rendered["agent-off"]}
    assert "agent" not in comps and not of_kind(rendered["agent-off"], "DaemonSet")


def test_monitoring_objects_need_the_api_and_the_value(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["monitoring"]
    assert sorted(o["metadata"]["name"] for o in of_kind(objs, "ServiceMonitor")) == \
        ["flexinfer-extender", "flexinfer-proxy"]
    pms = {o["metadata"]["labels"]["app.kubernetes.io/component"]: o for o in of_kind(objs, "PodMonitor")}
    assert sorted(pms) == ["agent", "operator"]
    for pm in pms.values():
        assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    # the value on but the API absent: nothing (a plain `helm install` on a cluster without the operator)
    objs = render(MATRIX["monitoring"])
    assert not of_kind(objs, "ServiceMonitor") and not of_kind(objs, "PodMonitor")
    # the API present but the value off: nothing
    assert not of_kind(render({}, api_versions=MONITORING), "ServiceMonitor")


def test_network_policies(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pols = {o["metadata"]["labels"]["app.kubernetes.io/component"]: o for o in of_kind(rendered["all-on"], "NetworkPolicy")}
    assert sorted(pols) == ["agent", "extender", "operator", "proxy"]
    assert pols["proxy"]["spec"]["ingress"][0]["from"] == [{"namespaceSelector": {}}]


def test_notes_tell_how_to_reach_the_endpoint() -> None:
    text = notes({})
    assert "kubectl -n flexinfer-system port-forward svc/flexinfer-proxy 8080:80" in text
    assert "curl -s http://127.0.0.1:8080/v1/chat/completions" in text
    assert 'OpenAI(base_url="http://127.0.0.1:8080/v1"' in text


# ---- RBAC shape (proved least-privilege elsewhere) --------------------------------------------------------

@pytest.mark.parametrize("case", ["defaults", "all-on", "kube-all-namespaces"])
def test_rbac_one_rule_per_group_and_resources(rendered: dict[str, list[dict[str, Any]]], case: str) -> None:
    for role in (o for o in rendered[case] if o["kind"] in ("Role", "ClusterRole")):
        seen = set()
        for r in role["rules"]:
            assert len(r["apiGroups"]) == 1, r
            key = (r["apiGroups"][0], tuple(r["resources"]))
            assert key not in seen, (role["metadata"]["name"], key)
            seen.add(key)
            assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"]
    for b in (o for o in rendered[case] if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount"
            assert any(o["kind"] == "ServiceAccount" and o["metadata"]["name"] == s["name"]
                       and o["metadata"]["namespace"] == s["namespace"] for o in rendered[case]), s


def test_rbac_templates_comment_every_rule() -> None:
    for path in sorted((CHART / "templates").glob("rbac-*.yaml")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                prev = next(p for p in reversed(lines[:i]) if not p.strip().startswith("{{"))
                assert prev.strip().startswith("#"), f"{path.name}:{i + 1}: a rule without a comment"


def test_bench_account_in_every_listed_namespace(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["all-on"]
    sas = sorted(o["metadata"]["namespace"] for o in of_kind(objs, "ServiceAccount")
                 if o["metadata"]["name"] == "flexinfer-bench")
    assert sas == ["flexinfer-system", "team-a"]
    roles = [o for o in of_kind(objs, "Role") if o["metadata"]["name"] == "flexinfer-bench"]
    assert all(r["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]}]
               for r in roles) and len(roles) == 2


def test_values_are_not_mutated_by_rendering() -> None:
    before = copy.deepcopy(ALL_ON)
    render(ALL_ON)
    assert before == ALL_ON
