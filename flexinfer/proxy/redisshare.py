"""Sharing across proxy replicas through Redis (``PROXY_REDIS_URL``; off by default).

Owns: one worker's Redis client, its rate-limit leases, the in-flight counts exchange with the other
machines, and the fall back to local state while Redis is down or slow.
Must not: make a request fail or wait longer than ``PROXY_REDIS_TIMEOUT`` because of Redis, raise
out of :meth:`RedisShare.take`, or know the request pipeline (the limiter and the router call it).

Identities. A *machine* is one ``flexinfer proxy`` (its workers share memory); each *worker* process
is its own Redis client, a *member* ``<machine>/<worker>``. The machine id must be chosen once per
machine, before the workers fork (:func:`default_machine_id`): the machine's own load is counted
through shared memory, so Redis reports only the other machines'.

Rate limits: GCRA with leases (scripts in :mod:`flexinfer.proxy.redis_scripts`). One bucket per
scope in Redis; a worker fetches a *lease* of up to k tokens (granted only what the bucket holds:
never more) and spends it locally, so a request waits on a round trip only when its lease ran dry,
and concurrent requests then share that one fetch. Below half a lease the next one is prefetched in
the background. When the bucket is empty the script says until when, and the worker refuses locally
until then without asking. k = the worker's observed rate of this scope x 50 ms, at least 1, at most
a tenth of the burst; tokens unused for 0.5 s go back (TAT -= n x interval, not below now).
Token limits also *charge* after the fact (:meth:`RedisShare.charge`: output tokens, corrections
of an estimate; ``CHARGE``): the bucket's TAT moves past now (debt), so the next lease finds it empty
and says until when; tokens already leased locally (at most a tenth of the burst) still admit.
Accuracy: every admitted token was granted by the one bucket, so from a full bucket over any time T
admitted <= r*T + b (grace of 1 us per grant); in a window starting while leases are held, plus
the tokens leased then (<= workers x b/10). Under-admission <= the tokens leased but unused (each
worker's last lease of a scope, b/10 at most, until given back after 0.5 s of idleness).

In-flight counts: every ``PROXY_REDIS_SYNC_INTERVAL`` each worker runs one script that publishes its
counts and returns the sums of every other machine: :attr:`RedisShare.remote_in_flight`, replaced
whole (the router adds it to the machine-local count). Staleness: at most two intervals (the other
worker's and this one's) plus one round trip; a dead worker's counts vanish after 3 intervals + 2
timeouts (the member TTL) at the next sync of anyone; a stopping one takes them out at once.

Failure: every call is bounded by the timeout (``asyncio.timeout`` around it, the connect timeout,
no client retries). No *socket* timeout on purpose: redis-py wraps each send in ``asyncio.wait_for``
when one is set, and Python 3.11's ``wait_for`` loses a cancellation that arrives as the inner call
completes (CPython gh-86296, fixed in 3.12): measured, ~1 in 4 cancels of an in-flight command were
lost, which let a stopped sync loop run on. The first failure flips :attr:`up` to False, logs once,
clears ``remote_in_flight`` (stale loads would mislead), and from then on limits are decided locally:
first from the tokens still leased (real grants), then by the fallback at this machine's share of the
limit (rate / machines seen at the last sync: the best guess of how many now decide alone too; at
least 1, so a replica that never reached Redis admits the whole limit). A background probe (the sync
itself) retries with backoff up to 1 s; when it answers, sharing resumes (a restarted Redis has empty
state: buckets start full, counts are re-published by this sync).

Defaults. Timeout 0.1 s: two orders of magnitude above an in-cluster round trip (0.2-1 ms), so a
busy Redis is not taken for a dead one, yet the most a request ever waits on Redis. Sync interval
0.1 s: a sync costs O(endpoints) in Redis, flat in the number of members (~0.15-0.25 ms of Redis time
at 50 endpoints on a 2-core test box), so 10 per second per worker is cheap next to LLM requests
that last seconds; raise it for hundreds of workers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from flexinfer._speedups import TokenBucket
from flexinfer.proxy import redis_scripts as lua
from flexinfer.proxy.prom import Counter, Gauge, Registry
from flexinfer.settings import ProxySettings

log = logging.getLogger(__name__)

Fallback = Callable[[str, float, float, float], float]
"""(scope, rate, burst, n) -> 0.0 admitted / seconds to wait: a local bucket at this machine's share."""
ChargeFallback = Callable[[str, float, float, float], object]
"""(scope, rate, burst, n): the same local bucket's ``charge`` (token limits while Redis is away)."""

