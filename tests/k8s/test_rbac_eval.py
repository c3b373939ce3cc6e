"""The RBAC evaluator of the emulator (``tests/kube_rbac.py``) against table cases: request attributes
as the apiserver derives them, rule matching, binding scope, decisions and reports, and the 403 over
HTTP."""

from __future__ import annotations

import pytest

from tests.kube_emulator import KubeEnv, kube_fixture  # noqa: F401
from tests.kube_rbac import (
    Authorizer,
    Policy,
    UserInfo,
    forbidden_status,
    request_attributes,
    service_account,
)

SA = service_account("flexinfer-system", "operator")
OTHER = service_account("flexinfer-system", "proxy")

ATTR_CASES = [
    # method, path, query -> verb, group, resource, sub, name, namespace, resource_request
    ("GET", "/api/v1/namespaces/x/pods", "", ("list", "", "pods", "", "", "x", True)),
    ("GET", "/api/v1/namespaces/x/pods", "watch=true", ("watch", "", "pods", "", "", "x", True)),
    ("GET", "/api/v1/namespaces/x/pods", "watch=True", ("watch", "", "pods", "", "", "x", True)),
    ("GET", "/api/v1/namespaces/x/pods", "watch=1", ("watch", "", "pods", "", "", "x", True)),
    ("GET", "/api/v1/namespaces/x/pods", "watch=false", ("list", "", "pods", "", "", "x", True)),
    ("GET", "/api/v1/pods", "", ("list", "", "pods", "", "", "", True)),
    ("GET", "/api/v1/namespaces/x/pods/p", "", ("get", "", "pods", "", "p", "x", True)),
    ("HEAD", "/api/v1/namespaces/x/pods/p", "", ("get", "", "pods", "", "p", "x", True)),
    ("GET", "/api/v1/namespaces/x/pods", "fieldSelector=metadata.name%3Dp",
     ("list", "", "pods", "", "p", "x", True)),
    ("GET", "/api/v1/watch/namespaces/x/pods", "", ("watch", "", "pods", "", "", "x", True)),
    ("POST", "/apis/ai.flexinfer/v1alpha2/namespaces/x/models", "",
     ("create", "ai.flexinfer", "models", "", "", "x", True)),
    ("PUT", "/apis/ai.flexinfer/v1alpha2/namespaces/x/models/m", "",
     ("update", "ai.flexinfer", "models", "", "m", "x", True)),
    ("PATCH", "/apis/ai.flexinfer/v1alpha2/namespaces/x/models/m/status", "",
     ("patch", "ai.flexinfer", "models", "status", "m", "x", True)),
    ("PATCH", "/apis/apps/v1/namespaces/x/deployments/d/scale", "",
     ("patch", "apps", "deployments", "scale", "d", "x", True)),
    ("DELETE", "/api/v1/namespaces/x/configmaps/c", "", ("delete", "", "configmaps", "", "c", "x", True)),
    ("DELETE", "/api/v1/namespaces/x/configmaps", "", ("deletecollection", "", "configmaps", "", "", "x", True)),
    ("GET", "/api/v1/nodes/n", "", ("get", "", "nodes", "", "n", "", True)),
    ("PATCH", "/api/v1/nodes/n/status", "", ("patch", "", "nodes", "status", "n", "", True)),
    ("GET", "/api/v1/namespaces", "", ("list", "", "namespaces", "", "", "", True)),
    ("GET", "/api/v1/namespaces/x", "", ("get", "", "namespaces", "", "x", "x", True)),
    ("PUT", "/api/v1/namespaces/x/finalize", "", ("update", "", "namespaces", "finalize", "x", "x", True)),
    ("GET", "/api", "", ("get", "", "", "", "", "", False)),
    ("GET", "/api/v1", "", ("get", "", "", "", "", "", False)),
    ("GET", "/apis", "", ("get", "", "", "", "", "", False)),
    ("GET", "/apis/ai.flexinfer", "", ("get", "", "", "", "", "", False)),
    ("GET", "/apis/ai.flexinfer/v1alpha2", "", ("get", "", "", "", "", "", False)),
    ("GET", "/version", "", ("get", "", "", "", "", "", False)),
    ("POST", "/metrics", "", ("post", "", "", "", "", "", False)),
]


@pytest.mark.parametrize(("method", "path", "query", "want"), ATTR_CASES)
def test_request_attributes(method: str, path: str, query: str, want: tuple[object, ...]) -> None:
    a = request_attributes(method, path, query, SA)
    assert (a.verb, a.api_group, a.resource, a.subresource, a.name, a.namespace, a.resource_request) == want


POLICY = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: op}
rules:
# needed because: the operator watches its CRs everywhere
- apiGroups: [ai.flexinfer]
  resources: [models]
  verbs: [get, list, watch]
