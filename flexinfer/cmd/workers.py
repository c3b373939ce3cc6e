"""What the workers of ``flexinfer proxy`` share, wired: the machine's shared memory, merged metrics, Redis.

Owns: :class:`SharedParts`, built in the parent before it forks (the shared mapping and the metrics
directory must exist before the children do), and, in each worker, the handler with its router,
limiter and metrics pointed at them; the worker's start/stop hooks (the Redis client, the metrics
publisher); the parent's hook for a worker that died (its in-flight row is zeroed) and the cleanup
at exit. Decisions:

- ``--workers 1`` without Redis shares nothing: local buckets and counts, exactly as before.
- ``--workers N``: rate limits and in-flight counts in shared memory (:mod:`flexinfer.proxy.machine`),
  prefix-cache hints in a shared table, ``/metrics`` merged over the workers, and one engine
  scraper per machine: worker 0 scrapes and publishes in the machine's engine region, the other
  workers read it (:mod:`flexinfer.proxy.enginepub`).
- ``PROXY_REDIS_URL``: other machines' in-flight counts and the limits' buckets through Redis
  (:mod:`flexinfer.proxy.redisshare`), this machine's shared memory as the fallback.

Must not: be imported by anything but ``cmd/proxy.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from flexinfer.http.server import current_worker
from flexinfer.proxy.limits import Limiter, MachineBuckets
from flexinfer.proxy.machine import MachineState, SharedLoad, SharedPrefixStore
from flexinfer.proxy.metrics import ProxyMetrics
from flexinfer.proxy.pipeline import ProxyHandler, ejector_for
from flexinfer.proxy.prom import Gauge
from flexinfer.proxy.redisshare import default_machine_id
from flexinfer.proxy.routing import Router
from flexinfer.proxy.workermetrics import PUBLISH_INTERVAL
from flexinfer.runtime.base import Inventory, Scaler
from flexinfer.settings import ProxySettings

if TYPE_CHECKING:
    from flexinfer.http.server import HTTPServer
    from flexinfer.proxy.ejection import HealthChecker
    from flexinfer.proxy.enginepub import EnginePublisher, EngineStateReader
    from flexinfer.proxy.redisshare import RedisShare
    from flexinfer.proxy.scrape import EngineScraper

log = logging.getLogger("flexinfer.proxy")

class SharedParts:
    """Built once in the parent; each worker calls :meth:`handler` after the fork."""

    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.workers = settings.workers
        sharing = self.workers > 1 or bool(settings.redis_url)
        self.machine: MachineState | None = MachineState(self.workers) if sharing else None
        self.metrics_dir: str | None = (tempfile.mkdtemp(prefix="flexinfer-metrics-")
                                        if self.workers > 1 else None)
        self.machine_id = default_machine_id(settings.replica_id)  # in the parent: one id for its workers
        # per worker process (set after the fork)
        self.redis: RedisShare | None = None
        self.metrics: ProxyMetrics | None = None
        self._publisher: asyncio.Task[None] | None = None
        self.scraper: EngineScraper | None = None  # worker 0's (or the only process's)
        self.engine_pub: EnginePublisher | None = None  # worker 0's, with --workers N
        #: what the router reads engine states from (``state``, ``last``): the scraper, or with
        #: --workers N in workers 1..N-1 the reader of worker 0's publication
        self.engines: EngineScraper | EngineStateReader | None = None
        self.health: HealthChecker | None = None

    # -- in the worker ------------------------------------------------------------------------
    def handler(self, inventory: Inventory, *, scaler: Scaler | None = None, health_check: bool = False,
                **kw: Any) -> ProxyHandler:
        """The worker's handler; ``health_check``: the inventory's endpoints are fixed (a static
        file), so the optional active health check (``PROXY_HEALTH_CHECK_INTERVAL``) applies."""
        handler = self._handler(inventory, scaler=scaler, **kw)
        self._scrape_engines(inventory, handler.router)
        if health_check:
            self._check_health(inventory, handler.router)
        return handler

    def _check_health(self, inventory: Inventory, router: Router) -> None:
        """GET the health path of every endpoint each interval; failures feed the ejector as the
        passive failures do, a success re-admits an ejected endpoint at once."""
        s = self.settings
        if s.health_check_interval <= 0 or router.ejector is None:
            return
        from flexinfer.proxy.ejection import HealthChecker

        checker = self.health = HealthChecker(router.ejector, interval=s.health_check_interval,
                                              timeout=s.health_check_timeout, path=s.health_check_path)

        def follow(_view: object = None) -> None:
            eps = [e for v in inventory.models() for e in v.endpoints]
            checker.set_endpoints(sorted({e.key for e in eps}), {e.key: e.link for e in eps if e.link is not None})

        follow()
        inventory.subscribe(follow)

    def _scrape_engines(self, inventory: Inventory, router: Router) -> None:
        """The engine metrics of the ``scored`` models' endpoints, for the router: one scraper per
        machine (it starts with the worker and follows the inventory's changes). With ``--workers N``
        worker 0 scrapes and publishes its states in the machine's engine region; the others read
        them there (every worker sees the same inventory, so worker 0's endpoint set is theirs)."""
        from flexinfer.proxy.enginepub import EnginePublisher, EngineStateReader
        from flexinfer.proxy.scrape import EngineScraper

        s = self.settings
        slot = current_worker()
        shared = self.machine is not None and self.workers > 1
        if shared and slot is not None and slot.index != 0:
            assert self.machine is not None
            reader = self.engines = EngineStateReader(self.machine.engine_region(),
                                                      max_age=s.engine_metrics_max_age)
            router.engine_state = reader.state
            router.engine_last = reader.last
            return
        scraper = self.scraper = EngineScraper(interval=s.engine_scrape_interval, timeout=s.engine_scrape_timeout,
                                               max_age=s.engine_metrics_max_age)

        def follow(_view: object = None) -> None:
            eps = [e for v in inventory.models() if v.routing == "scored" for e in v.endpoints]
            scraper.set_endpoints(sorted({e.key for e in eps}), {e.key: e.link for e in eps if e.link is not None})

        follow()
        inventory.subscribe(follow)
        router.engine_state = scraper.state
        router.engine_last = scraper.last
        self.engines = scraper
        if shared:
            assert self.machine is not None
            pub = self.engine_pub = EnginePublisher(self.machine.engine_region(), scraper.snapshot)
            scraper.on_change = pub.changed

    def _handler(self, inventory: Inventory, *, scaler: Scaler | None = None, **kw: Any) -> ProxyHandler:
        settings = self.settings
        if self.machine is None:
            return ProxyHandler(inventory, settings, scaler=scaler, **kw)
        slot = current_worker()
        index = slot.index if slot is not None else 0
        ws = self.machine.bind(index)
        metrics = self.metrics = ProxyMetrics()
        if self.metrics_dir is not None:
            # a per-worker gauge (merged with a worker="<index>" label): who is up, restarted how often
            Gauge("flexinfer_proxy_worker_restarts", "Times the parent restarted this worker slot.",
                  registry=metrics.registry).set(slot.restarts if slot is not None else 0)
            metrics.share_across_workers(self.metrics_dir, index, self.workers)
        machine_buckets = MachineBuckets(ws.buckets)
        buckets: Any = machine_buckets
        redis = None
        if settings.redis_url:
            from flexinfer.proxy.redisshare import RedisShare

            redis = self.redis = RedisShare(settings, metrics.registry, machine_id=self.machine_id,
                                            worker_id=str(index), local_load=ws.counts.own_items,
                                            fallback=machine_buckets.take, charge_fallback=machine_buckets.charge)
            buckets = redis
        router = Router(load=SharedLoad(ws.counts, redis), prefixes=SharedPrefixStore(ws.prefixes, ws.counts),
                        ejector=ejector_for(settings))
        limiter = Limiter(settings, metrics, buckets=buckets) if settings.rate_limit_enabled else None
        return ProxyHandler(inventory, settings, metrics=metrics, router=router, limiter=limiter,
                            token_buckets=buckets, scaler=scaler, **kw)

    async def start(self, _server: HTTPServer | None = None) -> None:
        if self.scraper is not None:
            await self.scraper.start()
        if self.health is not None:
            await self.health.start()
        if self.redis is not None:
            await self.redis.start()
        if self.metrics is not None and self.metrics_dir is not None:
            self._publisher = asyncio.get_running_loop().create_task(self._publish(), name="metrics publisher")

    async def stop(self, _server: HTTPServer | None = None) -> None:
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher
            self._publisher = None
        if self.metrics is not None and self.metrics_dir is not None:
            self.metrics.publish()  # the final figures, for the scrapes of the workers still up
        if self.redis is not None:
            await self.redis.stop()
        if self.scraper is not None:
            await self.scraper.stop()
        if self.health is not None:
            await self.health.stop()
        if self.engine_pub is not None:
            self.engine_pub.close()
        tracer = getattr(_server.handler, "tracer", None) if _server is not None else None
        if tracer is not None:  # export the buffered spans (a forked worker ends with os._exit: no atexit)
            await asyncio.to_thread(tracer.shutdown)

    async def _publish(self) -> None:
        assert self.metrics is not None
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL)
            try:
                self.metrics.publish()
            except OSError as exc:  # a full or vanished temp directory must not stop the worker
                log.warning("publishing metrics failed: %s", exc)

    # -- in the parent ------------------------------------------------------------------------
    def worker_exited(self, index: int) -> None:
        """A worker died: its open requests died with it."""
        if self.machine is not None:
            self.machine.reset_worker(index)

    def close(self) -> None:
        if self.metrics_dir is not None:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
