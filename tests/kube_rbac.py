"""Kubernetes RBAC for the test emulator: an authorizer that evaluates Roles, ClusterRoles, RoleBindings
and ClusterRoleBindings (given as manifests) for every request, and records every decision.

What it implements (the kube-apiserver's ``RequestInfoFactory`` and ``rbac/validation.RuleAllows``):

- **identity**: one bearer token per user (:meth:`Authorizer.add_service_account` maps a token to
  ``system:serviceaccount:<ns>:<name>`` with the groups ``system:serviceaccounts``,
  ``system:serviceaccounts:<ns>`` and ``system:authenticated``); the ``admin_tokens`` (the emulator's
  default kubeconfig token ``dummy``) are ``system:admin`` in ``system:masters``, which is allowed
  everything without consulting the policy (as the apiserver's superuser group); an unknown token is a
  401; a request without ``Authorization`` is ``system:anonymous`` (group ``system:unauthenticated``);
- **request attributes**: ``/api/v1/...`` and ``/apis/<group>/<version>/...`` are resource requests
  (``namespaces/<ns>/<resource>/<name>/<subresource>``; ``/api/v1/namespaces/<ns>`` is resource
  ``namespaces`` named and namespaced ``<ns>``; ``namespaces/<ns>/status|finalize`` are its
  subresources; the legacy ``/watch/`` path prefix is the verb ``watch``); everything else
  (``/api``, ``/apis``, ``/apis/<group>``, ``/version``, ``/openapi/v2``…) is a non-resource request
  whose verb is the lower-cased HTTP method;
- **verbs**: GET/HEAD with a name = ``get``, without = ``list`` or, with ``watch=true|1|t|True``,
  ``watch`` (a ``fieldSelector=metadata.name=<n>`` on a list/watch sets the name, so
  ``resourceNames`` rules can allow it); POST = ``create``; PUT = ``update``; PATCH = ``patch``;
  DELETE = ``delete``, on a collection ``deletecollection``;
- **rules**: ``verbs``, ``apiGroups`` and ``resources`` match exactly or by ``*``; a subresource
  request (``models/status``, ``deployments/scale``) needs ``<resource>/<sub>``, ``*/<sub>`` or ``*``
  (``<resource>/*`` is not a wildcard, as in Kubernetes); an empty ``resourceNames`` matches any
  name, otherwise the request's name must be listed (so list/watch/create with no name never match
  it); ``nonResourceURLs`` match exactly, by ``*``, or by a trailing-``*`` prefix;
- **bindings**: a ClusterRoleBinding grants its ClusterRole everywhere; a RoleBinding grants its Role
  (of the binding's namespace) or ClusterRole only for requests in the binding's namespace, so
  cluster-scoped resources, all-namespace lists and non-resource URLs need a ClusterRoleBinding;
  subjects ``ServiceAccount`` (namespace defaulting to the binding's), ``User`` and ``Group``;
  ClusterRole ``aggregationRule`` (``matchLabels`` and ``matchExpressions`` over other ClusterRoles);
- **discovery is always allowed to authenticated users**: the apiserver's bootstrap ClusterRoles
  ``system:discovery`` (get on ``/api``, ``/api/*``, ``/apis``, ``/apis/*``, ``/openapi``,
  ``/openapi/*``, ``/version``, ``/healthz``…), ``system:public-info-viewer`` and
  ``system:basic-user`` (create selfsubjectaccessreviews/rulesreviews/reviews) bound to
  ``system:authenticated`` are part of every policy (``builtin=True``; never reported as unused), so a
  chart never needs to grant discovery.

Left out: impersonation, the ``escalate``/``bind`` checks on writing RBAC objects (the policy is static
for a test), ``proxy``/``connect`` special verbs beyond parsing, ``namespaces/<ns>`` list subtleties
of webhook authorizers, and any authorizer other than RBAC (Node, ABAC, webhook).

The :class:`Authorizer` records every decision: :meth:`Authorizer.denied` (with the rule that would be
needed), :meth:`Authorizer.unused_rules` (policy rules no request used) and
:meth:`Authorizer.usage` (per user: ``(apiGroup, resource, verb)`` seen allowed), so a test can fail
on a missing rule and on excess privilege.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import yaml

NEEDED_BECAUSE = "# needed because:"
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True)
class UserInfo:
    name: str
    groups: tuple[str, ...] = ()


def service_account(namespace: str, name: str) -> UserInfo:
    """The identity of a ServiceAccount's token, as the apiserver's token authenticator gives it."""
    return UserInfo(f"system:serviceaccount:{namespace}:{name}",
                    ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


ADMIN = UserInfo("system:admin", ("system:masters", "system:authenticated"))
ANONYMOUS = UserInfo("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True)
class Attributes:
    """The authorizer's view of one request (``authorizer.Attributes``)."""

    user: UserInfo
    verb: str
    resource_request: bool = True
    namespace: str = ""
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def describe(self) -> str:
        if not self.resource_request:
            return f"{self.verb} {self.path}"
        where = f"namespace {self.namespace}" if self.namespace else "cluster"
        group = self.api_group or "core"
        named = f" {self.name!r}" if self.name else ""
        return f"{self.verb} {group}/{self.combined_resource}{named} ({where})"


