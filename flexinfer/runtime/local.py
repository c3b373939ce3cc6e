"""The local runtime: models as processes on this machine, started on demand.

Owns the lifecycle of each model's process: a free port, the command, supervision (a crash of a
running model restarts it with backoff while it is in demand), readiness polled every 50 ms on the
health path, the idle TTL (SIGTERM, then SIGKILL after ``stop_timeout``), shared groups (one member
running at a time, chosen by :func:`flexinfer.sharing.choose_leader`, the old member's
in-flight requests drained before it stops; a group's ``exclusive``/``persistent`` policy decides
by :func:`flexinfer.sharing.evictions` which models of other groups stop first), recent output for ``/logs``, and stopping everything on
exit. It is both the :class:`~flexinfer.runtime.base.Inventory` and the
:class:`~flexinfer.runtime.base.Scaler` the proxy sees; it knows nothing about HTTP requests.
Swaps are counted in :attr:`LocalRuntime.swaps` (plain integers) and exported by
:class:`SwapCollector` as ``flexinfer_local_swaps_total`` {group,model}: ``flexinfer serve``
registers it in the proxy's registry, so the count is on the proxy's ``/metrics``.
A config reload hands :meth:`LocalRuntime.apply` the new definitions: an unchanged model keeps its
process, a model whose process definition (:data:`PROCESS_FIELDS`) changed gets a fresh state (its old
process is drained and stopped in the background; the new one starts on demand once that is done),
a change of anything else (group, priority, aliases, timeouts, routing) is applied in place, a
removed model is drained, stopped and dropped from the views (docs/config.md "Reload").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from flexinfer.runtime.base import NO_LOAD, LoadView, ModelView, StaticInventoryBase
from flexinfer.runtime.localconfig import LocalModelSpec
from flexinfer.runtime.localproc import port_accepts, stop_by_command
from flexinfer.sharing import GroupPolicy, Member, Windows, choose_leader, evictions

log = logging.getLogger("flexinfer.local")

POLL_INTERVAL = 0.05
LOG_LINES = 2000
#: what the running process is made of: a change of any of these restarts the model on reload
PROCESS_FIELDS = ("command", "model", "env", "health_path", "backend", "proxy")


class StartError(RuntimeError):
    """A model process could not be started or did not become healthy."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def http_ok(port: int, path: str, timeout: float = 1.0, host: str = "127.0.0.1") -> bool:
    """True when ``GET path`` on host:port answers 2xx."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        line = await asyncio.wait_for(reader.readline(), timeout)
        parts = line.split(b" ", 2)
        return len(parts) >= 2 and parts[1][:1] == b"2"
    except (OSError, TimeoutError, ValueError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


@dataclass
class _State:
    spec: LocalModelSpec
    state: str = "stopped"  # stopped | starting | ready | stopping | restarting | failed
    port: int = 0
    proc: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    ready_at: float = 0.0
    last_request: float | None = None  # time.time() of the last request seen
    preempted_at: float | None = None
    restarts: int = 0
    last_error: str = ""
    load_seconds: float = 0.0
    intentional_stop: bool = False
    start_task: asyncio.Task[None] | None = None
    watch_task: asyncio.Task[None] | None = None
    log_task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.logs: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
        self.followers: set[asyncio.Queue[str | None]] = set()
        if not self.spec.command:  # proxy: without cmd: a server started elsewhere, never started here
            self.state = "ready"


class LocalRuntime(StaticInventoryBase):
    """Inventory + Scaler over local processes."""

    def __init__(self, specs: list[LocalModelSpec], *, windows: Windows = Windows(),
                 drain_timeout: float = 30.0, restart_backoff: tuple[float, float] = (1.0, 30.0),
                 reap_interval: float = 1.0, clock: Callable[[], float] = time.time,
                 load: LoadView = NO_LOAD) -> None:
        self.procs: dict[str, _State] = {s.name: _State(s) for s in specs}
        self.windows = windows
        self.drain_timeout = drain_timeout
        self.restart_backoff = restart_backoff
        self.reap_interval = reap_interval
        self.clock = clock
        self.load = load  # the proxy's open requests per endpoint: drains and idle checks wait for 0
        self._group_locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        #: (group, model swapped in) -> swaps: a member started after stopping another of its group
        self.swaps: dict[tuple[str, str], int] = {}
        self._reaper: asyncio.Task[None] | None = None
        #: old states a reload replaced or removed, being drained and stopped (task -> state)
        self._retiring: dict[asyncio.Task[None], _State] = {}
        self._chores: set[asyncio.Task[None]] = set()  # group enforcement after a reload
        super().__init__([self._view(st) for st in self.procs.values()])

    # -- views -------------------------------------------------------------------------------------
    def _view(self, st: _State) -> ModelView:
        s = st.spec
        ready = st.state == "ready"
        return ModelView(
            name=s.name, endpoints=(s.upstream(st.port),) if ready else (), ready=ready,
            served_name=s.served_name, aliases=s.aliases, routing=s.routing, scheduler=s.scheduler,
            cold_start_timeout=s.cold_start_timeout or s.start_timeout, context_window=s.context_window, owned_by="flexinfer-local",
            metadata={"backend": s.backend, "state": st.state, "group": s.group, "priority": s.priority,
                      **_listing(s),
                      **({} if s.send_loading_state is None else {"send_loading_state": s.send_loading_state})},
            concurrency_limit=s.concurrency_limit, response_timeout=s.response_timeout, filters=s.filters,
            unlisted=s.unlisted,
        )

    def _publish(self, st: _State) -> None:
        if self.procs.get(st.spec.name) is st:  # a state a reload retired no longer speaks for the model
            self.update(self._view(st))

    # -- Scaler ------------------------------------------------------------------------------------
    def record_demand(self, model: ModelView) -> None:
        st = self.procs.get(model.name)
        if st is not None:
            st.last_request = self.clock()

    async def wake(self, model: ModelView) -> None:
        """Start the model (swapping its group if the leader rule allows) and wait until healthy."""
        while True:
            st = self.procs.get(model.name)
            if st is None:
                raise StartError(f"unknown model {model.name!r}")
            if st.last_request is None:
                st.last_request = self.clock()
            try:
                if st.spec.group:
                    await self._wake_in_group(st)
                else:
                    await self._ensure_started(st)
            except (StartError, asyncio.CancelledError):
                task = asyncio.current_task()
                if self.procs.get(model.name) is st or (task is not None and task.cancelling()):
                    raise
                continue  # a reload replaced the definition while it started: wake the new one
            if self.procs.get(model.name) is st:
                return

    # -- groups ------------------------------------------------------------------------------------
    def _members(self, group: str) -> list[_State]:
        return [s for s in self.procs.values() if s.spec.group == group]

    def group_leader(self, group: str) -> str | None:
        now = self.clock()
        members = [Member(name=s.spec.name, priority=s.spec.priority,
                          phase="Ready" if s.state == "ready" else ("Loading" if s.state == "starting" else ""),
                          last_active=s.last_request,
                          state="Active" if s.state in ("ready", "starting") else "",
                          preempted_at=s.preempted_at, swap_cooldown=self.windows.min_cooldown)
                   for s in self._members(group)]
        return choose_leader(members, now, self.windows)

    async def _wake_in_group(self, st: _State) -> None:
        group = st.spec.group
        assert group is not None
        while True:
            if self.procs.get(st.spec.name) is not st:
                raise StartError(f"model {st.spec.name!r} was redefined by a config reload")
            async with self._group_locks[group]:
                if st.state == "ready":
                    return
                leader = self.group_leader(group)
                if leader == st.spec.name:
                    running = [(o.spec.name, o.spec.group) for o in self.procs.values()
                               if o.state in ("ready", "starting", "restarting")]
                    policies = {o.spec.group: GroupPolicy(o.spec.exclusive, o.spec.persistent)
                                for o in self.procs.values() if o.spec.group}
                    gone = [self.procs[n] for n in evictions(st.spec.name, group, running, policies)]
                    for other in gone:
                        if other.spec.group != group:
                            log.info("unloading %s: exclusive group %s starts %s", other.spec.name, group,
                                     st.spec.name)
                        await self._drain_and_stop(other, preempted=other.spec.group == group)
                    if gone:
                        key = (group, st.spec.name)
                        self.swaps[key] = self.swaps.get(key, 0) + 1
                    await self._ensure_started(st)
                    return
            # requests are still waiting for this model: that is demand (the proxy cancels this wake
            # when the last waiter leaves, so a model nobody wants any more stops asking)
            st.last_request = self.clock()
            await asyncio.sleep(min(1.0, max(0.05, self.windows.demand / 10)))

    async def _drain_and_stop(self, st: _State, preempted: bool) -> None:
        key = st.spec.upstream(st.port).key
        end = time.monotonic() + self.drain_timeout
        while self.load.in_flight(key) > 0 and time.monotonic() < end:
            await asyncio.sleep(0.05)
        if self.load.in_flight(key) > 0:
            log.warning("%s: %d requests still open after the %gs drain: stopping it anyway", st.spec.name,
                        self.load.in_flight(key), self.drain_timeout)
        if preempted:
            st.preempted_at = self.clock()
            log.info("swapping out %s (group %s)", st.spec.name, st.spec.group)
        await self._stop_state(st)

    # -- process lifecycle -------------------------------------------------------------------------
    async def _ensure_started(self, st: _State) -> None:
        if st.state == "ready":
            return
        if st.start_task is None or st.start_task.done():
            st.start_task = asyncio.get_running_loop().create_task(self._start(st))
        await asyncio.shield(st.start_task)

    async def _start(self, st: _State) -> None:
        s = st.spec
        pending = [t for t, old in self._retiring.items()
                   if old is not st and (old.spec.name == s.name or (s.group and old.spec.group == s.group))]
        if pending:  # the old definition (or a retired member of the group) is still draining
            st.state = "starting"
            self._publish(st)
            await asyncio.wait(pending)
        if not s.command:  # a server started elsewhere (proxy: without cmd)
            st.state = "ready"
            self._publish(st)
            return
        st.port = s.fixed_port or free_port()
        argv = s.render(st.port)
        env = {**os.environ, **s.env}
        st.state, st.started_at, st.intentional_stop = "starting", time.monotonic(), False
        st.logs.append(f"[flexinfer] starting {s.name}: {' '.join(argv)}")
        self._publish(st)
        log.info("starting %s on port %d", s.name, st.port)
        try:
            st.proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
                start_new_session=True)
        except OSError as exc:
            st.state, st.last_error = "failed", f"cannot run {argv[0]!r}: {exc.strerror}"
            self._publish(st)
            raise StartError(st.last_error) from None
        st.log_task = asyncio.get_running_loop().create_task(self._pump_logs(st, st.proc))
        deadline = time.monotonic() + s.start_timeout
        while True:
            if st.proc.returncode is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(st.log_task), 0.5)
                tail = " | ".join(list(st.logs)[-3:])
                st.state = "failed"
                st.last_error = f"process exited with code {st.proc.returncode} during start: {tail}"
                self._publish(st)
                raise StartError(st.last_error)
            if await self._healthy(st, min(1.0, s.start_timeout)):
                break
            if time.monotonic() > deadline:
                st.last_error = f"not healthy after {s.start_timeout:g}s"
                await self._kill(st)
                st.state = "failed"
                self._publish(st)
                raise StartError(st.last_error)
            await asyncio.sleep(POLL_INTERVAL)
        st.state, st.ready_at = "ready", time.monotonic()
        st.load_seconds = st.ready_at - st.started_at
        st.last_error = ""
        log.info("%s ready in %.2fs (pid %d, port %d)", s.name, st.load_seconds, st.proc.pid, st.port)
        self._publish(st)
        st.watch_task = asyncio.get_running_loop().create_task(self._watch(st, st.proc))
        self._ensure_reaper()

    async def _healthy(self, st: _State, timeout: float) -> bool:
        """The readiness probe: ``GET health_path`` answers 2xx, or (``check_endpoint: none``) the port accepts."""
        ep = st.spec.upstream(st.port)
        if not st.spec.health_path:
            return await port_accepts(ep.host, ep.port, timeout)
        return await http_ok(ep.port, st.spec.health_path, timeout=timeout, host=ep.host)

    async def _pump_logs(self, st: _State, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            text = line.decode("utf-8", "replace").rstrip("\n")
            st.logs.append(text)
            for q in list(st.followers):
                if q.qsize() < 1000:
                    q.put_nowait(text)

    async def _watch(self, st: _State, proc: asyncio.subprocess.Process) -> None:
        """Supervise a running process: an unexpected exit restarts it with backoff while in demand."""
        code = await proc.wait()
        if st.intentional_stop or st.proc is not proc:
            return
        st.state, st.last_error = "restarting", f"process exited unexpectedly with code {code}"
        log.warning("%s: %s", st.spec.name, st.last_error)
        self._publish(st)
        delay = self.restart_backoff[0]
        while not st.intentional_stop:
            recent = st.last_request is not None and self.clock() - st.last_request <= max(st.spec.idle_ttl, 1)
            if not recent:
                st.state = "stopped"
                self._publish(st)
                return
            await asyncio.sleep(delay)
            if st.intentional_stop:
                return
            st.restarts += 1
            try:
                await self._start(st)
                return
            except StartError:
                delay = min(delay * 2, self.restart_backoff[1])

    async def _kill(self, st: _State) -> None:
        proc = st.proc
        if proc is None or proc.returncode is not None:
            return
        if st.spec.stop_command and await stop_by_command(st.spec, st.port, proc, st.spec.env, st.logs):
            return  # cmd_stop stopped it (else, or when it hung: the signals below)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), st.spec.stop_timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def stop(self, name: str) -> bool:
        """Stop one model (SIGTERM, then SIGKILL). True if something was running."""
        return await self._stop_state(self.procs[name])

    async def _stop_state(self, st: _State) -> bool:
        name = st.spec.name
        if not st.spec.command:  # a server started elsewhere: nothing of ours to stop
            return False
        if st.proc is None or st.proc.returncode is not None:
            if st.state != "stopped":
                st.state = "stopped"
                self._publish(st)
            return False
        st.intentional_stop = True
        st.state = "stopping"
        self._publish(st)
        await self._kill(st)
        st.state = "stopped"
        st.logs.append(f"[flexinfer] stopped {name}")
        self._publish(st)
        return True

    async def stop_all(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        retiring = list(self._retiring.values())
        for t in [*self._retiring, *self._chores]:
            t.cancel()
        await asyncio.gather(*(self._stop_state(st) for st in [*self.procs.values(), *retiring]),
                             return_exceptions=True)

    # -- config reload -----------------------------------------------------------------------------
    async def apply(self, specs: list[LocalModelSpec]) -> dict[str, list[str]]:
        """Swap in a reloaded config's models; returns the names by what happened to them
        (``unchanged``, ``updated`` in place, ``restarted``, ``added``, ``removed``)."""
        out: dict[str, list[str]] = {k: [] for k in ("unchanged", "updated", "restarted", "added", "removed")}
        procs: dict[str, _State] = {}
        retire: list[_State] = []
        for s in specs:
            st = self.procs.get(s.name)
            if st is None:
                procs[s.name] = _State(s)
                out["added"].append(s.name)
            elif st.spec == s:
                procs[s.name] = st
                out["unchanged"].append(s.name)
            elif all(getattr(st.spec, f) == getattr(s, f) for f in PROCESS_FIELDS):
                st.spec = s  # same process: group, priority, aliases, timeouts, routing apply now
                procs[s.name] = st
                out["updated"].append(s.name)
            else:
                fresh = procs[s.name] = _State(s)
                fresh.logs, fresh.followers, fresh.last_request = st.logs, st.followers, st.last_request
                retire.append(st)
                out["restarted"].append(s.name)
        for name, st in self.procs.items():
            if name not in procs:
                retire.append(st)
                out["removed"].append(name)
        self.procs = procs
        loop = asyncio.get_running_loop()
        for st in retire:
            task = loop.create_task(self._retire(st))
            self._retiring[task] = st
            task.add_done_callback(self._retired)
        self.replace([self._view(st) for st in procs.values()])
        for group in sorted({st.spec.group for st in procs.values() if st.spec.group}):
            chore = loop.create_task(self._one_per_group(group))
            self._chores.add(chore)
            chore.add_done_callback(self._chores.discard)
        return out

    def _retired(self, task: asyncio.Task[None]) -> None:
        self._retiring.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("stopping a retired model failed: %s", task.exception())

    async def _retire(self, st: _State) -> None:
        """Drain and stop a state a reload replaced or removed (a start in progress is abandoned)."""
        st.intentional_stop = True
        for t in (st.start_task, st.watch_task):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        log.info("config reload: draining and stopping the old %s", st.spec.name)
        await self._drain_and_stop(st, preempted=False)

    async def _one_per_group(self, group: str) -> None:
        """After a reload moved models between groups: one running member per group (the leader)."""
        async with self._group_locks[group]:
            members = self._members(group)
            running = [m for m in members if m.state in ("ready", "starting", "restarting")]
            if len(running) < 2:
                return
            leader = self.group_leader(group)
            names = [m.spec.name for m in running]
            keep = leader if leader is not None and leader in names else names[0]
            for m in running:
                if m.spec.name != keep:
                    await self._drain_and_stop(m, preempted=True)

    # -- idle TTL ----------------------------------------------------------------------------------
    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval)
            now = self.clock()
            for st in list(self.procs.values()):  # a reload may swap the dict while a stop awaits
                ttl = st.spec.idle_ttl
                if st.state != "ready" or ttl <= 0 or not st.spec.command:
                    continue
                idle_since = st.last_request if st.last_request is not None else now
                if now - idle_since > ttl and self.load.in_flight(st.spec.upstream(st.port).key) == 0:
                    log.info("%s idle for %.0fs: unloading", st.spec.name, now - idle_since)
                    await self._stop_state(st)

    # -- admin views -------------------------------------------------------------------------------
    def running(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        now_m = time.monotonic()
        for st in self.procs.values():
            alive = st.proc is not None and st.proc.returncode is None
            out.append({
                "model": st.spec.name, "state": st.state, "port": st.port if alive else None,
                "pid": st.proc.pid if alive and st.proc else None,
                "uptime_s": round(now_m - st.ready_at, 1) if st.state == "ready" else 0,
                "last_request": st.last_request, "group": st.spec.group, "priority": st.spec.priority,
                "restarts": st.restarts, "last_error": st.last_error or None,
                "load_seconds": round(st.load_seconds, 3) if st.load_seconds else None,
            })
        return out

    def logs(self, name: str) -> list[str]:
        return list(self.procs[name].logs)

    def follow(self, name: str) -> asyncio.Queue[str | None]:
        q: asyncio.Queue[str | None] = asyncio.Queue()
        self.procs[name].followers.add(q)
        return q

    def unfollow(self, name: str, q: asyncio.Queue[str | None]) -> None:
        self.procs[name].followers.discard(q)


def _listing(s: LocalModelSpec) -> dict[str, str]:
    """``display_name`` and ``description``, as ``/v1/models`` lists them (only those set)."""
    out = {"name": s.display_name, "description": s.description}
    return {k: v for k, v in out.items() if v is not None}


class SwapCollector(Collector):
    """``flexinfer_local_swaps_total`` {group,model}: read from :attr:`LocalRuntime.swaps` when scraped."""

    def __init__(self, runtime: LocalRuntime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = CounterMetricFamily("flexinfer_local_swaps", "Shared-group swaps: a member started after stopping "
                                "another (model: the one swapped in).", labels=["group", "model"])
        for (group, model), n in sorted(self.runtime.swaps.items()):
            c.add_metric([group, model], n)
        yield c
