"""The engine-metrics scrape loop: every endpoint's ``/metrics`` (and ``/v1/models``) each interval.

Owns: :class:`EngineScraper` (the endpoint set, one tick task, one scrape task per endpoint at a
time, the last good :class:`~flexinfer.proxy.enginemetrics.EngineState` per endpoint, the error
counts) and the minimal HTTP/1.1 GET it scrapes with (``Connection: close``; Content-Length,
chunked or close-delimited bodies; a byte limit on the body and on the head).
Must not: run on the request path (readers call :meth:`EngineScraper.state`, a dict lookup), raise
out of the loop, keep a connection open past its deadline, or remember dropped endpoints.

Scheduling. A tick every ``interval`` seconds starts a scrape of each endpoint that has none in
flight (one still running - a slow engine - is skipped and counted in ``skipped``; ticks missed
while the loop was busy are not made up). Scrapes run under an ``asyncio.Semaphore`` of
``concurrency``; ``timeout`` bounds each GET as a whole (connect, head and body) once the scrape
holds the semaphore, so a slow engine costs one slot for at most ``timeout`` and a huge page is
cut at ``max_bytes`` and never buffered further. The other endpoints keep their schedule while
fewer than ``concurrency`` endpoints hang at once. Parsing a page (at most ``max_bytes``) runs on
the loop: a few milliseconds for 1 MiB (enginemetrics parses only the lines it reads).

Reading. :meth:`EngineScraper.state` is the last *successful* scrape while it is at most
``max_age`` seconds old, else ``None`` (unknown: see enginemetrics for how a scheduler must read
unknown; it never means idle). A failed scrape does not erase a good one younger than ``max_age``;
:meth:`EngineScraper.last` shows the latest attempt, failed or not (for ``/debug/endpoints``).

Errors, counted by reason in ``errors`` (all endpoints) and ``endpoint_errors[key]``: ``connect``
(refused, unreachable, unresolvable, or no connection within ``timeout``), ``timeout`` (connected,
page not complete within ``timeout``), ``too_large`` (body over ``max_bytes``), ``malformed`` (a bad
HTTP answer or an unparsable page), ``http_status`` (anything but 200). ``/v1/models`` failures are
counted the same way in ``model_errors`` and keep the adapters last seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from flexinfer.proxy.enginemetrics import EngineState, failed, fresh, parse, parse_adapters
from flexinfer.proxy.sidedial import side_auth, side_open, side_path

__all__ = ["EngineScraper", "ScrapeError"]

log = logging.getLogger("flexinfer.proxy.scrape")

_HEAD_LIMIT = 16 * 1024  # response head bytes
_MODELS_MAX_BYTES = 1 << 20
_READ = 64 * 1024


class ScrapeError(Exception):
    """A failed GET; ``reason`` is one of the error reasons of the module doc."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _split_key(key: str) -> tuple[str, int]:
    if key.startswith("["):  # [v6]:port
        host, _, port = key[1:].partition("]:")
    else:
        host, _, port = key.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint key {key!r} must look like host:port")
    return host, int(port)


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], max_bytes: int) -> bytes:
    te = headers.get("transfer-encoding", "").lower()
    if te:
        if te.split(",")[-1].strip() != "chunked" or "content-length" in headers:
            raise ScrapeError("malformed")
        parts: list[bytes] = []
        total = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ScrapeError("malformed") from None
            if size < 0:
                raise ScrapeError("malformed")
            if size == 0:
                return b"".join(parts)  # trailers are not read: the connection is closed anyway
            total += size
            if total > max_bytes:
                raise ScrapeError("too_large")
            parts.append(await reader.readexactly(size))
            if await reader.readexactly(2) != b"\r\n":
                raise ScrapeError("malformed")
    cl = headers.get("content-length")
    if cl is not None:
        if not cl.isdigit():
            raise ScrapeError("malformed")
        n = int(cl)
        if n > max_bytes:
            raise ScrapeError("too_large")
        return await reader.readexactly(n)
    buf = bytearray()  # close-delimited
    while True:
        chunk = await reader.read(_READ)
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > max_bytes:
            raise ScrapeError("too_large")