def request_attributes(method: str, path: str, query: str | Mapping[str, str], user: UserInfo) -> Attributes:
    """Attributes of a request the way the apiserver's ``RequestInfoFactory`` computes them."""
    params: Mapping[str, str]
    if isinstance(query, str):
        params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    else:
        params = query
    method = method.upper()
    parts = [p for p in path.strip("/").split("/") if p]
    nonresource = Attributes(user=user, verb=method.lower(), resource_request=False, path=path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return nonresource
    prefix, rest = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(rest) < 3:
            return nonresource
        group, rest = rest[0], rest[1:]
    rest = rest[1:]  # the version
    verb = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}.get(method, "")
    if rest and rest[0] in ("watch", "proxy"):
        if len(rest) < 2:
            return nonresource
        verb, rest = rest[0], rest[1:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        verb = "watch" if params.get("watch", "") in _TRUE else "list"
        m = re.fullmatch(r"metadata\.name==?([^,]+)", params.get("fieldSelector", "").strip())
        if m:
            name = m.group(1)
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(user=user, verb=verb, namespace=namespace, api_group=group, resource=resource,
                      subresource=subresource, name=name, path=path)


# ---- policy ---------------------------------------------------------------------------------------


@dataclass
class Rule:
    """One ``PolicyRule`` of a Role or ClusterRole."""

    role_kind: str
    role_name: str
    role_namespace: str
    index: int
    verbs: tuple[str, ...] = ()
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()
    comment: str = ""
    builtin: bool = False

    @property
    def id(self) -> str:
        where = f"{self.role_namespace}/" if self.role_namespace else ""
        return f"{self.role_kind}/{where}{self.role_name}#{self.index}"

    @property
    def justified(self) -> bool:
        return NEEDED_BECAUSE in self.comment

    def as_dict(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        if self.non_resource_urls:
            out["nonResourceURLs"] = list(self.non_resource_urls)
        else:
            out["apiGroups"] = list(self.api_groups)
            out["resources"] = list(self.resources)
        if self.resource_names:
            out["resourceNames"] = list(self.resource_names)
        out["verbs"] = list(self.verbs)
        return out

    def allows(self, a: Attributes) -> bool:
        """``rbac/validation.RuleAllows``."""
        if not ("*" in self.verbs or a.verb in self.verbs):
            return False
        if not a.resource_request:
            for url in self.non_resource_urls:
                if url == "*" or url == a.path:
                    return True
                if url.endswith("*") and a.path.startswith(url.rstrip("*")):
                    return True
            return False
        if not ("*" in self.api_groups or a.api_group in self.api_groups):
            return False
        combined = a.combined_resource
        ok = any(res in ("*", combined) or (a.subresource and res == f"*/{a.subresource}") for res in self.resources)
        if not ok:
            return False
        return not self.resource_names or a.name in self.resource_names


@dataclass
class Binding:
    kind: str  # RoleBinding | ClusterRoleBinding
    name: str
    namespace: str
    role_kind: str
    role_name: str
    subjects: tuple[Mapping[str, Any], ...]
    builtin: bool = False

    def applies_to(self, user: UserInfo) -> bool:
        """``rbac.appliesToUser``."""
        for s in self.subjects:
            kind = s.get("kind")
            if kind == "User" and s.get("name") == user.name:
                return True
            if kind == "Group" and s.get("name") in user.groups:
                return True
            if kind == "ServiceAccount":
                ns = s.get("namespace") or self.namespace
                if user.name == f"system:serviceaccount:{ns}:{s.get('name')}":
                    return True
        return False


def _tuple(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in (v or ()))


def _selector_matches(sel: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in sel.get("matchExpressions") or ():
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or ())
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _rule_comments(text: str) -> list[list[str]]:
    """Per document, per rule of its ``rules:`` list: the comment text attached to that rule (comment
    lines directly above its ``-`` line and every comment inside it)."""
    lines = text.splitlines()
    out: list[list[str]] = []
    for doc in yaml.compose_all(text, Loader=yaml.SafeLoader):
        found: list[str] = []
        if isinstance(doc, yaml.MappingNode):
            for key, value in doc.value:
                if getattr(key, "value", None) == "rules" and isinstance(value, yaml.SequenceNode):
                    items = value.value
                    for i, item in enumerate(items):
                        start = item.start_mark.line
                        stop = items[i + 1].start_mark.line if i + 1 < len(items) else (
                            item.end_mark.line + (1 if item.end_mark.column else 0))
                        own = lines[start:stop]
                        if i + 1 < len(items):  # comment lines at the end lead into the next rule
                            while own and (not own[-1].strip() or own[-1].strip().startswith("#")):
                                own = own[:-1]
                        lead: list[str] = []
                        j = start - 1
                        while j >= 0 and lines[j].strip().startswith("#"):
                            lead.insert(0, lines[j])
                            j -= 1
                        found.append("\n".join(ln[ln.index("#"):] for ln in (*lead, *own) if "#" in ln))
        out.append(found)
    return out


BOOTSTRAP_YAML = """
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: "system:discovery"}
rules:
- nonResourceURLs: [/api, /api/*, /apis, /apis/*, /healthz, /livez, /openapi, /openapi/*, /readyz,
                    /version, /version/]
  verbs: [get]
---
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: "system:public-info-viewer"}
rules:
- nonResourceURLs: [/healthz, /livez, /readyz, /version, /version/]
  verbs: [get]
---
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: "system:basic-user"}
rules:
- apiGroups: [authorization.k8s.io]
  resources: [selfsubjectaccessreviews, selfsubjectrulesreviews]
  verbs: [create]
- apiGroups: [authentication.k8s.io]
  resources: [selfsubjectreviews]
  verbs: [create]
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: "system:discovery"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:discovery"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}]
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: "system:public-info-viewer"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:public-info-viewer"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"},
           {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:unauthenticated"}]
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: "system:basic-user"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:basic-user"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}]
"""


@dataclass
class Policy:
    """Roles, ClusterRoles and their bindings; :meth:`rules_for` walks them like the RBAC authorizer."""

    roles: dict[tuple[str, str], list[Rule]] = field(default_factory=dict)  # (namespace, name)
    cluster_roles: dict[str, list[Rule]] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _aggregation: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    _role_labels: dict[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]], *, comments: Iterable[list[str]] | None = None,
                     bootstrap: bool = True) -> Policy:
        """Build a policy from manifests (objects of other kinds are ignored)."""
        policy = cls()
        if bootstrap:
            policy.add_yaml(BOOTSTRAP_YAML, builtin=True)
        policy.add(objects, comments=comments)
        return policy

    @classmethod
    def from_yaml(cls, text: str, *, bootstrap: bool = True) -> Policy:
        """Build a policy from a multi-document YAML text, keeping each rule's comments."""
        policy = cls.from_objects((), bootstrap=bootstrap)
        policy.add_yaml(text)
        return policy

    def add_yaml(self, text: str, *, builtin: bool = False) -> None:
        docs = list(yaml.safe_load_all(text))
        self.add([d for d in docs], comments=_rule_comments(text), builtin=builtin)

    def add(self, objects: Iterable[Mapping[str, Any]], *, comments: Iterable[list[str]] | None = None,
            builtin: bool = False) -> None:
        objs = list(objects)
        notes = list(comments) if comments is not None else [[] for _ in objs]
        for obj, doc_notes in zip(objs, notes, strict=False):
            if not isinstance(obj, Mapping):
                continue
            kind = obj.get("kind")
            if kind == "List":
                self.add(obj.get("items") or (), builtin=builtin)
                continue
            meta = obj.get("metadata") or {}
            name, ns = str(meta.get("name", "")), str(meta.get("namespace") or "")
            if kind in ("Role", "ClusterRole"):
                if kind == "Role" and not ns:
                    self.errors.append(f"Role {name} has no namespace (give the rendered manifests a namespace)")
                rules = []
                for i, r in enumerate(obj.get("rules") or ()):
                    rules.append(Rule(role_kind=kind, role_name=name, role_namespace=ns if kind == "Role" else "",
                                      index=i, verbs=_tuple(r.get("verbs")), api_groups=_tuple(r.get("apiGroups")),
                                      resources=_tuple(r.get("resources")),
                                      resource_names=_tuple(r.get("resourceNames")),
                                      non_resource_urls=_tuple(r.get("nonResourceURLs")),
                                      comment=doc_notes[i] if i < len(doc_notes) else "", builtin=builtin))
                if kind == "Role":
                    self.roles[(ns, name)] = rules
                else:
                    self.cluster_roles[name] = rules
                    self._role_labels[name] = meta.get("labels") or {}
                    agg = obj.get("aggregationRule")
                    if agg:
                        self._aggregation[name] = list(agg.get("clusterRoleSelectors") or ())
            elif kind in ("RoleBinding", "ClusterRoleBinding"):
                ref = obj.get("roleRef") or {}
                if kind == "RoleBinding" and not ns:
                    self.errors.append(f"RoleBinding {name} has no namespace")
                self.bindings.append(Binding(kind=kind, name=name, namespace=ns if kind == "RoleBinding" else "",
                                             role_kind=str(ref.get("kind", "")), role_name=str(ref.get("name", "")),
                                             subjects=tuple(obj.get("subjects") or ()), builtin=builtin))

    def cluster_role_rules(self, name: str) -> list[Rule]:
        rules = list(self.cluster_roles.get(name, ()))
        for sel in self._aggregation.get(name, ()):
            for other, labels in self._role_labels.items():
                if other != name and _selector_matches(sel, labels):
                    rules.extend(self.cluster_roles[other])
        return rules

    def _binding_rules(self, b: Binding) -> list[Rule]:
        if b.role_kind == "ClusterRole":
            if b.role_name not in self.cluster_roles:
                self.errors.append(f"{b.kind} {b.name} refers to a missing ClusterRole {b.role_name}")
            return self.cluster_role_rules(b.role_name)
        if b.role_kind == "Role" and b.kind == "RoleBinding":
            if (b.namespace, b.role_name) not in self.roles:
                self.errors.append(f"RoleBinding {b.namespace}/{b.name} refers to a missing Role {b.role_name}")
            return list(self.roles.get((b.namespace, b.role_name), ()))
        self.errors.append(f"{b.kind} {b.name} has an invalid roleRef {b.role_kind}/{b.role_name}")
        return []

    def rules_for(self, user: UserInfo, namespace: str) -> Iterator[Rule]:
        """``DefaultRuleResolver.VisitRulesFor``: ClusterRoleBindings, then the namespace's RoleBindings."""
        for b in self.bindings:
            if b.kind == "ClusterRoleBinding" and b.applies_to(user):
                yield from self._binding_rules(b)
        if namespace:
            for b in self.bindings:
                if b.kind == "RoleBinding" and b.namespace == namespace and b.applies_to(user):
                    yield from self._binding_rules(b)

    def all_rules(self) -> list[Rule]:
        out = [r for rules in self.cluster_roles.values() for r in rules]
        out += [r for rules in self.roles.values() for r in rules]
        return out


