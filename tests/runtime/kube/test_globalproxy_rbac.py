"""The chart's global-proxy Role, proven on the emulator with RBAC on: ``runtime.kubeglobal`` run as the
global proxy's ServiceAccount reads its GlobalProxy, the FederatedModels and the TLS Secret named by
``globalProxy.tls.secretName`` (``resourceNames``), writes the status, and is denied any other Secret
(reported ``SecretForbidden``, nothing crashes)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from flexinfer.runtime.globalrt import GlobalRuntime, empty_config
from flexinfer.runtime.kubeglobal import KubeGlobalSource
from tests.api.helpers import CRDS
from tests.chart.helpers import render
from tests.kube_emulator import KubeEnv
from tests.kube_rbac import Policy
from tests.tls.certs import make_certs

GPROXIES = "ai.flexinfer/v1alpha2/globalproxies"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "v1alpha2" / "globalproxy.yaml"


def _tls(obj: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "TLSReady")


async def test_global_proxy_role_allows_its_secret_only(kube: KubeEnv, tmp_path: Path) -> None:
    objs = [o for o in render({"globalProxy": {"enabled": True, "tls": {"secretName": "global-proxy-tls"}}},
                              namespace="default")
            if o["metadata"]["labels"].get("app.kubernetes.io/component") == "global-proxy"]
    sa = next(o for o in objs if o["kind"] == "ServiceAccount")["metadata"]["name"]
    for name in ("globalproxies", "federatedmodels"):
        kube.register_crd(yaml.safe_load((CRDS / f"ai.flexinfer_{name}.yaml").read_text()))
    gp = yaml.safe_load(EXAMPLE.read_text())
    kube.seed(GPROXIES, {**gp, "metadata": {**gp["metadata"], "namespace": "default"}})
    ca = make_certs(tmp_path / "certs").ca
    for name in ("global-proxy-tls", "other-tls"):
        kube.seed("v1/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default"},
                                 "data": {"ca.crt": base64.b64encode(ca.read_bytes()).decode()}})
    az = kube.authorize(Policy.from_objects([o for o in objs if o["kind"] in ("Role", "RoleBinding")]))
    az.add_service_account("token-gp", "default", sa)
    view = kube.as_user(kube.kubeconfig_for("token-gp", tmp_path / "gp.kubeconfig"))
    runtime = GlobalRuntime(empty_config())
    async with view.api_client() as api:
        source = KubeGlobalSource(runtime, api, "default")
        try:
            await source.sync()
            assert source.error is None and source.tls_condition is not None
            assert source.tls_condition[:2] == ("True", "SecretLoaded"), source.tls_condition
            await source.write_status()
            got = kube.get(GPROXIES, "default", "global")
            assert got is not None and _tls(got)["reason"] == "SecretLoaded"
            assert runtime.config.tls is not None and runtime.config.tls.ca_file is not None
            # another Secret than the one the Role names: denied, reported, the last good material kept
            await kube.upsert(GPROXIES, {**got, "spec": {**got["spec"], "tls": {"secretRef": {"name": "other-tls"}}}})
            await source.sync()
            assert source.tls_condition is not None and source.tls_condition[1] == "SecretForbidden"
            assert "last good TLS material stays" in source.tls_condition[2]
            assert runtime.config.tls is not None
        finally:
            await source.stop()
    denied = [d.attributes.describe() for d in az.decisions if not d.allowed]
    assert denied == [d for d in denied if "other-tls" in d] and len(denied) == 1, denied
