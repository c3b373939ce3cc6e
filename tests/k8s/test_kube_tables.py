"""The emulator's server-side printing (``tests/kube_tables.py``): JSONPath as printer columns use it,
cell typing, ages, and the Table shape."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kube_tables import cell, human_duration, jsonpath, table, wants_table

OBJ: dict[str, Any] = {
    "metadata": {"name": "m", "creationTimestamp": "2020-01-01T00:00:00Z", "labels": {"a.b/c": "x"}},
    "spec": {"backend": "vllm", "gpu": {"priority": 7}, "list": [1, 2, 3], "flag": True},
    "status": {"phase": "Ready", "conditions": [{"type": "Cached", "status": "False"},
                                                {"type": "Ready", "status": "True"}]},
}


@pytest.mark.parametrize(("path", "want"), [
    (".status.phase", ["Ready"]),
    ("{.spec.backend}", ["vllm"]),
    (".spec.missing", []),
    ('.status.conditions[?(@.type=="Ready")].status', ["True"]),
    (".status.conditions[?(@.type!='Ready')].type", ["Cached"]),
    (".status.conditions[*].type", ["Cached", "Ready"]),
    (".status.conditions[-1].type", ["Ready"]),
    (".spec.list[5]", []),
    (".metadata.labels['a.b/c']", ["x"]),
    ("..priority", [7]),
    (".spec.list", [[1, 2, 3]]),
])
def test_jsonpath(path: str, want: list[Any]) -> None:
    assert jsonpath(OBJ, path) == want


@pytest.mark.parametrize(("column", "want"), [
    ({"jsonPath": ".status.phase", "type": "string"}, "Ready"),
    ({"jsonPath": ".spec.gpu.priority", "type": "integer"}, 7),
    ({"jsonPath": ".spec.backend", "type": "integer"}, None),  # wrong type: <none>
    ({"jsonPath": ".spec.flag", "type": "string"}, "true"),
    ({"jsonPath": ".spec.list", "type": "string"}, "[1,2,3]"),
    ({"jsonPath": ".spec.flag", "type": "boolean"}, True),
    ({"jsonPath": ".status.nothing", "type": "string"}, None),
    ({"jsonPath": ".status.conditions[*].type", "type": "string"}, "Cached"),  # the first result only
])
def test_cells(column: dict[str, Any], want: Any) -> None:
    assert cell(column, OBJ) == want


@pytest.mark.parametrize(("seconds", "want"), [
    (5, "5s"), (119, "119s"), (150, "2m30s"), (600, "10m"), (3 * 3600 + 5 * 60, "3h5m"), (10 * 3600, "10h"),
    (3 * 86400 + 3600, "3d1h"), (30 * 86400, "30d"), (800 * 86400, "2y70d"), (-5, "<invalid>"),
])
def test_human_duration(seconds: int, want: str) -> None:
    assert human_duration(seconds) == want


def test_table_shape_and_accept() -> None:
    t = table([OBJ], [{"name": "Phase", "jsonPath": ".status.phase", "type": "string"},
                      {"name": "Age", "jsonPath": ".metadata.creationTimestamp", "type": "date"}], resource_version="9")
    assert t["kind"] == "Table" and t["apiVersion"] == "meta.k8s.io/v1" and t["metadata"]["resourceVersion"] == "9"
    assert [c["name"] for c in t["columnDefinitions"]] == ["Name", "Phase", "Age"]
    assert t["rows"][0]["cells"][:2] == ["m", "Ready"] and t["rows"][0]["cells"][2].endswith(("d", "y"))
    assert t["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert [c["name"] for c in table([OBJ], None)["columnDefinitions"]] == ["Name", "Age"]
    assert wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert not wants_table("application/json")