# ---- decisions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    attributes: Attributes
    allowed: bool
    rules: tuple[str, ...] = ()  # ids of every policy rule that allows the request
    status: int = 200  # 401 / 403 when refused

    @property
    def needed_rule(self) -> dict[str, Any]:
        """The rule (and binding scope) that would have allowed this request."""
        a = self.attributes
        if not a.resource_request:
            return {"nonResourceURLs": [a.path], "verbs": [a.verb], "scope": "ClusterRoleBinding"}
        return {"apiGroups": [a.api_group], "resources": [a.combined_resource], "verbs": [a.verb],
                "scope": f"RoleBinding in {a.namespace}" if a.namespace else "ClusterRoleBinding"}


def forbidden_status(a: Attributes) -> dict[str, Any]:
    """The apiserver's 403 ``Status`` (``responsewriters.forbiddenMessage`` + ``NewForbidden``)."""
    user = a.user.name
    if not a.resource_request:
        message = f'forbidden: User "{user}" cannot {a.verb} path "{a.path}"'
        details: dict[str, Any] = {}
    else:
        where = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
        reason = (f'User "{user}" cannot {a.verb} resource "{a.combined_resource}" in API group '
                  f'"{a.api_group}" {where}')
        qualified = f"{a.resource}.{a.api_group}" if a.api_group else a.resource
        message = f'{qualified} "{a.name}" is forbidden: {reason}' if a.name else f"{qualified} is forbidden: {reason}"
        details = {"group": a.api_group, "kind": a.resource, **({"name": a.name} if a.name else {})}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": "Forbidden", "details": details, "code": 403}


