"""ModelDeployment (v1alpha1, legacy): Deployment, Service and PVC, idle scale-down, benchmark gate.

Owns (``shared/reference/flexinfer-upstream.md`` §2.6): the finalizer ``flexinfer.ai/cleanup``;
validation (the typed view; a failure sets Failed and is not retried); the PVC ``<md>`` (skipped with
``modelCacheRef``, which must name a Ready ModelCache, and for diffusers/comfyui); the Deployment and
the Service (labels ``app=<md>``, ``modeldeployment_cr=<md>``; LiteLLM annotations; for GPU-group
members ``ai.flexinfer/active-services`` while active); the benchmark gate when ``spec.benchmark`` is
given (Job ``<md>-benchmark`` until the ConfigMap ``<md>-benchmark-results`` exists, then
``status.tokensPerSecond`` and Event ``BenchmarkComplete``; Ready waits for it); idle scale-down
(minReplicas 0 and ``lastAccessTime`` older than ``idleTimeoutSeconds``: ``spec.replicas`` = min,
guarded by the resourceVersion so a concurrent wake-up wins; skipped for GPU-group members, whose
replicas the GPUGroup sets); status with the scale subresource fields (replicas, selector).

Pure parts: ``md_*`` builders and ``idle_scale_down``. Must not: choose GPU-group leaders.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from flexinfer import labels
from flexinfer.api import ModelCache, ModelDeployment, SpecError
from flexinfer.api.conditions import READY, ConditionSet
from flexinfer.backends import ImageNotConfigured, LaunchContext, get_backend
from flexinfer.operator import builders, jobs
from flexinfer.operator.api_resources import (
    CONFIGMAP,
    DEPLOYMENT,
    GPU_GROUP,
    JOB,
    MODEL_CACHE,
    MODEL_DEPLOYMENT,
    PVC,
    SERVICE,
)
from flexinfer.operator.config import OperatorSettings
from flexinfer.operator.context import Operator
from flexinfer.operator.results import Event, Result

FINALIZER = labels.FINALIZER_LEGACY
APP = "modeldeployment"
NO_PVC_BACKENDS = frozenset({"diffusers", "comfyui"})


def md_selector(name: str) -> dict[str, str]:
    return {labels.APP_NAME: APP, labels.APP_INSTANCE: name}


def md_labels(name: str) -> dict[str, str]:
    return {**md_selector(name), labels.MANAGED_BY: labels.MANAGED_BY_VALUE, "app": name,
            labels.MODELDEPLOYMENT_CR: name}


def md_model_path(md: ModelDeployment, cache: ModelCache | None) -> str:
    if cache is not None:
        return cache.status.path or f"{builders.MODELS_DIR}/{(cache.spec.model_path or cache.meta.name).strip('/')}"
    return md.spec.model


def md_volume_claim(md: ModelDeployment, cache: ModelCache | None) -> str | None:
    if cache is not None:
        return cache.spec.existing_claim_name or cache.meta.name
    if md.spec.backend in NO_PVC_BACKENDS:
        return None
    return md.meta.name


def md_deployment(md: ModelDeployment, owner: Mapping[str, Any], *, image: str, replicas: int, claim: str | None,
                  model_path: str, settings: OperatorSettings) -> dict[str, Any]:
    s = md.spec
    backend = get_backend(s.backend)
    vendor = s.gpu_vendor
    ctx = LaunchContext(model_path=model_path, config=s.backend_config(), vendor=vendor, gpu_count=s.gpu_count,
                        served_name=s.model)
    container: dict[str, Any] = {
        "name": builders.CONTAINER, "image": image, "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": backend.port, "protocol": "TCP"}],
        "env": [{"name": k, "value": v} for k, v in sorted(backend.env(ctx).items())],
        "readinessProbe": backend.readiness_probe().to_k8s(),
    }
    cmd, args = backend.command(ctx), backend.args(ctx)
    if cmd:
        container["command"] = cmd
    if args:
        container["args"] = args
    res = s.resources.to_k8s()
    if res:
        container["resources"] = res
    mounts = [{"name": "shm", "mountPath": builders.SHM_DIR}]
    volumes: list[dict[str, Any]] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}}]
    if claim:
        mounts.insert(0, {"name": "model", "mountPath": builders.MODELS_DIR})
        volumes.insert(0, {"name": "model", "persistentVolumeClaim": {"claimName": claim}})
    container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"automountServiceAccountToken": False, "containers": [container], "volumes": volumes}
    gpu = vendor in ("nvidia", "amd")
    if gpu:
        pod["tolerations"] = [dict(builders.GPU_TOLERATION)]
    if vendor == "nvidia":
        pod["runtimeClassName"] = builders.NVIDIA_RUNTIME_CLASS
    elif vendor == "amd":
        pod["securityContext"] = {"supplementalGroups": list(builders.AMD_SUPPLEMENTAL_GROUPS)}
    if s.node_selector:
        pod["nodeSelector"] = dict(s.node_selector)
    spec: dict[str, Any] = {"replicas": replicas, "selector": {"matchLabels": md_selector(md.meta.name)},
                            "template": {"metadata": {"labels": md_labels(md.meta.name)}, "spec": pod}}
    if gpu:
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": builders.meta(md.meta.name, md.meta.namespace, md_labels(md.meta.name), owner), "spec": spec}


def md_service(md: ModelDeployment, owner: Mapping[str, Any], *, active: bool | None) -> dict[str, Any]:
    """``active``: None outside a GPU group; else whether this member holds the group's GPU."""
    s = md.spec
    port = get_backend(s.backend).port
    ll = s.litellm
    on = ll.declared and ll.enabled
    served = (ll.served_model_name or md.meta.name) if on else None
    aliases = sorted((set(s.service_labels) | set(ll.aliases)) - {served}) if on else []
    ann: dict[str, str | None] = {
        labels.LITELLM_SERVED_MODEL: served,
        labels.LITELLM_ALIASES: ",".join(aliases) if aliases else None,
        labels.LITELLM_COPILOT_MODEL: ll.copilot_alias if on else None,
        labels.SERVICE_LABELS: ",".join(s.service_labels) if s.service_labels else None,
        labels.ACTIVE_SERVICES: ",".join(s.service_labels) if active else None,
    }
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": builders.meta(md.meta.name, md.meta.namespace, md_labels(md.meta.name), owner, ann),
            "spec": {"type": "ClusterIP", "selector": md_selector(md.meta.name),
                     "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}]}}


def idle_scale_down(md: ModelDeployment, now: datetime) -> tuple[int | None, float | None]:
    """(new spec.replicas or None, seconds until the next look) for the idle rule."""
    s = md.spec
    if s.gpu_group_ref or s.min_replicas > 0 or s.replicas <= s.min_replicas:
        return None, None
    last = md.status.last_access_time
    if last is None:
        return None, None
    idle = (now - last).total_seconds()
    if idle > s.idle_timeout_s:
        return s.min_replicas, None
    return None, max(1.0, s.idle_timeout_s / 2)


def _status(body: Mapping[str, Any], now: datetime, *, phase: str, ready: bool, reason: str, message: str,
            extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    gen = (body.get("metadata") or {}).get("generation") or 0
    conds = ConditionSet((body.get("status") or {}).get("conditions"), gen, now)
    conds.set(READY, "True" if ready else "False", reason, message)
    return {"observedGeneration": gen, "phase": phase, "conditions": conds.to_list(), **(extra or {})}


async def _write(op: Operator, body: Mapping[str, Any], status: dict[str, Any]) -> None:
    old = body.get("status") or {}
    after = await op.w.patch_status(MODEL_DEPLOYMENT, body, status)
    if after is None:
        return
    if status["phase"] == "Failed" and old.get("phase") != "Failed":
        c = status["conditions"][-1]
        op.record(after, Event("Warning", c["reason"], c["message"]))
    if status.get("tokensPerSecond") is not None and old.get("tokensPerSecond") is None:
        op.record(after, Event("Normal", "BenchmarkComplete", f"{status['tokensPerSecond']:g} tokens/s"))


async def reconcile_md(op: Operator, key: tuple[str, str]) -> Result:
    ns, name = key
    st = op.store
    body = st.get(MODEL_DEPLOYMENT, ns, name)
    if body is None:
        return Result()
    now = op.clock()
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        await _cleanup(op, body)
        return Result()
    try:
        md = ModelDeployment.from_obj(body)
        image = get_backend(md.spec.backend).image(md.spec.gpu_vendor, "", env=op.settings.images).image
    except (SpecError, ImageNotConfigured) as e:
        reason, msg = getattr(e, "reason", "ImageNotConfigured"), str(e)
        await _write(op, body, _status(body, now, phase="Failed", ready=False, reason=reason, message=msg))
        return Result(permanent=f"{reason}: {msg}")
    w = op.w
    body = await w.add_finalizer(MODEL_DEPLOYMENT, body, FINALIZER)
    s = md.spec
    cache = None
    if s.model_cache_ref:
        raw = st.get(MODEL_CACHE, ns, s.model_cache_ref)
        try:
            cache = ModelCache.from_obj(raw) if raw is not None else None
        except SpecError:
            cache = None
        if cache is None or not cache.status.ready:
            msg = f"waiting for ModelCache {s.model_cache_ref} to be Ready"
            await _write(op, body, _status(body, now, phase="Pending", ready=False, reason="CacheNotReady", message=msg))
            return Result(op.settings.resync_s)
    claim = md_volume_claim(md, cache)
    if claim and cache is None:
        await w.create_if_missing(PVC, builders.pvc(claim, ns, md_labels(name), body, size="50Gi", storage_class=None))
    replicas = s.replicas
    new_replicas, requeue = idle_scale_down(md, now)
    if new_replicas is not None:
        after = await w.patch(MODEL_DEPLOYMENT, body, {"spec": {"replicas": new_replicas}}, guard=True)
        if after is not None:
            body, replicas = after, new_replicas
            op.record(after, Event("Normal", "ScaledDown", f"idle for more than {s.idle_timeout_s:g}s: "
                                                           f"{new_replicas} replica(s)"))
    active: bool | None = None
    if s.gpu_group_ref:
        grp = st.get(GPU_GROUP, ns, s.gpu_group_ref)
        active = ((grp or {}).get("status") or {}).get("activeModel") == name
    await w.ensure(SERVICE, md_service(md, body, active=active))
    _, dep = await w.ensure(DEPLOYMENT, md_deployment(md, body, image=image, replicas=replicas, claim=claim,
                                                      model_path=md_model_path(md, cache), settings=op.settings),
                            immutable=("selector",))
    tps: float | None = None
    bench_needed = "benchmark" in (body.get("spec") or {})
    if bench_needed:
        cm = st.get(CONFIGMAP, ns, f"{name}{labels.BENCHMARK_CONFIGMAP_SUFFIX}")
        if cm is None:
            b = s.benchmark
            await w.create_if_missing(JOB, jobs.benchmark_job(
                name, ns, backend=s.backend, obj_labels=md_labels(name), owner=body, warmup=b.warmup_iterations,
                iterations=b.iterations, min_duration_s=b.min_duration_s, max_tokens=b.batch_size,
                node_selector=None, settings=op.settings))
        else:
            try:
                tps = float((cm.get("data") or {}).get(labels.TOKENS_PER_SECOND) or "nan")
            except ValueError:
                tps = None
            if tps is not None and tps != tps:
                tps = None
    dst = dep.get("status") or {}
    ready_replicas = int(dst.get("readyReplicas") or 0)
    sel = ",".join(f"{k}={v}" for k, v in md_selector(name).items())
    extra: dict[str, Any] = {"replicas": int(dst.get("replicas") or 0), "readyReplicas": ready_replicas,
                             "selector": sel, "endpoints": {"internal": f"http://{name}.{ns}.svc.cluster.local:"
                                                                        f"{get_backend(s.backend).port}"}}
    if tps is not None:
        extra["tokensPerSecond"] = tps
    if replicas == 0:
        status = _status(body, now, phase="Running" if ready_replicas else "Pending", ready=False, reason="Idle",
                         message="scaled to zero; the first request wakes it", extra=extra)
    elif ready_replicas == 0:
        status = _status(body, now, phase="Pending", ready=False, reason="StartingBackend",
                         message=f"starting {replicas} replica(s)", extra=extra)
    elif bench_needed and tps is None:
        status = _status(body, now, phase="Running", ready=False, reason="BenchmarkPending",
                         message="waiting for the benchmark results", extra=extra)
    else:
        status = _status(body, now, phase="Running", ready=True, reason="Ready",
                         message=f"{ready_replicas} replica(s) ready", extra=extra)
    await _write(op, body, status)
    nxt = op.settings.resync_s if requeue is None else min(requeue, op.settings.resync_s)
    return Result(nxt)


async def _cleanup(op: Operator, body: Mapping[str, Any]) -> None:
    md = body.get("metadata") or {}
    if FINALIZER not in (md.get("finalizers") or ()):
        return
    ns, uid = str(md.get("namespace") or "default"), md.get("uid")
    for kind in (DEPLOYMENT, SERVICE, PVC, JOB):
        for obj in op.store.list(kind, ns):
            owners = (obj.get("metadata") or {}).get("ownerReferences") or ()
            if any(isinstance(o, Mapping) and o.get("uid") == uid for o in owners):
                await op.w.delete(kind, obj)
    await op.w.remove_finalizer(MODEL_DEPLOYMENT, body, FINALIZER)
