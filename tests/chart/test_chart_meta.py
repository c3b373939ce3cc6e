"""Chart metadata, CRDs, the values schema and the values table of charts/flexinfer/README.md."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

import flexinfer
from flexinfer.api import generate
from tests.chart.helpers import CHART, ROOT, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def test_app_version_is_the_package_version() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["name"] == "flexinfer"
    assert meta["appVersion"] == flexinfer.__version__
    with helm.Chart.load(CHART) as ch:
        assert ch.metadata["appVersion"] == flexinfer.__version__


def test_chart_crds_are_the_generated_crds() -> None:
    chart, repo = CHART / "crds", ROOT / "crds"
    names = sorted(p.name for p in chart.glob("*"))
    assert names == sorted(p.name for p in repo.glob("*.yaml"))
    assert "kopf.dev_clusterkopfpeerings.yaml" in names and "kopf.dev_kopfpeerings.yaml" in names
    for n in names:
        assert (chart / n).read_bytes() == (repo / n).read_bytes(), n
    assert generate.diff(chart) == "", "run `flexinfer crds --out charts/flexinfer/crds`"
    with helm.Chart.load(CHART) as ch:
        assert len(ch.crds) == len(names)


# ---- the values schema ----------------------------------------------------------------------------------

def test_defaults_satisfy_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(VALUES, SCHEMA)


def _walk(schema: dict[str, Any], path: str = "") -> Any:
    yield path, schema
    for k, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}/{k}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")


def test_schema_closes_every_object_and_covers_every_value() -> None:
    for path, s in _walk(SCHEMA):
        if "properties" in s:
            assert s.get("additionalProperties") is False, path
    def keys(values: Any, schema: dict[str, Any], path: str) -> None:
        if isinstance(values, dict) and "properties" in schema:
            for k, v in values.items():
                assert k in schema["properties"], f"{path}/{k} has no schema"
                keys(v, schema["properties"][k], f"{path}/{k}")
    keys(VALUES, SCHEMA, "")


@pytest.mark.parametrize(("values", "message"), [
    ({"proxy": {"replicaz": 2}}, "at '/proxy': additional properties 'replicaz' not allowed"),
    ({"unknown": True}, "at '': additional properties 'unknown' not allowed"),
    ({"operator": {"replicas": "two"}}, "at '/operator/replicas': got string, want integer"),
    ({"proxy": {"kube": "yes"}}, "at '/proxy/kube': got string, want boolean"),
    ({"operator": {"replicas": -1}}, "at '/operator/replicas': minimum: got -1, want 0"),
    ({"proxy": {"replicas": -3}}, "at '/proxy/replicas': minimum: got -3, want 0"),
    ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
    ({"securityContext": {"readOnlyRootFilesystem": False}}, "at '/securityContext/readOnlyRootFilesystem'"),
])
def test_bad_values_fail_with_the_schemas_message(tmp_path: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as e:
        render(values)
    assert message in str(e.value)
    # and the same from a values file through lint
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(values))
    report = helm.lint(str(CHART), helm.values_from_yaml(f.read_text()), strict=True)
    assert any(message in err for err in report["errors"]), report


# ---- charts/flexinfer/README.md values table ---------------------------------------------------------------

def test_every_value_has_a_comment() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "chart-values-table.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_values_table_check_fails_when_stale(tmp_path: Any) -> None:
    import shutil

    chart = tmp_path / "flexinfer"
    shutil.copytree(CHART, chart)
    readme = chart / "README.md"
    readme.write_text(readme.read_text().replace("`proxy.replicas`", "`proxy.replicaz`"))
    script = [sys.executable, str(ROOT / "scripts" / "chart-values-table.py"), "--chart", str(chart)]
    out = subprocess.run([*script, "--check"], capture_output=True, text=True)
    assert out.returncode == 1 and "stale" in out.stdout
    assert subprocess.run(script, capture_output=True, text=True).returncode == 0
    assert subprocess.run([*script, "--check"], capture_output=True, text=True).returncode == 0
    # a value without a comment is refused
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace("  # -- Deploy the operator.\n", ""))
    out = subprocess.run([*script, "--check"], capture_output=True, text=True)
    assert out.returncode == 1 and "operator.enabled" in out.stdout


def test_readme_documents_the_install() -> None:
    text = (ROOT / "README.md").read_text()
    assert "## Install on Kubernetes" in text
    assert "helm install flexinfer charts/flexinfer -n flexinfer-system --create-namespace" in text
    assert "/v1/chat/completions" in text.split("## Install on Kubernetes", 1)[1]