async def http_get(host: str, port: int, path: str, timeout: float, max_bytes: int,
                   link: Any | None = None) -> bytes:
    """GET ``path`` over a fresh connection (TLS, base path and key as the endpoint's ``link`` says:
    :mod:`flexinfer.proxy.sidedial`); the 200 answer's body, or :class:`ScrapeError`."""
    writer: asyncio.StreamWriter | None = None
    connected = False
    try:
        async with asyncio.timeout(timeout):
            try:
                reader, writer = await side_open(host, port, link, _HEAD_LIMIT)
            except OSError:  # refused, unreachable, or a failed TLS handshake (ssl.SSLError)
                raise ScrapeError("connect") from None
            connected = True
            hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            writer.write(f"GET {side_path(link, path)} HTTP/1.1\r\nHost: {hostport}\r\nAccept: */*\r\n"
                         f"{side_auth(link)}User-Agent: flexinfer-scraper\r\nConnection: close\r\n\r\n"
                         .encode("latin-1"))
            try:
                raw = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                raise ScrapeError("malformed") from None
            lines = raw.decode("latin-1").split("\r\n")
            status = lines[0].split(" ", 2)
            if len(status) < 2 or not status[0].startswith("HTTP/1.") or not status[1].isdigit():
                raise ScrapeError("malformed")
            if status[1] != "200":
                raise ScrapeError("http_status")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if not line:
                    continue
                name, sep, value = line.partition(":")
                if not sep:
                    raise ScrapeError("malformed")
                name = name.strip().lower()
                if name == "content-length" and name in headers and headers[name] != value.strip():
                    raise ScrapeError("malformed")
                headers[name] = value.strip()
            return await _read_body(reader, headers, max_bytes)
    except TimeoutError:
        raise ScrapeError("timeout" if connected else "connect") from None
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        raise ScrapeError("malformed") from None
    except OSError:  # reset mid-answer
        raise ScrapeError("connect") from None
    finally:
        if writer is not None:
            writer.transport.abort()  # Connection: close; nothing left to say, nothing to wait for


