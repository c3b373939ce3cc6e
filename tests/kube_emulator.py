"""A Kubernetes API emulator for tests: ``kmock.KubernetesEmulator`` with its known gaps fixed.

Use the async fixture ``kube`` (import it into the test module: ``from tests.kube_emulator import
KubeEnv, kube_fixture  # noqa: F401`` and take a ``kube: KubeEnv`` parameter) or the async context
manager :func:`start_kube` where a fixture does not fit.

``kube`` is a :class:`KubeEnv` with:

- ``url`` (``http://127.0.0.1:<port>``), ``kubeconfig_path`` (token ``dummy``; ``KUBECONFIG`` is set
  to it for the test), ``emulator`` (the :class:`FlexEmulator`, a ``kmock.KubernetesEmulator``:
  its whole DSL, ``objects`` and recorded requests still work), ``server`` (the ``kmock.Server``);
- ``register(resource, kind=..., namespaced=..., subresources=...)`` and ``register_crd(manifest)``;
- ``seed(resource, obj)`` / ``get(resource, namespace, name)`` / ``await upsert(resource, obj)``;
- ``writes`` / ``write_count(resource, method)`` and ``requests`` / ``request_count(...)``: counters of
  the requests received per (METHOD, resource key), faulted ones included;
- ``inject(method, path_regex, status=..., times=..., retry_after=..., delay=..., query=...)``:
  fault injection; ``expire_resource_versions()`` (410 for older watches) and
  ``await close_watches()`` (end every open watch stream, as an apiserver restart would);
- ``api_client()``: an async context manager giving a ``kubernetes_asyncio`` ``ApiClient``;
- ``authorize(policy)``: RBAC for every request from then on (``tests/kube_rbac.py``: bearer token →
  ServiceAccount, 403 ``Forbidden`` Status as the apiserver words it, every decision recorded) and
  ``kubeconfig_for(token, path)``.

Gaps of kmock 0.8 fixed here (``shared/reference/ecosystem-facts.md`` §3a) and other behaviour added:

1. create answers **201** (kubernetes_asyncio returns ``None`` on 200 for creates);
2. ``watch=True``/``1`` is a watch (kubernetes_asyncio sends ``True``);
3. ``generateName`` is filled in; a missing name is a 422;
4. create stamps ``uid``, ``namespace``, ``creationTimestamp``, ``generation`` 1, ``resourceVersion``,
   ``apiVersion``/``kind``; every change bumps the (cluster-wide, monotonic) ``resourceVersion``;
   ``generation`` grows only when something other than metadata/status changes; a no-op patch
   writes nothing (like the real apiserver);
5. status subresource semantics: the main endpoint ignores ``status``, ``…/status`` changes only
   ``status`` (resources registered with ``subresources={'status'}``); ``…/scale`` maps ``spec.replicas``;
6. optimistic concurrency: a stale ``metadata.resourceVersion`` in a merge patch or PUT → **409**;
   a failing JSON-patch ``test`` op (kopf's own guard) → **422**, not 500;
7. **PUT** replaces an object; DELETE honours finalizers (``deletionTimestamp``, removed when the last
   finalizer goes); DELETE on a collection deletes the matching objects;
8. ``labelSelector`` and ``fieldSelector`` on list, watch and collection delete;
9. lists carry a real ``resourceVersion``; a watch with ``resourceVersion`` resumes after it (only
   newer changes are replayed), an expired one (``expire_resource_versions()``) gets an ``ERROR`` 410 event; ``timeoutSeconds`` ends
   the stream; ``allowWatchBookmarks`` yields one BOOKMARK after the replay;
10. ``/api/v1/namespaces`` (list, get, create, delete) works; namespaces that objects use exist
    implicitly.

Not emulated: defaulting and schema validation, strategic-merge list semantics (lists are replaced),
server-side apply, ``limit``/``continue`` paging (everything comes in one page), label-change DELETED
events for watches with a selector, ownerReference garbage collection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import datetime
import itertools
import json
import random
import re
import uuid
import warnings
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import pytest
import pytest_asyncio
from kmock._internal import apps as _kapps
from kmock._internal import dicts as _kdicts
from kmock._internal import enums as _kenums
from kmock._internal import parsing as _kparsing
from kmock._internal import rendering as _krendering

from tests import kube_tables
from tests.kube_rbac import Authorizer, Policy, forbidden_status

ALL_VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    409: "Conflict", 410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
    503: "ServiceUnavailable", 504: "Timeout",
}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver uses for generateName suffixes
_NS_LIST = re.compile(r"^/api/v1/namespaces/?$")
_NS_ONE = re.compile(r"^/api/v1/namespaces/([^/]+)/?$")
_CLOSE = "__kube_emulator_close__"


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, message: str, reason: str | None = None) -> dict[str, Any]:
    """A ``v1.Status`` failure object, as the apiserver sends it."""
    return {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason or _REASONS.get(code, "Unknown"), "code": code,
    }


def _error(code: int, message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=code, reason=_REASONS.get(code, "Unknown"), message=message,
                                 details={"message": message})


def resource_key(resource: Any, subresource: str | None = None) -> str:
    """``"nodes"``, ``"models.ai.flexinfer"``, ``"nodes/status"``: how counters name a resource."""
    plural = resource.plural or ""
    base = plural if not resource.group else f"{plural}.{resource.group}"
    return f"{base}/{subresource}" if subresource else base


# ---- selectors ------------------------------------------------------------------------------------


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return [p for p in out if p]


_SET_REQ = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")


def label_selector_matches(selector: str | None, labels: Mapping[str, str] | None) -> bool:
    """Equality- and set-based label selectors (``a=b``, ``a!=b``, ``a in (x,y)``, ``a``, ``!a``)."""
    if not selector:
        return True
    labels = labels or {}
    for req in _split_top(selector):
        m = _SET_REQ.match(req)
        if m:
            k, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in" and labels.get(k) not in vals:
                return False
            if op == "notin" and k in labels and labels[k] in vals:
                return False
            continue
        if "!=" in req:
            k, v = (s.strip() for s in req.split("!=", 1))
            if labels.get(k) == v:
                return False
        elif "==" in req or "=" in req:
            k, v = (s.strip() for s in re.split(r"==?", req, maxsplit=1))
            if labels.get(k) != v:
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif req.strip() not in labels:
            return False
    return True


def _dig(obj: Mapping[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def field_selector_matches(selector: str | None, obj: Mapping[str, Any]) -> bool:
    """``a.b=c``, ``a.b==c``, ``a.b!=c`` over the object's fields (missing fields compare as "")."""
    if not selector:
        return True
    for req in _split_top(selector):
        neg = "!=" in req
        k, v = (s.strip() for s in (req.split("!=", 1) if neg else re.split(r"==?", req, maxsplit=1)))
        got = _dig(obj, k)
        got_s = "" if got is None else (str(got).lower() if isinstance(got, bool) else str(got))
        if (got_s == v) == neg:
            return False
    return True


