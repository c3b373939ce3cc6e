"""Pure placement logic of the scheduler extender: node/pod facts, ``filter_nodes``, ``score_nodes``.

Everything here is a function of (pod, nodes, benchmark data, tenant usage, settings): no I/O, no
clock, no globals that change. The server gathers the inputs (``inventory.py``) and renders the
outputs (``wire.py``). Results never depend on the order of the nodes.

Filter (per node; every failing node gets a reason):

- the node must carry ``flexinfer.ai/gpu.vendor`` (the agent reported a GPU);
- a pod asking for ``nvidia.com/gpu`` or ``amd.com/gpu`` needs a node of that vendor;
- a node labelled ``flexinfer.ai/spot-terminating`` is refused;
- with pod annotation ``flexinfer.ai/gpu.vram-estimate-mb`` and node annotation
  ``flexinfer.ai/gpu-free-memory`` both readable: free ≥ estimate × GPU count (an unknown free
  amount passes: the agent has not reported yet);
- pod annotation ``flexinfer.ai/backend`` must support the node's ``flexinfer.ai/gpu.arch``.

Vendor, arch and spot failures also go to ``FailedAndUnresolvableNodes`` (preempting pods cannot fix
them); a VRAM shortfall is resolvable.

Score (raw, per node) = tps·wTPS − util·wUtil − cost·wCost − kv·wCache + freeRatio·wVRAM
− max(0, kv − 0.85)·20 + tenantAdj. Then **normalisation** to kube-scheduler's integer range 0..10:
min-max over the scored nodes, ``floor(10·(s − min)/(max − min) + 0.5)`` (round half up); when every
node has the same raw score they all get 10. This keeps the best node at 10 and the worst at 0 for
every pod, so the extender's weight in the scheduler config means the same thing for every pod.
Note: the tenant term is the same for every node of one pod, so after normalisation it cannot change
a placement (the original had the same property relative to other nodes); it is kept in the raw
score and exported as gauges.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from typing import Any, cast

import msgspec
from msgspec.structs import force_setattr

from flexinfer import labels, units
from flexinfer.backends import Support, UnknownBackendError, canonical_name, support_level
from flexinfer.scheduler.settings import ExtenderSettings

# ---- small parsers ----------------------------------------------------------------------------------


def parse_float(raw: Any) -> float | None:
    """A finite float from a label/annotation value, or None."""
    if raw is None or isinstance(raw, bool):
        return None
    try:
        v = float(str(raw).strip())
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def parse_quantity_int(raw: Any) -> int | None:
    """A non-negative integer extended-resource quantity (``"1"``, ``"2"``, ``2``), or None."""
    try:
        q = units.parse_quantity(raw)
    except ValueError:
        return None
    return int(q) if q >= 0 and q == q.to_integral_value() else None


_GI = Decimal(2**30)


def parse_vram_gi(raw: Any) -> float | None:
    """``"24Gi"`` → 24.0, ``"24576Mi"`` → 24.0, ``"24"`` → 24.0 (a bare number is GiB); None when unreadable."""
    if not isinstance(raw, str):
        return None
    try:
        q = units.parse_quantity(raw)
    except ValueError:
        return None
    if q < 0:
        return None
    return float(q) if raw.strip()[-1] in "0123456789." else float(q / _GI)


# ---- backend / arch compatibility ---------------------------------------------------------------------
# The support matrix lives in the backend registry (flexinfer.backends.compat); only the lookup is here.

UNSUPPORTED = Support.UNSUPPORTED.value


def canonical_backend(name: str) -> str:
    """Canonical backend name (``llama.cpp`` → ``llamacpp``); unknown names are lower-cased as is."""
    try:
        return canonical_name(name)
    except UnknownBackendError:
        return name.strip().lower()


@lru_cache(maxsize=1024)
def compat_level(backend: str, arch: str) -> str:
    """``full`` | ``experimental`` | ``unsupported`` for a backend on a GPU arch (unknown → full)."""
    if not arch:
        return Support.FULL.value
    return support_level(canonical_backend(backend), arch.strip()).value


# ---- facts ------------------------------------------------------------------------------------------------


class NodeFacts(msgspec.Struct, frozen=True, gc=False):
    """What the extender needs to know about one node, parsed once from its labels/annotations.

    A ``msgspec.Struct`` with ``gc=False``: it holds only atomic values, so the garbage collector
    never tracks it; the extender keeps tens of thousands (inventory, NodeList facts cache), which as
    tracked objects made every full collection cost 10-30 ms (reliability plan F20)."""

    name: str
    vendor: str | None = None
    arch: str | None = None
    vram_gi: float | None = None
    count: int = 1
    free_mb: float | None = None
    util: float = 0.0
    kv: float = 0.0
    cost: float = 0.0
    spot: bool = False
    device_class: str = ""
    free_ratio: float = 0.0  # derived from the fields above (set in __post_init__)

    def __post_init__(self) -> None:
        force_setattr(self, "free_ratio", free_ratio(self))


def _str_map(raw: Any) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def device_class(node_labels: Mapping[str, Any]) -> str:
    """The device class the bench runner keys results by (:func:`flexinfer.labels.device_class_from_labels`)."""
    return labels.device_class_from_labels(node_labels)


def _truthy(raw: Any) -> bool:
    return str(raw).strip().lower() in ("true", "1", "yes", "on") if raw is not None else False


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """Facts of a raw ``v1.Node`` dict; unreadable values fall back to neutral defaults."""
    meta = _str_map(node.get("metadata"))
    lab = _str_map(meta.get("labels"))
    ann = _str_map(meta.get("annotations"))
    vendor = lab.get(labels.GPU_VENDOR)
    count = parse_quantity_int(lab.get(labels.GPU_COUNT))
    util = parse_float(ann.get(labels.GPU_UTIL))
    kv = parse_float(ann.get(labels.KV_CACHE_USAGE))
    cost = parse_float(ann.get(labels.COST)) if labels.COST in ann else parse_float(lab.get(labels.COST))
    return NodeFacts(
        name=str(meta.get("name") or ""),
        vendor=str(vendor) if vendor else None,
        arch=str(lab.get(labels.GPU_ARCH)) if lab.get(labels.GPU_ARCH) else None,
        vram_gi=parse_vram_gi(lab.get(labels.GPU_VRAM)),
        count=count if count else 1,
        free_mb=parse_float(ann.get(labels.GPU_FREE_MEMORY)),
        util=min(max(util, 0.0), 100.0) if util is not None else 0.0,
        kv=min(max(kv, 0.0), 1.0) if kv is not None else 0.0,
        cost=cost if cost is not None else 0.0,
        spot=_truthy(lab.get(labels.SPOT_TERMINATING)) or _truthy(ann.get(labels.SPOT_TERMINATING)),
        device_class=device_class(lab),
    )


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the extender needs to know about the pod being scheduled."""

    namespace: str = "default"
    name: str = ""
    backend: str | None = None
    model: str | None = None
    vram_estimate_mb: float | None = None
    gpu_count: int = 1
    gpu_resource: str | None = None
    tenant: str = "default"
    deployment: str | None = None


