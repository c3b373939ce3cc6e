"""The one API error: built from an ``ApiException`` or a raw answer, with the fields each caller reads."""

from __future__ import annotations

import json

from kubernetes_asyncio.client.exceptions import ApiException

from flexinfer.k8s.errors import MAX_RETRY_AFTER, KubeAPIError, retry_after_seconds


def _exc(status: int, body: object, headers: dict[str, str] | None = None, reason: str = "") -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = body
    e.headers = headers or {}
    return e


def test_from_api_exception_reads_the_status_body() -> None:
    body = json.dumps({"kind": "Status", "code": 409, "reason": "AlreadyExists", "message": "pods \"a\" exists"})
    e = KubeAPIError.from_api_exception(_exc(409, body, {"Retry-After": "2"}, reason="Conflict"))
    assert (e.status, e.reason, e.message, e.retry_after) == (409, "AlreadyExists", 'pods "a" exists', 2.0)
    assert e.conflict and e.already_exists and e.retryable
    assert str(e) == '409 AlreadyExists: pods "a" exists' and e.detail == 'pods "a" exists'


def test_bodies_without_a_message() -> None:
    e = KubeAPIError.from_api_exception(_exc(503, b"", reason="Service Unavailable"))
    assert (e.reason, e.message, e.detail) == ("Service Unavailable", "", "Service Unavailable")
    e = KubeAPIError.from_api_exception(_exc(502, b"<html>bad gateway</html>", reason="Bad Gateway"))
    assert (e.reason, e.message) == ("Bad Gateway", "<html>bad gateway</html>")  # not JSON: the text
    e = KubeAPIError.from_response(500, b"[1, 2]")
    assert (e.reason, e.message, e.detail, str(e)) == ("", "", "HTTP 500", "HTTP 500")
    assert not KubeAPIError.from_response(404, b"{}").retryable


def test_transport_errors_and_own_errors() -> None:
    e = KubeAPIError(0, "ClientConnectorError: refused")
    assert (str(e), e.detail, e.reason, e.retryable) == ("ClientConnectorError: refused",) * 2 + ("", True)
    e = KubeAPIError(404, "Deployment a/b disappeared while patching", reason="NotFound")
    assert str(e) == "404 NotFound: Deployment a/b disappeared while patching" and not e.conflict


def test_retry_after_is_clamped_seconds() -> None:
    assert retry_after_seconds({"Retry-After": "3"}) == 3.0
    assert retry_after_seconds({"Retry-After": "-1"}) == 0.0
    assert retry_after_seconds({"Retry-After": "3600"}) == MAX_RETRY_AFTER
    for headers in (None, {}, {"Retry-After": ""}, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, object()):
        assert retry_after_seconds(headers) is None