# ---- faults ---------------------------------------------------------------------------------------


@dataclass
class Fault:
    """Answer the next ``times`` requests matching (method, path regex[, query regex])."""

    method: str | None
    path: re.Pattern[str]
    status: int | None = None
    times: int = 1
    retry_after: float | None = None
    delay: float | None = None
    query: re.Pattern[str] | None = None
    body: Any = None
    hits: int = 0

    @property
    def remaining(self) -> int:
        return self.times - self.hits

    def matches(self, method: str, path: str, query: str) -> bool:
        if self.remaining <= 0:
            return False
        if self.method not in (None, "*") and self.method.upper() != method:
            return False
        if not self.path.search(path):
            return False
        return self.query is None or bool(self.query.search(query))


# ---- the emulator ---------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class FlexEmulator(kmock.KubernetesEmulator):
    """``kmock.KubernetesEmulator`` that behaves closer to a real apiserver (see the module docstring)."""

    strict_status: bool = True
    writes: collections.Counter[tuple[str, str]] = attrs.field(factory=collections.Counter, init=False)
    seen: collections.Counter[tuple[str, str]] = attrs.field(factory=collections.Counter, init=False)
    faults: list[Fault] = attrs.field(factory=list, init=False)
    # (group, version, plural) -> additionalPrinterColumns; (group, version) -> [(kind, schema, plural, namespaced)]
    printer_columns: dict[tuple[str, str, str], list[dict[str, Any]]] = attrs.field(factory=dict, init=False)
    crd_schemas: dict[tuple[str, str], list[tuple[str, Any, str, bool]]] = attrs.field(factory=dict, init=False)
    authorizer: Authorizer | None = None  # a tests.kube_rbac.Authorizer: every request is authenticated and authorized
    _rv: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _last_rv: int = attrs.field(default=0, init=False)
    _min_rv: int = attrs.field(default=0, init=False)
    _epoch: int = attrs.field(default=0, init=False)

    # -- resource versions -------------------------------------------------------------------------

    def next_rv(self) -> str:
        """A new cluster-wide resourceVersion."""
        self._last_rv = next(self._rv)
        return str(self._last_rv)

    @property
    def current_rv(self) -> int:
        return self._last_rv

    def expire_resource_versions(self) -> None:
        """Watches that resume from a resourceVersion older than the current one now get 410 Gone
        (a fresh list's version stays valid, as after an etcd compaction)."""
        self._min_rv = self._last_rv

    async def close_watches(self) -> None:
        """End every open watch stream (the client sees a clean end of stream)."""
        self._epoch += 1
        for bus in list(self._buses.values()):
            await bus.put({"type": _CLOSE, "epoch": self._epoch})

    # -- resource info -----------------------------------------------------------------------------

    def _info(self, resource: Any) -> kmock.ResourceInfo | None:
        try:
            return self.resources[resource]
        except KeyError:
            return None

    def _has_status(self, resource: Any) -> bool:
        info = self._info(resource)
        return bool(self.strict_status and info is not None and "status" in info.subresources)

    def _namespaced(self, resource: Any, url_namespace: str | None) -> bool:
        info = self._info(resource)
        if info is not None and info.namespaced is not None:
            return bool(info.namespaced)
        return url_namespace is not None

    def _type_meta(self, resource: Any) -> tuple[str, str | None]:
        info = self._info(resource)
        api_version = f"{resource.group}/{resource.version}" if resource.group else str(resource.version)
        return api_version, (info.kind if info is not None else None)

    def stamp_new(self, resource: Any, obj: dict[str, Any], namespace: str | None) -> dict[str, Any]:
        """Fill server-side fields of a new object (in place) and return it."""
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _error(400, "metadata must be an object")
        if not meta.get("name"):
            gen = meta.get("generateName")
            if not gen:
                raise _error(422, "metadata.name or metadata.generateName is required")
            meta["name"] = gen + "".join(random.choice(_NAME_CHARS) for _ in range(5))
        if self._namespaced(resource, namespace):
            body_ns = meta.get("namespace")
            if namespace and body_ns and body_ns != namespace:
                raise _error(400, "the namespace of the provided object does not match the namespace "
                                  "sent on the request")
            meta["namespace"] = namespace or body_ns or "default"
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        meta["resourceVersion"] = self.next_rv()
        meta.pop("deletionTimestamp", None)
        api_version, kind = self._type_meta(resource)
        obj.setdefault("apiVersion", api_version)
        if kind:
            obj.setdefault("kind", kind)
        return obj

    # -- entry point -------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        method = raw_request.method.upper()
        path = raw_request.path
        try:
            parsed = _kparsing.parse_path(path)
            rkey = resource_key(kmock.resource(parsed.group, parsed.version, parsed.plural or ""),
                                parsed.subresource) if parsed.group is not None else path
        except ValueError:
            rkey = "namespaces" if path.startswith("/api/v1/namespaces") else path
        if _NS_LIST.match(path) or _NS_ONE.match(path):
            rkey = "namespaces"
        self.seen[(method, rkey)] += 1
        if method in WRITE_METHODS:
            self.writes[(method, rkey)] += 1

        if self.authorizer is not None:
            decision = self.authorizer.check(method, path, raw_request.query_string,
                                             raw_request.headers.get("Authorization"))
            if not decision.allowed and (self.authorizer.enforce or decision.status == 401):
                await raw_request.read()
                if decision.status == 401:
                    return aiohttp.web.json_response(status_body(401, "Unauthorized"), status=401)
                return aiohttp.web.json_response(forbidden_status(decision.attributes), status=403)

        for fault in self.faults:
            if fault.matches(method, path, raw_request.query_string):
                fault.hits += 1
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.status is not None:
                    await raw_request.read()
                    headers = {}
                    if fault.retry_after is not None:
                        headers["Retry-After"] = str(int(fault.retry_after))
                    body = fault.body if fault.body is not None else status_body(
                        fault.status, f"injected fault {fault.status}")
                    return aiohttp.web.json_response(body, status=fault.status, headers=headers)
                break

        if method == "GET" and (path == "/openapi/v3" or path.startswith("/openapi/v3/apis/")):
            return self._serve_openapi(path)

        if _NS_LIST.match(path) or _NS_ONE.match(path):
            return await self._serve_namespaces(raw_request)

        watch = raw_request.query.get("watch")
        if watch is not None and watch.lower() in ("true", "1") and watch != "true":
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.update_query(watch="true"))
        response = await super().__call__(raw_request)
        if method == "GET" and watch is None and kube_tables.wants_table(raw_request.headers.get("Accept")):
            return self._as_table(raw_request, response)
        return response

    # -- kubectl: discovery, server-side printing and OpenAPI ----------------------------------------

    async def _serve_version(self, request: _krendering.Request) -> _krendering.Payload:
        """kmock copies categories and short names onto subresource entries (``gpugroups/status`` in
        category ``flexinfer`` breaks ``kubectl get flexinfer``); the apiserver lists subresources bare."""
        payload = await super()._serve_version(request)
        if isinstance(payload, dict):
            for entry in payload.get("resources") or ():
                if "/" in entry.get("name", ""):
                    entry.update(categories=[], shortNames=[], singularName="",
                                 verbs=["get", "patch", "update"])
        return payload

    def _as_table(self, raw_request: aiohttp.web.BaseRequest,
                  response: aiohttp.web.StreamResponse) -> aiohttp.web.StreamResponse:
        """A resource GET answered as a ``meta.k8s.io/v1`` Table (``tests/kube_tables.py``)."""
        if response.status != 200 or not isinstance(response, aiohttp.web.Response) or not response.body:
            return response
        try:
            parsed = _kparsing.parse_path(raw_request.path)
            data = json.loads(bytes(response.body))  # type: ignore[arg-type]
        except (ValueError, TypeError):
            return response
        if parsed.group is None or not parsed.plural or parsed.subresource or not isinstance(data, dict):
            return response
        if "items" in data:
            objs, rv = data.get("items") or [], str((data.get("metadata") or {}).get("resourceVersion", ""))
        elif data.get("kind") not in (None, "Status"):
            objs, rv = [data], str((data.get("metadata") or {}).get("resourceVersion", ""))
        else:
            return response
        columns = self.printer_columns.get((parsed.group, parsed.version or "", parsed.plural))
        body = kube_tables.table(objs, columns, resource_version=rv,
                                 include_object=raw_request.query.get("includeObject", "PartialObjectMetadata"))
        return aiohttp.web.json_response(body, content_type="application/json")

    def _serve_openapi(self, path: str) -> aiohttp.web.StreamResponse:
        """``/openapi/v3`` and ``/openapi/v3/apis/<g>/<v>`` for the registered CRDs (kubectl validates
        manifests against these before it sends them)."""
        if path == "/openapi/v3":
            return aiohttp.web.json_response(kube_tables.openapi_v3_root(self.crd_schemas))
        parts = path[len("/openapi/v3/apis/"):].strip("/").split("/")
        doc = kube_tables.openapi_v3_group(parts[0], parts[1], self.crd_schemas) if len(parts) == 2 else None
        if doc is None:
            return aiohttp.web.json_response(status_body(404, "the server could not find the requested resource"),
                                             status=404)
        return aiohttp.web.json_response(doc)

    # -- namespaces (kmock cannot parse these paths) -----------------------------------------------

    def _namespace_objects(self) -> dict[str, dict[str, Any]]:
        res = kmock.resource("", "v1", "namespaces")
        out: dict[str, dict[str, Any]] = {}
        for (r, ns, name), obj in self._objects.items():
            if r == res and not obj.deleted:
                out[name] = obj.raw
            elif ns and not obj.deleted and ns not in out:
                out[ns] = {}
        for implicit in ("default", "kube-system"):
            out.setdefault(implicit, {})
        for name, raw in list(out.items()):
            if not raw:
                out[name] = {"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": name, "uid": f"implicit-{name}", "resourceVersion": "1"},
                             "status": {"phase": "Active"}}
        return out

    async def _serve_namespaces(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        method = raw_request.method.upper()
        m = _NS_ONE.match(raw_request.path)
        res = kmock.resource("", "v1", "namespaces")
        body = await raw_request.read()
        async with self._lock:
            known = self._namespace_objects()
            if m is None and method == "GET":
                items = [o for o in known.values()
                         if label_selector_matches(raw_request.query.get("labelSelector"),
                                                   o.get("metadata", {}).get("labels"))]
                return aiohttp.web.json_response({
                    "apiVersion": "v1", "kind": "NamespaceList",
                    "metadata": {"resourceVersion": str(self._last_rv)}, "items": items})
            if m is None and method == "POST":
                try:
                    data = json.loads(body or b"{}")
                except ValueError:
                    return aiohttp.web.json_response(status_body(400, "invalid JSON"), status=400)
                name = (data.get("metadata") or {}).get("name")
                if name in known and (res, None, name) in self._objects:
                    return aiohttp.web.json_response(status_body(409, f'namespaces "{name}" already exists',
                                                                 "AlreadyExists"), status=409)
                try:
                    self.stamp_new(res, data, None)
                except kmock.KubernetesError as exc:
                    return aiohttp.web.json_response(status_body(exc.status, exc.message or ""), status=exc.status)
                data.setdefault("kind", "Namespace")
                data.setdefault("status", {"phase": "Active"})
                self._objects[res, None, data["metadata"]["name"]] = data
                return aiohttp.web.json_response(data, status=201)
            if m is not None:
                name = m.group(1)
                if method == "GET":
                    if name not in known:
                        return aiohttp.web.json_response(
                            status_body(404, f'namespaces "{name}" not found'), status=404)
                    return aiohttp.web.json_response(known[name])
                if method == "DELETE":
                    if (res, None, name) in self._objects and not self._objects[res, None, name].deleted:
                        raw = self._objects[res, None, name].raw
                        self._objects[res, None, name].delete()
                        return aiohttp.web.json_response(raw)
                    return aiohttp.web.json_response(status_body(404, f'namespaces "{name}" not found'),
                                                     status=404)
        return aiohttp.web.json_response(status_body(405, "method not allowed on namespaces"), status=405)

    # -- state changes -----------------------------------------------------------------------------

    async def _handle(self, request: _krendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None:
            return await _kapps.RawHandler._handle(self, request)
        method = str(request.method.value).upper() if request.method is not None else ""
        gc_key = None
        reply: dict[str, Any] = {}
        async with self._lock:
            if request.action == _kenums.action.CREATE:
                await self._do_create(request)
            elif request.action == _kenums.action.UPDATE and request.name is not None:
                gc_key = await self._do_patch(request)
            elif method == "PUT" and request.name is not None:
                gc_key = await self._do_put(request)
                obj = self._objects[request.resource, request.namespace, request.name]
                reply = obj.last.raw
                if request.subresource == "scale":
                    reply = self._scale_view(reply)
            elif request.action == _kenums.action.DELETE and request.name is not None:
                gc_key = await self._do_delete(request.resource, request.namespace, request.name)
            elif method == "DELETE" and request.name is None:
                reply = await self._do_delete_collection(request)
        try:
            if method == "PUT" and request.name is not None:
                return aiohttp.web.json_response(reply)
            if method == "DELETE" and request.name is None:
                return aiohttp.web.json_response(reply)
            return await _kapps.RawHandler._handle(self, request)
        finally:
            if gc_key is not None:
                async with self._lock:
                    obj = self._objects[gc_key]
                    if not obj.deleted:
                        raw = obj.raw
                        obj.delete()
                        await self._buses[gc_key[0]].put({"type": "DELETED", "object": raw})

    async def _do_create(self, request: _krendering.Request) -> None:
        data = request.data
        if not isinstance(data, dict):
            raise _error(400, "the body of a create must be a JSON object")
        data = copy.deepcopy(data)
        if self._has_status(request.resource):
            data.pop("status", None)
        self.stamp_new(request.resource, data, request.namespace)
        meta = data["metadata"]
        ns = meta.get("namespace")
        key = (request.resource, ns, meta["name"])
        if key in self._objects and not self._objects[key].deleted:
            raise kmock.KubernetesError(status=409, reason="AlreadyExists",
                                        message=f'{request.resource.plural} "{meta["name"]}" already exists')
        if key in self._objects:
            self._objects[key].create(data)
        else:
            self._objects[key] = data
        # kmock's _serve_create looks the object up from the request body: give it the final name.
        if isinstance(request.data, dict):
            request.data.setdefault("metadata", {})
            if isinstance(request.data["metadata"], dict):
                request.data["metadata"]["name"] = meta["name"]
                request.data["metadata"]["namespace"] = ns
        await self._buses[request.resource].put({"type": "ADDED", "object": copy.deepcopy(data)})

    def _existing(self, resource: Any, namespace: str | None, name: str) -> Any:
        key = (resource, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            raise _error(404, f'{resource.plural} "{name}" not found')
        return self._objects[key]

    async def _commit(self, resource: Any, namespace: str | None, name: str,
                      old: dict[str, Any], new: dict[str, Any]) -> Any:
        """Store ``new`` as the next version if it differs; bump rv/generation; emit; gc key or None."""
        obj = self._objects[resource, namespace, name]
        old_meta, meta = old.get("metadata", {}), new.setdefault("metadata", {})
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion"):
            if fixed in old_meta:
                meta[fixed] = old_meta[fixed]
            else:
                meta.pop(fixed, None)
        if "deletionTimestamp" in old_meta:
            meta["deletionTimestamp"] = old_meta["deletionTimestamp"]
        if new == old:
            return None
        spec_old = {k: v for k, v in old.items() if k not in ("metadata", "status")}
        spec_new = {k: v for k, v in new.items() if k not in ("metadata", "status")}
        if spec_old != spec_new:
            meta["generation"] = int(old_meta.get("generation") or 0) + 1
        meta["resourceVersion"] = self.next_rv()
        obj.history.append(new)
        await self._buses[resource].put({"type": "MODIFIED", "object": copy.deepcopy(new)})
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return (resource, namespace, name)
        return None

    def _check_rv(self, body: Any, old: Mapping[str, Any]) -> None:
        if isinstance(body, Mapping):
            want = (body.get("metadata") or {}).get("resourceVersion") if isinstance(
                body.get("metadata"), Mapping) else None
            have = old.get("metadata", {}).get("resourceVersion")
            if want not in (None, "") and str(want) != str(have):
                raise kmock.KubernetesError(
                    status=409, reason="Conflict",
                    message="Operation cannot be fulfilled: the object has been modified; please apply "
                            "your changes to the latest version and try again")

    async def _do_patch(self, request: _krendering.Request) -> Any:
        resource, ns, name = request.resource, request.namespace, request.name
        assert name is not None
        obj = self._existing(resource, ns, name)
        old = copy.deepcopy(obj.raw)
        body = request.data
        sub = request.subresource
        if body is None:
            raise _error(400, "the body of a patch must be JSON")
        self._check_rv(body, old)
        try:
            if sub == "scale":
                replicas = _dig(body, "spec.replicas") if isinstance(body, Mapping) else None
                if replicas is None:
                    raise _error(422, "a scale patch must set spec.replicas")
                new = dict(_kdicts.patch_dict(old, {"spec": {"replicas": replicas}}))
            elif sub == "status":
                if isinstance(body, Mapping):
                    new = dict(_kdicts.patch_dict(old, {"status": body.get("status")}))
                    if "status" not in body:
                        new = copy.deepcopy(old)
                else:
                    ops = [op for op in body if op.get("op") == "test" or str(op.get("path", "")).startswith("/status")]
                    new = dict(_kdicts.patch_dict(old, ops))
            elif sub:
                raise _error(404, f"the subresource {sub} is not emulated")
            else:
                if isinstance(body, Mapping):
                    patch = dict(body)
                    if self._has_status(resource):
                        patch.pop("status", None)
                    new = dict(_kdicts.patch_dict(old, patch))
                else:
                    ops = list(body)
                    if self._has_status(resource):
                        ops = [op for op in ops if not str(op.get("path", "")).startswith("/status")]
                    new = dict(_kdicts.patch_dict(old, ops))
        except jsonpatch.JsonPatchException as exc:
            raise _error(422, f"the JSON patch cannot be applied: {exc}") from None
        except (ValueError, TypeError, AttributeError) as exc:
            raise _error(422, f"the patch cannot be applied: {exc}") from None
        new = copy.deepcopy(new)
        return await self._commit(resource, ns, name, old, new)

    async def _do_put(self, request: _krendering.Request) -> Any:
        resource, ns, name = request.resource, request.namespace, request.name
        assert name is not None
        obj = self._existing(resource, ns, name)
        old = copy.deepcopy(obj.raw)
        body = request.data
        if not isinstance(body, Mapping):
            raise _error(400, "the body of a replace must be a JSON object")
        self._check_rv(body, old)
        body = copy.deepcopy(dict(body))
        sub = request.subresource
        if sub == "status":
            new = copy.deepcopy(old)
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
        elif sub == "scale":
            new = copy.deepcopy(old)
            new.setdefault("spec", {})["replicas"] = _dig(body, "spec.replicas")
        elif sub:
            raise _error(404, f"the subresource {sub} is not emulated")
        else:
            new = body
            if self._has_status(resource):
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
            new.setdefault("apiVersion", old.get("apiVersion"))
            if "kind" in old:
                new.setdefault("kind", old["kind"])
        return await self._commit(resource, ns, name, old, new)

    async def _do_delete(self, resource: Any, ns: str | None, name: str) -> Any:
        obj = self._existing(resource, ns, name)
        old = copy.deepcopy(obj.raw)
        meta = old.get("metadata", {})
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return None
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"]["resourceVersion"] = self.next_rv()
            obj.history.append(new)
            await self._buses[resource].put({"type": "MODIFIED", "object": copy.deepcopy(new)})
            return None
        new = copy.deepcopy(old)
        new["metadata"]["resourceVersion"] = self.next_rv()
        obj.history.append(new)
        return (resource, ns, name)  # soft-deleted after the response renders the last state

    async def _do_delete_collection(self, request: _krendering.Request) -> dict[str, Any]:
        items = self._matching(request.resource, request.namespace, None, request.params)
        deleted = []
        for raw in items:
            meta = raw.get("metadata", {})
            key = await self._do_delete(request.resource, meta.get("namespace"), meta["name"])
            if key is not None:
                obj = self._objects[key]
                last = obj.raw
                obj.delete()
                await self._buses[request.resource].put({"type": "DELETED", "object": last})
                deleted.append(last)
            else:
                deleted.append(self._objects[request.resource, meta.get("namespace"), meta["name"]].raw)
        return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": str(self._last_rv)},
                "items": deleted}

    # -- reads -------------------------------------------------------------------------------------

    def _matching(self, resource: Any, namespace: str | None, name: str | None,
                  params: Mapping[str, str]) -> list[dict[str, Any]]:
        out = []
        lsel, fsel = params.get("labelSelector"), params.get("fieldSelector")
        for (r, ns, n), obj in self._objects.items():
            if r != resource or obj.deleted:
                continue
            if namespace is not None and ns != namespace:
                continue
            if name is not None and n != name:
                continue
            raw = obj.raw
            if not label_selector_matches(lsel, raw.get("metadata", {}).get("labels")):
                continue
            if not field_selector_matches(fsel, raw):
                continue
            out.append(raw)
        return out

    @staticmethod
    def _scale_view(raw: Mapping[str, Any]) -> dict[str, Any]:
        meta = raw.get("metadata", {})
        return {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": _dig(raw, "spec.replicas") or 0},
            "status": {"replicas": _dig(raw, "status.replicas") or 0,
                       "selector": _dig(raw, "status.selector") or ""},
        }

    async def _serve_fetch(self, request: _krendering.Request) -> _krendering.Payload:
        async with self._lock:
            key = (request.resource, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                raise _error(404, f'{getattr(request.resource, "plural", "")} "{request.name}" not found')
            raw = self._objects[key].raw
        return self._scale_view(raw) if request.subresource == "scale" else raw

    async def _serve_create(self, request: _krendering.Request) -> _krendering.Payload:
        raw = await super()._serve_create(request)
        return _krendering.Response(status=201, payload=raw)

    async def _serve_update(self, request: _krendering.Request) -> _krendering.Payload:
        raw = await super()._serve_update(request)
        if request.subresource == "scale" and isinstance(raw, Mapping):
            return self._scale_view(raw)
        return raw

    async def _serve_list(self, request: _krendering.Request) -> _krendering.Payload:
        if not any(r == request.resource for r in self._get_resources()):
            raise kmock.KubernetesResourceNotFoundError()
        async with self._lock:
            items = self._matching(request.resource, request.namespace, None, request.params)
            rv = str(self._last_rv)
        _, kind = self._type_meta(request.resource)
        api_version, _ = self._type_meta(request.resource)
        return {"apiVersion": api_version, "kind": f"{kind}List" if kind else "List",
                "metadata": {"resourceVersion": rv}, "items": items}

    async def _serve_watch(self, request: _krendering.Request) -> AsyncIterator[_krendering.Payload]:
        yield b""
        assert request.resource is not None
        params = request.params
        lsel, fsel = params.get("labelSelector"), params.get("fieldSelector")
        timeout = float(params.get("timeoutSeconds") or 0) or None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        since_raw = params.get("resourceVersion") or ""
        try:
            since = int(since_raw) if since_raw not in ("", "0") else None
        except ValueError:
            yield {"type": "ERROR", "object": status_body(400, f"invalid resourceVersion {since_raw!r}")}
            return
        if since is not None and since < self._min_rv:
            yield {"type": "ERROR", "object": status_body(
                410, f"too old resource version: {since} ({self._min_rv})", "Expired")}
            return
        bus = self._buses[request.resource]
        epoch = self._epoch

        def wanted(raw: Mapping[str, Any]) -> bool:
            meta = raw.get("metadata", {})
            if request.namespace is not None and meta.get("namespace") != request.namespace:
                return False
            if request.name is not None and meta.get("name") != request.name:
                return False
            return label_selector_matches(lsel, meta.get("labels")) and field_selector_matches(fsel, raw)

        initial: list[dict[str, Any]] = []
        async with self._lock:
            marker = await bus.mark()
            for (r, _ns, _n), obj in self._objects.items():
                if r != request.resource:
                    continue
                if obj.deleted:
                    if since is None:
                        continue
                    last = obj.last.raw
                    if int(last.get("metadata", {}).get("resourceVersion") or 0) > since and wanted(last):
                        initial.append({"type": "DELETED", "object": last})
                    continue
                raw = obj.raw
                if not wanted(raw):
                    continue
                rv = int(raw.get("metadata", {}).get("resourceVersion") or 0)
                if since is None:
                    initial.append({"type": "ADDED", "object": raw})
                elif rv > since:
                    first = next((v for v in obj.history if v is not None), None)
                    created = int((first or {}).get("metadata", {}).get("resourceVersion") or 0)
                    initial.append({"type": "ADDED" if created > since else "MODIFIED", "object": raw})
            current = self._last_rv
        if since is not None:  # a resumed watch replays the changes in the order they happened
            initial.sort(key=lambda ev: int(ev["object"].get("metadata", {}).get("resourceVersion") or 0))
        agen = bus.stream(since=marker)
        try:
            for event in initial:
                yield event
            if params.get("allowWatchBookmarks") in ("true", "True", "1"):
                api_version, kind = self._type_meta(request.resource)
                yield {"type": "BOOKMARK", "object": {"apiVersion": api_version, "kind": kind or "",
                                                      "metadata": {"resourceVersion": str(current)}}}
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    event = await asyncio.wait_for(anext(agen), remaining)
                except (TimeoutError, StopAsyncIteration):
                    break
                if event.get("type") == _CLOSE:
                    if event.get("epoch", 0) > epoch:
                        break
                    continue
                if wanted(event.get("object", {})):
                    yield event
        finally:
            await agen.aclose()
            with contextlib.suppress(ValueError):
                await bus.unmark(marker)


# ---- test-facing wrapper --------------------------------------------------------------------------


def write_kubeconfig(path: Path | str, url: str, *, token: str = "dummy", namespace: str = "default") -> Path:
    """Write a kubeconfig pointing at ``url`` with a bearer token; return its path."""
    path = Path(path)
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator", "preferences": {},
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": token}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator",
                                                       "namespace": namespace}}],
    }
    path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")  # JSON is YAML
    return path