def gpu_resources(pod: Mapping[str, Any]) -> tuple[int, str | None]:
    """(GPU count, first GPU resource name) from limits, else requests; (0, None) when none.

    Effective count = max(sum over containers, max over init containers), as kube-scheduler counts.
    """
    spec = _str_map(pod.get("spec"))
    found: str | None = None

    def count(containers: Any) -> list[int]:
        nonlocal found
        out = []
        for c in containers if isinstance(containers, list) else []:
            res = _str_map(_str_map(c).get("resources"))
            n = 0
            for res_name in labels.GPU_RESOURCES:
                q = parse_quantity_int(_str_map(res.get("limits")).get(res_name))
                if q is None:
                    q = parse_quantity_int(_str_map(res.get("requests")).get(res_name))
                if q:
                    n += q
                    found = found or res_name
            out.append(n)
        return out

    total = sum(count(spec.get("containers")))
    init = max(count(spec.get("initContainers")), default=0)
    return max(total, init), found


def gpu_request(pod: Mapping[str, Any]) -> tuple[int, str | None]:
    """Like :func:`gpu_resources`, but a pod without any GPU resource counts as 1 GPU: every pod
    this extender places wants one."""
    n, found = gpu_resources(pod)
    return (n, found) if n > 0 else (1, found)


