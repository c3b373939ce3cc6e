"""The one error tree of FlexInfer.

Every error knows its HTTP status, its OpenAI error ``type`` and ``code``, and whether a client
retry can help (``x-should-retry``). The proxy renders them in the OpenAI shape
``{"error": {"message", "type", "param", "code"}}`` so the official ``openai`` client raises the
matching exception class. This module knows nothing about HTTP framing or models.

Also here, for the one-shot commands (``flexinfer flash-load``, ``flexinfer bench``):
:func:`report_failure`, the one-line message on stderr and exit status 1 for any failure.
"""

from __future__ import annotations

import logging
import sys
from typing import ClassVar

import orjson


class FlexInferError(Exception):
    """Base of all errors that end up in a response."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = "internal_error"
    should_retry: ClassVar[bool | None] = None  # None: let the client decide by status

    def __init__(self, message: str, *, param: str | None = None, retry_after: float | None = None,
                 code: str | None = None, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.headers = headers or []
        if code is not None:
            self.code_override: str | None = code
        else:
            self.code_override = None

    @property
    def error_code(self) -> str | None:
        return self.code_override if self.code_override is not None else self.code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.error_code, self.param)


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    """Serialize an OpenAI error object."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


# ---- 4xx -------------------------------------------------------------------------------------

class BadRequest(FlexInferError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"
    should_retry = False


class MissingModel(BadRequest):
    code = "missing_required_field"


class InvalidModelName(BadRequest):
    code = "invalid_model_name"


class InvalidJSON(BadRequest):
    code = "invalid_json"


class Unauthorized(FlexInferError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"
    should_retry = False


class Forbidden(FlexInferError):
    status = 403
    type = "permission_error"
    code = "forbidden"
    should_retry = False


class NotFound(FlexInferError):
    status = 404
    type = "not_found_error"
    code = "not_found"
    should_retry = False


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(FlexInferError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"
    should_retry = False


class RequestTimeout(FlexInferError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"
    should_retry = False


class PayloadTooLarge(FlexInferError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"
    should_retry = False


class URITooLong(FlexInferError):
    status = 414
    type = "invalid_request_error"
    code = "uri_too_long"
    should_retry = False


class HeadersTooLarge(FlexInferError):
    status = 431
    type = "invalid_request_error"
    code = "request_header_fields_too_large"
    should_retry = False


class RateLimited(FlexInferError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    should_retry = None  # the client honours Retry-After


# ---- 5xx -------------------------------------------------------------------------------------

class InternalError(FlexInferError):
    status = 500
    type = "server_error"
    code = "internal_error"


class NotImplementedHTTP(FlexInferError):
    status = 501
    type = "invalid_request_error"
    code = "not_implemented"
    should_retry = False


class BadGateway(FlexInferError):
    status = 502
    type = "server_error"
    code = "upstream_error"


class ServiceUnavailable(FlexInferError):
    status = 503
    type = "server_error"
    code = "service_unavailable"


class QueueFull(ServiceUnavailable):
    code = "queue_full"


class ActivationFailed(ServiceUnavailable):
    code = "activation_failed"
    should_retry = False


class ShuttingDown(ServiceUnavailable):
    code = "shutting_down"


class GatewayTimeout(FlexInferError):
    status = 504
    type = "server_error"
    code = "timeout"
    should_retry = False


class VersionNotSupported(FlexInferError):
    status = 505
    type = "invalid_request_error"
    code = "http_version_not_supported"
    should_retry = False


# ---- command line ----------------------------------------------------------------------------

def report_failure(prog: str, exc: Exception, expected: tuple[type[BaseException], ...],
                   logger: logging.Logger) -> int:
    """Print ``<prog>: error: <one line>`` on stderr and return the exit status 1.

    An ``expected`` error shows its own message; an ``OSError`` its strerror (and file name);
    anything else its type and message, with the traceback logged at debug level only.
    """
    if isinstance(exc, expected):
        message = str(exc)
    elif isinstance(exc, OSError):
        message = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
    else:
        logger.debug("%s failed", prog, exc_info=exc)
        message = f"{type(exc).__name__}: {exc}"
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1