class EngineScraper:
    """Scrapes every endpoint's engine metrics each ``interval`` seconds (module doc)."""

    def __init__(self, interval: float = 1.0, timeout: float = 0.5, max_bytes: int = 1 << 20,
                 concurrency: int = 16, max_age: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 models_every: int = 1) -> None:
        if interval <= 0 or timeout <= 0 or max_bytes <= 0 or concurrency < 1 or models_every < 0:
            raise ValueError("interval, timeout and max_bytes must be > 0, concurrency >= 1, models_every >= 0")
        self.interval = interval
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.concurrency = concurrency
        self.max_age = max_age
        self.models_every = models_every  # fetch /v1/models every N scrapes (0: never)
        self._clock = clock
        self._targets: dict[str, tuple[str, int]] = {}
        self._links: dict[str, Any] = {}  # key -> UpstreamLink (TLS / keyed endpoints only)
        self._good: dict[str, EngineState] = {}
        self._last: dict[str, EngineState] = {}
        self._inflight: dict[str, asyncio.Task[EngineState]] = {}
        self._sem: asyncio.Semaphore | None = None
        self._task: asyncio.Task[None] | None = None
        self.errors: dict[str, int] = {}
        self.model_errors: dict[str, int] = {}
        self.endpoint_errors: dict[str, dict[str, int]] = {}
        self.scrapes: dict[str, int] = {}  # finished scrapes (good or failed) per endpoint
        self.skipped: dict[str, int] = {}  # ticks that found the endpoint's previous scrape in flight
        #: called (no arguments, on the loop) after each recorded scrape and after endpoints were
        #: dropped: the hook of :class:`flexinfer.proxy.enginepub.EnginePublisher`
        self.on_change: Callable[[], None] | None = None

    # ---- endpoints ---------------------------------------------------------------------------------
    def set_endpoints(self, keys: Iterable[str], links: Mapping[str, Any] | None = None) -> None:
        """The endpoints to scrape (``host:port``), with the ``UpstreamLink`` of those that have one
        (TLS, a peer's key: dialled as their requests are). Dropped ones are forgotten (state,
        counters) and their scrape in flight is cancelled; new ones are scraped from the next tick."""
        self._links = dict(links or {})
        new: dict[str, tuple[str, int]] = {}
        for k in keys:
            new[k] = self._targets.get(k) or _split_key(k)
        for k in list(self._targets):
            if k not in new:
                task = self._inflight.pop(k, None)
                if task is not None:
                    task.cancel()
                for d in (self._good, self._last, self.endpoint_errors, self.scrapes, self.skipped):
                    d.pop(k, None)
        dropped = any(k not in new for k in self._targets)
        self._targets = new
        if dropped and self.on_change is not None:
            self.on_change()

    @property
    def endpoints(self) -> list[str]:
        return list(self._targets)

    # ---- reading -----------------------------------------------------------------------------------
    def state(self, key: str) -> EngineState | None:
        """The last good scrape of ``key`` while fresh (``max_age``), else None: unknown, never idle."""
        st = self._good.get(key)
        return st if fresh(st, self._clock(), self.max_age) else None

    def last(self, key: str) -> EngineState | None:
        """The latest scrape attempt of ``key``, failed or not, however old."""
        return self._last.get(key)

    def snapshot(self) -> dict[str, tuple[EngineState | None, EngineState | None]]:
        """Every endpoint's (last good, latest attempt) scrape, however old (for publishing)."""
        return {k: (self._good.get(k), self._last.get(k)) for k in self._targets if k in self._last}

    def in_flight(self, key: str) -> bool:
        return key in self._inflight

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._sem = asyncio.Semaphore(self.concurrency)
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-scraper")

    async def stop(self) -> None:
        """Stop ticking and cancel the scrapes in flight (their connections are closed)."""
        task, self._task = self._task, None
        tasks: list[asyncio.Task[Any]] = [t for t in (task, *self._inflight.values()) if t is not None]
        self._inflight.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            self.tick()
            next_at += self.interval
            now = loop.time()
            if next_at < now:  # a late tick: do not make up the missed ones
                next_at = now + self.interval
            await asyncio.sleep(next_at - now)

    def tick(self) -> None:
        """Start a scrape of every endpoint that has none in flight (the loop calls this)."""
        loop = asyncio.get_running_loop()
        for key, target in self._targets.items():
            if key in self._inflight:
                self.skipped[key] = self.skipped.get(key, 0) + 1
                continue
            task = loop.create_task(self.scrape(key, target))
            self._inflight[key] = task
            task.add_done_callback(lambda t, k=key: self._done(k, t))  # type: ignore[misc]

    def _done(self, key: str, task: asyncio.Task[EngineState]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled() and task.exception() is not None:  # a bug: never let it pass silently
            log.error("engine scrape of %s failed", key, exc_info=task.exception())

    # ---- one scrape --------------------------------------------------------------------------------
    def _count(self, key: str, reason: str, models: bool = False) -> None:
        table = self.model_errors if models else self.errors
        table[reason] = table.get(reason, 0) + 1
        if not models:
            per = self.endpoint_errors.setdefault(key, {})
            per[reason] = per.get(reason, 0) + 1

    async def scrape(self, key: str, target: tuple[str, int] | None = None) -> EngineState:
        """Scrape ``key`` once now (under the semaphore) and record the result."""
        host, port = target or self._targets.get(key) or _split_key(key)
        sem = self._sem or asyncio.Semaphore(1)
        async with sem:
            prev = self._good.get(key)
            try:
                link = self._links.get(key)
                body = await http_get(host, port, "/metrics", self.timeout, self.max_bytes, link)
                st = parse(body.decode("utf-8", "replace"), prev, self._clock(), self.max_bytes)
            except ScrapeError as e:
                st = failed(prev, self._clock(), e.reason)
            n = self.scrapes.get(key, 0)
            if st.error is None and self.models_every and n % self.models_every == 0:
                try:
                    adapters = parse_adapters(await http_get(host, port, "/v1/models", self.timeout,
                                                             _MODELS_MAX_BYTES, link))
                    if adapters is None:
                        self._count(key, "malformed", models=True)
                    else:
                        st = replace(st, adapters=adapters)
                except ScrapeError as e:
                    self._count(key, e.reason, models=True)
        if key in self._targets or target is None:
            self.scrapes[key] = n + 1
            self._last[key] = st
            if st.error is None:
                self._good[key] = st
            else:
                self._count(key, st.error)
            if self.on_change is not None:
                self.on_change()
        return st