- apiGroups: [ai.flexinfer]
  resources: [models/status]   # needed because: status is written through the subresource
  verbs: [patch]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [update]
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [flexinfer-benchmark-results]
  verbs: [get, patch]
- apiGroups: ["*"]
  resources: ["*/status"]
  verbs: [get]
- nonResourceURLs: [/metrics, /logs/*]
  verbs: [get]
- apiGroups: [""]
  resources: [nodes]
  verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: op}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: op}
subjects: [{kind: ServiceAccount, name: operator, namespace: flexinfer-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: leases, namespace: flexinfer-system}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: leases, namespace: flexinfer-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leases}
subjects: [{kind: ServiceAccount, name: operator}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pods-reader}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: pods, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pods-reader}
subjects: [{kind: Group, name: "system:serviceaccounts:flexinfer-system"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: aggregate}
aggregationRule:
  clusterRoleSelectors: [{matchLabels: {agg: "yes"}}]
rules: []
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: part, labels: {agg: "yes"}}
rules:
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: aggregate}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: aggregate}
subjects: [{kind: User, name: alice}]
"""

M = "/apis/ai.flexinfer/v1alpha2"
DECISION_CASES = [
    # user, method, path, query, allowed
    (SA, "GET", f"{M}/models", "", True),  # list all namespaces: ClusterRoleBinding
    (SA, "GET", f"{M}/namespaces/x/models", "watch=true", True),
    (SA, "GET", f"{M}/namespaces/x/models/m", "", True),
    (SA, "PATCH", f"{M}/namespaces/x/models/m", "", False),  # patch only on models/status
    (SA, "PATCH", f"{M}/namespaces/x/models/m/status", "", True),
    (SA, "PUT", f"{M}/namespaces/x/models/m/status", "", False),  # update != patch
    (SA, "GET", f"{M}/namespaces/x/models/m/status", "", True),  # */status, any group
    (SA, "GET", "/apis/apps/v1/namespaces/x/deployments/d/status", "", True),
    (SA, "GET", "/apis/apps/v1/namespaces/x/deployments/d", "", False),  # */status is not the main resource
    (SA, "PUT", "/apis/apps/v1/namespaces/x/deployments/d/scale", "", True),
    (SA, "PUT", "/apis/apps/v1/namespaces/x/deployments/d", "", False),
    (SA, "GET", "/api/v1/namespaces/x/configmaps/flexinfer-benchmark-results", "", True),
    (SA, "GET", "/api/v1/namespaces/x/configmaps/other", "", False),  # resourceNames
    (SA, "GET", "/api/v1/namespaces/x/configmaps", "", False),  # list never matches resourceNames
    (SA, "GET", "/api/v1/namespaces/x/configmaps", "fieldSelector=metadata.name=flexinfer-benchmark-results",
     False),  # the name is set, but list is not among the verbs
    (SA, "PATCH", "/api/v1/nodes/n", "", True),  # verbs *
    (SA, "DELETE", "/api/v1/nodes", "", True),  # deletecollection via *
    (SA, "PATCH", "/api/v1/nodes/n/status", "", False),  # [nodes] is not nodes/status; */status is get only
    (SA, "GET", "/metrics", "", True),
    (SA, "POST", "/metrics", "", False),
    (SA, "GET", "/logs/kube-apiserver.log", "", True),
    (SA, "GET", "/apis", "", True),  # discovery: system:discovery to system:authenticated
    (SA, "GET", f"{M}", "", True),
    (SA, "GET", "/version", "", True),
    (SA, "GET", "/apis/coordination.k8s.io/v1/namespaces/flexinfer-system/leases/l", "", True),
    (SA, "GET", "/apis/coordination.k8s.io/v1/namespaces/other/leases/l", "", False),  # Role is namespaced
    (SA, "GET", "/apis/coordination.k8s.io/v1/leases", "", False),
    (OTHER, "GET", "/api/v1/namespaces/team-a/pods", "", True),  # ClusterRole via RoleBinding, by Group
    (OTHER, "GET", "/api/v1/namespaces/team-b/pods", "", False),
    (OTHER, "GET", "/api/v1/pods", "", False),  # all namespaces needs a ClusterRoleBinding
    (OTHER, "GET", f"{M}/models", "", False),
    (UserInfo("alice", ("system:authenticated",)), "POST", "/apis/batch/v1/namespaces/x/jobs", "", True),
    (UserInfo("alice", ("system:authenticated",)), "GET", "/apis/batch/v1/namespaces/x/jobs", "", False),
    (UserInfo("system:anonymous", ("system:unauthenticated",)), "GET", "/apis", "", False),
    (UserInfo("system:anonymous", ("system:unauthenticated",)), "GET", "/version", "", True),
]


