"""Test helpers for flexinfer.http: a recording handler, a server context, raw socket clients, a
response splitter and a scripted raw backend. Real sockets on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httptools

from flexinfer.errors import FlexInferError, Unauthorized
from flexinfer.http.protocol import ClientGone, Request, ResponseWriter
from flexinfer.http.responses import sse_event
from flexinfer.http.server import HTTPServer
from flexinfer.settings import HTTPSettings, UpstreamSettings, with_changes

HOST = "127.0.0.1"
#: upstream timeouts scaled down so that a test of the pool and its connections ends in seconds
FAST_UPSTREAM = UpstreamSettings(connect_timeout=1.0, response_timeout=2.0, stream_idle_timeout=2.0,
                                 pool_idle_timeout=2.0)


def fast_settings(**changes: object) -> HTTPSettings:
    """Default limits, timeouts scaled down so that every test ends in seconds."""
    base = HTTPSettings(header_timeout=2.0, body_timeout=2.0, keepalive_timeout=2.0, drain_timeout=2.0)
    return with_changes(base, **changes) if changes else base


class RecordingHandler:
    """Routes by path; records every on_headers / handle call and disconnects."""

    def __init__(self) -> None:
        self.seen_headers: list[Request] = []
        self.handled: list[Request] = []
        self.disconnects = 0
        self.relay_errors: list[BaseException] = []
        self.gate = asyncio.Event()
        self.upstream: Callable[[Request, ResponseWriter], Awaitable[None]] | None = None

    def on_headers(self, req: Request) -> FlexInferError | None:
        self.seen_headers.append(req)
        if req.path.startswith("/auth") and req.get(b"authorization") is None:
            return Unauthorized("Missing bearer token.")
        return None

    async def handle(self, req: Request, resp: ResponseWriter) -> None:
        self.handled.append(req)
        path = req.path
        if path == "/echo":
            resp.send(200, [(b"content-type", b"application/octet-stream")], req.body)
        elif path.startswith("/sleep/"):
            await asyncio.sleep(float(path.rsplit("/", 1)[1]))
            resp.send(200, [(b"content-type", b"text/plain")], path.encode())
        elif path == "/stream":
            q = dict(p.split("=") for p in req.query.split("&") if p)
            n, delay = int(q.get("n", "3")), float(q.get("d", "0.01"))
            resp.on_disconnect(self._gone)
            resp.start(200, [(b"content-type", b"text/event-stream")])
            for i in range(n):
                resp.write(sse_event(b"%d" % i))
                await resp.drain()
                await asyncio.sleep(delay)
            resp.end()
        elif path == "/forever":
            resp.on_disconnect(self._gone)
            resp.start(200, [(b"content-type", b"text/event-stream")])
            resp.write(sse_event(b"first"))
            await asyncio.Event().wait()
        elif path == "/gate":
            await self.gate.wait()
            resp.send(200, [], b"gate")
        elif path == "/boom":
            raise RuntimeError("secret-internal-detail")
        elif path == "/proxy" and self.upstream is not None:
            await self.upstream(req, resp)
        else:
            resp.send(200, [(b"content-type", b"text/plain")], b"ok " + req.target)

    def _gone(self) -> None:
        self.disconnects += 1


@contextlib.asynccontextmanager
async def serve(handler: RecordingHandler | None = None, settings: HTTPSettings | None = None,
                ) -> AsyncIterator[HTTPServer]:
    server = HTTPServer(handler or RecordingHandler(), settings or fast_settings())
    await server.start()
    try:
        yield server
    finally:
        await server.drain_and_close(0.5)


@dataclass
class Exchange:
    data: bytes
    eof: bool
    eof_after: float  # seconds from the last byte sent to EOF (inf if none)
    error: str | None = None


async def exchange(port: int, payload: bytes | list[bytes], *, timeout: float = 2.0,
                   pace: float = 0.0, rcvbuf: int | None = None) -> Exchange:
    """Send ``payload`` (pieces ``pace`` seconds apart), read until EOF or ``timeout``."""
    reader, writer = await asyncio.open_connection(HOST, port)
    if rcvbuf:
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    pieces = [payload] if isinstance(payload, bytes) else payload
    chunks: list[bytes] = []
    sent_at = time.monotonic()
    done_sending = asyncio.Event()

    async def send() -> None:
        nonlocal sent_at
        try:
            for i, piece in enumerate(pieces):
                if pace and i:
                    await asyncio.sleep(pace)
                writer.write(piece)
                await writer.drain()
                sent_at = time.monotonic()
        except (ConnectionError, OSError):
            pass
        finally:
            done_sending.set()

    sender = asyncio.ensure_future(send())
    eof = False
    error = None
    deadline = time.monotonic() + timeout + pace * len(pieces)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                chunk = await asyncio.wait_for(reader.read(65536), left)
            except TimeoutError:
                break
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
    except (ConnectionError, OSError) as exc:
        error = type(exc).__name__
        eof = True
    eof_at = time.monotonic()
    sender.cancel()
    with contextlib.suppress(BaseException):
        await sender
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return Exchange(b"".join(chunks), eof, (eof_at - sent_at) if eof else float("inf"), error)


@dataclass
class Resp:
    status: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = False

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


class _Collector:
    def __init__(self) -> None:
        self.responses: list[Resp] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.responses.append(Resp(0))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.responses[-1].headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.responses[-1].status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.responses[-1].body += body

    def on_message_complete(self) -> None:
        self.responses[-1].complete = True


def parse_responses(data: bytes) -> list[Resp]:
    """Split raw bytes into responses (1xx included as their own entries)."""
    c = _Collector()
    with contextlib.suppress(httptools.HttpParserError):
        c.parser.feed_data(data)
    return c.responses


# ---- raw backend ---------------------------------------------------------------------------

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "BackendConn"], Awaitable[None]]


@dataclass
class BackendConn:
    index: int
    captured: bytearray = field(default_factory=bytearray)
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class RawBackend:
    """An asyncio server that runs ``script`` per connection and records what it reads."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.conns: list[BackendConn] = []
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawBackend:
        self.server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = BackendConn(len(self.conns))
        self.conns.append(conn)
        self.writers.append(writer)
        rec = _RecordingReader(reader, conn)
        try:
            await self.script(rec, writer, conn)  # type: ignore[arg-type]
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            conn.closed.set()
            writer.close()


