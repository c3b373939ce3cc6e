"""The operator's own API client: generic CRUD on plain dicts over ``kubernetes_asyncio``.

Owns: the kinds the operator reads and writes (``Kind``: group, version, plural, kind, scope),
their URL paths, and one retry policy for every request (429 with ``Retry-After``, 5xx, timeouts and
connection errors are retried a bounded number of times, with :class:`~flexinfer.k8s.backoff.Backoff`;
4xx are not). Every failed attempt is reported to ``on_error`` (the operator's
``flexinfer_operator_api_errors_total`` {verb,code}). Failures reach the reconcilers as :class:`~flexinfer.k8s.errors.KubeAPIError`.
Objects stay plain JSON dicts: no model classes, no deserialisation cost.

kopf watches and indexes the cluster; every write the reconcilers make goes through here.
Must not: hold any reconcile logic.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from flexinfer.k8s.backoff import Backoff
from flexinfer.k8s.errors import KubeAPIError
from flexinfer.operator.api_resources import Kind

log = logging.getLogger("flexinfer.operator.api")


RETRYABLE = frozenset({429, 500, 502, 503, 504})  # and 0 (no answer); a 409 is the reconcile's to handle
#: HTTP method -> Kubernetes verb of the ``verb`` label (a GET of a collection passes ``list``)
VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
#: (verb, HTTP status or 0, reason) of one failed attempt
ErrorHook = Callable[[str, int, str], None]


class KubeClient:
    """Plain-dict CRUD with bounded retries. ``get``/``patch``/``delete`` answer None for 404."""

    def __init__(self, api: k8s.ApiClient, *, timeout_s: float = 30.0, retries: int = 3,
                 backoff_s: float = 0.5, on_error: ErrorHook | None = None) -> None:
        self.api = api
        self.on_error = on_error
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    async def close(self) -> None:
        await self.api.close()

    async def request(self, method: str, path: str, body: Any = None, *, query: Mapping[str, str] | None = None,
                      content_type: str = "application/json", verb: str | None = None) -> Any:
        """One request with the retry policy; the decoded JSON answer (None when empty).

        The n-th retry waits ``backoff_s * 2**(n-1)``, or the server's Retry-After instead, times 1.0-1.2."""
        backoff = Backoff(self.backoff_s, math.inf, jitter=(1.0, 1.2), retry_after="replace")
        while True:
            try:
                return await self._once(method, path, body, query, content_type)
            except KubeAPIError as e:
                if self.on_error is not None:
                    self.on_error(verb or VERBS.get(method, method.lower()), e.status, e.reason or "")
                if e.status not in RETRYABLE and e.status != 0:
                    raise
                if backoff.failures >= self.retries:
                    raise
                delay = backoff.next(e.retry_after)
                log.info("%s %s: %s; retry %d/%d in %.1fs", method, path, e, backoff.failures, self.retries,
                         delay)
                await asyncio.sleep(delay)

    async def _once(self, method: str, path: str, body: Any, query: Mapping[str, str] | None,
                    content_type: str) -> Any:
        try:
            data = await self.api.call_api(
                path, method, query_params=list((query or {}).items()) or None,
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body, response_types_map={200: "object", 201: "object", 202: "object"},
                auth_settings=["BearerToken"], _return_http_data_only=True, _preload_content=True,
                _request_timeout=self.timeout_s)
        except ApiException as e:
            raise KubeAPIError.from_api_exception(e) from None
        except TimeoutError as e:
            raise KubeAPIError(0, f"no answer within {self.timeout_s:g}s", reason="Timeout") from e
        except OSError as e:  # aiohttp.ClientConnectionError is an OSError
            raise KubeAPIError(0, str(e) or type(e).__name__, reason="ConnectionError") from e
        return data

    # ---- verbs ------------------------------------------------------------------------------------

    async def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = await self.request("GET", kind.path(namespace, name))
        except KubeAPIError as e:
            if e.status == 404:
                return None
            raise
        return out

    async def list(self, kind: Kind, namespace: str | None = None, *,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        data = await self.request("GET", kind.path(namespace), query=query, verb="list")
        return list((data or {}).get("items") or [])

    async def create(self, kind: Kind, namespace: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = await self.request("POST", kind.path(namespace), dict(body))
        return out

    async def patch(self, kind: Kind, namespace: str | None, name: str, patch: Any, *,
                    sub: str | None = None, json_patch: bool = False) -> dict[str, Any] | None:
        """A merge patch (or a JSON patch); None when the object is gone."""
        ctype = "application/json-patch+json" if json_patch else "application/merge-patch+json"
        try:
            out: dict[str, Any] = await self.request("PATCH", kind.path(namespace, name, sub), patch,
                                                     content_type=ctype)
        except KubeAPIError as e:
            if e.status == 404:
                return None
            raise
        return out

    async def delete(self, kind: Kind, namespace: str | None, name: str, *,
                     propagation: str = "Background") -> bool:
        """True when deleted (or being deleted), False when it was not there."""
        try:
            await self.request("DELETE", kind.path(namespace, name),
                               {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation})
        except KubeAPIError as e:
            if e.status == 404:
                return False
            raise
        return True
