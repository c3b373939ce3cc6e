"""The operator's own API client: generic CRUD on plain dicts over ``kubernetes_asyncio``.

Owns: the kinds the operator reads and writes (``Kind``: group, version, plural, kind, scope),
their URL paths, one retry policy for every request (429 with ``Retry-After``, 5xx, timeouts and
connection errors are retried a bounded number of times; 4xx are not) and the ``ApiError`` the
reconcilers see. Objects stay plain JSON dicts: no model classes, no deserialisation cost.

kopf watches and indexes the cluster; every write the reconcilers make goes through here.
Must not: hold any reconcile logic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from flexinfer.operator.kinds import Kind

log = logging.getLogger("flexinfer.operator.api")


RETRYABLE = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 30.0


class ApiError(Exception):
    """A request the API server refused (or that never got an answer: ``status`` 0)."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"


def _api_error(exc: ApiException) -> ApiError:
    status = int(exc.status or 0)
    reason, message = str(exc.reason or ""), ""
    body: Any = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        try:
            data = json.loads(body)
        except ValueError:
            message = body[:500]
        else:
            if isinstance(data, Mapping):
                reason = str(data.get("reason") or reason)
                message = str(data.get("message") or "")
    retry_after: float | None = None
    headers: Any = exc.headers or {}
    raw = headers.get("Retry-After") if hasattr(headers, "get") else None
    if raw:
        try:
            retry_after = min(MAX_RETRY_AFTER_S, max(0.0, float(raw)))
        except ValueError:
            retry_after = None
    return ApiError(status, reason, message, retry_after)


class KubeClient:
    """Plain-dict CRUD with bounded retries. ``get``/``patch``/``delete`` answer None for 404."""

    def __init__(self, api: k8s.ApiClient, *, timeout_s: float = 30.0, retries: int = 3,
                 backoff_s: float = 0.5) -> None:
        self.api = api
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    async def close(self) -> None:
        await self.api.close()

    async def request(self, method: str, path: str, body: Any = None, *, query: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        """One request with the retry policy; the decoded JSON answer (None when empty)."""
        attempt = 0
        while True:
            try:
                return await self._once(method, path, body, query, content_type)
            except ApiError as e:
                if e.status not in RETRYABLE and e.status != 0:
                    raise
                if attempt >= self.retries:
                    raise
                delay = e.retry_after if e.retry_after is not None else self.backoff_s * (2 ** attempt)
                delay *= 1.0 + random.uniform(0, 0.2)
                log.info("%s %s: %s; retry %d/%d in %.1fs", method, path, e, attempt + 1, self.retries, delay)
                attempt += 1
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
            raise _api_error(e) from None
        except TimeoutError as e:
            raise ApiError(0, "Timeout", f"no answer within {self.timeout_s:g}s") from e
        except OSError as e:  # aiohttp.ClientConnectionError is an OSError
            raise ApiError(0, "ConnectionError", str(e) or type(e).__name__) from e
        return data

    # ---- verbs ------------------------------------------------------------------------------------

    async def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = await self.request("GET", kind.path(namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return out

    async def list(self, kind: Kind, namespace: str | None = None, *,
                   label_selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        data = await self.request("GET", kind.path(namespace), query=query)
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
        except ApiError as e:
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
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return True
