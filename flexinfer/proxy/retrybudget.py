"""The retry budget: how many retries of one model may be open at once (Envoy's retry budget).

Owns: :class:`RetryBudget`, asked by the forwarder before its single retry on another replica
(only ever after a refused connection, nothing sent). A retry is allowed while the model's open
retries stay below ``max(min_concurrency, percent x in-flight)``; ``in_flight`` is the model's
open upstream requests, the asking one included. Defaults are the reliability plan's (F12): 20 %
with a minimum of 3, so one refusing replica of three cannot double the load on the other two
while the outlier ejector has not caught up. Counts what it refused and the most it held open
(``high_water``, with the in-flight figure of that moment) for tests and ``/debug`` views.
Must not: do I/O, sleep, or know how requests are sent.
"""

from __future__ import annotations

__all__ = ["RetryBudget"]


class RetryBudget:
    __slots__ = ("_open", "granted", "high_water", "min_concurrency", "percent", "refused")

    def __init__(self, percent: float = 0.2, min_concurrency: int = 3) -> None:
        if not 0.0 <= percent <= 1.0 or min_concurrency < 0:
            raise ValueError("retry budget: percent within [0, 1] and min_concurrency >= 0")
        self.percent = percent
        self.min_concurrency = min_concurrency
        self._open: dict[str, int] = {}
        self.granted = 0
        self.refused = 0
        #: the most retries of one model open at once, and that model's in-flight count then
        self.high_water: tuple[int, int] = (0, 0)

    def allowed(self, in_flight: int) -> float:
        return max(float(self.min_concurrency), self.percent * in_flight)

    def take(self, model: str, in_flight: int) -> bool:
        """One retry of ``model`` may start now (then call :meth:`done` when it ends)."""
        n = self._open.get(model, 0)
        if n + 1 > self.allowed(in_flight):
            self.refused += 1
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

    def open(self, model: str) -> int:
        return self._open.get(model, 0)
