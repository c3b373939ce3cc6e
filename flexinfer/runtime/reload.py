"""Hot reload of ``flexinfer serve``'s config file: watch it, parse it, apply only what changed.

Owns: noticing that the file changed (:class:`ConfigWatcher` polls it every ``interval`` seconds,
reading and hashing its bytes, so an in-place write and an editor's rename-over both count, and a
missing file is waited out; SIGHUP reloads at once), parsing the new file with the typed config
(the loader handed in by the composition root: :func:`flexinfer.runtime.localconfig.load_local_config`
plus the scheduler check), refusing a bad file (its ``FILE:LINE: path: message`` lines are logged
and kept; the old config keeps serving), handing a good one to
:meth:`flexinfer.runtime.local.LocalRuntime.apply`, and reporting it: :meth:`ConfigWatcher.status`
(``GET /config`` through :class:`ReloadAdmin`) and :class:`ReloadCollector`
(``flexinfer_serve_config_reloads_total{result}``, ``flexinfer_serve_config_last_reload_success``,
``flexinfer_serve_config_loaded_timestamp_seconds``, ``flexinfer_serve_config_info{sha256}``).
Must not: decide what a change means for a process (that is the runtime's ``apply``), or import the
proxy (the loader and the admin routes it wraps are given to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from flexinfer import errors
from flexinfer.http.protocol import Request, ResponseWriter
from flexinfer.runtime.configfile import InventoryConfigError
from flexinfer.runtime.local import LocalRuntime
from flexinfer.runtime.localconfig import LocalModelSpec

log = logging.getLogger("flexinfer.reload")

#: a change is applied once the file's bytes are the same on two reads this far apart (an editor
#: or ``cp`` writing the file in several pieces is not caught half-way)
SETTLE = 0.05
JSON = [(b"content-type", b"application/json")]
Loader = Callable[[str], list[LocalModelSpec]]


def file_digest(path: str) -> str | None:
    """The sha256 of the file's bytes, or None when it cannot be read (gone, mid-rename)."""
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