@pytest.mark.parametrize(("user", "method", "path", "query", "allowed"), DECISION_CASES)
def test_decisions(user: UserInfo, method: str, path: str, query: str, allowed: bool) -> None:
    az = Authorizer(Policy.from_yaml(POLICY))
    assert az.authorize(request_attributes(method, path, query, user)).allowed is allowed


def test_policy_records_comments_and_reports() -> None:
    policy = Policy.from_yaml(POLICY)
    assert not policy.errors
    op = policy.cluster_roles["op"]
    assert op[0].justified and op[1].justified and not op[2].justified
    az = Authorizer(policy)
    az.authorize(request_attributes("GET", f"{M}/models", "watch=1", SA))
    az.authorize(request_attributes("PATCH", f"{M}/namespaces/x/models/m", "", SA))
    assert [d.needed_rule for d in az.denied()] == [
        {"apiGroups": ["ai.flexinfer"], "resources": ["models"], "verbs": ["patch"], "scope": "RoleBinding in x"}]
    unused = {r.id for r in az.unused_rules()}
    assert "ClusterRole/op#0" not in unused and "ClusterRole/op#1" in unused
    assert "Role/flexinfer-system/leases#0" in unused
    assert not any(r.startswith("ClusterRole/system:") for r in unused)  # the builtin ones never count
    assert az.unused_grants()["ClusterRole/op#0"] == [("ai.flexinfer", "models", "get"),
                                                       ("ai.flexinfer", "models", "list")]
    assert az.usage() == {SA.name: {("ai.flexinfer", "models"): {"watch"}}}
    assert "DENIED system:serviceaccount:flexinfer-system:operator" in az.report()


def test_forbidden_message_is_the_apiservers() -> None:
    a = request_attributes("GET", f"{M}/namespaces/x/models", "", SA)
    body = forbidden_status(a)
    assert body["kind"] == "Status" and body["reason"] == "Forbidden" and body["code"] == 403
    assert body["message"] == ('models.ai.flexinfer is forbidden: User "system:serviceaccount:flexinfer-system:'
                               'operator" cannot list resource "models" in API group "ai.flexinfer" in the '
                               'namespace "x"')
    named = forbidden_status(request_attributes("PATCH", "/api/v1/nodes/n/status", "", SA))
    assert named["message"] == ('nodes "n" is forbidden: User "system:serviceaccount:flexinfer-system:operator" '
                                'cannot patch resource "nodes/status" in API group "" at the cluster scope')
    url = forbidden_status(request_attributes("POST", "/metrics", "", SA))
    assert url["message"] == 'forbidden: User "system:serviceaccount:flexinfer-system:operator" cannot post path "/metrics"'


def test_missing_role_is_a_policy_error() -> None:
    policy = Policy.from_yaml("""
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: b}
roleRef: {kind: ClusterRole, name: nope}
subjects: [{kind: User, name: bob}]
""")
    az = Authorizer(policy)
    assert not az.authorize(request_attributes("GET", "/api/v1/pods", "", UserInfo("bob"))).allowed
    assert policy.errors == ["ClusterRoleBinding b refers to a missing ClusterRole nope"]


async def test_emulator_answers_403_and_401(kube: KubeEnv) -> None:
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client.exceptions import ApiException

    az = kube.authorize(Policy.from_yaml(POLICY))
    az.add_service_account("op-token", "flexinfer-system", "operator")
    kube.seed("v1/nodes", {"metadata": {"name": "n"}})
    cfg = kube.kubeconfig_for("op-token", kube.kubeconfig_path.parent / "op.kubeconfig")
    api = await config.new_client_from_config(config_file=str(cfg))
    try:
        core = k8s.CoreV1Api(api)
        assert (await core.read_node("n")).metadata.name == "n"
        with pytest.raises(ApiException) as exc:
            await core.list_namespaced_pod("team-b")
        assert exc.value.status == 403
        import json

        body = json.loads(exc.value.body)
        assert body["reason"] == "Forbidden"
        assert 'cannot list resource "pods" in API group "" in the namespace "team-b"' in body["message"]
    finally:
        await api.close()
    bad = kube.kubeconfig_for("nope", kube.kubeconfig_path.parent / "bad.kubeconfig")
    api = await config.new_client_from_config(config_file=str(bad))
    try:
        with pytest.raises(ApiException) as exc:
            await k8s.CoreV1Api(api).read_node("n")
        assert exc.value.status == 401
    finally:
        await api.close()
    async with kube.api_client() as admin:  # the default token is system:masters
        assert (await k8s.CoreV1Api(admin).list_namespaced_pod("team-b")).items == []
    assert [d.status for d in az.denied()] == [403, 401]
