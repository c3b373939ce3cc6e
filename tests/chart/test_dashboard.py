"""The chart's Grafana dashboard: every PromQL expression parses with a real PromQL parser, every series
it reads belongs to a component whose real scrape is checked (the proxy in
``tests/runtime/test_dashboard_scrape.py``, the operator in ``tests/operator/test_metrics.py``), and the
dashboard ConfigMap renders (Helm's real engine, kubernetes-validate) with the sidecar label, behind
``grafana.dashboards.enabled``. The operator's metrics port reaches its Deployment, PodMonitor and
NetworkPolicy."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import pytest

from tests.chart.helpers import KUBE_VERSIONS, MONITORING, NAMESPACE, container, of_kind, one, render
from tests.dashboard import DASHBOARDS, dashboard_uses, dashboards, expressions, parse, to_promql

#: the components whose scrape the dashboard tests check, by metric name prefix
SCRAPED = ("flexinfer_proxy_", "flexinfer_local_", "flexinfer_operator_")


def test_every_expression_parses() -> None:
    dash = dashboards()
    assert list(dash) == ["flexinfer.json"]
    exprs = [e for d in dash.values() for e in expressions(d)]
    assert len(exprs) >= 25
    for where, expr in exprs:
        try:
            parse(expr)
        except ValueError as e:
            pytest.fail(f"{where}: {to_promql(expr)!r}: {e}")


@pytest.mark.parametrize("broken", [
    'sum(rate(flexinfer_proxy_requests_total[5m])',  # unbalanced
    'rate(flexinfer_proxy_requests_total)',  # rate needs a range vector
    'sum by (model) (flexinfer_proxy_requests_total{model=~"$model"}[$__rate_interval]) + 1',  # range in a sum
])
def test_the_parser_refuses_broken_expressions(broken: str) -> None:
    with pytest.raises(ValueError):
        parse(broken)


def test_every_series_belongs_to_a_scraped_component() -> None:
    names = {u.name for _, u in dashboard_uses()}
    assert {n for n in names if not n.startswith(SCRAPED)} == set()
    # the panels the issue asks for: traffic, errors, TTFT, ITL, tokens, queue, activations, swaps, operator
    for want in ("flexinfer_proxy_requests_total", "flexinfer_proxy_upstream_errors_total",
                 "flexinfer_proxy_time_to_first_token_seconds_bucket",
                 "flexinfer_proxy_inter_token_latency_seconds_bucket", "flexinfer_proxy_prompt_tokens_total",
                 "flexinfer_proxy_completion_tokens_total", "flexinfer_proxy_queue_depth",
                 "flexinfer_proxy_queue_wait_seconds_bucket", "flexinfer_proxy_activations_total",
                 "flexinfer_local_swaps_total", "flexinfer_operator_reconciles_total",
                 "flexinfer_operator_api_errors_total"):
        assert want in names, want


def test_dashboard_is_importable_json() -> None:
    (dash,) = dashboards().values()
    assert dash["uid"] == "flexinfer" and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24


def _configmaps(values: dict[str, Any]) -> list[Mapping[str, Any]]:
    return [o for o in of_kind(render(values), "ConfigMap")
            if o["metadata"]["labels"]["app.kubernetes.io/component"] == "dashboards"]


def test_dashboard_configmap_behind_the_value() -> None:
    assert _configmaps({}) == []
    (cm,) = _configmaps({"grafana": {"dashboards": {"enabled": True}}})
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NAMESPACE and cm["metadata"]["name"] == "flexinfer-dashboards"
    assert json.loads(cm["data"]["flexinfer.json"]) == json.loads((DASHBOARDS / "flexinfer.json").read_text())
    assert len(json.dumps(cm)) < 256 * 1024  # fits kubectl apply's last-applied annotation
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(cm, version, strict=True)
    (cm,) = _configmaps({"grafana": {"dashboards": {
        "enabled": True, "labelKey": "example.com/dashboard", "labelValue": "yes", "namespace": "monitoring",
        "annotations": {"grafana_folder": "FlexInfer"}}}})
    assert cm["metadata"]["labels"]["example.com/dashboard"] == "yes" and "grafana_dashboard" not in \
        cm["metadata"]["labels"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "FlexInfer"}


def test_operator_metrics_port_is_exposed_and_scraped() -> None:
    objs = render({"monitoring": {"podMonitor": {"enabled": True}}, "networkPolicy": {"enabled": True},
                   "operator": {"metricsPort": 9400}}, api_versions=MONITORING)
    dep = one(objs, "Deployment", "operator")
    c = container(dep, "operator")
    assert "--metrics-port=9400" in c["args"]
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in c["ports"]
    pm = one(objs, "PodMonitor", "operator")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pol = one(objs, "NetworkPolicy", "operator")
    assert {"port": "metrics", "protocol": "TCP"} in pol["spec"]["ingress"][0]["ports"]
    # the value off: no PodMonitor for the operator, the port still served
    objs = render({}, api_versions=MONITORING)
    assert not [o for o in of_kind(objs, "PodMonitor")]
    assert "--metrics-port=8080" in container(one(objs, "Deployment", "operator"), "operator")["args"]
