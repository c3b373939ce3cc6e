"""Pure manifest builders for a Model's children: Deployment, Service, cache PVC, flash-loader.

Owns: names (``<n>``, ``<n>-cache``, bounded ``<n>-<suffix>`` for Jobs), labels and annotations
(``shared/reference/flexinfer-upstream.md`` §2.2), owner references, the model volume and model path
per cache strategy and source, the flash-loader init container and its tmpfs, and the pod template:
image, command, args, env and probes from the backend registry, GPU limit, ``dedicated=gpu``
toleration, ``maxSurge 0``, ``runtimeClassName: nvidia``, AMD supplemental groups, hostname
anti-affinity with more than one replica, ``/dev/shm``, compile cache, no service-account token.

Every function is a pure function of its arguments and returns plain dicts that validate against
the Kubernetes 1.30 schemas (strict). ``None`` values mean "absent" (removed by the selective merge,
stripped on create). Must not: do I/O or read the environment.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flexinfer import labels
from flexinfer.api.model_view import Model
from flexinfer.backends import COMPILE_CACHE_DIR, LaunchContext, gpu_resource_name
from flexinfer.operator.config import OperatorSettings

MODELS_DIR = "/models"
SHM_DIR = "/dev/shm"
FLASH_SHM_ROOT = "/dev/shm/flexinfer"
MAX_NAME = 63
GPU_TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
AMD_SUPPLEMENTAL_GROUPS = [109, 992]  # video, render
NVIDIA_RUNTIME_CLASS = "nvidia"
CONTAINER = "model"
FLASH_CONTAINER = "flash-loader"
APP_MODEL = "model"


# ---- names, labels, owners -------------------------------------------------------------------------

def child_name(base: str, suffix: str) -> str:
    """``<base>-<suffix>``, shortened with a hash when longer than 63 characters (Job/label limit)."""
    name = f"{base}-{suffix}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    keep = MAX_NAME - len(suffix) - len(digest) - 2
    return f"{base[:keep].rstrip('-')}-{digest}-{suffix}"


def cache_pvc_name(m: Model) -> str:
    """The PVC holding the model files: ``cache.pvcName`` or ``<n>-cache``."""
    return m.spec.cache.pvc_name or f"{m.name}-cache"


def selector_labels(m: Model) -> dict[str, str]:
    return {labels.APP_NAME: APP_MODEL, labels.APP_INSTANCE: m.name, labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
            labels.MODEL: m.name, labels.BACKEND: m.spec.backend}


def object_labels(m: Model) -> dict[str, str]:
    out = selector_labels(m)
    if m.spec.gpu.shared:
        out[labels.GPU_GROUP] = m.spec.gpu.shared
    return out


def owner_ref(owner: Mapping[str, Any]) -> dict[str, Any]:
    md = owner.get("metadata") or {}
    return {"apiVersion": owner.get("apiVersion"), "kind": owner.get("kind"), "name": md.get("name"),
            "uid": md.get("uid"), "controller": True, "blockOwnerDeletion": True}


def meta(name: str, namespace: str, lbls: Mapping[str, str], owner: Mapping[str, Any] | None = None,
         annotations: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(lbls)}
    if annotations:
        out["annotations"] = dict(annotations)
    if owner is not None:
        out["ownerReferences"] = [owner_ref(owner)]
    return out


def endpoint(m: Model) -> str:
    return f"http://{m.name}.{m.namespace}.svc.cluster.local:{m.spec.backend_def.port}"


# ---- placement and volumes -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Target:
    """Resolved placement: vendor (nvidia | amd | cpu), architecture and the image for them."""

    vendor: str
    arch: str
    image: str

    @property
    def gpu(self) -> bool:
        return self.vendor in ("nvidia", "amd")


@dataclass(frozen=True, slots=True)
class ModelVolume:
    """The model volume (None: the backend needs none), where the server loads from, how it mounts."""

    source: Mapping[str, Any] | None
    model_path: str
    sub_path: str | None = None
    persistent: bool = False  # PVC or hostPath: worth a flash-loader copy


def model_volume(m: Model, *, staging: bool = False) -> ModelVolume:
    """The volume and model path for ``m`` (``staging``: a ``pvc://`` source copied into the cache PVC)."""
    s, backend = m.spec, m.spec.backend_def
    src = s.source
    if not backend.needs_volume:
        return ModelVolume(None, src.model_id)
    strategy = s.cache.strategy
    if src.scheme == "pvc":
        if staging:
            return ModelVolume({"persistentVolumeClaim": {"claimName": cache_pvc_name(m)}},
                               f"{MODELS_DIR}/{m.name}", persistent=True)
        path = f"{MODELS_DIR}/{src.pvc_path}" if src.pvc_path else MODELS_DIR
        return ModelVolume({"persistentVolumeClaim": {"claimName": src.pvc_claim}}, path, persistent=True)
    if strategy == "SharedPVC":
        source: Mapping[str, Any] = {"persistentVolumeClaim": {"claimName": cache_pvc_name(m)}}
        persistent = True
    elif strategy == "Local":
        source = {"hostPath": {"path": s.cache.local_dir(m.namespace, m.name), "type": "DirectoryOrCreate"}}
        persistent = True
    elif strategy == "Memory":
        source, persistent = {"emptyDir": {"medium": "Memory"}}, False
    else:
        source, persistent = {"emptyDir": {}}, False
    if src.scheme == "hf":
        if s.backend == "llamacpp":
            return ModelVolume(source, f"{MODELS_DIR}/{m.name}/{s.gguf_file}", persistent=persistent)
        if strategy == "SharedPVC":
            if s.backend == "diffusers":
                return ModelVolume(source, MODELS_DIR, sub_path=m.name, persistent=persistent)
            return ModelVolume(source, f"{MODELS_DIR}/{m.name}", persistent=persistent)
        return ModelVolume(source, src.model_id, persistent=persistent)  # the server downloads it
    return ModelVolume(source, src.model_id, persistent=persistent)


@dataclass(frozen=True, slots=True)
class FlashLoader:
    """The resolved flash-loader configuration (env, then a matching ModelCache, then the spec)."""

    image: str
    concurrency: int
    buffer_kb: int
    verify: bool
    exclude: tuple[str, ...]
    tmpfs_size_limit: str | None


def flash_loader(m: Model, vol: ModelVolume, settings: OperatorSettings,
                 cache_flash: Any = None) -> FlashLoader | None:
    """The flash-loader for ``m`` or None. ``cache_flash``: a matching ModelCache's ``flashLoader``.

    Auto: on for shared Models with a Local cache. Only a persistent volume under /models is copied.
    """
    enabled, image = settings.flash_enabled, settings.flash_image
    conc, buf, verify = settings.flash_concurrency, settings.flash_buffer_kb, settings.flash_verify
    tmpfs: str | None = settings.flash_tmpfs_size_limit or None
    decided = settings.flash_enabled
    if cache_flash is not None:
        enabled, decided = bool(cache_flash.enabled), True
        conc, buf = cache_flash.concurrency, cache_flash.buffer_size_kb
        tmpfs = cache_flash.tmpfs_size_limit or tmpfs
        image = cache_flash.image or image
    fl = m.spec.cache.flash_loader
    if fl.enabled is not None:
        enabled, decided = fl.enabled, True
        conc, buf, verify = fl.concurrency, fl.buffer_size_kb, fl.verify_integrity
        tmpfs = fl.tmpfs_size_limit or tmpfs
        image = fl.image or image
    if not decided:
        enabled = bool(m.spec.gpu.shared) and m.spec.cache.strategy == "Local"
    if not enabled or vol.source is None or not vol.persistent or not vol.model_path.startswith(MODELS_DIR):
        return None
    return FlashLoader(image, conc, buf, verify, settings.flash_excludes, tmpfs)


def _model_dir(vol: ModelVolume) -> str:
    """The directory under /models that holds the model (what the flash-loader copies)."""
    p = vol.model_path
    if posixpath.splitext(p)[1] in (".gguf", ".bin", ".safetensors"):
        p = posixpath.dirname(p)
    return p


# ---- Deployment -------------------------------------------------------------------------------------

def _env_list(env: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in sorted(env.items())]


def hf_env(m: Model) -> dict[str, str]:
    """Hugging Face cache locations on the model volume (HF sources with a volume only)."""
    if m.spec.source.scheme != "hf" or not m.spec.backend_def.needs_volume:
        return {}
    home = f"{MODELS_DIR}/.cache/huggingface"
    return {"HF_HOME": home, "HF_HUB_CACHE": f"{home}/hub", "HUGGINGFACE_HUB_CACHE": f"{home}/hub",
            "TRANSFORMERS_CACHE": f"{home}/hub"}


def capabilities_json(m: Model) -> str:
    c = m.spec.effective_capabilities
    caps = {"toolCalling": c.tool_calling, "vision": c.vision, "imageGeneration": c.image_generation}
    return json.dumps({k: v for k, v in caps.items() if v is not None}, sort_keys=True, separators=(",", ":"))


def launch_context(m: Model, target: Target, vol: ModelVolume, lora_adapters: int) -> LaunchContext:
    s = m.spec
    cc = s.cache.compilation_cache.enabled and target.gpu and s.backend_def.uses_compile_cache
    return LaunchContext(model_path=vol.model_path, config=s.config, vendor=target.vendor, arch=target.arch,
                         gpu_count=s.gpu.count if target.gpu else 0, served_name=s.served_name,
                         source=s.source.raw, lora_adapters=lora_adapters, kv_block_size=s.kv_cache.max_block_size,
                         kv_swap_space_gb=s.kv_cache.swap_space_gb, compile_cache=cc)


def _resources(m: Model, target: Target) -> dict[str, Any]:
    res: dict[str, Any] = dict(m.spec.resources.to_k8s())
    gpu_key = gpu_resource_name(target.vendor)
    if target.gpu and gpu_key and m.spec.gpu.count > 0:
        limits: dict[str, Any] = res.setdefault("limits", {})
        limits[gpu_key] = str(m.spec.gpu.count)
    return res


def _flash_container(m: Model, vol: ModelVolume, fl: FlashLoader) -> dict[str, Any]:
    rel = _model_dir(vol)[len(MODELS_DIR):]
    env = {"FLASH_SRC": f"/src{rel}", "FLASH_DST": f"{MODELS_DIR}{rel}", "FLASH_CONCURRENCY": str(fl.concurrency),
           "FLASH_BUFFER_KB": str(fl.buffer_kb), "FLASH_VERIFY": "true" if fl.verify else "false"}
    if fl.exclude:
        env["FLASH_EXCLUDE"] = ",".join(fl.exclude)
    if str(m.spec.config.get("useFp16", "")).lower() in ("1", "true"):
        env["FLASH_VARIANT"] = "fp16"
    mounts: list[dict[str, Any]] = [{"name": "model", "mountPath": "/src", "readOnly": True},
                                    {"name": "flash-tmpfs", "mountPath": MODELS_DIR}]
    if vol.sub_path:
        mounts[0]["subPath"] = vol.sub_path
    return {"name": FLASH_CONTAINER, "image": fl.image, "imagePullPolicy": "IfNotPresent",
            "command": ["flexinfer", "flash-load"], "env": _env_list(env), "volumeMounts": mounts}


def pod_spec(m: Model, target: Target, vol: ModelVolume, *, settings: OperatorSettings, lora_adapters: int = 0,
             flash: FlashLoader | None = None) -> dict[str, Any]:
    """The pod template spec of a Model's Deployment."""
    s, backend = m.spec, m.spec.backend_def
    ctx = launch_context(m, target, vol, lora_adapters)
    env = {**hf_env(m), **backend.env(ctx)}
    container: dict[str, Any] = {
        "name": CONTAINER, "image": target.image, "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": backend.port, "protocol": "TCP"}],
        "env": _env_list(env), "readinessProbe": backend.readiness_probe().to_k8s(),
    }
    cmd = backend.command(ctx)
    if cmd:
        container["command"] = cmd
    args = backend.args(ctx)
    if args:
        container["args"] = args
    startup = backend.startup_probe()
    if startup is not None:
        container["startupProbe"] = startup.to_k8s()
    res = _resources(m, target)
    if res:
        container["resources"] = res
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if vol.source is not None:
        volumes.append({"name": "model", **vol.source})
        if flash is not None:
            tmpfs: dict[str, Any]
            if s.gpu.shared:
                tmpfs = {"hostPath": {"path": f"{FLASH_SHM_ROOT}/{m.namespace}/{m.name}", "type": "DirectoryOrCreate"}}
            else:
                tmpfs = {"emptyDir": {"medium": "Memory", **({"sizeLimit": flash.tmpfs_size_limit}
                                                             if flash.tmpfs_size_limit else {})}}
            volumes.append({"name": "flash-tmpfs", **tmpfs})
            mounts.append({"name": "flash-tmpfs", "mountPath": MODELS_DIR})
        else:
            mount: dict[str, Any] = {"name": "model", "mountPath": MODELS_DIR}
            if vol.sub_path:
                mount["subPath"] = vol.sub_path
            mounts.append(mount)
    volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}})
    mounts.append({"name": "shm", "mountPath": SHM_DIR})
    if ctx.compile_cache:
        volumes.append({"name": "compile-cache", "hostPath": {"path": s.cache.compilation_cache.host_path,
                                                              "type": "DirectoryOrCreate"}})
        mounts.append({"name": "compile-cache", "mountPath": COMPILE_CACHE_DIR})
    container["volumeMounts"] = mounts
    spec: dict[str, Any] = {"automountServiceAccountToken": False, "containers": [container], "volumes": volumes}
    if flash is not None and vol.source is not None:
        init = _flash_container(m, vol, flash)
        init["imagePullPolicy"] = settings.image_pull_policy  # the FlexInfer image, as the chart pulls it
        spec["initContainers"] = [init]
    if settings.pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in settings.pull_secrets]
    tolerations = [GPU_TOLERATION] if target.gpu else []
    tolerations += [t.to_k8s() for t in s.tolerations]
    if tolerations:
        spec["tolerations"] = tolerations
    if s.node_selector:
        spec["nodeSelector"] = dict(s.node_selector)
    if target.vendor == "nvidia":
        spec["runtimeClassName"] = NVIDIA_RUNTIME_CLASS
    elif target.vendor == "amd":
        spec["securityContext"] = {"supplementalGroups": list(AMD_SUPPLEMENTAL_GROUPS)}
    if s.serverless.min_replicas > 1:
        sel = {"matchLabels": {labels.APP_INSTANCE: m.name, labels.MODEL: m.name}}
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": sel, "topologyKey": "kubernetes.io/hostname"}]}}
        spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                              "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": sel}]
    return spec


