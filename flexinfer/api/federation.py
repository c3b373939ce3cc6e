"""The federation CRDs (ai.flexinfer/v1alpha2): ``Cluster``, ``FederatedModel`` and ``GlobalProxy``.

Owns: their schemas, CEL rules (the original's ``ValidateBasic`` checks expressed as CEL), printer
columns and typed views, and the pure ``LabelSelector.matches`` used for cluster placement.

Must not: import Kubernetes clients, open kubeconfigs or probe clusters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer.api.common import (
    INVALID_SPEC,
    V1ALPHA2,
    ObjectMeta,
    SpecError,
    check_kind,
    frozen_map,
    opt_time,
    parse_duration,
)
from flexinfer.api.conditions import Condition, parse_conditions
from flexinfer.api.model import MODEL_SPEC
from flexinfer.api.model_view import ModelSpec, resolve_backend
from flexinfer.api.schema import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    Column,
    KindDef,
    array,
    boolean,
    conditions,
    date_time,
    duration,
    integer,
    label_selector,
    number,
    obj,
    observed_generation,
    quantity,
    rule,
    secret_ref,
    string,
    string_map,
)
from flexinfer.api.validate import validate, validate_lenient

#: Pending, NotReady and Unknown are kept for existing objects; the operator writes the last four
CLUSTER_PHASES = ("Pending", "Ready", "NotReady", "Unknown", "Unreachable", "Unauthorized", "Invalid")
FED_STRATEGIES = ("RoundRobin", "Latency", "Weighted", "Failover")
PROXY_STRATEGIES = ("RoundRobin", "Failover", "Latency")

# ---- CEL rules ------------------------------------------------------------------------------------


def _failover_has_order(s: dict[str, Any]) -> bool:
    return s.get("strategy") != "Failover" or bool(s.get("failoverOrder"))


def _weighted_has_weights(s: dict[str, Any]) -> bool:
    return s.get("strategy") != "Weighted" or bool(s.get("weights"))


def _placement_targets(p: dict[str, Any]) -> bool:
    return bool(p.get("clusters")) or "clusterSelector" in p


def _latency_no_order(s: dict[str, Any]) -> bool:
    return s.get("strategy") != "Latency" or not s.get("failoverOrder")


def _order_known(s: dict[str, Any]) -> bool:
    names = {c.get("name") for c in s.get("clusters") or ()}
    return all(n in names for n in s.get("failoverOrder") or ())


FAILOVER_ORDER_RULE = rule("self.strategy != 'Failover' || (has(self.failoverOrder) && size(self.failoverOrder) > 0)",
                           "strategy Failover needs failoverOrder", _failover_has_order, field_path=".failoverOrder")
WEIGHTS_RULE = rule("self.strategy != 'Weighted' || (has(self.weights) && size(self.weights) > 0)",
                    "strategy Weighted needs weights", _weighted_has_weights, field_path=".weights")
PLACEMENT_RULE = rule("(has(self.clusters) && size(self.clusters) > 0) || has(self.clusterSelector)",
                      "placement needs clusters or clusterSelector", _placement_targets)
LATENCY_RULE = rule("self.strategy != 'Latency' || !has(self.failoverOrder) || size(self.failoverOrder) == 0",
                    "strategy Latency takes no failoverOrder", _latency_no_order, field_path=".failoverOrder")
ORDER_KNOWN_RULE = rule("!has(self.failoverOrder) || self.failoverOrder.all(n, self.clusters.exists(c, c.name == n))",
                        "failoverOrder may only name clusters of spec.clusters", _order_known,
                        field_path=".failoverOrder")

# ---- Cluster --------------------------------------------------------------------------------------

CLUSTER_SPEC = obj("A remote cluster FlexInfer can place models on.", {
    "apiEndpoint": string("Kubernetes API URL of the cluster (https).", pattern=r"^https://[^/\s]+(/\S*)?$",
                          max_length=2048),
    "secretRef": secret_ref("Secret with a kubeconfig (key kubeconfig, config or value, or the only key).",
                            with_key=True),
    "labels": string_map("Labels FederatedModel placement selects on (region, tier, ...).", max_properties=64),
    "probeInterval": duration("Time between health probes.", default="30s"),
}, required=["apiEndpoint", "secretRef"])

CLUSTER_STATUS = obj("Observed state of a remote cluster.", {
    "observedGeneration": observed_generation(),
    "phase": string("Health.", enum=CLUSTER_PHASES),
    "conditions": conditions(),
    "serverVersion": string("Kubernetes version reported by the cluster."),
    "capacity": string_map("GPU capacity (node allocatable).", values=quantity("")),
    "available": string_map("GPUs not requested by running pods.", values=quantity("")),
    "models": array(obj("A Model on the cluster.", {
        "name": string("Name."),
        "namespace": string("Namespace."),
        "phase": string("Phase."),
    }), "Models seen on the cluster.", max_items=1000),
    "lastProbeTime": date_time("When the cluster was last probed."),
    "probeLatencyMs": number("Latency of the last probe.", minimum=0),
    "message": string("Details of the last probe.", max_length=32768),
})

CLUSTER = KindDef(
    kind="Cluster",
    plural="clusters",
    singular="cluster",
    version=V1ALPHA2,
    short_names=("ficl",),
    description="A remote Kubernetes cluster, probed for health and GPU capacity.",
    spec=CLUSTER_SPEC,
    status=CLUSTER_STATUS,
    columns=(
        Column("Phase", ".status.phase"),
        Column("Endpoint", ".spec.apiEndpoint"),
        Column("Version", ".status.serverVersion", priority=1),
    ),
)

# ---- FederatedModel -------------------------------------------------------------------------------

FEDERATED_SPEC = obj("A Model template placed on several clusters.", {
    "template": MODEL_SPEC,
    "placement": obj("Which clusters get the Model.", {
        "clusterSelector": label_selector("Clusters whose spec.labels match."),
        "clusters": array(string("A Cluster name.", pattern=DNS_SUBDOMAIN, max_length=253), "Clusters by name.",
                          max_items=64, list_type="set"),
        "replicasPerCluster": integer("Replicas on each cluster.", minimum=1, maximum=100, default=1),
    }, rules=[PLACEMENT_RULE]),
    "routing": obj("How the global proxy spreads requests (reserved: not yet used by the operator).", {
        "strategy": string("Routing strategy.", enum=FED_STRATEGIES, default="RoundRobin"),
        "weights": string_map("Weight per cluster for Weighted.", values=integer("", minimum=0, maximum=1000),
                              max_properties=64),
        "failoverOrder": array(string("A Cluster name.", max_length=253), "Order for Failover.", max_items=64,
                               list_type="set"),
    }, rules=[WEIGHTS_RULE, FAILOVER_ORDER_RULE]),
}, required=["template", "placement"])

FEDERATED_STATUS = obj("Observed state of a federated model.", {
    "observedGeneration": observed_generation(),
    "conditions": conditions(),
    "clusters": array(obj("The Model on one cluster.", {
        "cluster": string("Cluster name."),
        "phase": string("Phase of the remote Model."),
        "readyReplicas": integer("Ready replicas.", minimum=0),
        "totalReplicas": integer("Desired replicas.", minimum=0),
        "message": string("Details.", max_length=4096),
    }), "Per-cluster state.", max_items=64),
    "readyClusters": integer("Clusters where the Model is ready.", minimum=0),
    "totalClusters": integer("Clusters in the placement.", minimum=0),
})

FEDERATED_MODEL = KindDef(
    kind="FederatedModel",
    plural="federatedmodels",
    singular="federatedmodel",
    version=V1ALPHA2,
    short_names=("fmodel",),
    description="A Model copied to every cluster of its placement.",
    spec=FEDERATED_SPEC,
    status=FEDERATED_STATUS,
    columns=(
        Column("ReadyClusters", ".status.readyClusters", "integer"),
        Column("TotalClusters", ".status.totalClusters", "integer"),
        Column("Strategy", ".spec.routing.strategy", priority=1),
    ),
)

# ---- GlobalProxy ----------------------------------------------------------------------------------

PROXY_SPEC = obj("A global entry point routing across clusters.", {
    "externalEndpoint": string("Public hostname (not a URL).", pattern=DNS_SUBDOMAIN, max_length=253),
    "strategy": string("How a cluster is chosen.", enum=PROXY_STRATEGIES, default="RoundRobin"),
    "tls": obj("TLS towards the clusters.", {
        "secretRef": secret_ref("Secret with tls.crt, tls.key and optionally ca.crt."),
        "insecureSkipVerify": boolean("Skip certificate verification (testing only).", default=False),
    }),
    "clusters": array(obj("A cluster endpoint.", {
        "name": string("Unique name.", pattern=DNS_LABEL, max_length=63),
        "endpoint": string("Base URL of the cluster's FlexInfer proxy.", pattern=r"^https?://\S+$", max_length=2048),
        "weight": integer("Reserved for weighted routing.", minimum=0, maximum=1000),
    }, required=["name", "endpoint"]), "Clusters to route to.", min_items=1, max_items=64, list_type="map",
        map_keys=["name"]),
    "failoverOrder": array(string("A cluster name.", max_length=63), "Order for Failover.", max_items=64,
                           list_type="set"),
    "probe": obj("Health probing of the clusters.", {
        "path": string("Path probed on each endpoint.", default="/healthz", pattern=r"^/\S*$", max_length=1024),
        "timeout": duration("Probe timeout.", default="2s"),
        "interval": duration("Time between probes.", default="15s"),
    }),
}, required=["clusters"], rules=[FAILOVER_ORDER_RULE, LATENCY_RULE, ORDER_KNOWN_RULE])

PROXY_STATUS = obj("Observed state of a global proxy.", {
    "observedGeneration": observed_generation(),
    "conditions": conditions(),
    "activeCluster": string("Cluster receiving traffic (Failover)."),
    "healthyClusters": integer("Clusters passing the probe.", minimum=0),
    "totalClusters": integer("Clusters configured.", minimum=0),
})

GLOBAL_PROXY = KindDef(
    kind="GlobalProxy",
    plural="globalproxies",
    singular="globalproxy",
    version=V1ALPHA2,
    short_names=("gproxy",),
    description="Configuration of flexinfer-global-proxy: clusters, strategy and probes.",
    spec=PROXY_SPEC,
    status=PROXY_STATUS,
    columns=(
        Column("Strategy", ".spec.strategy"),
        Column("Healthy", ".status.healthyClusters", "integer"),
        Column("Total", ".status.totalClusters", "integer"),
        Column("Active", ".status.activeCluster", priority=1),
    ),
)

# ---- typed views ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: Mapping[str, str]
    match_expressions: tuple[SelectorRequirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes label-selector semantics (an empty selector matches everything)."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for r in self.match_expressions:
            present = r.key in labels
            if r.operator == "In" and not (present and labels[r.key] in r.values):
                return False
            if r.operator == "NotIn" and present and labels[r.key] in r.values:
                return False
            if r.operator == "Exists" and not present:
                return False
            if r.operator == "DoesNotExist" and present:
                return False
        return True

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LabelSelector:
        return cls(frozen_map(d.get("matchLabels")),
                   tuple(SelectorRequirement(e["key"], e["operator"], tuple(e.get("values") or ()))
                         for e in d.get("matchExpressions") or ()))


def _status_base(schema: dict[str, Any], raw: Any) -> dict[str, Any]:
    return validate_lenient(schema, raw or {}) or {}


def _spec(schema: dict[str, Any], raw: Any, path: str) -> dict[str, Any]:
    if raw is None:
        raise SpecError(INVALID_SPEC, f"{path}: required")
    out: dict[str, Any] = validate(schema, raw, path)
    return out


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    api_endpoint: str
    secret_name: str
    secret_key: str | None
    labels: Mapping[str, str]
    probe_interval_s: float

    @classmethod
    def from_dict(cls, raw: Any, path: str = "spec") -> ClusterSpec:
        s = _spec(CLUSTER_SPEC, raw, path)
        ref = s["secretRef"]
        return cls(s["apiEndpoint"], ref["name"], ref.get("key") or None, frozen_map(s.get("labels")),
                   parse_duration(s["probeInterval"], path=f"{path}.probeInterval"))


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    observed_generation: int | None = None
    phase: str | None = None
    conditions: tuple[Condition, ...] = ()
    server_version: str | None = None
    last_probe_time: datetime | None = None
    message: str | None = None

    @classmethod
    def from_dict(cls, raw: Any) -> ClusterStatus:
        s = _status_base(CLUSTER_STATUS, raw)
        return cls(s.get("observedGeneration"), s.get("phase"), parse_conditions(s.get("conditions")),
                   s.get("serverVersion"), opt_time(s.get("lastProbeTime")), s.get("message"))


@dataclass(frozen=True, slots=True)
class Cluster:
    meta: ObjectMeta
    spec: ClusterSpec
    status: ClusterStatus

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> Cluster:
        check_kind(obj, "Cluster")
        return cls(ObjectMeta.from_obj(obj), ClusterSpec.from_dict(obj.get("spec")),
                   ClusterStatus.from_dict(obj.get("status")))


@dataclass(frozen=True, slots=True)
class Placement:
    cluster_selector: LabelSelector | None
    clusters: tuple[str, ...]
    replicas_per_cluster: int


@dataclass(frozen=True, slots=True)
class FederatedRouting:
    strategy: str
    weights: Mapping[str, int]
    failover_order: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FederatedModelSpec:
    template: ModelSpec
    template_raw: Mapping[str, Any]  # the defaulted template, copied to remote clusters as the Model spec
    placement: Placement
    routing: FederatedRouting

    @classmethod
    def from_dict(cls, raw: Any, path: str = "spec") -> FederatedModelSpec:
        tpl = raw.get("template") if isinstance(raw, Mapping) else None
        if isinstance(tpl, Mapping) and isinstance(tpl.get("backend"), str):
            resolve_backend(tpl["backend"], f"{path}.template.backend")  # UnknownBackend before the enum check
        s = _spec(FEDERATED_SPEC, raw, path)
        p, r = s["placement"], s.get("routing") or {"strategy": "RoundRobin"}
        sel = p.get("clusterSelector")
        return cls(
            template=ModelSpec.from_dict(raw["template"], f"{path}.template"),
            template_raw=frozen_map(s["template"]),
            placement=Placement(LabelSelector.from_dict(sel) if sel is not None else None,
                                tuple(p.get("clusters") or ()), p["replicasPerCluster"]),
            routing=FederatedRouting(r["strategy"], frozen_map(r.get("weights")), tuple(r.get("failoverOrder") or ())),
        )


@dataclass(frozen=True, slots=True)
class FederatedModelStatus:
    observed_generation: int | None = None
    conditions: tuple[Condition, ...] = ()
    ready_clusters: int = 0
    total_clusters: int = 0

    @classmethod
    def from_dict(cls, raw: Any) -> FederatedModelStatus:
        s = _status_base(FEDERATED_STATUS, raw)
        return cls(s.get("observedGeneration"), parse_conditions(s.get("conditions")), s.get("readyClusters", 0),
                   s.get("totalClusters", 0))


@dataclass(frozen=True, slots=True)
class FederatedModel:
    meta: ObjectMeta
    spec: FederatedModelSpec
    status: FederatedModelStatus

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> FederatedModel:
        check_kind(obj, "FederatedModel")
        return cls(ObjectMeta.from_obj(obj), FederatedModelSpec.from_dict(obj.get("spec")),
                   FederatedModelStatus.from_dict(obj.get("status")))


@dataclass(frozen=True, slots=True)
class ProxyCluster:
    name: str
    endpoint: str
    weight: int | None


@dataclass(frozen=True, slots=True)
class GlobalProxySpec:
    external_endpoint: str | None
    strategy: str
    clusters: tuple[ProxyCluster, ...]
    failover_order: tuple[str, ...]
    tls_secret_name: str | None
    insecure_skip_verify: bool
    probe_path: str
    probe_timeout_s: float
    probe_interval_s: float

    @classmethod
    def from_dict(cls, raw: Any, path: str = "spec") -> GlobalProxySpec:
        s = _spec(PROXY_SPEC, raw, path)
        tls = s.get("tls") or {}
        probe = s.get("probe") or validate(PROXY_SPEC["properties"]["probe"], {}, f"{path}.probe")
        return cls(
            external_endpoint=s.get("externalEndpoint"), strategy=s["strategy"],
            clusters=tuple(ProxyCluster(c["name"], c["endpoint"], c.get("weight")) for c in s["clusters"]),
            failover_order=tuple(s.get("failoverOrder") or ()),
            tls_secret_name=(tls.get("secretRef") or {}).get("name"),
            insecure_skip_verify=bool(tls.get("insecureSkipVerify", False)),
            probe_path=probe["path"],
            probe_timeout_s=parse_duration(probe["timeout"], path=f"{path}.probe.timeout"),
            probe_interval_s=parse_duration(probe["interval"], path=f"{path}.probe.interval"),
        )


@dataclass(frozen=True, slots=True)
class GlobalProxyStatus:
    observed_generation: int | None = None
    conditions: tuple[Condition, ...] = ()
    active_cluster: str | None = None
    healthy_clusters: int = 0
    total_clusters: int = 0

    @classmethod
    def from_dict(cls, raw: Any) -> GlobalProxyStatus:
        s = _status_base(PROXY_STATUS, raw)
        return cls(s.get("observedGeneration"), parse_conditions(s.get("conditions")), s.get("activeCluster"),
                   s.get("healthyClusters", 0), s.get("totalClusters", 0))


@dataclass(frozen=True, slots=True)
class GlobalProxy:
    meta: ObjectMeta
    spec: GlobalProxySpec
    status: GlobalProxyStatus

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> GlobalProxy:
        check_kind(obj, "GlobalProxy")
        return cls(ObjectMeta.from_obj(obj), GlobalProxySpec.from_dict(obj.get("spec")),
                   GlobalProxyStatus.from_dict(obj.get("status")))