class ConfigWatcher:
    """Reloads the runtime from ``path`` when the file changes (every ``interval`` s; 0: never by
    itself) and on SIGHUP or :meth:`reload`."""

    def __init__(self, path: str, runtime: LocalRuntime, load: Loader, *, interval: float = 1.0,
                 digest: str | None = None, clock: Callable[[], float] = time.time,
                 after_apply: Callable[[], dict[str, list[str]]] | None = None) -> None:
        self.path = path
        self.runtime = runtime
        self.load = load
        #: run after the runtime applied a reload (serve's peers): more changes, by kind
        self.after_apply = after_apply
        self.interval = interval
        self.clock = clock
        self.sha256 = digest or file_digest(path) or ""  # the config in use
        self.loaded_at = clock()
        self.counts = {"success": 0, "failure": 0}
        self.last: dict[str, Any] = {"result": "initial", "at": self.loaded_at, "reason": "start",
                                     "errors": [], "changes": {}}
        self._seen = self.sha256  # the last content looked at (a refused one is not retried)
        self._missing = False
        self._lock = asyncio.Lock()
        self._hup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._signal = False

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start watching (in the running loop) and reload on SIGHUP (main thread only)."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
            loop.add_signal_handler(signal.SIGHUP, self._hup.set)
            self._signal = True
        self._task = loop.create_task(self._run())

    async def close(self) -> None:
        if self._signal:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._signal = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                if self.interval > 0:
                    await asyncio.wait_for(self._hup.wait(), self.interval)
                else:
                    await self._hup.wait()
            except TimeoutError:
                await self._guarded(self._poll())
                continue
            self._hup.clear()
            await self._guarded(self.reload("SIGHUP"))

    async def _guarded(self, step: Coroutine[Any, Any, object]) -> None:
        """One poll or reload; a bug in it is logged and the watcher keeps watching."""
        try:
            await step
        except Exception:
            log.exception("config watcher: reloading %s failed", self.path)

    async def _poll(self) -> None:
        digest = file_digest(self.path)
        if digest is None:
            if not self._missing:
                log.warning("config %s cannot be read; still serving the config loaded at %s",
                            self.path, time.strftime("%H:%M:%S", time.localtime(self.loaded_at)))
            self._missing = True
            return
        self._missing = False
        if digest == self._seen:
            return
        await asyncio.sleep(SETTLE)
        if file_digest(self.path) != digest:
            return  # still being written: the next poll looks again
        await self.reload("file changed")

    # -- one reload --------------------------------------------------------------------------------
    async def reload(self, reason: str = "request") -> bool:
        """Parse the file and apply it; False (old config kept, errors logged) when it is refused."""
        async with self._lock:
            digest = file_digest(self.path)
            self._seen = digest or self._seen
            now = self.clock()
            try:
                if digest is None:
                    raise InventoryConfigError(f"cannot read {self.path}")
                specs = self.load(self.path)
            except InventoryConfigError as exc:
                return self._refused(reason, now, exc.problems)
            except Exception as exc:  # a bug in a check must not take the old config down
                log.exception("config reload of %s failed", self.path)
                return self._refused(reason, now, [f"{self.path}: {type(exc).__name__}: {exc}"])
            changes = await self.runtime.apply(specs)
            if self.after_apply is not None:
                changes = {**changes, **self.after_apply()}
            self.sha256, self.loaded_at = digest, now
            self.counts["success"] += 1
            self.last = {"result": "success", "at": now, "reason": reason, "errors": [],
                         "changes": {k: v for k, v in changes.items() if v}}
            moved = ", ".join(f"{k}: {' '.join(v)}" for k, v in changes.items() if v and k != "unchanged")
            log.info("config %s reloaded (%s, sha256 %s): %s", self.path, reason, digest[:12],
                     moved or "no model changed")
            return True

    def _refused(self, reason: str, now: float, problems: list[str]) -> bool:
        self.counts["failure"] += 1
        self.last = {"result": "failure", "at": now, "reason": reason, "errors": list(problems), "changes": {}}
        log.error("config %s refused (%s), still serving sha256 %s:\n  %s", self.path, reason,
                  self.sha256[:12], "\n  ".join(problems))
        return False

    def status(self) -> dict[str, Any]:
        """What ``GET /config`` answers: the config in use and the last reload."""
        return {"path": self.path, "sha256": self.sha256, "loaded_at": self.loaded_at,
                "watch_interval": self.interval, "reloads": dict(self.counts), "last_reload": self.last}


class ReloadCollector(Collector):
    """The watcher's counts and the config in use, read when ``/metrics`` is scraped."""

    def __init__(self, watcher: ConfigWatcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        w = self.watcher
        c = CounterMetricFamily("flexinfer_serve_config_reloads", "Config reloads by result (success: "
                                "applied; failure: refused, the old config kept).", labels=["result"])
        for result in ("success", "failure"):
            c.add_metric([result], w.counts[result])
        yield c
        yield GaugeMetricFamily("flexinfer_serve_config_last_reload_success",
                                "1 when the last reload (or the start) applied the file, 0 when it was refused.",
                                value=0 if w.last["result"] == "failure" else 1)
        yield GaugeMetricFamily("flexinfer_serve_config_loaded_timestamp_seconds",
                                "Unix time the config in use was loaded.", value=w.loaded_at)
        info = GaugeMetricFamily("flexinfer_serve_config_info", "The config in use (always 1).",
                                 labels=["path", "sha256"])
        info.add_metric([w.path, w.sha256], 1)
        yield info


class AdminRoutes(Protocol):
    """The admin routes :class:`ReloadAdmin` wraps (as ``flexinfer.proxy.pipeline.AdminRoutes``)."""

    def match(self, path: str) -> bool: ...

    async def handle(self, req: Request, resp: ResponseWriter) -> None: ...


class ReloadAdmin:
    """``GET /config`` (the watcher's status) in front of the runtime's other admin routes."""

    def __init__(self, inner: AdminRoutes, watcher: ConfigWatcher) -> None:
        self.inner = inner
        self.watcher = watcher

    def match(self, path: str) -> bool:
        return path == "/config" or self.inner.match(path)

    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        if req.path != "/config":
            await self.inner.handle(req, resp)
        elif req.method == "GET":
            resp.send(200, JSON, orjson.dumps(self.watcher.status()))
        else:
            resp.send_error(errors.MethodNotAllowed(f"{req.method} is not allowed on /config"))
