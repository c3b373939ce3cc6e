"""The one exponential backoff of the Kubernetes clients: :class:`Backoff`.

Owns: the delay before the next try after ``n`` consecutive failures: ``min(cap, base * 2**(n-1))``
times a jitter factor drawn uniformly from ``[jitter[0], jitter[1])`` (``(1.0, 1.0)``: none), and how a
server's ``Retry-After`` combines with it: as a floor (``"floor"``: the longer of the two) or in its
place (``"replace"``: the Retry-After, jittered). Each caller keeps its own base, cap, jitter and
Retry-After rule; one object counts the failures of one thing (a watch, a request, a key), or
:meth:`Backoff.delay` takes the count from the caller.

Must not: sleep, log, or decide what counts as a failure (the callers do).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

RetryAfterRule = Literal["floor", "replace"]


class Backoff:
    """Exponential, capped, jittered delays (see the module docstring)."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, *, jitter: tuple[float, float] = (0.5, 1.0),
                 retry_after: RetryAfterRule = "floor", rng: Callable[[], float] = random.random) -> None:
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.retry_after = retry_after
        self.rng = rng
        self.failures = 0

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """The delay after ``failures`` (>= 1) consecutive failures; ``retry_after`` is the server's hint."""
        lo, hi = self.jitter
        factor = lo if lo == hi else lo + (hi - lo) * self.rng()
        if retry_after is not None and self.retry_after == "replace":
            return retry_after * factor
        delay = min(self.cap, self.base * (2 ** min(max(failures - 1, 0), 30))) * factor
        return delay if retry_after is None else max(retry_after, delay)

    def next(self, retry_after: float | None = None) -> float:
        """Count one more failure and return the delay before the next try."""
        self.failures += 1
        return self.delay(self.failures, retry_after)

    def reset(self) -> None:
        """A success: the next failure starts again at ``base``."""
        self.failures = 0

