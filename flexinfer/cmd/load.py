"""The proxy's load as a runtime reads it: a late-bound :class:`~flexinfer.runtime.base.LoadView`.

The runtime is built first (the handler takes it as inventory and scaler), so it is handed this
adapter at construction, and :meth:`ProxyLoad.bind` points the adapter at the handler's router and
activator once the handler exists. Until then it reports nothing open and an unknown queue depth.
It also hands the local status page the proxy's own request and token counters (:meth:`ProxyLoad.totals`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flexinfer.proxy.activation import Activator
    from flexinfer.proxy.metrics import ProxyMetrics
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.proxy.routing import Router


class ProxyLoad:
    """Router in-flight counts per endpoint, activator queue depths per model."""

    __slots__ = ("_activator", "_bound", "_metrics", "_router")

    def __init__(self) -> None:
        self._router: Router | None = None
        self._activator: Activator | None = None
        self._bound = False
        self._metrics: ProxyMetrics | None = None

    def bind(self, handler: ProxyHandler) -> None:
        self._router, self._activator, self._bound = handler.router, handler.activator, True
        self._metrics = handler.metrics

    def in_flight(self, endpoint: str) -> int:
        router = self._router
        return router.load.get(endpoint, 0) if router is not None else 0

    def queue_depth(self, model: str) -> int | None:
        if self._activator is not None:
            return self._activator.queue_depth(model)
        return 0 if self._bound else None  # bound without an activator: nobody ever waits

    def totals(self, model: str) -> tuple[dict[int, int], int, int] | None:
        """The proxy's own counters of ``model`` (answers by status code, prompt and completion tokens:
        :meth:`ProxyMetrics.totals`), for the status page; None until bound."""
        return self._metrics.totals(model) if self._metrics is not None else None
