"""The proxy's access log: one record per request on the ``flexinfer.access`` logger.

Owns: :class:`AccessLog` (on when ``PROXY_ACCESS_LOG`` is set; the pipeline holds None otherwise,
so the cost when off is one check per request), the fields of a line (see docs/logging.md) and
:func:`refusals`, which wraps ``ProxyHandler.on_headers`` so that requests refused before their
body (401, a 404 model from the path or header, a 400 path) are logged too. The formatter of
``flexinfer.logs`` writes the record: JSON keys with ``--log-format json``, a JSON object after
the message with ``text``; it also redacts secrets and escapes control characters.
Reads the request context's fields ``endpoint``, ``ttft``, ``queue_wait``, ``prompt_tokens`` and
``completion_tokens`` (the pipeline fills them; an unmeasured one logs as null) and the
ResponseWriter's ``status``, ``sent`` and ``client_abort``.
Must not: log headers (the User-Agent alone is kept), the query string or bodies, or raise into
the request path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from flexinfer.errors import FlexInferError
from flexinfer.http.protocol import Request, ResponseWriter
from flexinfer.proxy.context import RequestContext

ACCESS = logging.getLogger("flexinfer.access")
#: longest path and User-Agent kept in a line (the URL limit is 8 KiB)
MAX_PATH = 1024
MAX_AGENT = 256


def _seconds(value: float) -> float | None:
    """A duration of the context (negative: not measured) as seconds rounded to the microsecond."""
    return round(value, 6) if value >= 0 else None


def _count(value: int) -> int | None:
    return value if value >= 0 else None


class AccessLog:
    """Writes the access record of each request (INFO, whatever ``--log-level`` says)."""

    __slots__ = ("logger",)

    def __init__(self, logger: logging.Logger = ACCESS) -> None:
        self.logger = logger
        logger.setLevel(logging.INFO)  # on by its own setting: --log-level warning keeps it

    def _fields(self, req: Request, ctx: RequestContext | None, model: str | None) -> dict[str, Any]:
        agent = req.get(b"user-agent")
        fields: dict[str, Any] = {
            "request_id": None, "method": req.method, "path": req.path[:MAX_PATH], "model": model or None,
            "endpoint": None, "status": 0, "bytes_sent": 0, "queue_wait": None, "ttft": None, "duration": None,
            "prompt_tokens": None, "completion_tokens": None, "client_abort": False, "client": req.peer,
            "user_agent": agent[:MAX_AGENT].decode("latin-1") if agent is not None else None,
        }
        if ctx is not None:  # None: refused before the context was made (a bad path)
            fields.update(request_id=ctx.request_id.decode("latin-1"), endpoint=ctx.endpoint or None,
                          queue_wait=_seconds(ctx.queue_wait), ttft=_seconds(ctx.ttft),
                          duration=round(time.perf_counter() - ctx.t0, 6),
                          prompt_tokens=_count(ctx.prompt_tokens), completion_tokens=_count(ctx.completion_tokens))
        return fields

    def request(self, req: Request, resp: ResponseWriter, ctx: RequestContext, model: str | None) -> None:
        """The record of a request the pipeline handled (at the end of ``handle``)."""
        try:
            fields = self._fields(req, ctx, model or ctx.model_name)
            aborted = bool(resp.client_abort)
            status = resp.status or (499 if aborted else 0)  # nginx's 499: gone before an answer
            fields["status"], fields["bytes_sent"], fields["client_abort"] = status, resp.sent, aborted
            self._emit(req.method, fields["path"], status, fields)
        except Exception:  # pragma: no cover - never into the request path
            self.logger.exception("access log record failed")

    def _emit(self, method: str, path: str, status: int, fields: dict[str, Any]) -> None:
        """``logger.info`` without the caller lookup (the record's origin is always this module)."""
        logger = self.logger
        logger.handle(logger.makeRecord(logger.name, logging.INFO, __file__, 0, "%s %s %d", (method, path, status),
                                        None, extra={"fields": fields}))

    def refused(self, req: Request, err: FlexInferError) -> None:
        """The record of a request refused by ``on_headers`` (answered by the HTTP core)."""
        try:
            ctx = req.ctx if isinstance(req.ctx, RequestContext) else None
            fields = self._fields(req, ctx, ctx.model_name if ctx is not None else None)
            fields["status"], fields["bytes_sent"] = err.status, 0 if req.method == "HEAD" else len(err.body())
            self._emit(req.method, fields["path"], err.status, fields)
        except Exception:  # pragma: no cover - never into the request path
            self.logger.exception("access log record failed")


def refusals(on_headers: Callable[[Request], FlexInferError | None],
             log: AccessLog) -> Callable[[Request], FlexInferError | None]:
    """``on_headers`` that also logs the requests it refuses."""

    def logged(req: Request) -> FlexInferError | None:
        err = on_headers(req)
        if err is not None:
            log.refused(req, err)
        return err

    return logged
