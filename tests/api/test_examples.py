"""Every example in examples/v1alpha{1,2}/ is valid for its kind: jsonschema against the generated
openAPIV3Schema, our validator with the CEL rules as Python predicates, and the typed view."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from flexinfer.api import KINDS, SpecError, kind_def, parse
from flexinfer.api.validate import validate
from tests.api.helpers import EXAMPLES, strip_k8s

FILES = sorted(EXAMPLES.glob("v1alpha*/*.yaml"))
DOCS = [(f, i, d) for f in FILES for i, d in enumerate(yaml.safe_load_all(f.read_text())) if d]


def test_expected_example_files():
    names = {f"{f.parent.name}/{f.name}" for f in FILES}
    assert {
        "v1alpha2/model-basic.yaml", "v1alpha2/model-shared-gpu.yaml", "v1alpha2/model-cpu.yaml", "v1alpha2/lora.yaml",
        "v1alpha2/catalog.yaml", "v1alpha2/cluster.yaml", "v1alpha2/federatedmodel.yaml", "v1alpha2/globalproxy.yaml",
        "v1alpha1/modeldeployment.yaml", "v1alpha1/modelcache.yaml", "v1alpha1/gpugroup.yaml",
    } <= names


def test_every_kind_has_an_example():
    assert {d["kind"] for _, _, d in DOCS} == {k.kind for k in KINDS}


@pytest.mark.parametrize(("path", "index", "doc"), DOCS, ids=[f"{f.parent.name}/{f.name}#{i}" for f, i, _ in DOCS])
def test_example_is_valid(path, index, doc):
    kd = kind_def(doc["kind"])
    assert doc["apiVersion"] == kd.api_version
    assert path.parent.name == kd.version
    jsonschema.Draft202012Validator(strip_k8s(kd.open_api_schema())).validate(doc)
    validate(kd.open_api_schema(), doc, "")  # schema + CEL predicates, as the API server would
    view = parse(doc)
    assert view.meta.name == doc["metadata"]["name"]


def test_shared_gpu_example_has_two_models_on_one_group():
    docs = list(yaml.safe_load_all((EXAMPLES / "v1alpha2" / "model-shared-gpu.yaml").read_text()))
    models = [parse(d) for d in docs]
    assert len(models) == 2
    assert {m.spec.gpu.shared for m in models} == {"homelab-gpu"}
    assert sorted(m.spec.gpu.priority for m in models) == [50, 100]
    assert {m.spec.cache.strategy for m in models} == {"Memory"}


def test_cpu_example_runs_on_cpu():
    m = parse(yaml.safe_load((EXAMPLES / "v1alpha2" / "model-cpu.yaml").read_text()))
    assert m.spec.backend == "llamacpp" and m.spec.gpu.vendor == "cpu" and m.spec.gpu.count == 0
    assert m.spec.serverless.min_replicas == 1


def test_jsonschema_and_our_validator_agree_on_a_broken_example():
    doc = yaml.safe_load((EXAMPLES / "v1alpha2" / "model-basic.yaml").read_text())
    doc["spec"]["gpu"]["priority"] = 5000
    schema = kind_def("Model").open_api_schema()
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, strip_k8s(schema))
    with pytest.raises(SpecError) as e:
        validate(schema, doc, "")
    assert e.value.reason == "InvalidSpec" and "spec.gpu.priority" in e.value.message


def test_views_accept_kopf_bodies():
    kopf = pytest.importorskip("kopf")
    for _, _, doc in DOCS:
        view = parse(kopf.Body(doc))
        assert view == parse(doc)