def pod_facts(pod: Mapping[str, Any], tenant_label_key: str = "") -> PodFacts:
    """Facts of a raw ``v1.Pod`` dict."""
    meta = _str_map(pod.get("metadata"))
    ann = _str_map(meta.get("annotations"))
    lab = _str_map(meta.get("labels"))
    namespace = str(meta.get("namespace") or "default")
    backend = ann.get(labels.BACKEND) or lab.get(labels.BACKEND)
    model = ann.get(labels.MODEL) or lab.get(labels.MODEL)
    est = parse_float(ann.get(labels.VRAM_ESTIMATE_MB))
    count, resource = gpu_request(pod)
    tenant = str(lab.get(tenant_label_key) or "") if tenant_label_key else ""
    return PodFacts(
        namespace=namespace,
        name=str(meta.get("name") or meta.get("generateName") or ""),
        backend=canonical_backend(str(backend)) if backend else None,
        model=str(model) if model else None,
        vram_estimate_mb=est if est is not None and est > 0 else None,
        gpu_count=count,
        gpu_resource=resource,
        tenant=tenant or namespace,
        deployment=str(lab[labels.MODELDEPLOYMENT_CR]) if lab.get(labels.MODELDEPLOYMENT_CR) else None,
    )


# ---- filter -------------------------------------------------------------------------------------------------

_RESOURCE_VENDOR = {labels.RESOURCE_NVIDIA_GPU: labels.VENDOR_NVIDIA, labels.RESOURCE_AMD_GPU: labels.VENDOR_AMD}

REASON_NO_VENDOR = "no_vendor"
REASON_VENDOR_MISMATCH = "vendor_mismatch"
REASON_SPOT = "spot_terminating"
REASON_VRAM = "insufficient_vram"
REASON_ARCH = "arch_unsupported"
REASON_UNKNOWN_NODE = "unknown_node"