@dataclass
class Authorizer:
    """Authenticates bearer tokens, authorizes with :class:`Policy`, records every :class:`Decision`."""

    policy: Policy
    tokens: dict[str, UserInfo] = field(default_factory=dict)
    admin_tokens: frozenset[str] = frozenset({"dummy"})
    decisions: list[Decision] = field(default_factory=list)
    enforce: bool = True  # False: audit mode, a denial is recorded but the request is served anyway

    def needed_rules(self) -> dict[str, dict[tuple[str, str, str], set[str]]]:
        """user → (scope, apiGroup, resource[/sub] or URL) → verbs denied: the rules to add."""
        out: dict[str, dict[tuple[str, str, str], set[str]]] = {}
        for d in self.denied():
            a = d.attributes
            key = (d.needed_rule["scope"], a.api_group, a.combined_resource) if a.resource_request else \
                ("ClusterRoleBinding", "(url)", a.path)
            out.setdefault(a.user.name, {}).setdefault(key, set()).add(a.verb)
        return out

    def add_service_account(self, token: str, namespace: str, name: str) -> UserInfo:
        user = service_account(namespace, name)
        self.tokens[token] = user
        return user

    def authenticate(self, authorization: str | None) -> UserInfo | None:
        """The user of an ``Authorization`` header; None for an unknown token (a 401)."""
        if not authorization:
            return ANONYMOUS
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        token = token.strip()
        if token in self.admin_tokens:
            return ADMIN
        return self.tokens.get(token)

    def authorize(self, a: Attributes) -> Decision:
        if "system:masters" in a.user.groups:
            d = Decision(a, True)
        else:
            seen: dict[str, None] = {}
            for rule in self.policy.rules_for(a.user, a.namespace if a.resource_request else ""):
                if rule.allows(a):
                    seen.setdefault(rule.id, None)
            d = Decision(a, bool(seen), tuple(seen), 200 if seen else 403)
        self.decisions.append(d)
        return d

    def check(self, method: str, path: str, query: str, authorization: str | None) -> Decision:
        user = self.authenticate(authorization)
        if user is None:
            d = Decision(request_attributes(method, path, query, ANONYMOUS), False, (), 401)
            self.decisions.append(d)
            return d
        return self.authorize(request_attributes(method, path, query, user))

    # -- reports -----------------------------------------------------------------------------------

    def denied(self, user: str | None = None) -> list[Decision]:
        return [d for d in self.decisions if not d.allowed and (user is None or d.attributes.user.name == user)]

    def used_rule_ids(self) -> set[str]:
        return {r for d in self.decisions for r in d.rules}

    def unused_rules(self) -> list[Rule]:
        """Policy rules (not the builtin discovery ones) that allowed no request."""
        used = self.used_rule_ids()
        return [r for r in self.policy.all_rules() if not r.builtin and r.id not in used]

    def usage(self, user: str | None = None, *, include_builtin: bool = False) -> dict[str, dict[tuple[str, str], set[str]]]:
        """user → (apiGroup, resource[/sub] or URL) → verbs seen allowed by the policy."""
        builtin = {r.id for r in self.policy.all_rules() if r.builtin}
        out: dict[str, dict[tuple[str, str], set[str]]] = {}
        for d in self.decisions:
            a = d.attributes
            if not d.allowed or not d.rules or (user is not None and a.user.name != user):
                continue
            if not include_builtin and all(r in builtin for r in d.rules):
                continue
            key = (a.api_group, a.combined_resource) if a.resource_request else ("(url)", a.path)
            out.setdefault(a.user.name, {}).setdefault(key, set()).add(a.verb)
        return out

    def unused_grants(self) -> dict[str, list[tuple[str, str, str]]]:
        """Per used rule: the explicit (apiGroup, resource, verb) triples it grants that no request used
        (rules with ``*`` are skipped: what they grant cannot be listed)."""
        used: dict[str, set[tuple[str, str, str]]] = {}
        for d in self.decisions:
            a = d.attributes
            for rid in d.rules:
                used.setdefault(rid, set()).add((a.api_group, a.combined_resource, a.verb))
        out: dict[str, list[tuple[str, str, str]]] = {}
        for r in self.policy.all_rules():
            if r.builtin or r.id not in used or r.non_resource_urls:
                continue
            if "*" in r.verbs or "*" in r.api_groups or "*" in r.resources:
                continue
            missing = [(g, res, v) for g in r.api_groups for res in r.resources for v in r.verbs
                       if (g, res, v) not in used[r.id]]
            if missing:
                out[r.id] = missing
        return out

    def report(self) -> str:
        lines = []
        for d in self.denied():
            lines.append(f"DENIED {d.attributes.user.name}: {d.attributes.describe()} -> needs {d.needed_rule}")
        for r in self.unused_rules():
            mark = " (justified: needed because)" if r.justified else ""
            lines.append(f"UNUSED {r.id}{mark}: {r.as_dict()}")
        for rid, triples in self.unused_grants().items():
            lines.append(f"PARTLY UNUSED {rid}: " + ", ".join(f"{v} {g or 'core'}/{res}" for g, res, v in triples))
        return "\n".join(lines)


__all__ = ["ADMIN", "ANONYMOUS", "NEEDED_BECAUSE", "Attributes", "Authorizer", "Binding", "Decision", "Policy",
           "Rule", "UserInfo", "forbidden_status", "request_attributes", "service_account"]

