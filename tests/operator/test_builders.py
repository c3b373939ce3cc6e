"""Table tests of the pure manifest builders and of the Model plan: every object validates against the
Kubernetes 1.30 schemas (strict), and carries the original's labels, probes, tolerations, volumes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes_validate
import pytest

from flexinfer import labels
from flexinfer.api import Model, ModelDeployment
from flexinfer.operator import builders, jobs
from flexinfer.operator.config import DEFAULT_FLEXINFER_IMAGE, OperatorSettings, load_settings
from flexinfer.operator.diff import strip_none
from flexinfer.operator.model_logic import ModelInputs, plan_model
from flexinfer.operator.modeldeployment import md_deployment, md_service
from tests.operator.harness import gpu_node

NOW = datetime(2025, 7, 1, 12, 0, tzinfo=UTC)
S = OperatorSettings()


def body(name: str = "m", ns: str = "ns", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
            "metadata": {"name": name, "namespace": ns, "uid": "uid-1", "generation": 3}, "spec": spec}


def plan(b: dict[str, Any], nodes: list[dict[str, Any]] | None = None, **kw: Any) -> Any:
    return plan_model(ModelInputs(body=b, model=Model.from_obj(b), error=None, now=NOW, nodes=nodes or [], **kw), S)


def valid(obj: dict[str, Any]) -> dict[str, Any]:
    clean = strip_none(obj)
    kubernetes_validate.validate(clean, "1.30.0", strict=True)
    return clean  # type: ignore[no-any-return]


def container(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    ("cpu-llamacpp", {"backend": "llama.cpp", "source": "HF://org/x-GGUF", "config": {"ggufFile": "x.gguf"},
                      "cache": {"strategy": "SharedPVC"}}, []),
    ("nvidia-vllm", {"backend": "vllm", "source": "HF://meta/llama", "gpu": {"vendor": "nvidia", "vramEstimateMB": 9000},
                     "serverless": {"minReplicas": 2}, "litellm": {"aliases": ["l3"]}, "serviceLabels": ["textgen"]},
     [gpu_node("n1")]),
    ("amd-auto-shared", {"backend": "mlc-llm", "source": "HF://mlc-ai/Qwen-MLC", "gpu": {"shared": "g1"},
                         "cache": {"strategy": "Local", "flashLoader": {"enabled": True, "tmpfsSizeLimit": "20Gi"}}},
     [gpu_node("a1", "amd")]),
    ("pvc-source", {"backend": "vllm", "source": "pvc://models/llama/8b", "gpu": {"vendor": "nvidia"}},
     [gpu_node("n1")]),
    ("ollama", {"backend": "ollama", "source": "ollama://llama3:8b",
                "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]}, []),
    ("diffusers", {"backend": "diffusers", "source": "HF://sd/x", "gpu": {"vendor": "nvidia"}}, [gpu_node("n1")]),
]


@pytest.mark.parametrize(("case", "spec", "nodes"), CASES, ids=[c[0] for c in CASES])
def test_children_validate_strictly(case: str, spec: dict[str, Any], nodes: list[dict[str, Any]],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings({"DEFAULT_IMAGE_REGISTRY": "registry.example"}) if case == "diffusers" else S
    b = body(**spec)
    p = plan_model(ModelInputs(body=b, model=Model.from_obj(b), error=None, now=NOW, nodes=nodes), settings)
    assert p.status["phase"] != "Failed", p.status
    dep, svc = valid(p.deployment), valid(p.service)
    for _, obj in p.create:
        valid(obj)
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel == {labels.APP_NAME: "model", labels.APP_INSTANCE: "m", labels.MANAGED_BY: "flexinfer",
                   labels.MODEL: "m", labels.BACKEND: Model.from_obj(b).spec.backend}
    assert svc["spec"]["selector"] == sel and dep["spec"]["template"]["metadata"]["labels"].items() >= sel.items()
    ref = dep["metadata"]["ownerReferences"][0]
    assert ref == {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "name": "m", "uid": "uid-1",
                   "controller": True, "blockOwnerDeletion": True}
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert {"name": "shm", "mountPath": "/dev/shm"} in container(dep)["volumeMounts"]
    assert container(dep)["readinessProbe"]


def test_gpu_pod_details() -> None:
    p = plan(body(backend="vllm", source="HF://meta/llama", gpu={"vendor": "nvidia", "count": 2},
                  serverless={"minReplicas": 2}, cache={"strategy": "None"}), [gpu_node("n1")])
    dep = valid(p.deployment)
    pod = dep["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert builders.GPU_TOLERATION in pod["tolerations"]
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] \
        == "kubernetes.io/hostname"
    assert container(dep)["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "--tensor-parallel-size" in container(dep)["args"]
    assert dep["spec"]["replicas"] == 2  # serverless minReplicas, no activity yet
    assert p.status["gpu"] == {"vendor": "nvidia", "architecture": "sm_89", "memoryMB": 24576}
    amd = plan(body(backend="vllm", source="HF://meta/llama", gpu={}), [gpu_node("a1", "amd")])
    apod = valid(amd.deployment)["spec"]["template"]["spec"]
    assert apod["securityContext"] == {"supplementalGroups": [109, 992]} and "runtimeClassName" not in apod
    env = {e["name"]: e["value"] for e in apod["containers"][0]["env"]}
    assert env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    cpu = plan(body(backend="ollama", source="ollama://x"))
    cpod = valid(cpu.deployment)["spec"]["template"]["spec"]
    assert "tolerations" not in cpod and "strategy" not in cpu.deployment["spec"]


def test_service_annotations_and_endpoint() -> None:
    p = plan(body(backend="ollama", source="ollama://x", litellm={"servedModelName": "llama", "aliases": ["l3", "llama"],
                                                                  "copilotAlias": "cp"}, serviceLabels=["textgen"]))
    ann = valid(p.service)["metadata"]["annotations"]
    assert ann == {labels.LITELLM_SERVED_MODEL: "llama", labels.LITELLM_ALIASES: "l3,textgen",
                   labels.LITELLM_COPILOT_MODEL: "cp", labels.SERVICE_LABELS: "textgen"}
    assert p.service["metadata"]["annotations"][labels.ACTIVE_SERVICES] is None  # not shared: removed if present
    assert p.service["spec"]["ports"] == [{"name": "http", "port": 11434, "targetPort": 11434, "protocol": "TCP"}]
    assert p.status["endpoint"] == "http://m.ns.svc.cluster.local:11434"
    shared = body(backend="ollama", source="ollama://x", gpu={"shared": "g"}, serviceLabels=["textgen"])
    shared["status"] = {"sharedGroup": {"groupName": "g", "state": "Active"}}
    ann = plan(shared, [gpu_node("n1")]).service["metadata"]["annotations"]
    assert ann[labels.ACTIVE_SERVICES] == "textgen"
    shared["status"]["sharedGroup"]["state"] = "Queued"
    assert plan(shared, [gpu_node("n1")]).service["metadata"]["annotations"][labels.ACTIVE_SERVICES] == ""


def test_cache_gating_prefetch() -> None:
    b = body(backend="vllm", source="HF://meta/llama", gpu={"vendor": "nvidia"},
             config={"hfAllowPatterns": ["*.safetensors"], "hfRevision": "main"}, serverless={"minReplicas": 1})
    p = plan(b, [gpu_node("n1")])
    kinds = {obj["kind"]: obj for _, obj in p.create}
    pvc = valid(kinds["PersistentVolumeClaim"])
    assert pvc["metadata"]["name"] == "m-cache" and pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    job = valid(kinds["Job"])
    assert job["metadata"]["name"] == "m-cache-prefetch" and job["spec"]["backoffLimit"] == 3
    assert job["metadata"]["annotations"][labels.SOURCE] == "HF://meta/llama"
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels.APP_NAME not in pod_labels  # the Service must not route to the Job pod
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HF_REPO"] == "meta/llama" and env["DEST"] == "/models/m" and env["HF_REVISION"] == "main"
    assert_hf_prefetch_in_flexinfer_image(job)
    assert p.deployment["spec"]["replicas"] == 0 and p.status["phase"] == "Pending"
    assert container(p.deployment)["args"][container(p.deployment)["args"].index("--model") + 1] == "/models/m"
    done = {"m-cache-prefetch": {**job, "status": {"succeeded": 1}}}
    p2 = plan(b, [gpu_node("n1")], jobs=done, deployment={"status": {}})
    assert p2.deployment["spec"]["replicas"] == 1 and p2.status["phase"] == "Loading"
    assert p2.status["cache"]["ready"] is True and p2.status["cache"]["jobPhase"] == "Succeeded"
    failed = {"m-cache-prefetch": {**job, "status": {"failed": 4}}}
    assert plan(b, [gpu_node("n1")], jobs=failed).status["phase"] == "Failed"
    stale = {"m-cache-prefetch": {**job, "metadata": {**job["metadata"], "annotations": {labels.SOURCE: "HF://x/y"}}}}
    p3 = plan(b, [gpu_node("n1")], jobs=stale)
    assert [o["metadata"]["name"] for _, o in p3.delete] == ["m-cache-prefetch"]
    mlc = plan(body(backend="mlc-llm", source="HF://mlc-ai/Q-MLC", gpu={"vendor": "nvidia"}), [gpu_node("n1")])
    mjob = next(o for _, o in mlc.create if o["kind"] == "Job")
    assert "git clone" in mjob["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "securityContext" not in mjob["spec"]["template"]["spec"]  # the git image installs git as root


def assert_hf_prefetch_in_flexinfer_image(job: dict[str, Any]) -> None:
    """The HF prefetch Job runs the FlexInfer image, whose huggingface_hub is installed: no pip at run time."""
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == DEFAULT_FLEXINFER_IMAGE
    assert c["command"][:2] == ["/bin/sh", "-c"]
    script = c["command"][2]
    assert "pip" not in script and "from huggingface_hub import snapshot_download" in script
    assert pod["securityContext"] == {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True,
                                      "fsGroup": 65532, "fsGroupChangePolicy": "OnRootMismatch"}


def test_prefetch_image_setting() -> None:
    settings = load_settings(env={"FLEXINFER_PREFETCH_IMAGE": "registry.local/flexinfer:1"})
    assert settings.prefetch_image == "registry.local/flexinfer:1"
    assert OperatorSettings().prefetch_image == OperatorSettings().flash_image == DEFAULT_FLEXINFER_IMAGE
    m = Model.from_obj(body(backend="vllm", source="HF://meta/llama", gpu={"vendor": "nvidia"}))
    job = jobs.prefetch_job(m, {}, settings)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/flexinfer:1"
    owner = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache", "metadata": {"name": "qwen", "uid": "u"}}
    mc = jobs.modelcache_prefetch_job("qwen", "default", source="huggingface://Qwen/Qwen3-8B", claim="qwen",
                                      dest="/models/qwen", obj_labels={}, owner=owner, node_selector=None,
                                      secret=None, settings=OperatorSettings())
    assert_hf_prefetch_in_flexinfer_image(valid(mc))
    oras = jobs.modelcache_prefetch_job("o", "default", source="oci://r/x:1", claim="o", dest="/models/o",
                                        obj_labels={}, owner=owner, node_selector=None, secret=None,
                                        settings=OperatorSettings())
    assert "securityContext" not in oras["spec"]["template"]["spec"]


def test_pvc_source_copy_and_check() -> None:
    b = body(backend="vllm", source="pvc://src/llama", gpu={"vendor": "nvidia"}, cache={"strategy": "SharedPVC"})
    p = plan(b, [gpu_node("n1")])
    assert p.status["cache"]["message"].startswith("waiting for source PVC src")
    bound = {"src": {"metadata": {"name": "src"}, "status": {"phase": "Bound"}}}
    p = plan(b, [gpu_node("n1")], pvcs=bound)
    job = valid(next(o for _, o in p.create if o["kind"] == "Job"))
    assert job["metadata"]["name"] == "m-cache-copy" and job["spec"]["backoffLimit"] == 1
    assert "cp -a /src/llama/. /models/m/" in job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    direct = plan(body(backend="vllm", source="pvc://src/llama", gpu={"vendor": "nvidia"}), [gpu_node("n1")])
    check = valid(next(o for _, o in direct.create if o["kind"] == "Job"))
    assert check["metadata"]["name"] == "m-cache-check" and check["spec"]["backoffLimit"] == 0
    vols = direct.deployment["spec"]["template"]["spec"]["volumes"]
    assert vols[0] == {"name": "model", "persistentVolumeClaim": {"claimName": "src"}}


def test_flash_loader_init_container() -> None:
    b = body(backend="vllm", source="HF://meta/llama", gpu={"vendor": "nvidia", "shared": "g"},
             cache={"strategy": "SharedPVC", "flashLoader": {"enabled": True, "concurrency": 8}})
    p = plan(b, [gpu_node("n1")])
    pod = valid(p.deployment)["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert init["name"] == "flash-loader" and init["command"] == ["flexinfer", "flash-load"]
    assert env["FLASH_SRC"] == "/src/m" and env["FLASH_DST"] == "/models/m" and env["FLASH_CONCURRENCY"] == "8"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["flash-tmpfs"]["hostPath"]["path"] == "/dev/shm/flexinfer/ns/m"  # shared: survives swaps
    assert {"name": "flash-tmpfs", "mountPath": "/models"} in pod["containers"][0]["volumeMounts"]
    # auto: shared + Local; off for a Memory cache (nothing persistent to copy from)
    auto = plan(body(backend="vllm", source="HF://meta/llama", gpu={"vendor": "nvidia", "shared": "g"}),
                [gpu_node("n1")])
    assert "initContainers" not in auto.deployment["spec"]["template"]["spec"]


def test_lora_args_and_capabilities() -> None:
    p = plan(body(backend="vllm", source="HF://meta/llama", gpu={"vendor": "nvidia"}), [gpu_node("n1")],
             lora_adapters=2)
    args = container(p.deployment)["args"]
    assert args[args.index("--max-loras") + 1] == "4" and "--enable-lora" in args
    env = {e["name"] for e in container(p.deployment)["env"]}
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in env
    assert p.deployment["metadata"]["annotations"][labels.LITELLM_CAPABILITIES] == \
        '{"imageGeneration":false,"toolCalling":true}'


def test_job_names_are_bounded() -> None:
    long = "a" * 60
    name = builders.child_name(long, "cache-prefetch")
    assert len(name) <= 63 and name.endswith("-cache-prefetch")
    assert builders.child_name("m", "cache-check") == "m-cache-check"


def test_tmpfs_cleanup_and_benchmark_jobs() -> None:
    m = Model.from_obj(body(backend="vllm", source="HF://x/y", gpu={"vendor": "nvidia", "shared": "g"},
                            nodeSelector={"kubernetes.io/hostname": "n1"}))
    j = valid(jobs.tmpfs_cleanup_job(m, S))
    assert "ownerReferences" not in j["metadata"] and j["spec"]["ttlSecondsAfterFinished"] == 120
    assert j["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    owner = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "md", "uid": "u"}}
    b = valid(jobs.benchmark_job("md", "ns", backend="ollama", obj_labels={"app": "md"}, owner=owner, warmup=2,
                                 iterations=5, min_duration_s=30, max_tokens=128, node_selector=None, settings=S))
    args = b["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--configmap") + 1] == "md-benchmark-results"
    assert b["spec"]["template"]["spec"]["serviceAccountName"] == "flexinfer-bench"


def test_modeldeployment_builders() -> None:
    obj = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
           "metadata": {"name": "md", "namespace": "ns", "uid": "u"},
           "spec": {"backend": "vllm", "model": "meta/llama", "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "vllm": {"maxModelLen": 4096}, "litellm": {"aliases": ["x"]}, "serviceLabels": ["textgen"]}}
    md = ModelDeployment.from_obj(obj)
    dep = valid(md_deployment(md, obj, image="vllm/vllm-openai:latest", replicas=1, claim="md",
                              model_path="meta/llama", settings=S))
    assert dep["spec"]["template"]["metadata"]["labels"]["app"] == "md"
    assert dep["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert "--max-model-len" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    svc = valid(md_service(md, obj, active=True))
    assert svc["metadata"]["annotations"][labels.ACTIVE_SERVICES] == "textgen"
    assert md_service(md, obj, active=False)["metadata"]["annotations"][labels.ACTIVE_SERVICES] is None


def test_failed_status_shapes() -> None:
    b = body(backend="vllm", source="HF://meta/llama", gpu={"vendor": "nvidia", "vramEstimateMB": 24000})
    p = plan(b, [gpu_node("n1")])
    assert p.status["phase"] == "Failed" and p.deployment is None and p.permanent.startswith("VRAMInsufficient")
    cond = {c["type"]: c for c in p.status["conditions"]}
    assert cond["Ready"]["status"] == "False" and cond["Schedulable"]["reason"] == "VRAMInsufficient"
    assert cond["Ready"]["observedGeneration"] == 3 and p.status["observedGeneration"] == 3
    # lastTransitionTime moves only when the status flips
    later = plan_model(ModelInputs(body={**b, "status": p.status}, model=Model.from_obj(b), error=None,
                                   now=NOW + timedelta(minutes=5), nodes=[gpu_node("n1")]), S)
    assert later.status == p.status
    long = plan(body(name="x" * 64, backend="ollama", source="ollama://x"))
    assert long.status["phase"] == "Failed" and long.permanent.startswith("InvalidSpec")
