"""Scale-from-zero activation: hold requests for a model that is not ready, wake it once, release.

Per model: a FIFO queue bounded by ``PROXY_MAX_QUEUE_SIZE`` (full -> 503 ``queue_full`` at once), one
wake at a time through the runtime's :class:`~flexinfer.runtime.base.Scaler` (concurrent arrivals join
it), and event-driven readiness: the inventory's change callback releases every waiter in arrival
order the moment the model turns ready (no polling). Each waiter has a deadline
``max(PROXY_QUEUE_TIMEOUT, model cold-start timeout)`` -> 504 ``timeout``; a failed wake -> 503
``activation_failed`` with its reason to every waiter; a waiter whose client leaves is removed at once.
Streaming waiters receive SSE comments (``: waiting for model m, position P, ~Ns``) so clients and
intermediaries keep the connection and a person sees progress; the ETA comes from observed load times.
With the loading state on (the model's ``send_loading_state`` in its view's metadata, else
``PROXY_SEND_LOADING_STATE``), a waiting streaming chat completion gets the same progress as
``reasoning_content`` deltas of proper ``chat.completion.chunk`` events instead (chat UIs show them
in their "thinking" box; SSE comments are hidden), and one "ready" line when the model is up. These
events are written here, not relayed: the usage tap never sees them (no tokens, no TTFT); the
model's own stream follows them on the same response (docs/loading-state.md).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from typing import Any, TypeGuard

import orjson

from flexinfer import errors
from flexinfer.http.protocol import ResponseWriter
from flexinfer.http.responses import sse_comment, sse_event
from flexinfer.proxy.context import RequestContext
from flexinfer.proxy.metrics import ProxyMetrics
from flexinfer.runtime.base import Inventory, ModelView, Scaler
from flexinfer.settings import ProxySettings

log = logging.getLogger("flexinfer.activation")

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store"),
               (b"x-accel-buffering", b"no")]


class _ModelQueue:
    __slots__ = ("cycle", "load_times", "waiters", "wake_started")

    def __init__(self) -> None:
        self.waiters: collections.deque[asyncio.Future[ModelView]] = collections.deque()
        self.cycle: asyncio.Task[None] | None = None  # the wake of the current activation cycle
        self.wake_started = 0.0
        self.load_times: collections.deque[float] = collections.deque(maxlen=5)

    def eta(self, now: float) -> float | None:
        if not self.load_times:
            return None
        expected = sum(self.load_times) / len(self.load_times)
        return max(0.0, expected - (now - self.wake_started))


def is_ready(view: ModelView | None) -> TypeGuard[ModelView]:
    return view is not None and view.ready and bool(view.endpoints)


class Activator:
    """Holds requests for models that are not ready and wakes them through the scaler."""

    def __init__(self, inventory: Inventory, scaler: Scaler, settings: ProxySettings,
                 metrics: ProxyMetrics) -> None:
        self.inventory = inventory
        self.scaler = scaler
        self.settings = settings
        self.metrics = metrics
        self.queues: dict[str, _ModelQueue] = {}
        inventory.subscribe(self._on_change)

    def queue_depth(self, model: str) -> int:
        """Requests waiting for ``model`` now."""
        q = self.queues.get(model)
        return len(q.waiters) if q is not None else 0

    # -- readiness events --------------------------------------------------------------------------
    def _on_change(self, view: ModelView) -> None:
        q = self.queues.get(view.name)
        if q is None or not is_ready(view):
            return
        if q.cycle is not None:
            took = time.monotonic() - q.wake_started
            q.load_times.append(took)
            self.metrics.activations.labels(view.name, "success").inc()
            self.metrics.activation_duration.labels(view.name, "success").observe(took)
            q.cycle = None
        while q.waiters:  # arrival order
            fut = q.waiters.popleft()
            if not fut.done():
                fut.set_result(view)
        self.metrics.queue_depth.labels(view.name).set(0)

    # -- the wake ----------------------------------------------------------------------------------
    async def _wake(self, view: ModelView, q: _ModelQueue) -> None:
        try:
            await self.scaler.wake(view)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the runtime says why; every waiter hears it
            reason = str(exc) or type(exc).__name__
            log.warning("activation of %s failed: %s", view.name, reason)
            self.metrics.activations.labels(view.name, "failure").inc()
            self.metrics.activation_duration.labels(view.name, "failure").observe(time.monotonic() - q.wake_started)
            q.cycle = None
            err = errors.ActivationFailed(f"model {view.name!r} failed to start: {reason}")
            while q.waiters:
                fut = q.waiters.popleft()
                if not fut.done():
                    fut.set_exception(err)
            self.metrics.queue_depth.labels(view.name).set(0)

    # -- one request -------------------------------------------------------------------------------
    async def wait_ready(self, view: ModelView, ctx: RequestContext, resp: ResponseWriter,
                         data: dict[str, Any] | None) -> ModelView:
        name = view.name
        current = self.inventory.resolve(name)
        if is_ready(current):
            return current
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = _ModelQueue()
        if len(q.waiters) >= self.settings.max_queue_size:
            self.metrics.queue_rejected.labels(name).inc()
            raise errors.QueueFull(f"model {name!r} is starting and its queue is full "
                                   f"({self.settings.max_queue_size} requests)", retry_after=2)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ModelView] = loop.create_future()
        q.waiters.append(fut)
        depth = self.metrics.queue_depth.labels(name)
        depth.set(len(q.waiters))
        if q.cycle is None:
            q.wake_started = time.monotonic()
            q.cycle = loop.create_task(self._wake(view, q))
        timeout = max(self.settings.queue_timeout, view.cold_start_timeout or self.settings.cold_start_timeout)
        t0 = time.monotonic()
        stream = data is not None and data.get("stream") is True
        loading = None
        if stream and ctx.path == "/v1/chat/completions" and view.metadata.get(
                "send_loading_state", self.settings.send_loading_state) is True:
            loading = _LoadingState(ctx, str((data or {}).get("model") or name))
        try:
            await self._wait(fut, q, name, t0 + timeout, resp if stream else None, ctx, loading)
            return fut.result()
        except TimeoutError:
            self.metrics.activations.labels(name, "timeout").inc()
            raise errors.GatewayTimeout(f"model {name!r} did not become ready within {timeout:g}s") from None
        finally:
            if not fut.done():
                fut.cancel()
            try:
                q.waiters.remove(fut)
            except ValueError:
                pass
            depth.set(len(q.waiters))
            if not q.waiters and q.cycle is not None:
                # nobody waits any more: stop asking (a start already under way runs to its end, shielded
                # in the runtime) and let the next arrival begin a new cycle
                if not q.cycle.done():
                    q.cycle.cancel()
                q.cycle = None
            ctx.queue_wait = time.monotonic() - t0
            self.metrics.queue_wait.labels(name).observe(ctx.queue_wait)

    async def _wait(self, fut: asyncio.Future[ModelView], q: _ModelQueue, name: str, deadline: float,
                    stream_resp: ResponseWriter | None, ctx: RequestContext,
                    loading: _LoadingState | None = None) -> None:
        s = self.settings
        t0 = time.monotonic()
        next_comment = t0 + s.queue_keepalive_after
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError
            wait_until = min(deadline, next_comment) if stream_resp is not None else deadline
            done, _ = await asyncio.wait({fut}, timeout=max(0.0, wait_until - now))
            if done:
                if loading is not None and loading.sent and stream_resp is not None and not fut.cancelled() \
                        and fut.exception() is None:
                    stream_resp.write(loading.event(f"{name} is ready after {time.monotonic() - t0:.1f}s.\n\n"))
                return
            if stream_resp is not None and time.monotonic() >= next_comment:
                if not stream_resp.started:
                    stream_resp.start(200, SSE_HEADERS)
                    ctx.sse_open = True
                pos = next((i + 1 for i, w in enumerate(q.waiters) if w is fut), 0)
                eta = q.eta(time.monotonic())
                eta_s = f"~{math.ceil(eta)}s" if eta is not None else "~?s"
                if loading is not None:
                    stream_resp.write(loading.event(f"Loading {name}: {time.monotonic() - t0:.0f}s, "
                                                    f"position {pos}, {eta_s} left\n"))
                else:
                    stream_resp.write(sse_comment(f"waiting for model {name}, position {pos}, {eta_s}"))
                next_comment = time.monotonic() + s.queue_keepalive_interval


class _LoadingState:
    """The ``chat.completion.chunk`` events of one waiting request (progress as ``reasoning_content``)."""

    __slots__ = ("head", "sent")

    def __init__(self, ctx: RequestContext, model: str) -> None:
        rid = ctx.request_id.decode() if isinstance(ctx.request_id, bytes) else str(ctx.request_id)
        self.head = {"id": f"chatcmpl-loading-{rid}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model}
        self.sent = 0

    def event(self, text: str) -> bytes:
        delta: dict[str, Any] = {"reasoning_content": text}
        if not self.sent:
            delta = {"role": "assistant", **delta}
        self.sent += 1
        return sse_event(orjson.dumps({**self.head, "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}))