LEASE_HORIZON = 0.05  # seconds of the observed rate one lease covers
LEASE_BURST_FRACTION = 0.1  # a lease holds at most this part of the burst (bounds what sits unused)
RATE_WINDOW = 0.05  # least time between two estimates of a scope's local rate
IDLE_RETURN = 0.5  # leased tokens unused this long go back to Redis
FORGET_AFTER = 30.0  # a scope's local state idle this long (and empty) is dropped
BACKOFF_MIN, BACKOFF_MAX = 0.05, 1.0  # retry delays of the probe while Redis is down


def default_machine_id(replica_id: str = "") -> str:
    """``PROXY_REPLICA_ID``, else ``<hostname>-<pid>``: call it in the process that forks the
    workers, so they all get the same id (two proxies on one host stay two machines)."""
    return replica_id or f"{socket.gethostname()}-{os.getpid()}"


class _Lease:
    """One scope's local lease: tokens granted by Redis, and what is known about the bucket."""

    __slots__ = ("burst", "calls", "empty_until", "fetch", "k", "last_take", "low", "rate", "rate_est",
                 "tokens", "waiting", "window_start")

    def __init__(self, now: float) -> None:
        self.tokens = 0.0
        self.empty_until = 0.0  # the bucket holds fewer than `need` tokens until then
        self.fetch: asyncio.Task[bool] | None = None
        self.waiting = 0.0  # tokens wanted by the requests awaiting `fetch`
        self.calls = 0.0  # tokens asked since window_start
        self.window_start = now
        self.rate_est = 0.0
        self.k = 1.0
        self.low = 0.5
        self.last_take = now
        self.rate = 0.0
        self.burst = 0.0


