"""Shared pieces of the API: ``SpecError``, durations, quantities, timestamps and ``ObjectMeta``.

Owns: the group/version constants, the ``SpecError`` face of the duration parser (Go syntax:
``"30s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``) and of the Kubernetes quantity parser (both grammars
live in ``flexinfer.units``), RFC 3339 timestamps and the typed view of ``metadata``. Every typed view raises ``SpecError(reason, message)``; the operator copies the
CamelCase reason onto a condition.

Must not: import Kubernetes clients, kopf, or anything of ours but ``flexinfer.labels`` (the one home of
well-known keys: group, finalizers, selector labels) and ``flexinfer.units``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from flexinfer import labels, units

GROUP = labels.API_GROUP
V1ALPHA1 = "v1alpha1"
V1ALPHA2 = "v1alpha2"
#: ``kubectl get flexinfer`` lists every kind
CATEGORY = "flexinfer"
#: node label a Model's nodeSelector may use to pin a vendor (checked against ``gpu.vendor``)
NODE_VENDOR_LABEL = labels.NODE_GPU_VENDOR_SELECTOR


class SpecError(ValueError):
    """A resource that cannot be acted on. ``reason`` is CamelCase (``InvalidSpec``, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"SpecError({self.reason!r}, {self.message!r})"


# Reasons a typed view raises (the operator may add its own).
INVALID_SPEC = "InvalidSpec"  # fails the schema or one of its CEL rules
UNKNOWN_BACKEND = "UnknownBackend"
INVALID_CONFIG = "InvalidConfig"  # a spec.config knob of the wrong type or a missing required knob
INVALID_SOURCE = "InvalidSource"  # a source the backend cannot load
BACKEND_UNSUPPORTED = "BackendUnsupported"  # the backend does not run on the chosen vendor
WRONG_KIND = "WrongKind"

# ---- durations and quantities: the grammars live in flexinfer.units ------------------------------


def parse_duration(value: str | int | float, *, path: str = "duration") -> float:
    """Seconds in a Go-style duration: ``"5m"`` -> 300.0, ``"1h30m"`` -> 5400.0, ``"0"`` -> 0.0.

    Numbers are taken as seconds; strings must be Go syntax (``"30"`` is not, as in the CRD
    schemas). Raises ``SpecError("InvalidSpec", ...)`` naming ``path``.
    """
    try:
        return units.parse_duration(value, bare_seconds=False)
    except ValueError as exc:
        raise SpecError(INVALID_SPEC, f"{path}: {exc}") from None


def parse_quantity(value: str | int | float, *, path: str = "quantity") -> Decimal:
    """The value of a Kubernetes quantity: ``"50Gi"`` -> 53687091200, ``"100m"`` -> 0.1."""
    try:
        return units.parse_quantity(value)
    except ValueError as exc:
        raise SpecError(INVALID_SPEC, f"{path}: {exc}") from None


# ---- timestamps ----------------------------------------------------------------------------------

def parse_time(value: Any, *, path: str = "time") -> datetime:
    """An aware UTC datetime from an RFC 3339 string (``2025-07-01T12:00:00Z``) or a datetime."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip())
        except ValueError:
            pass
        else:
            return dt.astimezone(UTC) if dt.tzinfo else dt.replace(tzinfo=UTC)
    raise SpecError(INVALID_SPEC, f"{path}: expected an RFC 3339 time, got {value!r}")


def opt_time(value: Any) -> datetime | None:
    """``parse_time`` for status fields: None for absent or unreadable values."""
    if value is None or value == "":
        return None
    try:
        return parse_time(value)
    except SpecError:
        return None


def format_time(dt: datetime) -> str:
    """RFC 3339 in UTC with second precision, the way metav1.Time serialises."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- metadata --------------------------------------------------------------------------------------

def frozen_map(m: Any) -> Mapping[str, Any]:
    """A read-only copy of a mapping (empty for None or anything that is not a mapping)."""
    return MappingProxyType(dict(m) if isinstance(m, Mapping) else {})


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """The parts of ``metadata`` the operator reads."""

    name: str
    namespace: str
    uid: str = ""
    generation: int = 0
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None

    @property
    def deleting(self) -> bool:
        return self.deletion_timestamp is not None

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> ObjectMeta:
        md = obj.get("metadata") or {}
        if not isinstance(md, Mapping):
            raise SpecError(INVALID_SPEC, "metadata: expected an object")
        name = md.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError(INVALID_SPEC, "metadata.name: required")
        gen = md.get("generation")
        return cls(
            name=name,
            namespace=str(md.get("namespace") or "default"),
            uid=str(md.get("uid") or ""),
            generation=gen if isinstance(gen, int) and not isinstance(gen, bool) else 0,
            resource_version=str(md.get("resourceVersion") or ""),
            labels=frozen_map(md.get("labels")),
            annotations=frozen_map(md.get("annotations")),
            finalizers=tuple(f for f in md.get("finalizers") or () if isinstance(f, str))
            if isinstance(md.get("finalizers"), list) else (),
            creation_timestamp=opt_time(md.get("creationTimestamp")),
            deletion_timestamp=opt_time(md.get("deletionTimestamp")),
        )


def check_kind(obj: Mapping[str, Any], kind: str) -> None:
    """Raise ``SpecError("WrongKind")`` when ``obj`` names another kind or group."""
    if not isinstance(obj, Mapping):
        raise SpecError(INVALID_SPEC, f"expected an object, got {type(obj).__name__}")
    k = obj.get("kind")
    if k is not None and k != kind:
        raise SpecError(WRONG_KIND, f"expected kind {kind}, got {k!r}")
    av = obj.get("apiVersion")
    if isinstance(av, str) and "/" in av and av.split("/", 1)[0] != GROUP:
        raise SpecError(WRONG_KIND, f"expected group {GROUP}, got apiVersion {av!r}")
