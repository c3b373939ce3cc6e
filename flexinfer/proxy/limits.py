"""Rate limits: a global bucket first, then one bucket per model, kept where the deployment needs them.

Off by default; when on: global 1000 rps / burst 200, per model 100 rps / burst 50 (configurable).
A refusal raises ``RateLimited`` (429 ``rate_limit_exceeded``) with ``Retry-After`` taken from the
bucket, so the request never reaches a backend, and counts in
``flexinfer_proxy_rate_limited_total{model,scope}``.

Where the buckets live (:class:`Buckets`, chosen by the composition root):

- :class:`LocalBuckets`: one process (``--workers 1``): token buckets on the monotonic clock.
- :class:`MachineBuckets`: every worker of the machine (``--workers N``): GCRA buckets in shared
  memory, updated with one compare-and-swap, so N workers admit what one would.
- ``redisshare.RedisShare``: every replica (``PROXY_REDIS_URL``): leases from GCRA buckets in Redis,
  with :class:`MachineBuckets` as the fallback while Redis is away.

Token limits (:mod:`flexinfer.proxy.tokenlimits`) use the same three places, with keys under
``tokens:`` and one more primitive, ``charge(key, rate, burst, n)``: tokens charged after the
response (no admission check, negative for a refund), GCRA arithmetic everywhere (one process: a
private ``SharedBuckets`` table in a ``bytearray``), so a bucket can owe up to one burst.

A decision is synchronous (a float: 0.0 admitted, else seconds to wait) except when a Redis lease
must be fetched first: then :meth:`Limiter.check` returns an awaitable that the pipeline awaits.
Must not: do I/O itself, or log per request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from flexinfer._speedups import BucketRegistry, SharedBuckets, TableFull, TokenBucket
from flexinfer.errors import RateLimited
from flexinfer.proxy.metrics import ProxyMetrics
from flexinfer.settings import ProxySettings

__all__ = ["GLOBAL_KEY", "Buckets", "Limiter", "LocalBuckets", "MachineBuckets", "model_key"]

#: Slots of the one-process GCRA table of token limits (models + API keys; idle slots are reclaimed).
LOCAL_TOKEN_SLOTS = 4096
TOKEN_PREFIX = "tokens:"

#: The bucket key of the global limit; a model's is :func:`model_key` (the Redis keys use them too).
GLOBAL_KEY = "global"

Decision = float | Awaitable[float]


def model_key(model: str) -> str:
    return "model:" + model


class Buckets(Protocol):
    """Take ``n`` from bucket ``key`` (rate per second, burst): 0.0 admitted, else seconds to wait."""

    def take(self, key: str, rate: float, burst: float, n: float = 1.0) -> Decision: ...


class LocalBuckets:
    """The buckets of one process (the rate and burst of each scope are fixed at construction)."""

    def __init__(self, settings: ProxySettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.global_bucket = TokenBucket(settings.rate_limit_global, settings.rate_limit_global_burst, clock)
        self.per_model = BucketRegistry(settings.rate_limit_per_model, settings.rate_limit_burst, clock=clock)
        self._tokens: SharedBuckets | None = None  # token limits' GCRA table, made on first use

    def take(self, key: str, rate: float, burst: float, n: float = 1.0) -> float:
        if key == GLOBAL_KEY:
            return self.global_bucket.take(n)
        if key.startswith(TOKEN_PREFIX):
            try:
                return self._token_table().take(key, rate, burst, n, self._now_ns())
            except TableFull:  # 4096 busy keys: far beyond any configuration; admit
                return 0.0
        return self.per_model.take(key, n)

    def charge(self, key: str, rate: float, burst: float, n: float) -> float:
        """Charge ``n`` tokens (negative: refund) after the fact; the debt wait (see SharedBuckets)."""
        try:
            return self._token_table().charge(key, rate, burst, n, self._now_ns())
        except TableFull:
            return 0.0

    def _token_table(self) -> SharedBuckets:
        t = self._tokens
        if t is None:
            t = self._tokens = SharedBuckets(bytearray(SharedBuckets.size(LOCAL_TOKEN_SLOTS)), LOCAL_TOKEN_SLOTS)
        return t

    def _now_ns(self) -> int:
        return int(self.clock() * 1e9)


class MachineBuckets:
    """GCRA buckets in the machine's shared memory; a key that finds no slot (the table is full of
    busy buckets, far beyond any inventory) falls back to a bucket of this process."""

    def __init__(self, shared: SharedBuckets, clock: Callable[[], float] = time.monotonic) -> None:
        self.shared = shared
        self._overflow: dict[tuple[float, float], BucketRegistry] = {}
        self._clock = clock

    def take(self, key: str, rate: float, burst: float, n: float = 1.0) -> float:
        try:
            return self.shared.take(key, rate, burst, n)
        except TableFull:
            reg = self._overflow.get((rate, burst))
            if reg is None:
                reg = self._overflow[(rate, burst)] = BucketRegistry(rate, burst, clock=self._clock)
            return reg.take(key, n)

    def charge(self, key: str, rate: float, burst: float, n: float) -> float:
        """Charge ``n`` tokens after the fact (token limits); dropped (0.0) when no slot is found."""
        try:
            return self.shared.charge(key, rate, burst, n)
        except TableFull:
            return 0.0


class Limiter:
    """Global, then per-model admission."""

    def __init__(self, settings: ProxySettings, metrics: ProxyMetrics,
                 clock: Callable[[], float] = time.monotonic, *, buckets: Buckets | None = None) -> None:
        self.metrics = metrics
        self.buckets: Buckets = buckets if buckets is not None else LocalBuckets(settings, clock)
        self._global = (settings.rate_limit_global, float(settings.rate_limit_global_burst))
        self._model = (settings.rate_limit_per_model, float(settings.rate_limit_burst))

    def check(self, model: str, n: float = 1.0) -> Awaitable[None] | None:
        """None when admitted; raises :class:`RateLimited`; or an awaitable that does one of both
        (a Redis lease is being fetched)."""
        wait = self.buckets.take(GLOBAL_KEY, *self._global, n)
        if not isinstance(wait, float):
            return self._later(wait, model, n)
        if wait == 0.0:
            wait = self.buckets.take(model_key(model), *self._model, n)
            if not isinstance(wait, float):
                return self._later_model(wait, model)
            if wait == 0.0:
                return None
            self._refuse(model, "model", wait)
        self._refuse(model, "global", wait)
        return None  # unreachable: _refuse raises

    async def _later(self, pending: Awaitable[float], model: str, n: float) -> None:
        wait = await pending
        if wait != 0.0:
            self._refuse(model, "global", wait)
        decision = self.buckets.take(model_key(model), *self._model, n)
        wait = decision if isinstance(decision, float) else await decision
        if wait != 0.0:
            self._refuse(model, "model", wait)

    async def _later_model(self, pending: Awaitable[float], model: str) -> None:
        wait = await pending
        if wait != 0.0:
            self._refuse(model, "model", wait)

    def _refuse(self, model: str, scope: str, wait: float) -> None:
        self.metrics.rate_limited.labels(model, scope).inc()
        ms = max(1, math.ceil(wait * 1000)) if wait < math.inf else 86_400_000
        raise RateLimited(f"rate limit exceeded ({scope}); retry in {wait:.2f}s",
                          retry_after=max(1, math.ceil(min(wait, 86_400.0))),
                          headers=[(b"retry-after-ms", str(ms).encode())])
