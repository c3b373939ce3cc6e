"""The chart's global proxy (values ``globalProxy``): off by default; on, a Deployment running
``flexinfer proxy --global --kube`` with exactly the RBAC runtime.kubeglobal needs, and a Service.
Every rendered manifest is also validated by tests/chart/test_render.py (case ``global-proxy``)."""

from __future__ import annotations

import argparse
from typing import Any

import kubernetes_validate

from flexinfer.cmd.proxy import configure
from tests.chart.helpers import container, one, render


def _mine(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["metadata"]["labels"]["app.kubernetes.io/component"] == "global-proxy"]


def test_off_by_default() -> None:
    assert _mine(render({})) == []


def test_on_renders_a_valid_deployment_service_and_role() -> None:
    objs = _mine(render({"globalProxy": {"enabled": True, "name": "global", "service": {"port": 8000}}}))
    assert sorted(o["kind"] for o in objs) == ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    for o in objs:
        kubernetes_validate.validate(o, "1.30", strict=True)
    c = container(one(objs, "Deployment", "global-proxy"), "global-proxy")
    assert c["command"] == ["flexinfer"]
    p = argparse.ArgumentParser()
    configure(p)
    args = p.parse_args(c["args"][1:])  # the real CLI accepts exactly these flags
    assert (args.global_, args.kube, args.global_name, args.workers) == ("", True, "global", 1)
    rules = {(tuple(r["resources"]), tuple(r["verbs"]), tuple(r.get("resourceNames") or ()))
             for r in one(objs, "Role", "global-proxy")["rules"]}
    assert rules == {(("globalproxies", "federatedmodels"), ("get", "list"), ()),
                     (("globalproxies/status",), ("patch",), ()), (("secrets",), ("get",), ())}
    svc = one(objs, "Service", "global-proxy")
    assert svc["spec"]["ports"][0]["port"] == 8000


def test_tls_secret_rule_by_name_or_off() -> None:
    """The TLS Secret of the GlobalProxy: ``get`` by name when the values name it, no Secret rule when off."""
    def secret_rules(tls: dict[str, Any]) -> list[dict[str, Any]]:
        objs = _mine(render({"globalProxy": {"enabled": True, "tls": tls}}))
        return [r for r in one(objs, "Role", "global-proxy")["rules"] if "secrets" in r["resources"]]

    assert secret_rules({"secretName": "global-proxy-tls"}) == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["global-proxy-tls"], "verbs": ["get"]}]
    assert secret_rules({"enabled": False}) == []