class _RecordingReader:
    """Wraps a StreamReader; records every byte read into the BackendConn."""

    def __init__(self, reader: asyncio.StreamReader, conn: BackendConn) -> None:
        self._r = reader
        self._c = conn

    async def readuntil(self, sep: bytes = b"\n") -> bytes:
        data = await self._r.readuntil(sep)
        self._c.captured += data
        return data

    async def readexactly(self, n: int) -> bytes:
        data = await self._r.readexactly(n)
        self._c.captured += data
        return data

    async def read(self, n: int = -1) -> bytes:
        data = await self._r.read(n)
        self._c.captured += data
        return data


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """Read one Content-Length framed request (head, body) from a backend connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length) if length else b""
    return head, body


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    s = socket.socket()
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    return port


async def until(cond: Callable[[], bool], timeout: float = 2.0, step: float = 0.01) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        await asyncio.sleep(step)
    return cond()


__all__ = [
    "HOST", "BackendConn", "ClientGone", "Exchange", "RawBackend", "RecordingHandler", "Resp",
    "exchange", "fast_settings", "free_port", "parse_responses", "read_request", "serve", "until",
]


def counting_parser(real: type) -> type:
    """A stand-in for the httptools parser class ``real`` (monkeypatched over it) that counts the
    bytes fed to any of its instances in its class attribute ``fed``: which path read what."""

    class Counting:
        fed = 0

        def __init__(self, proto: Any) -> None:
            self._p = real(proto)

        def feed_data(self, data: Any) -> None:
            Counting.fed += len(data)
            self._p.feed_data(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._p, name)

    return Counting
