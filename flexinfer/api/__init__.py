"""FlexInfer's Kubernetes API as Python: the single source of truth for the CRDs and typed views.

- ``schema``/``model``/``lora``/``catalog``/``federation``/``modeldeployment``/``modelcache``/``gpugroup``:
  the OpenAPI v3 schemas (with defaults, enums, ranges, CEL rules) of the nine kinds of group
  ``ai.flexinfer``; ``generate`` writes them to ``crds/`` (``flexinfer crds``).
- ``registry``: the nine kinds in that order, lookup by kind, plural or short name, and ``parse(obj)``.
- The typed views: frozen dataclasses parsed once per event (``Model.from_obj(body)``, ...) with the
  original's defaults applied; problems raise ``SpecError(reason, message)``.
- ``validate``: the runtime schema check/defaulting the views run (the API server's job in a cluster).

Imports nothing from Kubernetes clients or kopf.
"""

from flexinfer.api.catalog import ModelCatalog, ModelCatalogSpec, ModelCatalogStatus
from flexinfer.api.common import (
    BACKEND_UNSUPPORTED,
    CATEGORY,
    GROUP,
    INVALID_CONFIG,
    INVALID_SOURCE,
    INVALID_SPEC,
    UNKNOWN_BACKEND,
    V1ALPHA1,
    V1ALPHA2,
    WRONG_KIND,
    ObjectMeta,
    SpecError,
    format_time,
    parse_duration,
    parse_quantity,
    parse_time,
)
from flexinfer.api.conditions import Condition, find_condition, parse_conditions, set_condition
from flexinfer.api.federation import (
    Cluster,
    ClusterSpec,
    FederatedModel,
    FederatedModelSpec,
    GlobalProxy,
    GlobalProxySpec,
    LabelSelector,
)
from flexinfer.api.gpugroup import GPUGroup, GPUGroupSpec, GPUGroupStatus
from flexinfer.api.lora import LoRAAdapter, LoRAAdapterSpec, LoRAAdapterStatus
from flexinfer.api.model_view import Model, ModelSpec, ModelStatus, Source
from flexinfer.api.modelcache import ModelCache, ModelCacheSpec, ModelCacheStatus
from flexinfer.api.modeldeployment import ModelDeployment, ModelDeploymentSpec, ModelDeploymentStatus
from flexinfer.api.registry import KINDS, PARSERS, kind_def, parse
from flexinfer.units import format_duration

__all__ = [
    "BACKEND_UNSUPPORTED",
    "CATEGORY",
    "GROUP",
    "INVALID_CONFIG",
    "INVALID_SOURCE",
    "INVALID_SPEC",
    "KINDS",
    "PARSERS",
    "UNKNOWN_BACKEND",
    "V1ALPHA1",
    "V1ALPHA2",
    "WRONG_KIND",
    "Cluster",
    "ClusterSpec",
    "Condition",
    "FederatedModel",
    "FederatedModelSpec",
    "GPUGroup",
    "GPUGroupSpec",
    "GPUGroupStatus",
    "GlobalProxy",
    "GlobalProxySpec",
    "LabelSelector",
    "LoRAAdapter",
    "LoRAAdapterSpec",
    "LoRAAdapterStatus",
    "Model",
    "ModelCache",
    "ModelCacheSpec",
    "ModelCacheStatus",
    "ModelCatalog",
    "ModelCatalogSpec",
    "ModelCatalogStatus",
    "ModelDeployment",
    "ModelDeploymentSpec",
    "ModelDeploymentStatus",
    "ModelSpec",
    "ModelStatus",
    "ObjectMeta",
    "Source",
    "SpecError",
    "find_condition",
    "format_duration",
    "format_time",
    "kind_def",
    "parse",
    "parse_conditions",
    "parse_duration",
    "parse_quantity",
    "parse_time",
    "set_condition",
]