@dataclass(slots=True)
class FilterOutcome:
    """Names that pass (input order), failure messages, unresolvable subset, reason codes."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    codes: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _PodCheck:
    """Per-request constants of the filter, computed once per pod."""

    want_vendor: str | None
    need_mb: float | None
    need_msg: str
    backend: str | None

    @classmethod
    def of(cls, pod: PodFacts) -> _PodCheck:
        need = pod.vram_estimate_mb * pod.gpu_count if pod.vram_estimate_mb is not None else None
        return cls(_RESOURCE_VENDOR.get(pod.gpu_resource or ""), need,
                   f" need {need:.0f} MB" if need is not None else "", pod.backend)


@lru_cache(maxsize=256)
def _mismatch_message(resource: str, vendor: str) -> str:
    return f"pod requests {resource} but the node's GPU vendor is {vendor}"


def _check(ctx: _PodCheck, pod: PodFacts, node: NodeFacts) -> list[tuple[str, str, bool]] | None:
    """Every reason ``node`` cannot take the pod, or None when it fits (the hot path)."""
    if not node.vendor:
        return [(REASON_NO_VENDOR, f"node has no {labels.GPU_VENDOR} label (no GPU reported)", True)]
    out: list[tuple[str, str, bool]] | None = None
    if ctx.want_vendor and node.vendor.upper() != ctx.want_vendor:
        out = [(REASON_VENDOR_MISMATCH, _mismatch_message(pod.gpu_resource or "", node.vendor), True)]
    if node.spot:
        out = (out or []) + [(REASON_SPOT, "node is spot-terminating", True)]
    if ctx.need_mb is not None and node.free_mb is not None and node.free_mb < ctx.need_mb:
        out = (out or []) + [(REASON_VRAM, f"insufficient free VRAM: have {node.free_mb:.0f} MB{ctx.need_msg}",
                              False)]
    if ctx.backend and node.arch and compat_level(ctx.backend, node.arch) == UNSUPPORTED:
        out = (out or []) + [(REASON_ARCH, f"backend {ctx.backend} does not support GPU arch {node.arch}", True)]
    return out


def check_node(pod: PodFacts, node: NodeFacts) -> list[tuple[str, str, bool]]:
    """Every reason ``node`` cannot take ``pod``: (code, message, unresolvable). Empty = fits."""
    return _check(_PodCheck.of(pod), pod, node) or []


def filter_nodes(pod: PodFacts, nodes: Iterable[NodeFacts]) -> FilterOutcome:
    """Split ``nodes`` into passing names and failures with reasons. Duplicate names: first wins."""
    out = FilterOutcome()
    ctx = _PodCheck.of(pod)
    seen: set[str] = set()
    passed = out.passed
    want, need, backend = ctx.want_vendor, ctx.need_mb, ctx.backend
    arch_ok: dict[str, bool] = {}
    for node in nodes:
        name = node.name
        if name in seen:
            continue
        seen.add(name)
        # Fast path: the same rules as _check, as one predicate (the tests check they agree).
        vendor, arch, free = node.vendor, node.arch, node.free_mb
        if vendor and not node.spot and (want is None or vendor.upper() == want) \
                and (need is None or free is None or free >= need):
            if not backend or not arch:
                passed.append(name)
                continue
            ok = arch_ok.get(arch)
            if ok is None:
                ok = arch_ok[arch] = compat_level(backend, arch) != UNSUPPORTED
            if ok:
                passed.append(name)
                continue
        problems = _check(ctx, pod, node)
        if problems is None:
            passed.append(name)
            continue
        if len(problems) == 1:
            code, msg, unresolvable = problems[0]
            out.failed[name] = msg
            out.codes[name] = [code]
            if unresolvable:
                out.unresolvable[name] = msg
            continue
        out.failed[name] = "; ".join(msg for _, msg, _ in problems)
        out.codes[name] = [code for code, _, _ in problems]
        hard = [msg for _, msg, unresolvable in problems if unresolvable]
        if hard:
            out.unresolvable[name] = "; ".join(hard)
    return out


# ---- score -----------------------------------------------------------------------------------------------


@lru_cache(maxsize=8192)
def _cached_bench_key(backend: str, model: str, device: str) -> str:
    return labels.bench_key(backend, model, device)


def node_tps(pod: PodFacts, node: NodeFacts, bench: Mapping[str, str] | None,
             fallback_tps: float | None) -> float:
    """Measured tokens/s for (backend, model, node's device class), else the deployment's, else 0."""
    if bench and pod.backend and pod.model:
        v = parse_float(bench.get(_cached_bench_key(pod.backend, pod.model, node.device_class)))
        if v is not None and v >= 0:
            return v
    return fallback_tps if fallback_tps is not None and fallback_tps >= 0 else 0.0


def free_ratio(node: NodeFacts) -> float:
    """free ÷ (per-GPU VRAM × 1024 × count), clamped to [0, 1]; 0 when unknown."""
    if node.free_mb is None or not node.vram_gi:
        return 0.0
    total = node.vram_gi * 1024.0 * max(node.count, 1)
    return min(max(node.free_mb / total, 0.0), 1.0) if total > 0 else 0.0


def tenant_adjustment(settings: ExtenderSettings, used_gpus: float) -> float:
    """(1 − used ÷ budget) × weight when fair share is on, else 0."""
    if not settings.tenant_fairshare_enabled or settings.tenant_budget_gpus <= 0:
        return 0.0
    return (1.0 - used_gpus / settings.tenant_budget_gpus) * settings.tenant_fairshare_weight


def static_score(node: NodeFacts, settings: ExtenderSettings) -> float:
    """The part of the raw score that depends on the node alone (the inventory caches it per node):
    − util·wUtil − cost·wCost − kv·wCache + freeRatio·wVRAM − max(0, kv − 0.85)·20."""
    score = (node.free_ratio * settings.vram_free_weight
             - node.util * settings.util_weight
             - node.cost * settings.cost_weight
             - node.kv * settings.cache_weight)
    if node.kv > settings.kv_penalty_threshold:
        score -= (node.kv - settings.kv_penalty_threshold) * settings.kv_penalty_weight
    return score


def raw_score(node: NodeFacts, tps: float, settings: ExtenderSettings, tenant_adj: float = 0.0) -> float:
    """The score formula before normalisation: tps·wTPS + static part + tenant term
    (:func:`raw_scores` computes exactly this, bit for bit)."""
    return tps * settings.tps_weight + static_score(node, settings) + tenant_adj


def normalise(raw: Mapping[str, float]) -> dict[str, int]:
    """Min-max to integers 0..10, round half up; all equal (or one node) → 10. Non-finite → 0."""
    if not raw:
        return {}
    vals = raw.values()
    if not math.isfinite(sum(vals)):  # some value is inf/nan (or the sum overflowed): careful path
        finite = {k: v for k, v in raw.items() if math.isfinite(v)}
        out = dict.fromkeys(raw, 0)
        out.update(normalise(finite) if finite else {})
        return out
    lo, hi = min(vals), max(vals)
    if hi == lo:
        return dict.fromkeys(raw, 10)
    span = hi - lo
    scale = 10.0 / span
    if not math.isfinite(scale):  # a subnormal span (10 / span overflows): divide each by it instead
        return {k: int((v - lo) / span * 10.0 + 0.5) for k, v in raw.items()}
    # (v - lo) * scale is in [0, 10 + tiny], so int(x + 0.5) is floor(x + 0.5) and never above 10.
    return {k: int((v - lo) * scale + 0.5) for k, v in raw.items()}


@dataclass(frozen=True, slots=True)
class ScoreInputs:
    """Data the score needs besides the pod and the nodes."""

    bench: Mapping[str, str] | None = None
    fallback_tps: float | None = None
    tenant_used_gpus: float = 0.0


def raw_scores(pod: PodFacts, nodes: Sequence[NodeFacts], settings: ExtenderSettings,
               inputs: ScoreInputs = ScoreInputs(), static: Mapping[str, float] | None = None) -> dict[str, float]:
    """Raw score per node name (duplicates: first wins), the same arithmetic as :func:`raw_score`.

    Column-wise (the per-node work in C where it can be: 5,000 nodes per call): tokens/s is looked
    up once per device class; ``static`` (name → :func:`static_score` of that very node, as the
    inventory and the NodeList facts cache keep it) saves recomputing the node-only part.
    """
    adj = tenant_adjustment(settings, inputs.tenant_used_gpus)
    wt = settings.tps_weight
    names = [n.name for n in nodes]
    classes = [n.device_class for n in nodes]
    firsts = dict(zip(reversed(classes), reversed(nodes), strict=True))  # a node of each class
    tps_wt = {c: node_tps(pod, n, inputs.bench, inputs.fallback_tps) * wt for c, n in firsts.items()}
    sts: list[float]
    if static:
        got = list(map(static.get, names))
        sts = [static_score(n, settings) if v is None else v for n, v in zip(nodes, got, strict=True)] \
            if None in got else cast("list[float]", got)
    else:
        sts = [static_score(n, settings) for n in nodes]
    vals = [tps_wt[c] + v + adj for c, v in zip(classes, sts, strict=True)]
    out = dict(zip(names, vals, strict=True))
    if len(out) != len(names):  # duplicate names: the first one's score
        out = {}
        for name, v in zip(names, vals, strict=True):
            out.setdefault(name, v)
    return out


def score_nodes(pod: PodFacts, nodes: Sequence[NodeFacts], settings: ExtenderSettings,
                inputs: ScoreInputs = ScoreInputs(), static: Mapping[str, float] | None = None) -> dict[str, int]:
    """Integer scores 0..10 per node name."""
    return normalise(raw_scores(pod, nodes, settings, inputs, static))