class RedisShare:
    """One worker's share of a Redis: leases for rate limits, other machines' in-flight counts."""

    def __init__(self, settings: ProxySettings, registry: Registry, *, machine_id: str,
                 worker_id: str, local_load: Callable[[], Mapping[str, int]],
                 fallback: Fallback | None = None, clock: Callable[[], float] = time.monotonic,
                 charge_fallback: ChargeFallback | None = None) -> None:
        if not machine_id or not worker_id or lua.SEP in machine_id + worker_id:
            raise ValueError("machine_id and worker_id must be non-empty, without \\x1f")
        self.url = settings.redis_url
        self.prefix = settings.redis_prefix
        self.machine_id, self.worker_id = machine_id, worker_id
        self.member = lua.member_id(machine_id, worker_id)
        self.timeout = settings.redis_timeout
        self.interval = settings.redis_sync_interval
        self.member_ttl = 3 * self.interval + 2 * self.timeout
        self._local_load = local_load
        self._fallback = fallback
        self._charge_fallback = charge_fallback
        self._clock = clock
        self.up = False
        self.remote_in_flight: dict[str, int] = {}
        self.machines_seen = 1  # distinct machines in the last sync (this one included), >= 1
        self.members_seen = 1  # sharing workers in the last sync, >= 1
        self._state = "init"  # init | up | down: what was logged last
        self._leases: dict[str, _Lease] = {}
        self._local: dict[str, tuple[float, float, TokenBucket]] = {}  # the default fallback's buckets
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._went_down = asyncio.Event()
        self._closing = False
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._sync_keys = lua.sync_keys(self.prefix, machine_id, worker_id)
        self.registry = registry
        self.up_gauge = Gauge("flexinfer_proxy_redis_up", "1 while sharing through Redis works (this worker).",
                              registry=registry)
        self.errors = Counter("flexinfer_proxy_redis_errors", "Failed or timed-out Redis calls, by operation.",
                              ["op"], registry=registry)
        for op in ("sync", "lease", "return", "charge", "leave"):
            self.errors.labels(op)
        self.fallbacks = Counter("flexinfer_proxy_redis_fallback",
                                 "Rate-limit decisions taken locally because Redis was down or slow.",
                                 registry=registry)
        self.machines_gauge = Gauge("flexinfer_proxy_redis_machines",
                                    "Proxy machines sharing through Redis at the last sync.", registry=registry)

    # ---- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and sync once (bounded by the timeout); never fails because Redis is down: then it
        starts degraded and keeps trying in the background."""
        if not self.url or self._loop_task is not None:
            return
        self._closing = False
        # the asyncio Retry: redis 8.2 warns of a sync one given to an asyncio client (and converts it)
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._client = aioredis.Redis.from_url(
            self.url, socket_timeout=None, socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False, decode_responses=True,
            health_check_interval=0, client_name=_client_name(self.machine_id, self.worker_id))
        for name in ("LEASE", "GIVE_BACK", "CHARGE", "SYNC", "LEAVE"):
            self._scripts[name] = self._client.register_script(getattr(lua, name))
        await self._sync()
        self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="redis-share")

    async def stop(self) -> None:
        """Give leased tokens back, leave (this worker's counts go at once), close the client."""
        if self._client is None:
            return
        self._closing = True
        self._went_down.set()  # wakes the loop, which also ends on _closing
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.wait({self._loop_task}, timeout=self.timeout + 1.0)
            self._loop_task = None
        if self.up:
            final = [self._give_back(key, st.rate, math.floor(st.tokens))
                     for key, st in self._leases.items() if st.tokens >= 1 and st.rate > 0]
            final.append(self._call("leave", "LEAVE", self._sync_keys[:3], [self.prefix, self.member]))
            await asyncio.gather(*final, return_exceptions=True)
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.timeout + 1.0)
        self._leases.clear()
        await self._client.aclose()
        self._client = None
        self._set_down_quietly()

    # ---- rate limits ---------------------------------------------------------------------------------

    def take(self, key: str, rate: float, burst: float, n: float = 1.0) -> float | Awaitable[float]:
        """Take ``n`` tokens of scope ``key`` (``rate``/s, ``burst``; the same on every replica):
        0.0 admitted, > 0 the seconds to wait (refused), decided locally when it can be; else an
        awaitable (it must be awaited) resolving to the same, within the timeout."""
        if not rate > 0.0 or n > burst:
            return math.inf
        now = self._clock()
        st = self._leases.get(key)
        if st is None:
            st = self._leases[key] = _Lease(now)
        st.calls += n
        st.last_take = now
        st.rate, st.burst = rate, burst
        if st.tokens >= n:
            st.tokens -= n
            if st.tokens < st.low and st.fetch is None and now >= st.empty_until and self.up:
                self._start_fetch(key, st, n)
            return 0.0
        if not self.up:
            return self._fallback_take(key, rate, burst, n)
        if now < st.empty_until:
            return st.empty_until - now
        return self._await_lease(key, st, n, now + self.timeout)

    def charge(self, key: str, rate: float, burst: float, n: float) -> None:
        """Charge ``n`` tokens (negative: a refund) to scope ``key`` after the fact (token limits),
        without an admission check; never waits and never raises. Up: one ``CHARGE`` script call
        in the background (bounded by the timeout); a charge that fails there, or any charge while
        Redis is away, goes to ``charge_fallback`` at this machine's share (or is dropped without
        one: the local fallback then under-counts those tokens)."""
        if not rate > 0.0 or not burst > 0.0 or not -math.inf < n < math.inf or n == 0.0:
            return
        if self.up and self._client is not None:
            self._spawn(self._charge(key, rate, burst, n))
        else:
            self._fallback_charge(key, rate, burst, n)

    async def _charge(self, key: str, rate: float, burst: float, n: float) -> None:
        reply = await self._call("charge", "CHARGE", [lua.bucket_key(self.prefix, key)],
                                 [repr(rate), repr(burst), repr(n)])
        if reply is None:
            self._fallback_charge(key, rate, burst, n)

    def _fallback_charge(self, key: str, rate: float, burst: float, n: float) -> None:
        if self._charge_fallback is None:
            return
        share = self.machines_seen
        try:
            self._charge_fallback(key, rate / share, max(1.0, burst / share), n)
        except Exception:  # the local table is full of busy keys: the charge is dropped
            log.debug("token charge of %s dropped", key, exc_info=True)

    def leased(self, key: str) -> float:
        """Tokens of scope ``key`` leased to this worker and not spent yet."""
        st = self._leases.get(key)
        return 0.0 if st is None else st.tokens

    async def _await_lease(self, key: str, st: _Lease, n: float, deadline: float) -> float:
        while True:
            task = st.fetch if st.fetch is not None else self._start_fetch(key, st, n)
            remaining = deadline - self._clock()
            ok = False
            if remaining > 0.0:
                st.waiting += n
                try:
                    async with asyncio.timeout(remaining):
                        ok = await asyncio.shield(task)
                except TimeoutError:
                    ok = False
                except asyncio.CancelledError:  # the fetch was cancelled (stop), not this request
                    me = asyncio.current_task()
                    if not task.cancelled() or (me is not None and me.cancelling()):
                        raise
                    ok = False
                finally:
                    st.waiting -= n
            if not ok or not self.up or self._closing:
                return self._fallback_take(key, st.rate, st.burst, n)
            now = self._clock()
            if st.tokens >= n:
                st.tokens -= n
                if st.tokens < st.low and st.fetch is None and now >= st.empty_until:
                    self._start_fetch(key, st, n)
                return 0.0
            if now < st.empty_until:
                return st.empty_until - now
            # the bucket had more than the fetch asked for, but the other waiters took it: ask again

    def _start_fetch(self, key: str, st: _Lease, n: float) -> asyncio.Task[bool]:
        now = self._clock()
        elapsed = now - st.window_start
        if elapsed >= RATE_WINDOW:
            est = st.calls / elapsed
            st.rate_est = est if st.rate_est == 0.0 else 0.5 * (st.rate_est + est)
            st.calls, st.window_start = 0.0, now
        cap = max(1.0, math.floor(st.burst * LEASE_BURST_FRACTION))
        st.k = min(cap, max(1.0, math.ceil(st.rate_est * LEASE_HORIZON)))
        st.low = st.k / 2
        want = max(st.k, n, st.waiting + n)
        task = self._spawn(self._fetch(key, st, want, n))
        st.fetch = task
        return task

    async def _fetch(self, key: str, st: _Lease, want: float, need: float) -> bool:
        try:
            reply = await self._call("lease", "LEASE", [lua.bucket_key(self.prefix, key)],
                                     [repr(st.rate), repr(st.burst), repr(want), repr(need)])
            if reply is None:
                return False
            granted, wait_us = float(reply[0]), int(reply[1])
        except (ValueError, TypeError, IndexError) as exc:
            self._failed("lease", exc)
            return False
        finally:
            st.fetch = None
        st.tokens += granted
        st.empty_until = self._clock() + wait_us / 1e6 if wait_us > 0 else 0.0
        return True

    async def _give_back(self, key: str, rate: float, n: float) -> None:
        await self._call("return", "GIVE_BACK", [lua.bucket_key(self.prefix, key)], [repr(rate), repr(n)])

    def _return_idle(self, now: float) -> None:
        for key, st in list(self._leases.items()):
            if st.fetch is not None or now - st.last_take < IDLE_RETURN:
                continue
            if st.tokens >= 1.0:
                n = math.floor(st.tokens)
                st.tokens -= n
                self._spawn(self._give_back(key, st.rate, n))
            elif now - st.last_take >= FORGET_AFTER:
                del self._leases[key]

    def _fallback_take(self, key: str, rate: float, burst: float, n: float) -> float:
        """The local decision while Redis is unusable: this machine's share (rate / machines seen)
        through the given fallback, else this worker's share (rate / members seen) in a local bucket.
        The counts are those of the last sync: the best guess of who else now decides alone too."""
        self.fallbacks.inc()
        share = self.machines_seen if self._fallback is not None else self.members_seen
        r, b = rate / share, max(1.0, burst / share)
        if self._fallback is not None:
            return self._fallback(key, r, b, n)
        entry = self._local.get(key)
        if entry is None or entry[0] != r or entry[1] != b:
            entry = self._local[key] = (r, b, TokenBucket(r, b, self._clock))
        return entry[2].take(n)

    # ---- in-flight counts and the health of Redis --------------------------------------------------

    async def _run(self) -> None:
        """Sync every interval while up; while down, probe (the sync itself) with backoff <= 1 s."""
        backoff = BACKOFF_MIN
        while not self._closing:
            started = self._clock()
            try:
                if self.up:
                    if await self._sync():
                        self._return_idle(started)
                    if self._closing:
                        break
                    self._went_down.clear()
                    if self.up:  # until the next sync, or at once when a lease call finds Redis gone
                        try:
                            async with asyncio.timeout(max(0.0, self.interval - (self._clock() - started))):
                                await self._went_down.wait()
                        except TimeoutError:
                            pass
                else:
                    await asyncio.sleep(backoff)
                    backoff = BACKOFF_MIN if await self._sync() else min(BACKOFF_MAX, 2 * backoff)
            except Exception:  # a bug must not end the sharing for good: log it, go on
                log.exception("redis sharing: unexpected error")
                await asyncio.sleep(BACKOFF_MAX)

    async def _sync(self) -> bool:
        args: list[str] = [self.prefix, self.member, str(int(self.member_ttl * 1000))]
        for ep, count in self._local_load().items():
            if count > 0:
                args += (ep, str(int(count)))
        reply = await self._call("sync", "SYNC", self._sync_keys, args)
        if reply is None:
            return False
        try:
            remote = lua.remote_counts(reply[0], reply[1])
            machines, members = max(1, int(reply[2])), max(1, int(reply[3]))
        except (ValueError, TypeError, IndexError) as exc:
            self._failed("sync", exc)
            return False
        self.remote_in_flight = remote
        self.machines_seen, self.members_seen = machines, members
        self.machines_gauge.set(machines)
        if not self.up:
            self.up = True
            self.up_gauge.set(1)
            if self._state == "down":
                log.info("redis back: sharing again")
            else:
                log.info("redis: sharing across replicas as %s/%s", self.machine_id, self.worker_id)
            self._state = "up"
        return True

    async def _call(self, op: str, script: str, keys: list[str], args: list[str]) -> Any:
        """One script call bounded by the timeout; None (and Redis marked down) when it fails."""
        if self._client is None:
            return None
        try:
            async with asyncio.timeout(self.timeout):
                return await self._scripts[script](keys=keys, args=args)
        except Exception as exc:  # any failure of Redis or of the way there: local state decides
            self._failed(op, exc)
            return None

    def _failed(self, op: str, exc: BaseException) -> None:
        self.errors.labels(op).inc()
        if self.up or self._state == "init":
            if not self._closing:
                log.warning("redis unavailable: %s; using local state", _describe(exc))
            self._state = "down"
        self._set_down_quietly()

    def _set_down_quietly(self) -> None:
        self._went_down.set()
        self.up = False
        self.up_gauge.set(0)
        self.remote_in_flight = {}

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _client_name(machine: str, worker: str) -> str:
    """``CLIENT SETNAME`` refuses spaces and newlines: keep printable ASCII only."""
    return "".join(c if "!" <= c <= "~" else "_" for c in f"flexinfer-proxy:{machine}:{worker}")[:128]


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
