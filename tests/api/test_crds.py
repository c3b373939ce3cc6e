"""crds/ equals what `flexinfer crds` writes, and every CRD is a valid, structural apiextensions/v1 object."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from flexinfer.api import KINDS, generate, kind_def
from flexinfer.api.schema import CEL_CHECKS, KindDef
from flexinfer.api.validate import validate
from tests.api.helpers import CRDS, ROOT, nodes, resolve, strip_k8s

IDS = [k.kind for k in KINDS]


@functools.lru_cache(maxsize=16)
def _load_text(name: str) -> str:
    return (CRDS / name).read_text()


def _load(kind: KindDef) -> dict:
    docs = list(yaml.load_all(_load_text(kind.filename), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    assert len(docs) == 1
    return docs[0]


def test_crds_dir_matches_the_generator():
    d = generate.diff(CRDS)
    assert d == "", "crds/ drifted from flexinfer/api: run `flexinfer crds`\n" + d


def test_crds_dir_holds_exactly_the_nine_kinds_and_kopf_peering():
    assert sorted(p.name for p in CRDS.glob("ai.flexinfer_*.yaml")) == sorted(k.filename for k in KINDS)
    assert len(KINDS) == 9
    assert sorted(p.name for p in CRDS.glob("*.yaml")) == sorted(
        [k.filename for k in KINDS] + list(generate.KOPF_PEERING_CRDS))
    assert sorted(generate.KOPF_PEERING_CRDS) == ["kopf.dev_clusterkopfpeerings.yaml", "kopf.dev_kopfpeerings.yaml"]


def test_kopf_peering_crds_are_what_kopf_documents():
    for name, scope, kind in (("clusterkopfpeerings", "Cluster", "ClusterKopfPeering"),
                              ("kopfpeerings", "Namespaced", "KopfPeering")):
        doc = yaml.safe_load((CRDS / f"kopf.dev_{name}.yaml").read_text())
        assert doc["metadata"]["name"] == f"{name}.kopf.dev"
        assert doc["spec"]["scope"] == scope and doc["spec"]["names"]["kind"] == kind
        (v,) = doc["spec"]["versions"]
        assert v["name"] == "v1" and v["served"] and v["storage"]
        status = v["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _args(out: Path, check: bool) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    generate.configure(p)
    return p.parse_args(["--out", str(out), *(["--check"] if check else [])])


def test_cli_write_then_check(tmp_path, capsys):
    out = tmp_path / "crds"
    assert generate.run(_args(out, check=True)) == 1  # nothing there yet
    assert generate.run(_args(out, check=False)) == 0
    assert len(list(out.glob("*.yaml"))) == 9 + len(generate.KOPF_PEERING_CRDS)
    capsys.readouterr()
    assert generate.run(_args(out, check=True)) == 0
    # drift: an edited file and a stale generated file are both reported
    f = out / KINDS[0].filename
    f.write_text(f.read_text().replace("shortNames", "shortNamez"))
    (out / "ai.flexinfer_stale.yaml").write_text("x: 1\n")
    (out / "unrelated.yaml").write_text("y: 2\n")
    assert generate.run(_args(out, check=True)) == 1
    text = capsys.readouterr().out
    assert "-    shortNamez:" in text and "+    shortNames:" in text
    assert "ai.flexinfer_stale.yaml" in text and "unrelated" not in text
    assert generate.run(_args(out, check=False)) == 0
    assert not (out / "ai.flexinfer_stale.yaml").exists() and (out / "unrelated.yaml").exists()
    assert generate.diff(out) == ""


def test_cli_is_wired_into_flexinfer_command(tmp_path):
    from flexinfer import cli

    assert cli.main(["crds", "--out", str(tmp_path), "--check"]) == 1
    assert cli.main(["crds", "--out", str(tmp_path)]) == 0
    assert cli.main(["crds", "--out", str(tmp_path), "--check"]) == 0


def test_rendering_has_no_yaml_anchors():
    for k in KINDS:
        text = generate.render(k)
        assert "&id" not in text and "*id" not in text, k.kind


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_kubernetes_validate_strict(kind):
    kubernetes_validate.validate(_load(kind), "1.30.0", strict=True)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_names_and_subresources(kind):
    crd = _load(kind)
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{kind.plural}.ai.flexinfer"
    assert spec["group"] == "ai.flexinfer" and spec["scope"] == "Namespaced"
    assert "flexinfer" in spec["names"]["categories"]
    assert spec["names"]["shortNames"]
    (version,) = spec["versions"]
    assert version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["additionalPrinterColumns"][-1] == {"name": "Age", "type": "date",
                                                        "jsonPath": ".metadata.creationTimestamp"}


def test_short_names_and_versions():
    want = {"Model": ("mdl", "v1alpha2"), "LoRAAdapter": ("lora", "v1alpha2"), "ModelCatalog": ("mcat", "v1alpha2"),
            "Cluster": ("ficl", "v1alpha2"), "FederatedModel": ("fmodel", "v1alpha2"),
            "GlobalProxy": ("gproxy", "v1alpha2"), "ModelDeployment": ("md", "v1alpha1"),
            "ModelCache": ("mcache", "v1alpha1"), "GPUGroup": ("gpug", "v1alpha1")}
    got = {k.kind: (k.short_names[0], k.version) for k in KINDS}
    assert got == want
    all_short = [s for k in KINDS for s in k.short_names]
    assert len(all_short) == len(set(all_short))
    assert kind_def("mdl") is kind_def("Model") is kind_def("models")


def test_model_printer_columns():
    cols = _load(kind_def("Model"))["spec"]["versions"][0]["additionalPrinterColumns"]
    got = [(c["name"], c.get("priority", 0), c["type"]) for c in cols]
    assert got == [("Backend", 0, "string"), ("Phase", 0, "string"), ("Ready", 0, "string"),
                   ("Shared", 1, "string"), ("Priority", 1, "integer"), ("TPS", 0, "number"), ("Age", 0, "date")]
    ready = next(c for c in cols if c["name"] == "Ready")
    assert ready["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'


def test_modeldeployment_scale_subresource():
    v = _load(kind_def("md"))["spec"]["versions"][0]
    assert v["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                                          "labelSelectorPath": ".status.selector"}


_COLUMN_TYPES = {"string": {"string"}, "integer": {"integer"}, "number": {"number", "integer"}, "date": {"string"}}


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_printer_columns_point_at_schema_fields(kind):
    schema = kind.open_api_schema()
    for col in _load(kind)["spec"]["versions"][0]["additionalPrinterColumns"]:
        if col["jsonPath"].startswith(".metadata."):
            continue
        node = resolve(schema, col["jsonPath"])
        assert node is not None, f"{kind.kind} column {col['name']}: {col['jsonPath']} not in the schema"
        assert node.get("type") in _COLUMN_TYPES[col["type"]], (kind.kind, col)
        if col["type"] == "date":
            assert node.get("format") == "date-time"


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_schema_is_structural(kind):
    schema = kind.open_api_schema()
    assert schema["properties"]["metadata"] == {"type": "object"}
    preserved = 0
    for path, node in nodes(schema):
        where = f"{kind.kind}{path}"
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node and node["anyOf"] == [{"type": "integer"}, {"type": "string"}], where
        else:
            assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, where
            assert "anyOf" not in node and "oneOf" not in node and "allOf" not in node, where
        assert not ("properties" in node and "additionalProperties" in node), where
        assert "nullable" not in node, where
        props = node.get("properties") or {}
        assert set(node.get("required", ())) <= set(props), where
        if node.get("x-kubernetes-preserve-unknown-fields"):
            preserved += 1
            assert path in (".spec.config", ".spec.template.config"), f"{where}: only spec.config is free JSON"
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict), where
            lt = node.get("x-kubernetes-list-type")
            if lt == "set":
                assert node["items"]["type"] in {"string", "integer", "number", "boolean"}, where
            if lt == "map":
                items = node["items"]
                assert items["type"] == "object", where
                for key in node["x-kubernetes-list-map-keys"]:
                    assert key in items.get("required", ()) or "default" in items["properties"][key], where
        if path.count(".") == 2 and path.startswith((".spec.", ".status.")) and path[-1] not in "}]":
            assert node.get("description"), f"{where}: top-level fields need a description"
        for r in node.get("x-kubernetes-validations", ()):
            assert r["rule"] in CEL_CHECKS and r["message"], where
    assert preserved == (1 if kind.kind in ("Model", "FederatedModel") else 0)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_defaults_are_valid_under_their_own_schema(kind):

    for path, node in nodes(kind.open_api_schema()):
        if "default" not in node:
            continue

        jsonschema.Draft202012Validator(strip_k8s(node)).validate(node["default"])
        assert validate(node, node["default"], path) == node["default"], path
        if "enum" in node:
            assert node["default"] in node["enum"], path


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_status_is_strict(kind):
    status = kind.open_api_schema()["properties"]["status"]
    assert not any(n.get("x-kubernetes-preserve-unknown-fields") for _, n in nodes(status))
    props = status["properties"]
    assert props["observedGeneration"]["type"] == "integer"
    cond = props["conditions"]
    assert cond["x-kubernetes-list-type"] == "map" and cond["x-kubernetes-list-map-keys"] == ["type"]
    assert set(cond["items"]["properties"]) == {"type", "status", "reason", "message", "lastTransitionTime",
                                                "observedGeneration"}
    assert cond["items"]["properties"]["status"]["enum"] == ["True", "False", "Unknown"]


def test_model_spec_fields_and_rules_in_the_crd():
    text = (CRDS / kind_def("Model").filename).read_text()
    for needle in ("'cpu'", "nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "node.flexstack.io/gpu-vendor",
                   "pvc://", "x-kubernetes-validations", "default: 100", "default: 60s", "default: 5m"):
        assert needle in text, needle
    spec = kind_def("Model").spec
    assert spec["required"] == ["backend", "source"]
    gpu = spec["properties"]["gpu"]["properties"]
    assert gpu["priority"] == {**gpu["priority"], "minimum": 0, "maximum": 1000, "default": 100}
    assert gpu["count"]["minimum"] == 1 and gpu["count"]["maximum"] == 8 and "default" not in gpu["count"]
    assert spec["properties"]["serviceLabels"]["maxItems"] == 10


def test_modules_stay_small():
    for pkg in ("api", "backends"):
        for f in (ROOT / "flexinfer" / pkg).glob("*.py"):
            assert f.stat().st_size < 25_000, f
            assert f.read_text().lstrip().startswith('"""'), f"{f} needs a module docstring"
