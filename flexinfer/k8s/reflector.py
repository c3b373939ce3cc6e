"""The one resumable list+watch of a Kubernetes resource (a reflector): ``ResourceWatch``.

Owns: the loop that keeps a local copy of one resource in step with the API server, the way
client-go's reflector does: list (remember the list's ``resourceVersion``) -> watch from it with
bookmarks and a server-side timeout -> on a clean end resume from the last version seen -> on
``410 Gone`` (an ``ERROR`` event or the status) list again -> on any other failure wait a bounded,
jittered, exponentially growing delay (``Retry-After`` honoured, capped) and resume. A stream that
ends at once without news counts as a failure, so a server that keeps closing watches cannot cause a
request storm. Objects reach the owner as raw dicts (``on_sync(items)`` after each list,
``on_event(type, obj)`` per change); the owner decides what they mean.

Used by the proxy's ``kube`` runtime. Delays come from :class:`~flexinfer.k8s.backoff.Backoff`, errors
are :class:`~flexinfer.k8s.errors.KubeAPIError`.

Must not: interpret objects, touch the proxy, or retry without a delay after a failure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from flexinfer.k8s.backoff import Backoff
from flexinfer.k8s.errors import KubeAPIError

log = logging.getLogger("flexinfer.kube.watch")

ListFn = Callable[..., Awaitable[Any]]
SyncFn = Callable[[list[dict[str, Any]]], None]
EventFn = Callable[[str, dict[str, Any]], None]


@dataclass
class WatchStats:
    """What one watch did (tests and logs read it)."""

    lists: int = 0
    watches: int = 0
    events: int = 0
    errors: int = 0
    expired: int = 0


class _Expired(Exception):
    """The resourceVersion we resume from is gone (410): list again."""


class ResourceWatch:
    """Keeps one resource in step: list, then watch, resumable; call :meth:`run` as a task.

    ``list_fn`` is a generated ``kubernetes_asyncio`` list function (``CoreV1Api.list_namespaced_service``,
    ``CustomObjectsApi.list_namespaced_custom_object``, ...) and ``args``/``kwargs`` its arguments; it is
    called with ``_preload_content=False`` so objects stay raw dicts.
    """

    def __init__(self, name: str, list_fn: ListFn, args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
                 on_sync: SyncFn, on_event: EventFn, backoff: Backoff | None = None,
                 watch_timeout: float = 300.0, request_timeout: float = 30.0,
                 min_stream: float = 1.0) -> None:
        self.name = name
        self.list_fn = list_fn
        self.args = args
        self.kwargs = dict(kwargs)
        self.on_sync = on_sync
        self.on_event = on_event
        self.backoff = backoff or Backoff()
        self.watch_timeout = watch_timeout
        self.request_timeout = request_timeout
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
            except _Expired:
                self.stats.expired += 1
                log.info("watch %s: resourceVersion %s expired; listing again", self.name, self.resource_version)
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
        await asyncio.sleep(delay)

    # -- list --------------------------------------------------------------------------------------
    async def _open(self, **extra: Any) -> Any:
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
            raise _Expired(err.detail)
        raise err

    async def _list(self) -> None:
        self.stats.lists += 1
        resp = await self._open(_request_timeout=self.request_timeout)
        await self._check(resp)
        try:
            data = json.loads(await resp.read())
        finally:
            resp.release()
        items = data.get("items") or [] if isinstance(data, dict) else []
        rv = str(((data.get("metadata") or {}) if isinstance(data, dict) else {}).get("resourceVersion") or "")
        self.on_sync([i for i in items if isinstance(i, dict)])
        self.resource_version = rv or None
        self._fresh = True
        self.synced.set()
        self.settled.set()
        if self.resource_version is None:  # a server without list versions: watch from "now"
            self.resource_version = ""

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
                    self._fresh = False
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
            ev = json.loads(line)
        except ValueError:
            raise KubeAPIError(0, f"watch {self.name}: not JSON: {line[:200]!r}") from None
        if not isinstance(ev, dict):
            raise KubeAPIError(0, f"watch {self.name}: not an event: {line[:200]!r}")
        typ = ev.get("type")
        obj = ev.get("object")
        if not isinstance(obj, dict):
            raise KubeAPIError(0, f"watch {self.name}: event without an object")
        if typ == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                raise _Expired(str(obj.get("message") or "expired"))
            raise KubeAPIError(code, str(obj.get("message") or obj.get("reason") or "watch error"))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if typ == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            return False
        if typ not in ("ADDED", "MODIFIED", "DELETED"):
            return False
        self.stats.events += 1
        self.on_event(typ, obj)
        if rv:
            self.resource_version = str(rv)
        return True
