"""Custom-object calls for parts that may not import a Kubernetes client themselves (R5 of
docs/architecture.md), such as the global proxy's resource source (``runtime.kubeglobal``).

Owns: :func:`custom_objects` (a ``CustomObjectsApi`` over an ``ApiClient``), :func:`read_secret`
(one Secret as a plain dict, for the global proxy's TLS Secret), :data:`API_ERRORS` (what such a
call raises when the API or the network fails) and :func:`is_transport_error`.
Must not: know FlexInfer kinds.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

__all__ = ["API_ERRORS", "MERGE_PATCH", "custom_objects", "is_transport_error", "read_secret"]

MERGE_PATCH = "application/merge-patch+json"
#: an API answer with an error status, or the connection failing
API_ERRORS: tuple[type[BaseException], ...] = (ApiException, aiohttp.ClientError, OSError, TimeoutError)


def custom_objects(api_client: Any) -> Any:
    return k8s.CustomObjectsApi(api_client)


async def read_secret(api_client: Any, namespace: str, name: str, *, request_timeout: float) -> dict[str, Any]:
    """GET one Secret (its ``data`` base64 as served); raises one of :data:`API_ERRORS` (404: none)."""
    got = await k8s.CoreV1Api(api_client).read_namespaced_secret(name, namespace, _request_timeout=request_timeout)
    body: dict[str, Any] = api_client.sanitize_for_serialization(got)
    return body


def is_transport_error(exc: BaseException) -> bool:
    """True for a failed connection (worth one more try), False for an answer of the API server."""
    return isinstance(exc, aiohttp.ClientError | OSError)
