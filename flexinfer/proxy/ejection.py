"""Passive outlier ejection per endpoint, and an optional active health check for static endpoints.

Owns:

- :class:`Ejector`: what the forwarder reports about each upstream exchange
  (``record(key, ok, kind)``). ``consecutive`` (default 5) failures in a row (connect errors, 5xx,
  timeouts, failed health checks) eject the endpoint for ``base_s`` × times ejected (default 30 s),
  capped at ``max_ejection_s`` (default 300 s); any success resets the run. An endpoint that stayed in
  for ``max_ejection_s`` since it last came back starts over at ``base_s``. :meth:`Ejector.usable`
  filters one model's candidates: it never drops more than ``max_share`` (default 50 %, rounded down)
  of them and always leaves at least one (Envoy's "panic" rule); when too many are ejected, the ones
  ejected longest ago come back first. Ejections end lazily (checked when asked), no timers.
  These are the reliability plan's U11/F13 defaults (Envoy's outlier detection, per model pool).
- :class:`HealthChecker`: every ``interval`` seconds, ``GET path`` (``Connection: close``) on each
  configured endpoint, bounded in time (``timeout``) and concurrency; a failed check is a failure
  for the :class:`Ejector`, a 2xx answer readmits an ejected endpoint early.

Must not: do I/O in :class:`Ejector` (pure logic on an injectable clock), log per request, import
anything above the proxy floor, or dial an address that did not come from the inventory.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flexinfer.proxy.sidedial import side_auth, side_open, side_path

# kinds that count toward the consecutive-failure run ("health": a check answered but not with 2xx)
FAILURE_KINDS = frozenset(("connect", "5xx", "timeout", "health"))


@dataclass(slots=True)
class _State:
    consecutive: int = 0
    ejected_until: float | None = None  # None: in rotation
    ejected_at: float = 0.0
    returned_at: float | None = None  # when the last ejection ended
    times_ejected: int = 0  # the multiplier (decays, see the module docstring)
    last_error: str | None = None
    last_error_at: float | None = None


class Ejector:
    """Consecutive-failure outlier ejection, keyed by endpoint key (``host:port``)."""

    def __init__(self, consecutive: int = 5, base_s: float = 30.0, max_share: float = 0.5,
                 max_ejection_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        if consecutive < 1:
            raise ValueError("consecutive must be >= 1")
        if base_s <= 0 or max_ejection_s <= 0:
            raise ValueError("ejection times must be > 0")
        if not 0.0 <= max_share <= 1.0:
            raise ValueError("max_share must be within [0, 1]")
        self.consecutive = consecutive
        self.base_s = base_s
        self.max_share = max_share
        self.max_ejection_s = max_ejection_s
        self.clock = clock
        self._states: dict[str, _State] = {}
        self._out: dict[str, _State] = {}  # the ejected subset of _states (usable()'s fast path)
        #: The keys a success may have something to reset on (a run of failures, an ejection): a
        #: superset, kept by record/readmit/forget. The forwarder reports a success on any other key
        #: by not calling record at all (a Python call per request saved; issue 15).
        self.unsettled: set[str] = set()
        self.ejections_total: dict[str, int] = {}  # per key, monotonic (metrics)

    def _expire(self, key: str, st: _State, now: float) -> None:
        if st.ejected_until is not None and now >= st.ejected_until:
            st.returned_at = st.ejected_until  # when it came back, not when we noticed
            st.ejected_until = None
            self._out.pop(key, None)

    def record(self, key: str, ok: bool, kind: str) -> bool:
        """One upstream outcome. ``kind``: ``ok``, ``connect``, ``5xx``, ``timeout`` (``health`` from
        the checker); other failure kinds (a 4xx, a client gone) neither count nor reset.
        Returns True when this outcome ejected the endpoint."""
        st = self._states.get(key)
        if st is None:
            st = self._states[key] = _State()
        elif ok and st.consecutive == 0 and st.ejected_until is None:
            return False  # the common case, nothing to reset or to end (and no clock read)
        now = self.clock()
        self._expire(key, st, now)
        if ok:
            st.consecutive = 0
            if st.ejected_until is None:
                self.unsettled.discard(key)
            return False
        if kind not in FAILURE_KINDS:
            return False
        self.unsettled.add(key)
        st.last_error = kind
        st.last_error_at = now
        if st.ejected_until is not None:  # already out: in-flight stragglers do not extend it
            return False
        st.consecutive += 1
        if st.consecutive < self.consecutive:
            return False
        if st.returned_at is not None and now - st.returned_at >= self.max_ejection_s:
            st.times_ejected = 0  # healthy long enough: start over at base_s
        st.times_ejected += 1
        st.consecutive = 0
        st.ejected_at = now
        st.ejected_until = now + min(self.base_s * st.times_ejected, self.max_ejection_s)
        self._out[key] = st
        self.ejections_total[key] = self.ejections_total.get(key, 0) + 1
        return True

    def readmit(self, key: str) -> bool:
        """End an ejection early (a health check passed). Returns True when it was ejected."""
        st = self._states.get(key)
        if st is None or st.ejected_until is None:
            return False
        st.ejected_until = None
        st.returned_at = self.clock()
        self._out.pop(key, None)
        st.consecutive = 0
        self.unsettled.discard(key)
        return True

    def ejected(self, key: str) -> bool:
        """Whether ``key`` is ejected now (before the per-model share cap of :meth:`usable`)."""
        st = self._states.get(key)
        if st is None:
            return False
        self._expire(key, st, self.clock())
        return st.ejected_until is not None

    def usable(self, model_keys: Sequence[str]) -> list[str]:
        """The keys of one model that may get traffic, in the given order.

        At most ``floor(max_share * n)`` keys are dropped and at least one always remains; beyond
        that the most recently ejected stay out and the ones ejected longest ago come back first."""
        ejected = self._out
        if not ejected:
            return list(model_keys)
        now = self.clock()
        for k, est in list(ejected.items()):
            self._expire(k, est, now)
        out = [(st.ejected_at, k) for k in model_keys if (st := ejected.get(k)) is not None]
        if not out:
            return list(model_keys)
        n = len(model_keys)
        allowed = min(math.floor(self.max_share * n + 1e-9), n - 1)
        if allowed <= 0:
            return list(model_keys)
        out.sort(reverse=True)  # most recent ejection first: those stay out
        dropped = {k for _, k in out[:allowed]}
        return [k for k in model_keys if k not in dropped]

    def state(self, key: str) -> dict[str, Any]:
        """For ``/debug/endpoints``: the run of failures, the ejection and the last error kind.
        ``ejected_until`` is on the ejector's clock (monotonic); ``ejected_for_s`` is what is left."""
        st = self._states.get(key)
        if st is None:
            return {"consecutive_failures": 0, "ejected": False, "ejected_until": None, "ejected_for_s": 0.0,
                    "times_ejected": 0, "ejections_total": self.ejections_total.get(key, 0), "last_error": None}
        now = self.clock()
        self._expire(key, st, now)
        left = 0.0 if st.ejected_until is None else max(0.0, st.ejected_until - now)
        return {"consecutive_failures": st.consecutive, "ejected": st.ejected_until is not None,
                "ejected_until": st.ejected_until, "ejected_for_s": left,
                "times_ejected": st.times_ejected, "ejections_total": self.ejections_total.get(key, 0),
                "last_error": st.last_error}

    def forget(self, key: str) -> None:
        """The endpoint left the inventory: drop its state (its metric counter stays)."""
        self._states.pop(key, None)
        self._out.pop(key, None)
        self.unsettled.discard(key)

    def keys(self) -> list[str]:
        """The keys with state: each one with an outcome recorded (a success the forwarder skipped,
        see :attr:`unsettled`, leaves none)."""
        return list(self._states)


