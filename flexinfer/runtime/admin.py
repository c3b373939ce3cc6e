"""Admin endpoints of the local runtime, in the spirit of llama-swap.

``GET /running`` (models, state, port, pid, uptime, last request), ``POST /unload`` and
``POST /unload/<model>``, ``GET /logs/<model>`` (recent output; ``?follow=1`` streams new lines) and
``GET /`` (a small status page, plain HTML, refreshed every few seconds). Served by the proxy's
HTTP server next to the OpenAI API; auth applies when enabled.
"""

from __future__ import annotations

import asyncio
import html
import time
from urllib.parse import parse_qs

import orjson

from flexinfer import errors
from flexinfer.http.protocol import ClientGone, Request, ResponseWriter
from flexinfer.runtime.base import NO_LOAD, LoadView
from flexinfer.runtime.local import LocalRuntime

JSON = [(b"content-type", b"application/json")]


class LocalAdmin:
    """Routes ``/``, ``/running``, ``/unload[/<m>]``, ``/logs/<m>``."""

    def __init__(self, runtime: LocalRuntime, load: LoadView = NO_LOAD) -> None:
        self.runtime = runtime
        self.load = load

    def queue_depth(self, model: str) -> int:
        return self.load.queue_depth(model) or 0

    @staticmethod
    def match(path: str) -> bool:
        return path in ("/", "/running", "/unload") or path.startswith(("/unload/", "/logs/"))

    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        path, method = req.path, req.method
        if path == "/running" and method == "GET":
            rows = self.runtime.running()
            for r in rows:
                r["queue_depth"] = self.queue_depth(str(r["model"]))
            resp.send(200, JSON, orjson.dumps({"running": rows}))
        elif path == "/unload" and method == "POST":
            stopped = [n for n in list(self.runtime.procs) if await self.runtime.stop(n)]
            resp.send(200, JSON, orjson.dumps({"unloaded": stopped}))
        elif path.startswith("/unload/") and method == "POST":
            name = path[len("/unload/"):]
            if name not in self.runtime.procs:
                resp.send_error(errors.ModelNotFound(f"model {name!r} does not exist", param="model"))
                return
            was_running = await self.runtime.stop(name)
            resp.send(200, JSON, orjson.dumps({"unloaded": [name] if was_running else []}))
        elif path.startswith("/logs/") and method == "GET":
            await self._logs(req, resp, path[len("/logs/"):])
        elif path == "/" and method == "GET":
            resp.send(200, [(b"content-type", b"text/html; charset=utf-8")], self._page())
        else:
            resp.send_error(errors.MethodNotAllowed(f"{method} is not allowed on {path}"))

    async def _logs(self, req: Request, resp: ResponseWriter, name: str) -> None:
        if name not in self.runtime.procs:
            resp.send_error(errors.ModelNotFound(f"model {name!r} does not exist", param="model"))
            return
        follow = parse_qs(req.query).get("follow", ["0"])[0] in ("1", "true")
        text = "\n".join(self.runtime.logs(name))
        if not follow:
            resp.send(200, [(b"content-type", b"text/plain; charset=utf-8")], (text + "\n").encode())
            return
        q = self.runtime.follow(name)
        try:
            resp.start(200, [(b"content-type", b"text/plain; charset=utf-8"), (b"cache-control", b"no-store")])
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

    def _page(self) -> bytes:
        rows = []
        for r in self.runtime.running():
            last = r["last_request"]
            ago = f"{time.time() - float(last):.0f}s ago" if isinstance(last, int | float) else "never"
            rows.append("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
                r["model"], r["state"], r["group"] or "", r["port"] or "", r["pid"] or "", r["uptime_s"], ago,
                self.queue_depth(str(r["model"])), r["last_error"] or "")) + "</tr>")
        body = f"""<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="3">
<title>FlexInfer</title><style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}th{{background:#eee}}</style></head>
<body><h1>FlexInfer local runtime</h1>
<table><tr><th>model</th><th>state</th><th>group</th><th>port</th><th>pid</th><th>uptime s</th>
<th>last request</th><th>queued</th><th>last error</th></tr>{''.join(rows)}</table>
<p>OpenAI endpoint: <code>/v1</code> &middot; <a href="/running">/running</a> &middot;
<a href="/v1/models">/v1/models</a> &middot; <a href="/metrics">/metrics</a></p></body></html>"""
        return body.encode()
