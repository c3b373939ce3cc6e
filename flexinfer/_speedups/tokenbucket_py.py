"""Token buckets and a bounded keyed registry of them: the reference twin (the executable spec).

Owns: admission arithmetic for rate limits (how many tokens, how long to wait).
Must not: import anything from flexinfer, sleep, log, or read the wall clock (monotonic only).
``tokenbucket_c.pyx`` implements the same API with bit-identical float results.

Spec (all arithmetic in IEEE double, in exactly this order)
-----------------------------------------------------------
* A bucket starts full (``tokens = burst``) at ``now`` (or ``clock()``) and refills at
  ``rate`` tokens per second up to ``burst``.
* ``take(n=1.0, now=None)``: ``t = now`` if given, else ``clock()``. If ``t > last``:
  ``tokens = min(burst, tokens + (t - last) * rate)`` and ``last = t``; a clock that goes
  backwards adds nothing and does not move ``last``. Then, if
  ``tokens >= n - rate * GRACE`` (the missing part would arrive within ``GRACE`` = 1 µs),
  ``tokens = max(tokens - n, 0)`` and the answer is ``0.0`` (admitted). Otherwise nothing
  is consumed and the answer is the wait until ``n`` tokens would be there:
  ``(n - tokens) / rate`` (> 1 µs), or ``inf`` when that can never happen (``n > burst`` or
  ``rate == 0``). Use it for ``Retry-After`` (round up).
* Why ``GRACE``: clock readings are rounded floats, so a refill that should land exactly on
  ``n`` often lands a few ulps short, and a client pacing exactly at the rate (or retrying
  exactly after the answered wait) is then refused until its next request. Driven at 2r
  with burst 1, an exact comparison admitted 20-33 % less than r (r = 1.5, 10, 1000/s).
  The error is a time error (the ulp of the clock reading: 15 ns even at 10^8 s of uptime),
  so the slack is a time too.
* ``n`` must be ``>= 0`` (ValueError for negative or NaN); ``rate`` finite and ``>= 0``;
  ``burst`` finite and ``> 0``.
* ``BucketRegistry`` keeps one bucket per key, created full on first use, at most
  ``max_keys`` of them, in least-recently-used order (a ``take`` marks the key used).
  Before a new key is added, buckets are dropped from the LRU end while the oldest one is
  *evictable*: idle for ``>= idle_ttl`` seconds (``t - last >= idle_ttl``) or *full at t*
  (refilled to burst, hence the same as a new bucket: dropping it changes nothing). If the
  registry is still at ``max_keys``, the first bucket among the ``EVICTION_SCAN`` oldest
  that is full at t is dropped, else the LRU one (that key gets a fresh burst next time:
  the only lossy case, and only under key pressure). Each step is O(1) amortized.
  ``available`` peeks without changing anything.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from itertools import islice
from operator import index

__all__ = ["EVICTION_SCAN", "GRACE", "BucketRegistry", "TokenBucket"]

EVICTION_SCAN = 8  # how many of the oldest buckets a full registry checks for a full one
GRACE = 1e-6  # seconds: admit when the missing tokens would arrive within this time

Clock = Callable[[], float]
_INF = math.inf


def _as_float(x: object) -> float:
    """float(x) for numbers only (no parsing of strings), like a C double argument."""
    if type(x) is float:
        return x
    if isinstance(x, str | bytes | bytearray):
        raise TypeError(f"must be a real number, not {type(x).__name__}")
    return float(x)  # type: ignore[arg-type]


def _check_params(rate: float, burst: float) -> tuple[float, float]:
    rate = _as_float(rate)
    burst = _as_float(burst)
    if not 0.0 <= rate < _INF:
        raise ValueError("rate must be finite and >= 0")
    if not 0.0 < burst < _INF:
        raise ValueError("burst must be finite and > 0")
    return rate, burst


class TokenBucket:
    """One token bucket (pure Python)."""

    __slots__ = ("_burst", "_clock", "_last", "_rate", "_tokens")

    def __init__(
        self, rate: float, burst: float, clock: Clock = time.monotonic, now: float | None = None
    ) -> None:
        self._rate, self._burst = _check_params(rate, burst)
        self._clock = clock
        self._tokens = self._burst
        self._last = _as_float(clock() if now is None else now)

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> float:
        return self._burst

    @property
    def tokens(self) -> float:
        """Tokens as of the last update (no refill applied)."""
        return self._tokens

    @property
    def last(self) -> float:
        """Clock reading of the last refill."""
        return self._last

    def take(self, n: float = 1.0, now: float | None = None) -> float:
        """Take ``n`` tokens: 0.0 when admitted, else the seconds to wait (nothing taken)."""
        if type(n) is not float:
            n = _as_float(n)
        if not n >= 0.0:
            raise ValueError("n must be >= 0")
        t = self._clock() if now is None else now
        if type(t) is not float:
            t = _as_float(t)
        tokens = self._tokens
        if t > self._last:
            tokens = tokens + (t - self._last) * self._rate
            if tokens > self._burst:
                tokens = self._burst
            self._last = t
        if tokens >= n - self._rate * GRACE:
            tokens = tokens - n
            self._tokens = tokens if tokens > 0.0 else 0.0
            return 0.0
        self._tokens = tokens
        if n > self._burst or self._rate == 0.0:
            return _INF
        return (n - tokens) / self._rate

    def available(self, now: float | None = None) -> float:
        """Tokens that would be available at ``now``; changes nothing."""
        t = _as_float(self._clock() if now is None else now)
        return _refilled(self._tokens, self._last, self._rate, self._burst, t)


def _refilled(tokens: float, last: float, rate: float, burst: float, t: float) -> float:
    if t > last:
        tokens = tokens + (t - last) * rate
        if tokens > burst:
            tokens = burst
    return tokens


class BucketRegistry:
    """Keyed token buckets with bounded size and idle eviction (pure Python)."""

    __slots__ = ("_buckets", "_burst", "_clock", "_idle_ttl", "_max_keys", "_rate")

    def __init__(
        self,
        rate: float,
        burst: float,
        max_keys: int = 10000,
        idle_ttl: float = 300.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self._rate, self._burst = _check_params(rate, burst)
        max_keys = index(max_keys)
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        idle_ttl = _as_float(idle_ttl)
        if not idle_ttl > 0.0:
            raise ValueError("idle_ttl must be > 0")
        self._max_keys = max_keys
        self._idle_ttl = idle_ttl
        self._clock = clock
        # key -> [tokens, last]; first = least recently used
        self._buckets: OrderedDict[Hashable, list[float]] = OrderedDict()

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> float:
        return self._burst

    @property
    def max_keys(self) -> int:
        return self._max_keys

    @property
    def idle_ttl(self) -> float:
        return self._idle_ttl

    def __len__(self) -> int:
        return len(self._buckets)

    def __contains__(self, key: object) -> bool:
        return key in self._buckets

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        return list(self._buckets)

    def clear(self) -> None:
        self._buckets.clear()

    def take(self, key: Hashable, n: float = 1.0, now: float | None = None) -> float:
        """``TokenBucket.take`` on ``key``'s bucket (created full when new)."""
        if type(n) is not float:
            n = _as_float(n)
        if not n >= 0.0:
            raise ValueError("n must be >= 0")
        t = self._clock() if now is None else now
        if type(t) is not float:
            t = _as_float(t)
        buckets = self._buckets
        state = buckets.get(key)
        if state is None:
            self._make_room(t)
            state = [self._burst, t]
            buckets[key] = state
        else:
            buckets.move_to_end(key)
        tokens, last = state
        rate = self._rate
        burst = self._burst
        if t > last:
            tokens = tokens + (t - last) * rate
            if tokens > burst:
                tokens = burst
            state[1] = t
        if tokens >= n - self._rate * GRACE:
            tokens = tokens - n
            state[0] = tokens if tokens > 0.0 else 0.0
            return 0.0
        state[0] = tokens
        if n > burst or rate == 0.0:
            return _INF
        return (n - tokens) / rate

    def available(self, key: Hashable, now: float | None = None) -> float:
        """Tokens ``key`` would have at ``now`` (burst for an unknown key); changes nothing."""
        t = _as_float(self._clock() if now is None else now)
        state = self._buckets.get(key)
        if state is None:
            return self._burst
        return _refilled(state[0], state[1], self._rate, self._burst, t)

    def _make_room(self, t: float) -> None:
        buckets = self._buckets
        burst = self._burst
        while buckets:
            key, (tokens, last) = next(iter(buckets.items()))
            if t - last >= self._idle_ttl or _refilled(tokens, last, self._rate, burst, t) >= burst:
                del buckets[key]
            else:
                break
        if len(buckets) >= self._max_keys:
            victim = next(iter(buckets))  # LRU, unless one of the next oldest is full
            for key, (tokens, last) in islice(buckets.items(), EVICTION_SCAN):
                if _refilled(tokens, last, self._rate, burst, t) >= burst:
                    victim = key
                    break
            del buckets[victim]
