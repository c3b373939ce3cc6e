"""Admin endpoints of the local runtime, in the spirit of llama-swap, and its status page.

``GET /`` is the status page (docs/status-page.md): a static HTML shell with its script and style
(``flexinfer/runtime/ui/``, package data, no external asset; ``/ui/<file>``) that polls
``GET /status`` and streams ``GET /logs/<model>?follow=1``. ``GET /status`` (JSON: per model the
runtime's state, group, port, pid, uptime, queue depth, the proxy's request and token counters with
requests/s and tokens/s over the last :data:`RATE_WINDOW` seconds, and the recent errors),
``GET /running`` (the runtime's rows), ``POST /load/<model>`` (start it; ``?wait=1`` answers when it
is ready), ``POST /unload`` and ``POST /unload/<model>``, ``GET /logs/<model>`` (recent output,
``?tail=N`` the last N lines; ``?follow=1`` streams new lines). Served by the proxy's HTTP server
next to the OpenAI API; the proxy's auth applies to every route here when enabled, and a POST sent
by a browser from another origin is refused (403), so a web page cannot load or unload models.

Owns: the routes above, the rate samples and the list of recent errors (what the polls of
``/status`` and the loads saw). Must not: count requests or tokens itself (they are the proxy's
counters, read through :class:`Totals`), or put text that comes from models, configs or logs into
HTML: the page is static; data goes out as JSON and the page's script sets it as text.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from importlib import resources
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import orjson

from flexinfer import errors
from flexinfer.http.protocol import ClientGone, Request, ResponseWriter
from flexinfer.runtime.base import NO_LOAD, LoadView
from flexinfer.runtime.local import LocalRuntime

JSON = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
TEXT = [(b"content-type", b"text/plain; charset=utf-8"), (b"cache-control", b"no-store"),
        (b"x-content-type-options", b"nosniff")]
#: the page may load its own script and style and talk to this server only
CSP = (b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
ASSETS: dict[str, tuple[str, bytes]] = {
    "/": ("index.html", b"text/html; charset=utf-8"),
    "/ui/status.js": ("status.js", b"text/javascript; charset=utf-8"),
    "/ui/status.css": ("status.css", b"text/css; charset=utf-8"),
}
RATE_WINDOW = 10.0  # seconds of samples behind requests/s and tokens/s
SAMPLE_SPACING = 0.5  # a new rate sample at most this often, however many pages poll
ERRORS_KEPT = 50


class Totals(Protocol):
    """The proxy's own counters of a model: (answers by status code, prompt tokens, completion
    tokens), None when not known (``cmd.load.ProxyLoad`` reads them from the proxy's metrics)."""

    def totals(self, model: str) -> tuple[dict[int, int], int, int] | None: ...


def asset(name: str) -> bytes:
    """A file of the status page, from the package."""
    return (resources.files("flexinfer.runtime") / "ui" / name).read_bytes()


def cross_site(req: Request) -> bool:
    """A browser's request from another origin (its ``Origin`` is not this host, or
    ``Sec-Fetch-Site: cross-site``); requests from curl and scripts carry neither."""
    origin = req.get(b"origin")
    if origin is None:
        return req.get(b"sec-fetch-site") in (b"cross-site", b"same-site")
    host = (req.get(b"host") or b"").decode("latin-1").lower()
    return urlsplit(origin.decode("latin-1")).netloc.lower() != host or not host


class LocalAdmin:
    """Routes ``/``, ``/ui/*``, ``/status``, ``/running``, ``/load/<m>``, ``/unload[/<m>]``, ``/logs/<m>``."""

    def __init__(self, runtime: LocalRuntime, load: LoadView = NO_LOAD, totals: Totals | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.runtime = runtime
        self.load = load
        self.totals = totals
        self.clock = clock
        self.errors: collections.deque[dict[str, Any]] = collections.deque(maxlen=ERRORS_KEPT)
        self._samples: dict[str, collections.deque[tuple[float, int, int]]] = {}
        self._seen_error: dict[str, str] = {}
        self._seen_codes: dict[str, dict[int, int]] = {}
        self._loads: dict[str, asyncio.Task[bool]] = {}
        self._assets: dict[str, bytes] = {}

    def queue_depth(self, model: str) -> int:
        return self.load.queue_depth(model) or 0

    @staticmethod
    def match(path: str) -> bool:
        return path in ("/", "/status", "/running", "/unload") or path.startswith(
            ("/unload/", "/load/", "/logs/", "/ui/"))

    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        path, method = req.path, req.method
        if method == "POST" and cross_site(req):
            resp.send_error(errors.Forbidden(f"POST {path} from another origin is refused"))
        elif path in ASSETS and method == "GET":
            self._asset(resp, path)
        elif path.startswith("/ui/") and method == "GET":
            resp.send_error(errors.NotFound(f"no file {path!r}"))
        elif path == "/status" and method == "GET":
            resp.send(200, JSON, orjson.dumps(self.status()))
        elif path == "/running" and method == "GET":
            rows = self.runtime.running()
            for r in rows:
                r["queue_depth"] = self.queue_depth(str(r["model"]))
            resp.send(200, JSON, orjson.dumps({"running": rows}))
        elif path.startswith("/load/") and method == "POST":
            await self._load(req, resp, path[len("/load/"):])
        elif path == "/unload" and method == "POST":
            stopped = [n for n in list(self.runtime.procs) if await self._unload(n)]
            resp.send(200, JSON, orjson.dumps({"unloaded": stopped}))
        elif path.startswith("/unload/") and method == "POST":
            name = path[len("/unload/"):]
            if name not in self.runtime.procs:
                resp.send_error(errors.ModelNotFound(f"model {name!r} does not exist", param="model"))
                return
            was_running = await self._unload(name)
            resp.send(200, JSON, orjson.dumps({"unloaded": [name] if was_running else []}))
        elif path.startswith("/logs/") and method == "GET":
            await self._logs(req, resp, path[len("/logs/"):])
        else:
            resp.send_error(errors.MethodNotAllowed(f"{method} is not allowed on {path}"))

    def _asset(self, resp: ResponseWriter, path: str) -> None:
        name, ctype = ASSETS[path]
        body = self._assets.get(name)
        if body is None:
            body = self._assets[name] = asset(name)
        headers = [(b"content-type", ctype), (b"cache-control", b"no-cache"), (b"x-content-type-options", b"nosniff")]
        if path == "/":
            headers += [(b"content-security-policy", CSP), (b"x-frame-options", b"DENY"),
                        (b"referrer-policy", b"no-referrer")]
        resp.send(200, headers, body)

    # -- load / unload -----------------------------------------------------------------------------
    async def _load(self, req: Request, resp: ResponseWriter, name: str) -> None:
        st = self.runtime.procs.get(name)
        view = self.runtime.resolve(name)
        if st is None or view is None:
            resp.send_error(errors.ModelNotFound(f"model {name!r} does not exist", param="model"))
            return
        if st.state == "ready":
            resp.send(200, JSON, orjson.dumps({"loaded": name, "state": "ready"}))
            return
        task = self._loads.get(name)
        if task is None or task.done():
            task = self._loads[name] = asyncio.get_running_loop().create_task(self._wake(name))
        if parse_qs(req.query).get("wait", ["0"])[0] not in ("1", "true"):
            resp.send(202, JSON, orjson.dumps({"loading": name, "state": st.state}))
            return
        try:
            ok = await asyncio.shield(task)
        except asyncio.CancelledError:  # unloaded meanwhile (or the client left)
            ok = False
        if ok:
            resp.send(200, JSON, orjson.dumps({"loaded": name, "state": st.state}))
        else:
            resp.send_error(errors.ActivationFailed(
                f"model {name!r} did not load: {st.last_error or st.state}", param="model"))

    async def _wake(self, name: str) -> bool:
        """Start ``name`` as a request would (demand recorded, group swaps by the leader rule)."""
        view = self.runtime.resolve(name)
        assert view is not None
        self.runtime.record_demand(view)
        try:
            await self.runtime.wake(view)
        except Exception as exc:  # StartError, or anything the start raised: the page shows it
            self._note(name, str(exc) or type(exc).__name__)
            return False
        return True

    async def _unload(self, name: str) -> bool:
        task = self._loads.pop(name, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return await self.runtime.stop(name)

    # -- /status -----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Everything the page shows, as JSON-ready data."""
        now = self.clock()
        rows: list[dict[str, Any]] = []
        counted = False
        for r in self.runtime.running():
            name = str(r["model"])
            got = self.totals.totals(name) if self.totals is not None else None
            counted = counted or got is not None
            codes, prompt, completion = got if got is not None else ({}, 0, 0)
            requests = sum(codes.values())
            rps, tps = self._rates(name, now, requests, completion)
            self._note_codes(name, codes)
            if r["last_error"]:
                self._note(name, str(r["last_error"]))
            else:
                self._seen_error.pop(name, None)
            task = self._loads.get(name)
            rows.append({**r, "queue_depth": self.queue_depth(name), "requests": requests,
                         "errors_5xx": sum(n for c, n in codes.items() if c >= 500),
                         "errors_4xx": sum(n for c, n in codes.items() if 400 <= c < 500),
                         "prompt_tokens": prompt, "completion_tokens": completion,
                         "requests_per_s": rps, "tokens_per_s": tps,
                         "loading": task is not None and not task.done()})
        return {"now": time.time(), "counters": counted, "rate_window_s": RATE_WINDOW, "models": rows,
                "errors": list(reversed(self.errors))}

    def _rates(self, name: str, now: float, requests: int, tokens: int) -> tuple[float | None, float | None]:
        """(requests/s, completion tokens/s) between the oldest sample of the window and now;
        None until two samples at least :data:`SAMPLE_SPACING` apart exist."""
        samples = self._samples.setdefault(name, collections.deque())
        if not samples or now - samples[-1][0] >= SAMPLE_SPACING:
            samples.append((now, requests, tokens))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW:
            samples.popleft()  # keep one sample at least a window old as the base
        t0, r0, k0 = samples[0]
        if now - t0 < SAMPLE_SPACING:
            return None, None
        return round((requests - r0) / (now - t0), 3), round((tokens - k0) / (now - t0), 2)

    def _note(self, model: str, message: str) -> None:
        if self._seen_error.get(model) == message:
            return
        self._seen_error[model] = message
        self.errors.append({"time": time.time(), "model": model, "message": message})

    def _note_codes(self, model: str, codes: dict[int, int]) -> None:
        before = self._seen_codes.get(model, {})
        new = {c: n - before.get(c, 0) for c, n in codes.items() if c >= 500 and n > before.get(c, 0)}
        self._seen_codes[model] = dict(codes)
        if new:
            what = ", ".join(f"{n} x {c}" for c, n in sorted(new.items()))
            self.errors.append({"time": time.time(), "model": model, "message": f"answered {what}"})

    # -- /logs -------------------------------------------------------------------------------------
    async def _logs(self, req: Request, resp: ResponseWriter, name: str) -> None:
        if name not in self.runtime.procs:
            resp.send_error(errors.ModelNotFound(f"model {name!r} does not exist", param="model"))
            return
        query = parse_qs(req.query)
        follow = query.get("follow", ["0"])[0] in ("1", "true")
        lines = self.runtime.logs(name)
        tail = query.get("tail", [""])[0]
        if tail:
            if not tail.isdigit():
                resp.send_error(errors.BadRequest("tail must be a number of lines", param="tail"))
                return
            lines = lines[-int(tail):] if int(tail) else []
        text = "\n".join(lines)
        if not follow:
            resp.send(200, TEXT, (text + "\n").encode())
            return
        q = self.runtime.follow(name)
        try:
            resp.start(200, TEXT)
            if text:
                resp.write((text + "\n").encode())
            while True:
                line = await q.get()
                if line is None:
                    break
                resp.write((line + "\n").encode())
                await resp.drain()
        except (ClientGone, asyncio.CancelledError):
            return
        finally:
            self.runtime.unfollow(name, q)
        resp.end()
