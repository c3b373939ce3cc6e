"""Small builders for structural OpenAPI v3 schemas, CEL rules and CustomResourceDefinitions.

Owns: the helpers every kind module writes its schema with (``obj``, ``string``, ``integer``,
``array``, ``quantity``, ``duration``, ``conditions``, ``rule`` ...), the registry that pairs each CEL
rule with an equivalent Python predicate (``CEL_CHECKS``; the runtime validator evaluates those, since
kmock and unit tests have no API server), and ``KindDef.crd()`` which assembles an
``apiextensions.k8s.io/v1`` manifest with status subresource, printer columns, short names and the
``flexinfer`` category.

Must not: import kind modules (they import this), Kubernetes clients, or read the environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flexinfer.api.common import CATEGORY, GROUP
from flexinfer.units import DURATION_PATTERN, QUANTITY_PATTERN

Schema = dict[str, Any]
Check = Callable[[Any], bool]

#: CEL rule text -> Python predicate over the (defaulted) value the rule is attached to
CEL_CHECKS: dict[str, Check] = {}


def _schema(type_: str | None, desc: str, **kw: Any) -> Schema:
    out: Schema = {}
    if desc:
        out["description"] = desc
    if type_ is not None:
        out["type"] = type_
    for k, v in kw.items():
        if v is not None:
            out[k] = v
    return out


def string(desc: str, *, enum: Sequence[str] | None = None, pattern: str | None = None,
           default: str | None = None, min_length: int | None = None, max_length: int | None = None,
           fmt: str | None = None) -> Schema:
    return _schema("string", desc, format=fmt, enum=list(enum) if enum is not None else None, pattern=pattern,
                   minLength=min_length, maxLength=max_length, default=default)


def integer(desc: str, *, minimum: int | None = None, maximum: int | None = None, default: int | None = None,
            int64: bool = False) -> Schema:
    return _schema("integer", desc, format="int64" if int64 else "int32", minimum=minimum, maximum=maximum,
                   default=default)


def number(desc: str, *, minimum: float | None = None, maximum: float | None = None,
           default: float | None = None) -> Schema:
    return _schema("number", desc, minimum=minimum, maximum=maximum, default=default)


def boolean(desc: str, *, default: bool | None = None) -> Schema:
    return _schema("boolean", desc, default=default)


def array(items: Schema, desc: str, *, min_items: int | None = None, max_items: int | None = None,
          list_type: str | None = None, map_keys: Sequence[str] | None = None) -> Schema:
    out = _schema("array", desc, items=items, minItems=min_items, maxItems=max_items)
    if list_type:
        out["x-kubernetes-list-type"] = list_type
    if map_keys:
        out["x-kubernetes-list-map-keys"] = list(map_keys)
    return out


def string_map(desc: str, *, values: Schema | None = None, max_properties: int | None = None) -> Schema:
    """An object with free keys (``additionalProperties``), string values unless ``values`` says."""
    return _schema("object", desc, additionalProperties=values or {"type": "string"},
                   maxProperties=max_properties)


def obj(desc: str, props: Mapping[str, Schema], *, required: Sequence[str] = (),
        rules: Sequence[Schema] = (), default: Mapping[str, Any] | None = None,
        min_properties: int | None = None) -> Schema:
    """An object with known ``props``; ``rules`` are ``rule(...)`` entries (CEL)."""
    for r in required:
        if r not in props:
            raise KeyError(f"required field {r!r} is not a property")
    out = _schema("object", desc, properties=dict(props), minProperties=min_properties)
    if required:
        out["required"] = list(required)
    if default is not None:
        out["default"] = dict(default)
    if rules:
        out["x-kubernetes-validations"] = list(rules)
    return out


def free_object(desc: str) -> Schema:
    """Free-form JSON object (kept as written; used only for backend knobs)."""
    return _schema("object", desc, **{"x-kubernetes-preserve-unknown-fields": True})


def quantity(desc: str, *, default: str | None = None) -> Schema:
    """A Kubernetes quantity (``50Gi``, ``500m``, or an integer)."""
    out = _schema(None, desc, anyOf=[{"type": "integer"}, {"type": "string"}], pattern=QUANTITY_PATTERN,
                  default=default)
    out["x-kubernetes-int-or-string"] = True
    return out


def duration(desc: str, *, default: str | None = None) -> Schema:
    """A Go-style duration string (``30s``, ``5m``, ``1h30m``)."""
    return string(desc, pattern=DURATION_PATTERN, default=default, max_length=32)


def date_time(desc: str) -> Schema:
    return string(desc, fmt="date-time")


def rule(cel: str, message: str, check: Check, *, field_path: str | None = None) -> Schema:
    """A CEL ``x-kubernetes-validations`` entry; ``check`` is the same rule in Python.

    Registering the same rule text twice with different predicates is an error.
    """
    prev = CEL_CHECKS.get(cel)
    if prev is not None and prev is not check:
        raise ValueError(f"CEL rule registered twice with different checks: {cel}")
    CEL_CHECKS[cel] = check
    out: Schema = {"rule": cel, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


# ---- shared building blocks ------------------------------------------------------------------------

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: a label value (shared-group names become label values)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
#: the CamelCase reason of a condition (empty allowed)
REASON = r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?)?$"


def name_ref(desc: str) -> Schema:
    """The name of an object in the same namespace."""
    return string(desc, pattern=DNS_SUBDOMAIN, min_length=1, max_length=253)


def secret_ref(desc: str, *, with_key: bool = False) -> Schema:
    props: dict[str, Schema] = {"name": name_ref("Name of the Secret in the same namespace.")}
    if with_key:
        props["key"] = string("Key in the Secret; empty: the usual keys, or the only key.", max_length=253)
    return obj(desc, props, required=["name"])


def conditions(desc: str = "Latest observations of the object's state, one per type.") -> Schema:
    cond = obj("A status condition (Kubernetes API conventions).", {
        "type": string("Type of the condition in CamelCase (Ready, Schedulable, ...).", min_length=1,
                       max_length=316),
        "status": string("Status of the condition.", enum=["True", "False", "Unknown"]),
        "reason": string("Machine-readable CamelCase reason for the last transition.", pattern=REASON,
                         max_length=1024),
        "message": string("Human-readable details.", max_length=32768),
        "lastTransitionTime": date_time("When the status last changed."),
        "observedGeneration": integer("metadata.generation the condition was computed from.", minimum=0,
                                      int64=True),
    }, required=["type", "status"])
    return array(cond, desc, max_items=32, list_type="map", map_keys=["type"])


def observed_generation() -> Schema:
    return integer("metadata.generation the status was computed from.", minimum=0, int64=True)


def label_selector(desc: str) -> Schema:
    expr = obj("A label selector requirement.", {
        "key": string("Label key.", min_length=1, max_length=317),
        "operator": string("Relation of the key to the values.", enum=["In", "NotIn", "Exists", "DoesNotExist"]),
        "values": array(string("A value.", max_length=63), "Values for In/NotIn.", max_items=64),
    }, required=["key", "operator"])
    return obj(desc, {
        "matchLabels": string_map("Labels that must all match.", max_properties=64),
        "matchExpressions": array(expr, "Requirements that must all match.", max_items=32),
    })


# ---- CRD assembly ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Column:
    """One ``additionalPrinterColumns`` entry; priority 0 shows always, 1 only with ``-o wide``."""

    name: str
    json_path: str
    type: str = "string"
    priority: int = 0
    description: str = ""
    fmt: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.fmt:
            out["format"] = self.fmt
        if self.priority:
            out["priority"] = self.priority
        if self.description:
            out["description"] = self.description
        return out


READY_COLUMN = Column("Ready", '.status.conditions[?(@.type=="Ready")].status',
                      description="Status of the Ready condition")
AGE_COLUMN = Column("Age", ".metadata.creationTimestamp", "date")


@dataclass(frozen=True, slots=True)
class KindDef:
    """Everything that makes a CRD of one kind. ``crd()`` renders the manifest."""

    kind: str
    plural: str
    singular: str
    version: str
    short_names: tuple[str, ...]
    description: str
    spec: Schema
    status: Schema
    columns: tuple[Column, ...]
    #: ``{"specReplicasPath": ..., "statusReplicasPath": ..., "labelSelectorPath": ...}``
    scale: Mapping[str, str] | None = None
    finalizer: str | None = None
    extra_categories: tuple[str, ...] = field(default=())

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def filename(self) -> str:
        """``crds/<group>_<plural>.yaml``."""
        return f"{GROUP}_{self.plural}.yaml"

    def open_api_schema(self) -> Schema:
        return {
            "description": self.description,
            "type": "object",
            "properties": {
                "apiVersion": string("Versioned schema of this representation of an object."),
                "kind": string("REST resource this object represents."),
                "metadata": {"type": "object"},
                "spec": self.spec,
                "status": self.status,
            },
            "required": ["spec"],
        }

    def crd(self) -> dict[str, Any]:
        subresources: dict[str, Any] = {"status": {}}
        if self.scale:
            subresources["scale"] = dict(self.scale)
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": self.crd_name, "labels": {"app.kubernetes.io/part-of": "flexinfer"}},
            "spec": {
                "group": GROUP,
                "names": {
                    "kind": self.kind,
                    "listKind": f"{self.kind}List",
                    "plural": self.plural,
                    "singular": self.singular,
                    "shortNames": list(self.short_names),
                    "categories": [CATEGORY, *self.extra_categories],
                },
                "scope": "Namespaced",
                "versions": [{
                    "name": self.version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": self.open_api_schema()},
                    "subresources": subresources,
                    "additionalPrinterColumns": [c.to_dict() for c in (*self.columns, AGE_COLUMN)],
                }],
            },
        }