def _split(key: str) -> tuple[str, int]:
    host, _, port = key.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint key {key!r} must look like host:port")
    return host, int(port)


class HealthChecker:
    """Active health check: a ``GET path`` per endpoint each ``interval``, results into the ejector."""

    def __init__(self, ejector: Ejector, interval: float = 5.0, timeout: float = 1.0, path: str = "/health",
                 concurrency: int = 16) -> None:
        if not path.startswith("/") or any(c in path for c in "\r\n \t"):
            raise ValueError(f"health path {path!r} must be an absolute path without whitespace")
        self.ejector = ejector
        self.interval = interval
        self.timeout = timeout
        self.path = path
        self._sem = asyncio.Semaphore(max(1, concurrency))
        self._keys: tuple[str, ...] = ()
        self._links: dict[str, Any] = {}  # key -> UpstreamLink (TLS / keyed endpoints only)
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0  # completed rounds
        self.last: dict[str, str] = {}  # key -> last check result kind ("ok", "connect", ...)

    def set_endpoints(self, keys: Iterable[str], links: Mapping[str, Any] | None = None) -> None:
        """The endpoints to check from the next round on (``host:port`` keys from the inventory),
        with the ``UpstreamLink`` of those that have one (checked over TLS, with a peer's key)."""
        self._links = dict(links or {})
        ks = tuple(dict.fromkeys(keys))
        for k in ks:
            _split(k)
        self._keys = ks
        for gone in set(self.last) - set(ks):
            del self.last[gone]

    async def check(self, key: str) -> str:
        """One check: ``ok`` (2xx), ``health`` (another answer), ``connect`` or ``timeout``."""
        host, port = _split(key)
        link = self._links.get(key)
        hosthdr = f"[{host}]:{port}" if ":" in host else key
        req = (f"GET {side_path(link, self.path)} HTTP/1.1\r\nHost: {hosthdr}\r\nUser-Agent: flexinfer-health\r\n"
               f"{side_auth(link)}Accept: */*\r\nConnection: close\r\n\r\n").encode("latin-1")
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await side_open(host, port, link, 4096)
                writer.write(req)
                await writer.drain()
                line = await reader.readline()
        except TimeoutError:
            return "timeout"
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return "connect"
        finally:
            if writer is not None:
                writer.transport.abort()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        parts = line.split(None, 2)
        if not line or len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            return "connect" if not line else "health"
        status = int(parts[1])
        if 200 <= status < 300:
            return "ok"
        return "5xx" if status >= 500 else "health"

    async def _one(self, key: str) -> None:
        async with self._sem:
            kind = await self.check(key)
        if key not in self._keys:  # removed meanwhile
            return
        self.last[key] = kind
        if kind == "ok":
            self.ejector.record(key, True, "ok")
            self.ejector.readmit(key)
        else:
            self.ejector.record(key, False, kind)

    async def tick(self) -> None:
        """One round over the current endpoints (each bounded by ``timeout``)."""
        keys = self._keys
        if keys:
            await asyncio.gather(*(self._one(k) for k in keys))
        self.rounds += 1

    async def _run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.interval)

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="flexinfer-health")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait([task])  # a cancelled stop() still propagates its own cancellation
        exc = None if task.cancelled() else task.exception()
        if exc is not None:  # the loop died of a bug: say so here rather than never
            raise exc
