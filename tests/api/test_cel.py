"""The CEL rules in the CRDs and their Python twins agree.

Every rule has cases that pass and cases that fail. The Python predicate (what the operator's
validator runs) is checked on each; when `celpy` (PyPI cel-python) is importable, the CEL text itself
is compiled and evaluated on the same cases too, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.api import KINDS
from flexinfer.api.catalog import OCI_URL_RULE
from flexinfer.api.federation import (
    FAILOVER_ORDER_RULE,
    LATENCY_RULE,
    ORDER_KNOWN_RULE,
    PLACEMENT_RULE,
    WEIGHTS_RULE,
)
from flexinfer.api.gpugroup import MIN_MAX_RULE
from flexinfer.api.model import (
    CPU_RULE,
    GPU_RESOURCES_RULE,
    NODE_SELECTOR_RULE,
    PVC_SOURCE_RULE,
    WATERMARK_RULE,
)
from flexinfer.api.schema import CEL_CHECKS
from tests.api.helpers import nodes

SEL = "node.flexstack.io/gpu-vendor"
CASES: list[tuple[dict[str, Any], Any, bool]] = [
    (CPU_RULE, {"vendor": "cpu"}, True),
    (CPU_RULE, {"vendor": "nvidia", "count": 2, "shared": "g"}, True),
    (CPU_RULE, {"vendor": "cpu", "count": 1}, False),
    (CPU_RULE, {"vendor": "cpu", "shared": "g"}, False),
    (CPU_RULE, {"vendor": "cpu", "vramEstimateMB": 100}, False),
    (GPU_RESOURCES_RULE, {}, True),
    (GPU_RESOURCES_RULE, {"limits": {"memory": "1Gi"}, "requests": {"cpu": "1"}}, True),
    (GPU_RESOURCES_RULE, {"limits": {"nvidia.com/gpu": 1}}, False),
    (GPU_RESOURCES_RULE, {"requests": {"amd.com/gpu": "1"}}, False),
    (GPU_RESOURCES_RULE, {"limits": {"gpu.intel.com/i915": 1}}, False),
    (NODE_SELECTOR_RULE, {"source": "x"}, True),
    (NODE_SELECTOR_RULE, {"nodeSelector": {SEL: "amd"}}, True),  # nil gpu: not checked
    (NODE_SELECTOR_RULE, {"nodeSelector": {SEL: "amd"}, "gpu": {"vendor": "auto"}}, True),
    (NODE_SELECTOR_RULE, {"nodeSelector": {SEL: "amd"}, "gpu": {"vendor": "amd"}}, True),
    (NODE_SELECTOR_RULE, {"nodeSelector": {"other": "x"}, "gpu": {"vendor": "amd"}}, True),
    (NODE_SELECTOR_RULE, {"nodeSelector": {SEL: "nvidia"}, "gpu": {"vendor": "amd"}}, False),
    (PVC_SOURCE_RULE, {"source": "HF://a/b", "cache": {"strategy": "Memory"}}, True),
    (PVC_SOURCE_RULE, {"source": "pvc://c/p"}, True),
    (PVC_SOURCE_RULE, {"source": "pvc://c/p", "cache": {"strategy": "Local"}}, True),
    (PVC_SOURCE_RULE, {"source": "pvc://c/p", "cache": {"strategy": "Memory"}}, False),
    (WATERMARK_RULE, {"lowWatermark": 0.5, "highWatermark": 0.9}, True),
    (WATERMARK_RULE, {"lowWatermark": 0.9, "highWatermark": 0.9}, True),
    (WATERMARK_RULE, {"lowWatermark": 0.95, "highWatermark": 0.9}, False),
    (OCI_URL_RULE, {"type": "Ollama"}, True),
    (OCI_URL_RULE, {"type": "OCI", "url": "ghcr.io/x"}, True),
    (OCI_URL_RULE, {"type": "OCI"}, False),
    (OCI_URL_RULE, {"type": "OCI", "url": ""}, False),
    (FAILOVER_ORDER_RULE, {"strategy": "RoundRobin"}, True),
    (FAILOVER_ORDER_RULE, {"strategy": "Failover", "failoverOrder": ["a"]}, True),
    (FAILOVER_ORDER_RULE, {"strategy": "Failover"}, False),
    (FAILOVER_ORDER_RULE, {"strategy": "Failover", "failoverOrder": []}, False),
    (WEIGHTS_RULE, {"strategy": "Weighted", "weights": {"a": 1}}, True),
    (WEIGHTS_RULE, {"strategy": "Latency"}, True),
    (WEIGHTS_RULE, {"strategy": "Weighted"}, False),
    (PLACEMENT_RULE, {"clusters": ["a"]}, True),
    (PLACEMENT_RULE, {"clusterSelector": {}}, True),
    (PLACEMENT_RULE, {"clusters": []}, False),
    (PLACEMENT_RULE, {"replicasPerCluster": 1}, False),
    (LATENCY_RULE, {"strategy": "Latency"}, True),
    (LATENCY_RULE, {"strategy": "Failover", "failoverOrder": ["a"]}, True),
    (LATENCY_RULE, {"strategy": "Latency", "failoverOrder": ["a"]}, False),
    (ORDER_KNOWN_RULE, {"clusters": [{"name": "a"}, {"name": "b"}]}, True),
    (ORDER_KNOWN_RULE, {"clusters": [{"name": "a"}, {"name": "b"}], "failoverOrder": ["b", "a"]}, True),
    (ORDER_KNOWN_RULE, {"clusters": [{"name": "a"}], "failoverOrder": ["a", "c"]}, False),
    (MIN_MAX_RULE, {"minReplicas": 0, "maxReplicas": 1}, True),
    (MIN_MAX_RULE, {"minReplicas": 2, "maxReplicas": 2}, True),
    (MIN_MAX_RULE, {"minReplicas": 3, "maxReplicas": 2}, False),
]
IDS = [f"{r['rule'][:40]}|{i}" for i, (r, _, _) in enumerate(CASES)]


def _all_rules() -> set[str]:
    return {r["rule"] for k in KINDS for _, n in nodes(k.open_api_schema())
            for r in n.get("x-kubernetes-validations", ())}


def test_every_rule_in_the_crds_has_a_predicate_and_cases():
    rules = _all_rules()
    assert rules == set(CEL_CHECKS)
    for rule in rules:
        outcomes = {want for r, _, want in CASES if r["rule"] == rule}
        assert outcomes == {True, False}, f"need passing and failing cases for {rule}"


def test_original_rules_are_present():
    rules = "\n".join(_all_rules())
    assert "self.vendor != 'cpu'" in rules  # vendor cpu => no count/vramEstimateMB/shared
    assert "'nvidia.com/gpu' in self.limits" in rules  # resources must not carry GPU keys
    assert "self.nodeSelector['node.flexstack.io/gpu-vendor'] == self.gpu.vendor" in rules


@pytest.mark.parametrize(("rule", "value", "want"), CASES, ids=IDS)
def test_python_predicate(rule, value, want):
    assert CEL_CHECKS[rule["rule"]](value) is want


def test_cel_text_agrees_when_celpy_is_installed():
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    programs = {r: env.program(env.compile(r)) for r in CEL_CHECKS}
    wrong = [(rule["rule"], value) for rule, value, want in CASES
             if bool(programs[rule["rule"]].evaluate({"self": celpy.json_to_cel(value)})) is not want]
    assert wrong == []
