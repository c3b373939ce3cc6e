"""The one error type of a Kubernetes API request: :class:`KubeAPIError`.

Owns: what a refused or unanswered request looks like to FlexInfer's code: the HTTP ``status`` (0
when no answer came: timeouts, connection and stream errors), the ``reason`` and ``message`` of the
``v1.Status`` body, and the server's ``Retry-After`` (seconds, clamped to [0, 30]); building one from
a ``kubernetes_asyncio`` ``ApiException`` or from a raw response (``_preload_content=False``).

Must not: decide whether or when to retry (callers do, with :mod:`flexinfer.k8s.backoff`), log, or
import ``kubernetes_asyncio`` (an ``ApiException`` is read by its attributes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_RETRY_AFTER = 30.0  # seconds; a longer Retry-After is taken as this


class KubeAPIError(Exception):
    """An API request failed: HTTP ``status`` (0 for a transport error), ``reason``, ``message``, Retry-After.

    ``str()`` is ``"<status> <reason>: <message>"`` when the reason is known, else the message (or
    ``HTTP <status>``); :attr:`detail` is the text without the status, for messages that print it.
    """

    def __init__(self, status: int, message: str, *, reason: str = "",
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else message or f"HTTP {status}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def detail(self) -> str:
        """The message, else the reason, else ``HTTP <status>``."""
        return self.message or self.reason or f"HTTP {self.status}"

    @property
    def retryable(self) -> bool:
        """Worth trying the same request again: conflicts, throttling, server and transport errors."""
        return self.status in (0, 409, 429) or self.status >= 500

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @classmethod
    def from_response(cls, status: int, body: Any, headers: Any = None, *, reason: str = "") -> KubeAPIError:
        """From an answer's status, ``v1.Status`` body (bytes, str or dict) and headers; ``reason`` is
        the fallback when the body names none (the HTTP reason phrase)."""
        body_reason, message = _status_fields(body)
        return cls(status, message, reason=body_reason or reason, retry_after=retry_after_seconds(headers))

    @classmethod
    def from_api_exception(cls, exc: Any) -> KubeAPIError:
        """From a ``kubernetes_asyncio.client.exceptions.ApiException``."""
        return cls.from_response(int(exc.status or 0), exc.body, exc.headers, reason=str(exc.reason or ""))


def retry_after_seconds(headers: Any) -> float | None:
    """The ``Retry-After`` header in seconds, clamped to [0, ``MAX_RETRY_AFTER``]; None when absent or
    not a number (an HTTP date is not honoured)."""
    raw = headers.get("Retry-After") if headers and hasattr(headers, "get") else None
    if not raw:
        return None
    try:
        return max(0.0, min(MAX_RETRY_AFTER, float(raw)))
    except ValueError:
        return None


def _status_fields(body: Any) -> tuple[str, str]:
    """(reason, message) of a ``v1.Status`` body; a body that is not JSON is the message (500 chars)."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        if not body:
            return "", ""
        try:
            body = json.loads(body)
        except ValueError:
            return "", body[:500]
    if isinstance(body, Mapping):
        return str(body.get("reason") or ""), str(body.get("message") or "")
    return "", ""
