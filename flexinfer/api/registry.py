"""The registry of the nine FlexInfer kinds: their CRD definitions and typed-view parsers.

Owns: the list of kinds in the order ``flexinfer crds`` writes them, lookup by kind, plural or short
name, and ``parse(obj)`` which dispatches an object dict to its typed view.

Must not: import Kubernetes clients.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flexinfer.api.catalog import MODEL_CATALOG, ModelCatalog
from flexinfer.api.common import WRONG_KIND, SpecError
from flexinfer.api.federation import (
    CLUSTER,
    FEDERATED_MODEL,
    GLOBAL_PROXY,
    Cluster,
    FederatedModel,
    GlobalProxy,
)
from flexinfer.api.gpugroup import GPU_GROUP, GPUGroup
from flexinfer.api.lora import LORA_ADAPTER, LoRAAdapter
from flexinfer.api.model import MODEL
from flexinfer.api.model_view import Model
from flexinfer.api.modelcache import MODEL_CACHE, ModelCache
from flexinfer.api.modeldeployment import MODEL_DEPLOYMENT, ModelDeployment
from flexinfer.api.schema import KindDef

#: every kind, v1alpha2 first
KINDS: tuple[KindDef, ...] = (
    MODEL, LORA_ADAPTER, MODEL_CATALOG, CLUSTER, FEDERATED_MODEL, GLOBAL_PROXY,
    MODEL_DEPLOYMENT, MODEL_CACHE, GPU_GROUP,
)

#: kind -> typed-view parser (``X.from_obj``)
PARSERS: Mapping[str, Callable[[Mapping[str, Any]], Any]] = {
    "Model": Model.from_obj,
    "LoRAAdapter": LoRAAdapter.from_obj,
    "ModelCatalog": ModelCatalog.from_obj,
    "Cluster": Cluster.from_obj,
    "FederatedModel": FederatedModel.from_obj,
    "GlobalProxy": GlobalProxy.from_obj,
    "ModelDeployment": ModelDeployment.from_obj,
    "ModelCache": ModelCache.from_obj,
    "GPUGroup": GPUGroup.from_obj,
}


def kind_def(name: str) -> KindDef:
    """The KindDef for a kind, plural, singular or short name (case-insensitive); KeyError if none."""
    low = name.lower()
    for k in KINDS:
        if low in (k.kind.lower(), k.plural, k.singular, *k.short_names):
            return k
    raise KeyError(name)


def parse(obj: Mapping[str, Any]) -> Any:
    """The typed view of ``obj`` chosen by its ``kind``; raises ``SpecError``."""
    kind = obj.get("kind")
    parser = PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        raise SpecError(WRONG_KIND, f"not a FlexInfer kind: {kind!r}")
    return parser(obj)
