"""The retry budget: how many retries of one model may be open at once (Envoy's retry budget).

Owns: :class:`RetryBudget`, asked by the forwarder before its single retry on another replica
(only ever after a refused connection, nothing sent). A retry is allowed while the model's open
retries stay below ``max(min_concurrency, percent x in-flight)``; ``in_flight`` is the model's
open upstream requests, the asking one included. Defaults are the reliability plan's (F12): 20 %
with a minimum of 3, so one refusing replica of three cannot double the load on the other two
while the outlier ejector has not caught up. The budget bounds how many retries are open *at
once*, not how many happen: a retry that finds the budget full waits (:meth:`wait_slot`, the
forwarder bounds the wait by the connect timeout) for an open retry of its model to end, instead of
failing a request that never reached a backend (a burst read in one loop turn can put a dozen
picks on a replica before its first refusal is back). Counts what it refused (still full at the
end of the wait) and the most it held open (``high_water``, with the in-flight figure of that
moment) for tests and ``/debug`` views.
Must not: do I/O, sleep, or know how requests are sent.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["RetryBudget"]


class RetryBudget:
    __slots__ = ("_open", "_waiters", "granted", "high_water", "min_concurrency", "percent", "refused", "waited")

    def __init__(self, percent: float = 0.2, min_concurrency: int = 3) -> None:
        if not 0.0 <= percent <= 1.0 or min_concurrency < 0:
            raise ValueError("retry budget: percent within [0, 1] and min_concurrency >= 0")
        self.percent = percent
        self.min_concurrency = min_concurrency
        self._open: dict[str, int] = {}
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self.granted = 0
        self.refused = 0  # retries given up: the budget stayed full for the whole wait
        self.waited = 0  # retries that had to wait for a slot
        #: the most retries of one model open at once, and that model's in-flight count then
        self.high_water: tuple[int, int] = (0, 0)

    def allowed(self, in_flight: int) -> float:
        return max(float(self.min_concurrency), self.percent * in_flight)

    def take(self, model: str, in_flight: int) -> bool:
        """One retry of ``model`` may start now (then call :meth:`done` when it ends)."""
        n = self._open.get(model, 0)
        if n + 1 > self.allowed(in_flight):
            return False
        self._open[model] = n + 1
        self.granted += 1
        if n + 1 > self.high_water[0]:
            self.high_water = (n + 1, in_flight)
        return True

    def done(self, model: str) -> None:
        n = self._open.get(model, 0) - 1
        if n > 0:
            self._open[model] = n
        else:
            self._open.pop(model, None)
        waiters = self._waiters.get(model)
        while waiters:  # wake the oldest retry still waiting for a slot of this model
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                break
        if waiters is not None and not waiters:
            del self._waiters[model]

    def wait_slot(self, model: str) -> asyncio.Future[None]:
        """A future that resolves when an open retry of ``model`` ends (cancel it to stop waiting)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(model, deque()).append(fut)
        return fut