def model_deployment(m: Model, owner: Mapping[str, Any], target: Target, vol: ModelVolume, *, replicas: int,
                     settings: OperatorSettings, lora_adapters: int = 0,
                     flash: FlashLoader | None = None) -> dict[str, Any]:
    """The Deployment ``<n>`` of a Model."""
    pod_annotations = {labels.MODEL: m.name, labels.BACKEND: m.spec.backend}
    if m.spec.gpu.vram_estimate_mb:
        pod_annotations[labels.VRAM_ESTIMATE_MB] = str(m.spec.gpu.vram_estimate_mb)
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": selector_labels(m)},
        "template": {"metadata": {"labels": object_labels(m), "annotations": pod_annotations},
                     "spec": pod_spec(m, target, vol, settings=settings, lora_adapters=lora_adapters, flash=flash)},
    }
    if target.gpu:
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": meta(m.name, m.namespace, object_labels(m), owner,
                             {labels.LITELLM_CAPABILITIES: capabilities_json(m)}),
            "spec": spec}


# ---- Service ------------------------------------------------------------------------------------------

def service_annotations(m: Model, active_services: str | None) -> dict[str, str | None]:
    """The Service annotations the operator manages; None removes one that no longer applies."""
    s = m.spec
    ll = s.litellm
    on = ll.declared and ll.enabled
    served = (ll.served_model_name or m.name) if on else None
    aliases = sorted(set(s.service_labels) | set(ll.aliases)) if on else []
    aliases = [a for a in aliases if a != served]
    return {
        labels.LITELLM_SERVED_MODEL: served,
        labels.LITELLM_ALIASES: ",".join(aliases) if aliases else None,
        labels.LITELLM_COPILOT_MODEL: ll.copilot_alias if on else None,
        labels.SERVICE_LABELS: ",".join(s.service_labels) if s.service_labels else None,
        labels.ACTIVE_SERVICES: active_services if s.gpu.shared else None,
    }


def model_service(m: Model, owner: Mapping[str, Any], *, active_services: str | None = None) -> dict[str, Any]:
    """The ClusterIP Service ``<n>`` (port ``http``); ``active_services`` for shared-group members."""
    port = m.spec.backend_def.port
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": meta(m.name, m.namespace, object_labels(m), owner, service_annotations(m, active_services)),
            "spec": {"type": "ClusterIP", "selector": selector_labels(m),
                     "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}]}}


# ---- PVC --------------------------------------------------------------------------------------------------

def pvc(name: str, namespace: str, lbls: Mapping[str, str], owner: Mapping[str, Any] | None, *, size: str,
        storage_class: str | None, access_mode: str = "ReadWriteOnce") -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": [access_mode], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(name, namespace, lbls, owner),
            "spec": spec}


def model_cache_pvc(m: Model, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The cache PVC ``<n>-cache`` (created only when ``cache.pvcName`` is not given)."""
    return pvc(f"{m.name}-cache", m.namespace, object_labels(m), owner, size=m.spec.cache.size,
               storage_class=m.spec.cache.storage_class)

