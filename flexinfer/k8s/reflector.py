"""The one resumable list+watch of a Kubernetes resource (a reflector): ``ResourceWatch``.

Owns: the loop that keeps a local copy of one resource in step with the API server, the way
client-go's reflector does: list (remember the list's ``resourceVersion``) -> watch from it with
bookmarks and a server-side timeout -> on a clean end resume from the last version seen -> on
``410 Gone`` (an ``ERROR`` event or the status) list again -> on any other failure wait a bounded,
jittered, exponentially growing delay (``Retry-After`` honoured, capped) and resume. A stream that
ends at once without news counts as a failure, so a server that keeps closing watches cannot cause a
request storm. Objects reach the owner as raw dicts (``on_sync(items)`` after each list,
``on_event(type, obj)`` per change); the owner decides what they mean. ``on_restart(reason)`` hears of
each re-list after an expiry (``"gone"``) and each failure before its delay (``"error"``);
``apply_list``/``apply_event`` take one decoded answer, so owners can test without a server.

Used by the proxy's ``kube`` runtime and the scheduler extender's inventory. Delays come from
:class:`~flexinfer.k8s.backoff.Backoff`, errors are :class:`~flexinfer.k8s.errors.KubeAPIError`
(:class:`Expired` for a 410).

Must not: interpret objects, touch the proxy, or retry without a delay after a failure.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio.client.exceptions import ApiException

from flexinfer.k8s.backoff import Backoff
from flexinfer.k8s.errors import KubeAPIError

log = logging.getLogger("flexinfer.kube.watch")

ListFn = Callable[..., Awaitable[Any]]
SyncFn = Callable[[list[dict[str, Any]]], None]
EventFn = Callable[[str, dict[str, Any]], None]
RestartFn = Callable[[str], None]


@dataclass
class WatchStats:
    """What one watch did (tests and logs read it)."""

    lists: int = 0
    watches: int = 0
    events: int = 0
    errors: int = 0
    expired: int = 0


class Expired(KubeAPIError):
    """The resourceVersion a watch resumes from is gone (410 Gone): list again."""

    def __init__(self, message: str) -> None:
        super().__init__(410, message)


class ResourceWatch:
    """Keeps one resource in step: list, then watch, resumable; call :meth:`run` as a task.

    ``list_fn`` is a generated ``kubernetes_asyncio`` list function (``CoreV1Api.list_namespaced_service``,
    ``CustomObjectsApi.list_namespaced_custom_object``, ...) and ``args``/``kwargs`` its arguments; it is
    called with ``_preload_content=False`` so objects stay raw dicts. Without one (None) the watch can
    only be fed with :meth:`apply_list` and :meth:`apply_event`.

    ``request_timeout`` bounds a list (total) and a watch's connection; ``list_timeout``, when given,
    bounds a list instead (large lists). A watch asks the server to end it after ``watch_timeout`` x 1..2.
    """

    def __init__(self, name: str, list_fn: ListFn | None, args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
                 on_sync: SyncFn, on_event: EventFn, backoff: Backoff | None = None,
                 watch_timeout: float = 300.0, request_timeout: float = 30.0, list_timeout: float | None = None,
                 min_stream: float = 1.0, on_restart: RestartFn | None = None) -> None:
        self.name = name
        self.list_fn = list_fn
        self.args = args
        self.kwargs = dict(kwargs)
        self.on_sync = on_sync
        self.on_event = on_event
        self.on_restart = on_restart
        self.backoff = backoff or Backoff()
        self.watch_timeout = watch_timeout
        self.request_timeout = request_timeout
        self.list_timeout = request_timeout if list_timeout is None else list_timeout
        self.min_stream = min_stream
        self.synced = asyncio.Event()  # the first list arrived
        self.settled = asyncio.Event()  # listed, or refused in a way waiting will not fix (401/403/404)
        self.stats = WatchStats()
        self.resource_version: str | None = None
        self.last_error: str = ""
        self._logged_status: int | None = None
        self._fresh = False  # nothing seen since the last list

    # -- the loop ----------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Expired:
                self.stats.expired += 1
                log.info("watch %s: resourceVersion %s expired; listing again", self.name, self.resource_version)
                self._restart("gone")
                if self._fresh or self.resource_version is None:  # expired right after a list: do not spin
                    await asyncio.sleep(self.backoff.next())
                self.resource_version = None
            except KubeAPIError as exc:
                await self._failed(exc)
            except Exception as exc:  # a watch must never die: it waits and tries again
                await self._failed(KubeAPIError(0, f"{type(exc).__name__}: {exc}"))

    async def _failed(self, exc: KubeAPIError) -> None:
        self.stats.errors += 1
        self.last_error = exc.detail
        delay = self.backoff.next(exc.retry_after)
        if exc.status in (401, 403, 404):
            # no permission or the CRD is not installed: say so once per status, keep trying slowly
            self.settled.set()
            if self._logged_status != exc.status:
                log.warning("watch %s: HTTP %d %s; retrying every %gs at most", self.name, exc.status, exc.detail,
                            self.backoff.cap)
                self._logged_status = exc.status
        else:
            log.warning("watch %s failed (%s); retrying in %.2fs", self.name, exc.detail, delay)
        self._restart("error")
        await asyncio.sleep(delay)

    def _restart(self, reason: str) -> None:
        if self.on_restart is not None:
            self.on_restart(reason)

    # -- list --------------------------------------------------------------------------------------
    async def _open(self, **extra: Any) -> Any:
        assert self.list_fn is not None, f"watch {self.name} has no list function"
        try:
            return await self.list_fn(*self.args, **self.kwargs, **extra, _preload_content=False)
        except ApiException as exc:
            raise KubeAPIError.from_api_exception(exc) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise KubeAPIError(0, f"{type(exc).__name__}: {exc}") from None

    @staticmethod
    async def _check(resp: Any) -> None:
        if resp.status == 200:
            return
        try:
            body = await resp.read()
        finally:
            resp.release()
        err = KubeAPIError.from_response(resp.status, body, resp.headers)
        if resp.status == 410:
            raise Expired(err.detail)
        raise err

    async def _list(self) -> None:
        self.stats.lists += 1
        resp = await self._open(_request_timeout=self.list_timeout)
        await self._check(resp)
        try:
            data = orjson.loads(await resp.read())
        finally:
            resp.release()
        self.apply_list(data)

    def apply_list(self, data: Any) -> None:
        """Take one list answer (decoded JSON): ``on_sync`` its items, watch on from its resourceVersion."""
        if not isinstance(data, Mapping):
            raise KubeAPIError(0, f"list {self.name}: not an object")
        items = data.get("items")
        meta = data.get("metadata")
        rv = str((meta if isinstance(meta, Mapping) else {}).get("resourceVersion") or "")
        self.on_sync([i for i in (items if isinstance(items, list) else []) if isinstance(i, dict)])
        self.resource_version = rv  # "" (a server without list versions): watch from "now"
        self._fresh = True
        self.synced.set()
        self.settled.set()

    # -- watch -------------------------------------------------------------------------------------
    async def _watch(self) -> None:
        self.stats.watches += 1
        timeout = int(self.watch_timeout * (1 + random.random()))  # spread reconnects like client-go
        kw: dict[str, Any] = {"watch": True, "allow_watch_bookmarks": True, "timeout_seconds": timeout,
                              "_request_timeout": (self.request_timeout, timeout + self.request_timeout)}
        if self.resource_version:
            kw["resource_version"] = self.resource_version
        started = time.monotonic()
        news = 0
        resp = await self._open(**kw)
        await self._check(resp)
        try:
            while True:
                try:
                    line = await resp.content.readline()
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    raise KubeAPIError(0, f"watch stream broke: {type(exc).__name__}: {exc}") from None
                if not line:
                    break
                line = line.strip()
                if not line:
                    continue
                if self._event(line):
                    news += 1
        finally:
            resp.release()
        if news == 0 and time.monotonic() - started < self.min_stream:
            await asyncio.sleep(self.backoff.next())  # the server ends streams at once: slow down
        else:
            self.backoff.reset()
            self._logged_status = None

    def _event(self, line: bytes) -> bool:
        """Handle one watch line; True when it carried an object change (bookmarks only move the version)."""
        try:
            ev = orjson.loads(line)
        except ValueError:
            raise KubeAPIError(0, f"watch {self.name}: not JSON: {line[:200]!r}") from None
        if not isinstance(ev, dict):
            raise KubeAPIError(0, f"watch {self.name}: not an event: {line[:200]!r}")
        obj = ev.get("object")
        if not isinstance(obj, dict):
            raise KubeAPIError(0, f"watch {self.name}: event without an object")
        return self.apply_event(str(ev.get("type") or ""), obj)

    def apply_event(self, typ: str, obj: dict[str, Any]) -> bool:
        """Take one decoded watch event; True when it carried an object change (``on_event`` had it).

        ``BOOKMARK`` only moves the resourceVersion; ``ERROR`` raises (:class:`Expired` for a 410)."""
        if typ == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                raise Expired(str(obj.get("message") or "expired"))
            raise KubeAPIError(code, str(obj.get("message") or obj.get("reason") or "watch error"))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if typ == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            return False
        if typ not in ("ADDED", "MODIFIED", "DELETED"):
            log.debug("watch %s: ignoring event type %r", self.name, typ)
            return False
        self.stats.events += 1
        self.on_event(typ, obj)
        if rv:
            self.resource_version = str(rv)
        self._fresh = False
        return True
