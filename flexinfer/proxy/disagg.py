"""Prefill/decode disaggregation: vLLM's two-step flow for a model whose endpoints carry roles.

A view is disaggregated (:attr:`ModelView.disaggregated`) when some endpoint's role is not
``both``. Its prefill endpoints are those with role ``prefill`` or ``both``, its decode endpoints
those with role ``decode`` or ``both``. For ``POST .../completions`` and ``.../chat/completions``
with a JSON body (the protocol of vLLM's NIXL toy proxy, ``tests/v1/kv_connector/nixl_integration``):

1. the decode endpoint is picked first, by the model's strategy over the decode endpoints, and
   counted in flight while the prefill runs;
2. the prefill endpoint (the model's strategy over the prefill endpoints) gets the request with
   ``stream: false``, ``max_tokens: 1`` (and ``max_completion_tokens: 1`` when present), no
   ``stream_options`` and ``kv_transfer_params`` asking for a remote decode;
3. the ``kv_transfer_params`` of its JSON answer go into the original request, which the decode
   endpoint gets; its answer (streaming or not) is relayed by :mod:`flexinfer.proxy.forward`.

Any other request of a disaggregated model (embeddings, GET, a non-JSON body) goes to a decode
endpoint as an ordinary request.

Owns: the per-role derived views (built once per view object, named ``<model>@prefill`` and
``<model>@decode`` so the router keeps their state apart), the prefill request and the reading of
its answer, the decode request body, the errors of the prefill step (code ``prefill_failed``; a 4xx
of the prefill engine is the client's error and is relayed as it is) and the
``flexinfer_proxy_disagg_requests_total`` counter.

Must not: send anything twice (only a refused connection, where nothing was sent, moves on to
another replica, as :meth:`Forwarder._send` does), run the decode step after a failed prefill,
scan endpoints per request, or touch models that are not disaggregated.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import orjson

from flexinfer import errors
from flexinfer.http.client import UpstreamError, UpstreamResponse
from flexinfer.http.protocol import Request
from flexinfer.proxy.context import RequestContext
from flexinfer.runtime.base import Endpoint, ModelView

if TYPE_CHECKING:
    from flexinfer.proxy.forward import Forwarder

#: what the prefill request asks of the engine (vLLM's NixlConnector; the answer fills these in)
PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
PREFILL_ANSWER_LIMIT = 4 * 1024 * 1024  # bytes of the prefill's JSON answer (one token and the params)
_GENERATE = ("/completions", "/chat/completions")  # path endings that run the two-step flow


class Disagg:
    """The two-step flow of one :class:`~flexinfer.proxy.forward.Forwarder`."""

    def __init__(self, fwd: Forwarder) -> None:
        self.fwd = fwd
        self._views: dict[str, tuple[ModelView, ModelView, ModelView]] = {}  # name -> (view, decode, prefill)

    def views(self, view: ModelView) -> tuple[ModelView, ModelView]:
        """(decode view, prefill view) of a disaggregated view; rebuilt only when the view object changes."""
        hit = self._views.get(view.name)
        if hit is not None and hit[0] is view:
            return hit[1], hit[2]
        eps = view.endpoints
        decode = dataclasses.replace(view, name=f"{view.name}@decode",
                                     endpoints=tuple(e for e in eps if e.role != "prefill"))
        prefill = dataclasses.replace(view, name=f"{view.name}@prefill",
                                      endpoints=tuple(e for e in eps if e.role != "decode"))
        self._views[view.name] = (view, decode, prefill)
        return decode, prefill

    async def send(self, req: Request, ctx: RequestContext, path: str, view: ModelView,
                   data: dict[str, Any] | None, headers: list[tuple[bytes, bytes]], body: bytes
                   ) -> tuple[UpstreamResponse, Endpoint, str, str]:
        """Like :meth:`Forwarder._send` for a disaggregated view: prefill, then open the decode exchange."""
        fwd = self.fwd
        router = fwd.router
        decode, prefill = self.views(view)
        if data is None or req.method != "POST" or not path.split("?", 1)[0].endswith(_GENERATE):
            return await fwd._send(req, path, decode, data, headers, body)
        try:
            first = router.pick(decode, data, req)
        except LookupError:
            self._count(view, "decode", "no_replica")
            raise errors.ServiceUnavailable(f"model {view.name!r} has no reachable decode replica",
                                            retry_after=1, code="no_decode_replica") from None
        router.acquire(first[0])  # the decode replica is busy with this request from now on
        try:
            answer = await self._prefill(req, ctx, path, view, prefill, data, headers, body)
        finally:
            router.release(first[0])
        if isinstance(answer, tuple):  # the prefill engine refused the request itself (4xx): its answer
            return answer[0], answer[1], first[1], "prefill-refused"
        try:
            up = await fwd._send(req, path, decode, data, headers, answer, first)
        except errors.FlexInferError:
            self._count(view, "decode", "error")
            raise
        self._count(view, "decode", "ok" if up[0].status < 400 else str(up[0].status))
        return up

    async def _prefill(self, req: Request, ctx: RequestContext, path: str, view: ModelView, prefill: ModelView,
                       data: dict[str, Any], headers: list[tuple[bytes, bytes]], body: bytes
                       ) -> bytes | tuple[UpstreamResponse, Endpoint]:
        """Run the prefill step: the decode request body, or the prefill engine's own 4xx answer and
        its endpoint (still counted in flight: the forwarder releases it when the answer is relayed)."""
        try:
            orig = orjson.loads(body)  # the body as rewritten by the pipeline (model name, clamp)
        except orjson.JSONDecodeError:
            orig = None
        if not isinstance(orig, dict):
            raise errors.BadRequest("the request body must be a JSON object", code="invalid_json")
        pre = dict(orig)
        pre["stream"] = False
        pre["max_tokens"] = 1
        if "max_completion_tokens" in pre:
            pre["max_completion_tokens"] = 1
        pre.pop("stream_options", None)
        pre["kv_transfer_params"] = PREFILL_KV_PARAMS
        fwd = self.fwd
        try:
            up, ep, _, _ = await fwd._send(req, path, prefill, data, headers, orjson.dumps(pre))
        except errors.FlexInferError as exc:  # connect error, timeout, closed: the usual mapping, our code
            self._count(view, "prefill", "error")
            raise type(exc)(f"model {view.name!r}: the prefill step failed ({exc.message}); the decode step "
                            "was not run", retry_after=exc.retry_after, code="prefill_failed") from None
        if fwd.settings.route_header:
            ctx.extra_headers.append((b"x-flexinfer-prefill", ep.key.encode()))
        if 400 <= up.status < 500:
            self._count(view, "prefill", str(up.status))
            return up, ep
        try:
            raw = await up.read_all(PREFILL_ANSWER_LIMIT)
        except UpstreamError as exc:
            fwd.metrics.upstream_errors.labels(exc.reason, ep.key).inc()
            self._count(view, "prefill", "error")
            raise errors.BadGateway(f"model {view.name!r}: the prefill answer failed ({exc.reason}); the decode "
                                    "step was not run", code="prefill_failed") from None
        except BaseException:
            up.close()
            raise
        finally:
            fwd.router.release(ep)
        if up.status != 200:
            self._count(view, "prefill", str(up.status))
            raise errors.BadGateway(f"model {view.name!r}: the prefill endpoint answered {up.status}; the decode "
                                    "step was not run", code="prefill_failed")
        try:
            kv = orjson.loads(raw).get("kv_transfer_params")
        except (orjson.JSONDecodeError, AttributeError):
            self._count(view, "prefill", "bad_answer")
            raise errors.BadGateway(f"model {view.name!r}: the prefill answer is not a JSON object; the decode "
                                    "step was not run", code="prefill_failed") from None
        if not isinstance(kv, dict) or not kv:
            self._count(view, "prefill", "bad_answer")
            raise errors.BadGateway(f"model {view.name!r}: the prefill answer has no kv_transfer_params (is the "
                                    "engine started with a kv connector?); the decode step was not run",
                                    code="prefill_failed")
        self._count(view, "prefill", "ok")
        orig["kv_transfer_params"] = kv
        return orjson.dumps(orig)

    def _count(self, view: ModelView, stage: str, outcome: str) -> None:
        self.fwd.metrics.disagg_requests.labels(view.name, stage, outcome).inc()