@dataclass
class KubeEnv:
    """What the ``kube`` fixture yields."""

    emulator: FlexEmulator
    server: kmock.Server
    kubeconfig_path: Path
    _clients: list[Any] = field(default_factory=list)
    admin_kubeconfig_path: Path | None = None  # set on an ``as_user`` view: the test's own identity

    @property
    def admin_kubeconfig(self) -> Path:
        """The kubeconfig of the test itself (admin), also on an :meth:`as_user` view."""
        return self.admin_kubeconfig_path or self.kubeconfig_path

    def as_user(self, kubeconfig_path: Path | str) -> KubeEnv:
        """A view of the same emulator whose ``kubeconfig_path`` / ``api_client()`` are another user's (a
        component's ServiceAccount): harnesses that start a component with ``kube.kubeconfig_path`` then
        run it as that user, while their own requests use :attr:`admin_kubeconfig`."""
        return KubeEnv(emulator=self.emulator, server=self.server, kubeconfig_path=Path(kubeconfig_path),
                       admin_kubeconfig_path=self.admin_kubeconfig)

    @property
    def url(self) -> str:
        return str(self.server.url).rstrip("/")

    # -- resources ---------------------------------------------------------------------------------

    def register(self, resource: str, *, kind: str, namespaced: bool = True,
                 verbs: Iterable[str] = ALL_VERBS, subresources: Iterable[str] = ("status",),
                 shortnames: Iterable[str] = (), singular: str | None = None,
                 categories: Iterable[str] = ()) -> None:
        """Declare a resource, e.g. ``register("ai.flexinfer/v1alpha2/models", kind="Model")``."""
        self.emulator.resources[resource] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, verbs=set(verbs), subresources=set(subresources),
            shortnames=set(shortnames), singular=singular or kind.lower(), categories=set(categories))

    def register_crd(self, crd: Mapping[str, Any]) -> list[str]:
        """Declare every served version of a CustomResourceDefinition manifest; return the keys."""
        spec = crd["spec"]
        names = spec["names"]
        out = []
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            key = f'{spec["group"]}/{version["name"]}/{names["plural"]}'
            self.register(key, kind=names["kind"], namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                          subresources=set((version.get("subresources") or {}).keys()),
                          shortnames=names.get("shortNames", ()), singular=names.get("singular"),
                          categories=names.get("categories", ()))
            gv = (spec["group"], version["name"])
            self.emulator.printer_columns[(*gv, names["plural"])] = list(
                version.get("additionalPrinterColumns") or ())
            schemas = self.emulator.crd_schemas.setdefault(gv, [])
            schemas[:] = [e for e in schemas if e[0] != names["kind"]]
            schemas.append((names["kind"], (version.get("schema") or {}).get("openAPIV3Schema"), names["plural"],
                            spec.get("scope", "Namespaced") == "Namespaced"))
            out.append(key)
        return out

    # -- objects -----------------------------------------------------------------------------------

    def seed(self, resource: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store an object directly (server fields stamped, status kept, no watch event); return it."""
        data = copy.deepcopy(dict(obj))
        meta = data.get("metadata") or {}
        res = kmock.resource(resource)
        self.emulator.stamp_new(res, data, meta.get("namespace"))
        meta = data["metadata"]
        self.emulator.objects[res, meta.get("namespace"), meta["name"]] = data
        return data

    async def upsert(self, resource: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object directly, status included, emitting the watch event."""
        res = kmock.resource(resource)
        data = copy.deepcopy(dict(obj))
        meta = data.setdefault("metadata", {})
        key = (res, meta.get("namespace"), meta.get("name"))
        emu = self.emulator
        async with emu._lock:
            if key in emu.objects and not emu.objects[key].deleted:
                old = copy.deepcopy(emu.objects[key].raw)
                await emu._commit(res, key[1], key[2], old, data)
                return emu.objects[key].raw
            emu.stamp_new(res, data, meta.get("namespace"))
            meta = data["metadata"]
            key = (res, meta.get("namespace"), meta["name"])
            if key in emu.objects:
                emu.objects[key].create(data)
            else:
                emu.objects[key] = data
            await emu._buses[res].put({"type": "ADDED", "object": copy.deepcopy(data)})
            return data

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The current state of an object, or None if absent or deleted."""
        key = (kmock.resource(resource), namespace, name)
        objs = self.emulator.objects
        if key not in objs or objs[key].deleted:
            return None
        return copy.deepcopy(objs[key].raw)

    # -- counters and faults -----------------------------------------------------------------------

    @property
    def writes(self) -> collections.Counter[tuple[str, str]]:
        """(METHOD, resource key) → write requests received (POST/PUT/PATCH/DELETE), faulted included."""
        return self.emulator.writes

    @property
    def requests(self) -> collections.Counter[tuple[str, str]]:
        """(METHOD, resource key) → every request received."""
        return self.emulator.seen

    @staticmethod
    def _count(counter: Mapping[tuple[str, str], int], resource: str | None, method: str | None) -> int:
        total = 0
        for (m, k), n in counter.items():
            if method is not None and m != method.upper():
                continue
            if resource is not None:
                if "/" in resource and k != resource:
                    continue
                if "/" not in resource and k != resource and not k.startswith(resource + "/"):
                    continue
            total += n
        return total

    def write_count(self, resource: str | None = None, method: str | None = None) -> int:
        """Writes to ``resource`` (``"nodes"`` includes ``nodes/status``; ``"nodes/status"`` is exact)."""
        return self._count(self.writes, resource, method)

    def request_count(self, resource: str | None = None, method: str | None = None) -> int:
        """Requests of any method, filtered like :meth:`write_count`."""
        return self._count(self.requests, resource, method)

    def inject(self, method: str | None, path: str | re.Pattern[str], *, status: int | None = None,
               times: int = 1, retry_after: float | None = None, delay: float | None = None,
               query: str | None = None, body: Any = None) -> Fault:
        """Answer the next ``times`` matching requests with ``status`` (+ Retry-After) and/or a delay.

        ``path`` is a regex searched in the URL path; ``query`` one searched in the query string.
        A fault with only ``delay`` delays the request, which then proceeds normally. Faulted requests
        change no state. Faults are tried in the order they were added.
        """
        fault = Fault(method=method, path=re.compile(path) if isinstance(path, str) else path,
                      status=status, times=times, retry_after=retry_after, delay=delay,
                      query=re.compile(query) if query else None, body=body)
        self.emulator.faults.append(fault)
        return fault

    def expire_resource_versions(self) -> None:
        """Watches resuming from a resourceVersion older than the current one get an ERROR 410 event."""
        self.emulator.expire_resource_versions()

    async def close_watches(self) -> None:
        """End every open watch stream cleanly."""
        await self.emulator.close_watches()

    # -- RBAC --------------------------------------------------------------------------------------

    def authorize(self, policy: Policy) -> Authorizer:
        """From now on authenticate and authorize every request with ``policy`` (``tests.kube_rbac``); the
        default kubeconfig's token stays an admin (``system:masters``). Returns the :class:`Authorizer`:
        map ServiceAccount tokens with ``add_service_account`` and read its decisions."""
        self.emulator.authorizer = Authorizer(policy)
        return self.emulator.authorizer

    def kubeconfig_for(self, token: str, path: Path | str, namespace: str = "default") -> Path:
        """A kubeconfig for this emulator with another bearer token (one per ServiceAccount)."""
        return write_kubeconfig(path, self.url, token=token, namespace=namespace)

    # -- clients -----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def api_client(self) -> AsyncIterator[Any]:
        """A ``kubernetes_asyncio.client.ApiClient`` for the emulator, closed on exit."""
        from kubernetes_asyncio import config

        client = await config.new_client_from_config(config_file=str(self.kubeconfig_path))
        try:
            yield client
        finally:
            await client.close()


@contextlib.asynccontextmanager
async def start_kube(directory: Path | str, *, strict_status: bool = True) -> AsyncIterator[KubeEnv]:
    """Start an emulator on 127.0.0.1 (random port), with builtin resources and a kubeconfig."""
    emulator = FlexEmulator(strict_status=strict_status)
    with warnings.catch_warnings():  # kmock 0.8 uses the deprecated importlib.resources.read_binary
        warnings.simplefilter("ignore", DeprecationWarning)
        emulator.resources.load_bundled()
    async with emulator, kmock.Server(emulator, host="127.0.0.1") as server:
        env = KubeEnv(emulator=emulator, server=server, kubeconfig_path=Path(directory) / "kubeconfig")
        write_kubeconfig(env.kubeconfig_path, env.url)
        yield env


@pytest_asyncio.fixture(name="kube")
async def kube_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeEnv]:
    """The ``kube`` fixture: a fresh emulator per test; ``KUBECONFIG`` points at it for the test."""
    async with start_kube(tmp_path) as env:
        monkeypatch.setenv("KUBECONFIG", str(env.kubeconfig_path))
        yield env

