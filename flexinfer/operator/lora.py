"""LoRAAdapter (v1alpha2): hot-load an adapter on every ready replica of its parent Model.

Owns (``shared/reference/flexinfer-upstream.md`` §2.7): the finalizer ``flexinfer.ai/lora-cleanup``
(on deletion the adapter is unloaded from every replica, best effort); a missing parent -> Failed
(``ModelNotFound``, looked at again in 30 s); a backend without LoRA support -> Failed
(``BackendUnsupported``); a parent that is not Ready or has no ready endpoints -> Pending; otherwise
``POST http://<pod>:<port>/v1/load_lora_adapter`` ``{lora_name, lora_path, max_lora_rank?}`` on each
ready address of the parent's Endpoints that does not have it yet. All loaded -> Loaded; some ->
Loaded "partially loaded (k/n)"; none -> Failed (Event ``LoadFailed``). A 400 saying the adapter is
already loaded counts as loaded (after an operator restart). The HTTP call is injectable
(``Operator.http_post``). The parent Model gets ``--enable-lora --max-loras`` from the count of its
adapters (``model.gather``).

Pure parts: ``endpoint_targets``, ``load_request``, ``summarize``. Must not: parse Models' rules.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from flexinfer import labels
from flexinfer.api import LoRAAdapter, SpecError
from flexinfer.api.conditions import LOADED, READY, ConditionSet, ConditionStatus
from flexinfer.api.lora import LoRAAdapterSpec
from flexinfer.backends import UnknownBackendError, get_backend
from flexinfer.operator.api_resources import ENDPOINTS, LORA, MODEL
from flexinfer.operator.context import Operator
from flexinfer.operator.results import Event, Result

log = logging.getLogger("flexinfer.operator.lora")
FINALIZER = labels.FINALIZER_LORA
MODEL_NOT_FOUND_REQUEUE_S = 30.0


def endpoint_targets(endpoints: Mapping[str, Any] | None, default_port: int) -> list[str]:
    """``ip:port`` of every ready address of an Endpoints object (port ``http`` when named)."""
    out: list[str] = []
    for subset in (endpoints or {}).get("subsets") or ():
        ports = subset.get("ports") or ()
        port = next((p.get("port") for p in ports if p.get("name") == "http"), None)
        if port is None and ports:
            port = ports[0].get("port")
        for addr in subset.get("addresses") or ():
            if addr.get("ip"):
                out.append(f"{addr['ip']}:{port or default_port}")
    return sorted(set(out))


def load_request(spec: LoRAAdapterSpec) -> dict[str, Any]:
    body: dict[str, Any] = {"lora_name": spec.adapter_name, "lora_path": spec.source_uri}
    if spec.max_rank:
        body["max_lora_rank"] = spec.max_rank
    return body


def load_ok(status: int, text: str) -> bool:
    return 200 <= status < 300 or (status == 400 and "already" in text.lower())


def summarize(total: int, loaded: int, error: str) -> tuple[str, str, str]:
    """(phase, reason, message) after loading on ``total`` replicas, ``loaded`` of which succeeded."""
    if loaded >= total:
        return "Loaded", "Loaded", f"loaded on {loaded}/{total} replica(s)"
    if loaded > 0:
        return "Loaded", "PartiallyLoaded", f"partially loaded ({loaded}/{total} replicas): {error}"
    return "Failed", "LoadFailed", f"load failed on all {total} replica(s): {error}"


def _status(body: Mapping[str, Any], phase: str, reason: str, message: str, now: Any, *, loaded: int = 0,
            total: int = 0) -> dict[str, Any]:
    md = body.get("metadata") or {}
    gen = md.get("generation") if isinstance(md.get("generation"), int) else 0
    conds = ConditionSet((body.get("status") or {}).get("conditions"), gen, now)
    ok: ConditionStatus = "True" if phase == "Loaded" else "False"
    conds.set(LOADED, ok, reason, message)
    conds.set(READY, ok, reason, message)
    return {"observedGeneration": gen, "phase": phase, "conditions": conds.to_list(),
            "loadedReplicas": loaded, "totalReplicas": total, "message": message[:32768]}


async def _write(op: Operator, body: Mapping[str, Any], status: dict[str, Any]) -> None:
    old_phase = (body.get("status") or {}).get("phase")
    after = await op.w.patch_status(LORA, body, status)
    if after is None or old_phase == status["phase"]:
        return
    reason = status["conditions"][-1]["reason"] if status["conditions"] else status["phase"]
    if status["phase"] == "Failed":
        op.record(after, Event("Warning", reason, status["message"]))
    elif status["phase"] == "Loaded":
        op.record(after, Event("Normal", reason, status["message"]))


async def reconcile_lora(op: Operator, key: tuple[str, str]) -> Result:
    ns, name = key
    body = op.store.get(LORA, ns, name)
    if body is None:
        op.lora_loaded.pop(key, None)
        return Result()
    now = op.clock()
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        if FINALIZER not in ((body.get("metadata") or {}).get("finalizers") or ()):
            return Result()
        await _unload_all(op, body)
        await op.w.remove_finalizer(LORA, body, FINALIZER)
        op.lora_loaded.pop(key, None)
        return Result()
    try:
        lora = LoRAAdapter.from_obj(body)
    except SpecError as e:
        await _write(op, body, _status(body, "Failed", e.reason, e.message, now))
        return Result(permanent=f"{e.reason}: {e.message}")
    body = await op.w.add_finalizer(LORA, body, FINALIZER)
    parent = op.store.get(MODEL, ns, lora.spec.model_ref)
    if parent is None or (parent.get("metadata") or {}).get("deletionTimestamp"):
        await _write(op, body, _status(body, "Failed", "ModelNotFound",
                                       f"Model {lora.spec.model_ref} not found in {ns}", now))
        return Result(MODEL_NOT_FOUND_REQUEUE_S)
    try:
        backend = get_backend(str((parent.get("spec") or {}).get("backend") or ""))
    except UnknownBackendError as e:
        await _write(op, body, _status(body, "Failed", "BackendUnsupported", str(e), now))
        return Result()
    if not backend.supports_lora:
        await _write(op, body, _status(body, "Failed", "BackendUnsupported",
                                       f"backend {backend.name} of Model {lora.spec.model_ref} cannot load LoRA "
                                       "adapters", now))
        return Result()
    targets = endpoint_targets(op.store.get(ENDPOINTS, ns, lora.spec.model_ref), backend.port)
    loaded = op.lora_loaded.setdefault(key, set())
    loaded &= set(targets)
    if (parent.get("status") or {}).get("phase") != "Ready" or not targets:
        await _write(op, body, _status(body, "Pending", "ParentNotReady",
                                       f"waiting for Model {lora.spec.model_ref} to be Ready", now,
                                       loaded=len(loaded), total=len(targets)))
        return Result(op.settings.lora_pending_requeue_s)
    request = load_request(lora.spec)
    errors: list[str] = []
    for t in targets:
        if t in loaded:
            continue
        code, text = await op.http_post(f"http://{t}{backend.lora_load_path}", request, op.settings.lora_timeout_s)
        if load_ok(code, text):
            loaded.add(t)
        else:
            errors.append(f"{t}: {code or 'no answer'} {text[:200]}".strip())
    phase, reason, message = summarize(len(targets), len(loaded), "; ".join(errors))
    await _write(op, body, _status(body, phase, reason, message, now, loaded=len(loaded), total=len(targets)))
    return Result(op.settings.lora_requeue_s)


async def _unload_all(op: Operator, body: Mapping[str, Any]) -> None:
    """Best effort: unload from every ready replica of the parent (it may be gone already)."""
    spec = body.get("spec") or {}
    ns = (body.get("metadata") or {}).get("namespace") or "default"
    parent = op.store.get(MODEL, ns, str(spec.get("modelRef") or ""))
    if parent is None:
        return
    try:
        backend = get_backend(str((parent.get("spec") or {}).get("backend") or ""))
    except UnknownBackendError:
        return
    if not backend.supports_lora:
        return
    for t in endpoint_targets(op.store.get(ENDPOINTS, ns, str(spec.get("modelRef"))), backend.port):
        code, text = await op.http_post(f"http://{t}{backend.lora_unload_path}",
                                        {"lora_name": spec.get("adapterName")}, op.settings.lora_timeout_s)
        if not (200 <= code < 300):
            log.info("unloading %s from %s: %s %s", spec.get("adapterName"), t, code, text[:200])


def adapters_of(loras: Iterable[Mapping[str, Any]], model: str) -> list[str]:
    """Names of the LoRAAdapters referencing ``model``."""
    return [str((lo.get("metadata") or {}).get("name")) for lo in loras
            if (lo.get("spec") or {}).get("modelRef") == model]
