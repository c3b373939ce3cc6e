"""Reliability plan §3.1 "beyond the handcrafted rows" and row F2: a seeded mutation run through
the real proxy, judged by a differential transducer oracle.

The run. A handful of valid seed requests (below) are mutated by :mod:`tests.proxy._mutate` (byte
edits favouring CR LF HT SP : ; , NUL NEL NBSP, header insert/delete/replace, method replacement,
request-boundary concatenate/split/duplicate/shift, random TCP chunking). ``random.Random(SEED)``
makes the inputs identical run to run. Each input goes, on a fresh connection from its own source
address (127.x.y.z, so forwarded messages can be traced back through the ``x-forwarded-for`` the
proxy sets), to ONE real proxy (:class:`ProxyHandler` on the HTTP core, model ``m``) in front of a
RAW recording backend: an asyncio server that keeps the exact bytes of every upstream connection
and answers each complete request (it frames only enough to answer) with a fixed small JSON 200
that carries an ``x-backend`` marker header. 32 inputs are in flight at once.

The client reads until the proxy closes, or until it has as many final responses as complete
requests in the input (as the proxy's own parser, httptools, sees them): then it closes if the
input ended cleanly, or half-closes (and reads to EOF) if the input ended inside a request.
``FLEXINFER_FUZZ_INPUTS`` sets the count (5,000 in CI; 100,000 nightly), ``FLEXINFER_FUZZ_SEED``
the seed.

The oracle (every failure is reported with the repr of the input):

1. Status: no 500 and no 5xx but 502/503/504 (upstream trouble; never expected here, as the
   backend always answers) and 505 (the core's answer to ``HTTP/2.0`` and other versions). No
   connection is left hanging past the read deadline (DEADLINE seconds, far above the timings of
   a healthy run; the proxy's own header/body timeouts are 2 s).
2. Differential: each backend connection's bytes parse with BOTH httptools (request parser) and
   h11 (server role) to the SAME list of (method, target, headers with lower-cased names, body),
   with no error and no partial message left.
3. Canonical framing of each forwarded message: request line ``TOKEN SP [!-~]+ SP HTTP/1.1``;
   header lines ``name: value`` with lower-case token names, printable-ASCII values without
   leading/trailing whitespace, hence no obs-fold and no bare CR/LF/NUL; exactly one Host and one
   X-Forwarded-For; no Transfer-Encoding (the proxy's serializer always uses Content-Length); at
   most one Content-Length, equal to the body length, and no body without it; no hop-by-hop
   header (Connection, Keep-Alive, Proxy-Connection, TE, Trailer, Upgrade, HTTP2-Settings,
   Expect).
4. Smuggling / transducer:
   a. forwarded messages == responses carrying the backend's marker (each forwarded request is
      answered by exactly the backend's answer, and a request the proxy answered itself, 4xx
      included, was never forwarded);
   b. when h11 accepts the input (no error; a trailing incomplete request is fine), forwarded
      <= complete requests h11 finds. Not applied when h11 stops at an HTTP/1.0 request with
      ``Connection: keep-alive``: h11 treats every 1.0 request as the last, which RFC 9112
      §9.3 does not require, and httptools keeps such a connection open;
   c. when h11 rejects the FIRST request and the proxy's first answer is a 4xx: 0 forwarded.
      Not applied when h11's only objection is a run of spaces in the request line (``POST  /x``):
      llhttp accepts it as RFC 9112 §3 allows, it moves no message boundary, and the proxy
      answers such a request itself (e.g. 405 on ``/v1/models``) and serves the next one;
   d. the k-th forwarded message is the proxy's view (httptools) of the request whose response
      carried the marker: same method; same target (empty segments merged, a ``/model/<name>``
      prefix stripped); every
      forwarded end-to-end header present in that request with the same value (the proxy adds
      only Host, Content-Length, X-Request-ID, X-Forwarded-For, X-Forwarded-Proto); the same
      body, or for JSON the same object with ``model`` set to the routed model.
5. Every forwarded body that is a JSON object with a ``model`` key names ``m``, and has ONE
   top-level ``model`` key however it is spelled (a parser that keeps all pairs sees it once).
   Every forwarded target is under ``/v1/`` with no empty or dot segment.
6. No ERROR log record or traceback from flexinfer or asyncio during the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from flexinfer.runtime.base import Endpoint, ModelView
from tests.proxy import _mutate
from tests.proxy._oracle import ADDED, Msg, Parsed, canonical_problems, parse_h11, parse_httptools
from tests.proxy.conftest import Stack, fast_settings

SEED = int(os.environ.get("FLEXINFER_FUZZ_SEED", "20240917"))
N_INPUTS = int(os.environ.get("FLEXINFER_FUZZ_INPUTS", "5000"))
CONCURRENCY = 32
DEADLINE = 8.0
MODEL = "m"
REPORT_MAX = 5

BACKEND_BODY = b'{"ok":true}'
BACKEND_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-backend: raw\r\n"
                b"content-length: %d\r\n\r\n" % len(BACKEND_BODY))

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi, there; a:b"}],"max_tokens":4}'


def _post(body: bytes, extra: bytes = b"", path: bytes = b"/v1/chat/completions") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def _chunked(body: bytes, extra: bytes = b"", trailer: bytes = b"") -> bytes:
    half = len(body) // 2
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n" + extra
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n" % half + body[:half] + b"\r\n"
            + b"%x;ext=1\r\n" % (len(body) - half) + body[half:] + b"\r\n0\r\n" + trailer + b"\r\n")


GET_MODELS = b"GET /v1/models HTTP/1.1\r\nHost: a\r\nAccept: application/json\r\n\r\n"
SEEDS: list[list[bytes]] = [
    [_post(CHAT)],
    [_chunked(CHAT)],
    [_chunked(CHAT, trailer=b"X-T: 1\r\n")],
    [_post(CHAT, b"X-Model-ID: m\r\n")],
    [_post(b'{"prompt":"x","max_tokens":2}', b"X-Model-ID: m\r\n", b"/v1/completions")],
    [GET_MODELS],
    [_post(CHAT), _post(CHAT, b"X-Session-ID: s1\r\n")],
    [_post(CHAT), GET_MODELS],
    [_post(CHAT, b"Expect: 100-continue\r\n")],
    [_post(CHAT, b"Connection: close\r\n")],
    [b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
     % len(CHAT) + CHAT],
    # the model key spelled with escapes; a path only valid once normalized; a long chunk extension
    [_post(CHAT.replace(b'"model"', b'"\\u006dodel"'))],
    [_post(CHAT, path=b"//model/m//v1/chat/completions")],
    [_chunked(CHAT, extra=b"X-Model-ID: m\r\n", trailer=b"X-T: " + b"t" * 100 + b"\r\n")],
]


# ---- the raw recording backend --------------------------------------------------------------------

class RawBackend:
    """Records the exact bytes of every upstream connection; answers each complete request."""

    def __init__(self) -> None:
        self.conns: list[bytearray] = []
        #: per connection: {offset of a message start: global arrival number}
        self.starts: list[dict[int, int]] = []
        self.seq = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _BackendConn(self), "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


class _BackendConn(asyncio.Protocol):
    def __init__(self, backend: RawBackend) -> None:
        self.backend = backend
        self.raw = bytearray()
        self.starts: dict[int, int] = {}
        self.pos = 0  # offset in raw of the next message
        backend.conns.append(self.raw)
        backend.starts.append(self.starts)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.raw += data
        while True:
            end = self._message_end(self.pos)
            if end is None:
                return
            if end < 0:  # cannot frame it: give up on the connection (the oracle reports it)
                assert self.transport is not None
                self.transport.close()
                return
            self.starts[self.pos] = self.backend.seq
            self.backend.seq += 1
            head_only = bytes(self.raw[self.pos:self.pos + 5]) == b"HEAD "
            self.pos = end
            assert self.transport is not None
            self.transport.write(BACKEND_HEAD if head_only else BACKEND_HEAD + BACKEND_BODY)

    def _message_end(self, pos: int) -> int | None:
        """Offset after the message starting at ``pos``; None: incomplete; -1: unframeable."""
        raw = self.raw
        he = raw.find(b"\r\n\r\n", pos)
        if he < 0:
            return None
        cl, chunked = 0, False
        for line in bytes(raw[pos:he]).split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                if not value.strip().isdigit():
                    return -1
                cl = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
        p = he + 4
        if not chunked:
            return p + cl if len(raw) >= p + cl else None
        while True:  # minimal chunked framing, only so that a wrong proxy still gets an answer
            le = raw.find(b"\r\n", p)
            if le < 0:
                return None
            try:
                size = int(bytes(raw[p:le]).split(b";")[0], 16)
            except ValueError:
                return -1
            p = le + 2
            if size == 0:
                te = raw.find(b"\r\n\r\n", p - 2)
                return None if te < 0 else te + 4
            p += size + 2
            if len(raw) < p:
                return None


# ---- client side --------------------------------------------------------------------------------

@dataclass
class Resp:
    status: int
    marked: bool  # carries the backend's x-backend header: the backend answered it


@dataclass
class Outcome:
    index: int
    data: bytes
    ops: str
    ref: Parsed
    resps: list[Resp] = field(default_factory=list)
    hung: bool = False
    garbage: bool = False
    fwd: list[tuple[int, Msg]] = field(default_factory=list)  # (arrival number, message)


_STATUS_RE = re.compile(rb"HTTP/1\.[01] (\d{3})")


def parse_responses(buf: bytes, methods: list[bytes], eof: bool) -> tuple[list[Resp], bool]:
    """Final responses in ``buf`` (1xx skipped) and whether unparseable bytes follow them."""
    out: list[Resp] = []
    pos = 0
    while pos < len(buf):
        end = buf.find(b"\r\n\r\n", pos)
        if end < 0:
            return out, eof
        lines = buf[pos:end].split(b"\r\n")
        m = _STATUS_RE.match(lines[0])
        if m is None:
            # after a HEAD answer the proxy's own rejection (which closes) may carry a body
            return out, not (out and methods[len(out) - 1:len(out)] == [b"HEAD"])
        status = int(m.group(1))
        hdrs = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            hdrs[k.strip().lower()] = v.strip()
        p = end + 4
        if 100 <= status < 200:
            pos = p
            continue
        method = methods[len(out)] if len(out) < len(methods) else b""
        if method == b"HEAD" or status in (204, 304):
            pass
        elif b"content-length" in hdrs:
            p += int(hdrs[b"content-length"])
            if p > len(buf):
                return out, eof
        elif hdrs.get(b"transfer-encoding", b"").lower() == b"chunked":
            while True:
                le = buf.find(b"\r\n", p)
                if le < 0:
                    return out, eof
                size = int(buf[p:le].split(b";")[0], 16)
                p = le + 2
                if size == 0:
                    te = buf.find(b"\r\n", p)
                    if te < 0:
                        return out, eof
                    p = te + 2
                    break
                p += size + 2
            if p > len(buf):
                return out, eof
        elif eof:
            p = len(buf)
        else:
            return out, False
        out.append(Resp(status, b"x-backend" in hdrs))
        pos = p
    return out, False


def source_ip(i: int) -> str:
    return f"127.{1 + i // 62500}.{(i // 250) % 250 + 1}.{i % 250 + 1}"


async def exchange(port: int, out: Outcome, chunks: list[bytes]) -> None:
    ref = out.ref
    methods = [m.method for m in ref.msgs]
    want = len(ref.msgs)
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    sock = socket.socket()
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((source_ip(out.index), 0))
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), DEADLINE)
        reader, writer = await asyncio.open_connection(sock=sock)
    except (OSError, TimeoutError):
        sock.close()
        out.hung = True
        return
    try:
        for k, piece in enumerate(chunks):
            writer.write(piece)
            await writer.drain()
            if k + 1 < len(chunks):
                await asyncio.sleep(0)
    except (ConnectionError, OSError):
        pass  # the proxy refused early and closed: read what it said
    buf = b""
    eof = half_closed = False
    try:
        while True:
            resps, garbage = parse_responses(buf, methods, eof)
            out.resps, out.garbage = resps, garbage
            if eof or garbage:
                return
            if len(resps) >= want and ref.state == "idle":
                return
            if len(resps) >= want and ref.state == "partial" and not half_closed:
                half_closed = True
                try:
                    writer.write_eof()
                except (OSError, RuntimeError):
                    pass
            left = end - loop.time()
            if left <= 0:
                out.hung = True
                return
            try:
                piece = await asyncio.wait_for(reader.read(65536), left)
            except TimeoutError:
                out.hung = True
                return
            except (ConnectionError, OSError):
                piece = b""
            if piece:
                buf += piece
            else:
                eof = True
    finally:
        writer.close()


async def run_all(port: int, outcomes: list[Outcome], chunks: list[list[bytes]]) -> None:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(o: Outcome, c: list[bytes]) -> None:
        async with sem:
            await exchange(port, o, c)

    await asyncio.gather(*(one(o, c) for o, c in zip(outcomes, chunks, strict=True)))


# ---- the oracle ---------------------------------------------------------------------------------

def backend_messages(backend: RawBackend, problems: list[str]) -> list[tuple[int, Msg]]:
    """(arrival number, message) of every forwarded message; oracle (2) and (3) on the way."""
    found: list[tuple[int, Msg]] = []
    for ci, raw_ba in enumerate(backend.conns):
        raw = bytes(raw_ba)
        if not raw:  # opened, then closed unused (its client went away first): nothing was forwarded
            continue
        a, b = parse_httptools(raw, stop_on_close=False), parse_h11(raw)
        if a.state != "idle" or b.state != "idle" or [m.key() for m in a.msgs] != [m.key() for m in b.msgs]:
            problems.append(f"(2) upstream conn {ci}: httptools {a.state} {a.error} vs h11 {b.state} {b.error}; "
                            f"{len(a.msgs)} vs {len(b.msgs)} messages; bytes {raw[:600]!r}")
        pos = 0
        for m in a.msgs:
            he = raw.find(b"\r\n\r\n", pos)
            if he < 0:
                break
            probs = canonical_problems(raw[pos:he], m.body)
            if probs:
                problems.append(f"(3) non-canonical upstream message: {probs}: {raw[pos:he + 4 + len(m.body)][:600]!r}")
            seq = backend.starts[ci].get(pos, 10**9 + ci)
            found.append((seq, m))
            pos = he + 4 + len(m.body)
    return found


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _strip_model_prefix(target: bytes) -> bytes:
    """The target the proxy must forward for ``target``: empty segments merged, prefix stripped."""
    path, q, query = target.partition(b"?")
    path = re.sub(rb"//+", b"/", path)
    if path.startswith(b"/model/"):
        _, slash, tail = path[7:].partition(b"/")
        path = b"/" + tail if slash else b"/"
    return path + q + query


def _model_keys(body: bytes) -> int:
    """Top-level keys that decode to ``model`` (every pair kept), -1 when not a JSON object."""
    try:
        top = json.loads(body, object_pairs_hook=lambda pairs: pairs)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return -1
    return sum(1 for k, _ in top if k == "model") if isinstance(top, list) else -1


_DOT_SEGMENT = re.compile(rb"/(?:\.|%2e){1,2}(?:/|$)", re.IGNORECASE)


def _only_request_line_spacing(data: bytes) -> bool:
    """Whether h11 refuses the first request only for runs of SP in its request line, which
    llhttp accepts: RFC 9112 §3 lets a recipient parse the line on whitespace boundaries, and it
    does not move a message boundary (the proxy answers such a request itself, then goes on)."""
    le = data.find(b"\r\n")
    if le < 0 or b"  " not in data[:le]:
        return False
    again = parse_h11(re.sub(rb" +", b" ", data[:le]) + data[le:])
    return bool(again.msgs) or again.state != "error"


def judge(o: Outcome) -> list[str]:
    """Oracle (1), (4) and (5) for one input."""
    probs = []
    statuses = [r.status for r in o.resps]
    for s in statuses:
        if s >= 500 and s not in (502, 503, 504, 505):
            probs.append(f"(1) status {s}")
    if o.hung:
        probs.append(f"(1) connection still open after {DEADLINE} s (responses so far {statuses})")
    fwd = [m for _, m in sorted(o.fwd, key=lambda t: t[0])]
    marked = [k for k, r in enumerate(o.resps) if r.marked]
    if not o.hung and len(fwd) != len(marked):
        probs.append(f"(4a) {len(fwd)} forwarded, {len(marked)} answers from the backend ({statuses})")
    h = parse_h11(o.data)
    if h.state != "error" and not h.h10_keepalive_stop and len(fwd) > len(h.msgs):
        probs.append(f"(4b) {len(fwd)} forwarded > {len(h.msgs)} requests h11 finds")
    if (h.state == "error" and not h.msgs and statuses and 400 <= statuses[0] < 500 and fwd
            and not _only_request_line_spacing(o.data)):
        probs.append(f"(4c) h11 rejects the first request ({h.error}), proxy said {statuses[0]}, "
                     f"yet {len(fwd)} forwarded")
    for m, k in zip(fwd, marked, strict=False):
        if k >= len(o.ref.msgs):
            probs.append(f"(4d) answer {k} from the backend has no request in the proxy's view")
            continue
        r = o.ref.msgs[k]
        if m.method != r.method or m.target != _strip_model_prefix(r.target):
            probs.append(f"(4d) forwarded {m.method!r} {m.target!r} for {r.method!r} {r.target!r}")
        sent = {(n, v.strip(b" \t")) for n, v in r.headers}
        for n, v in m.headers:
            if n not in ADDED and (n, v) not in sent:
                probs.append(f"(4d) forwarded header {n!r}: {v!r} not in the request")
        if m.body != r.body:
            a, b = _json(m.body), _json(r.body)
            if not (isinstance(a, dict) and isinstance(b, dict) and "model" in b and a == {**b, "model": MODEL}):
                probs.append(f"(4d) forwarded body {m.body[:200]!r} for {r.body[:200]!r}")
    for m in fwd:
        data = _json(m.body)
        if isinstance(data, dict) and "model" in data and data["model"] != MODEL:
            probs.append(f"(5) forwarded body names model {data['model']!r}")
        if _model_keys(m.body) > 1:
            probs.append(f"(5) forwarded body has {_model_keys(m.body)} top-level model keys: {m.body[:200]!r}")
        path = m.target.partition(b"?")[0]
        if not path.startswith(b"/v1/") or b"//" in path or _DOT_SEGMENT.search(path):
            probs.append(f"(5) forwarded target {m.target!r} is not a canonical /v1/ path")
    return probs


class FuzzStack(Stack):
    def __init__(self) -> None:
        super().__init__()
        self.backend = RawBackend()

    async def stop_extra(self) -> None:
        await self.backend.stop()


@pytest.fixture
def fuzz_stack() -> Any:
    st = FuzzStack()
    try:
        yield st
    finally:
        st.close()


def test_mutation_fuzz_differential(fuzz_stack: FuzzStack, caplog: pytest.LogCaptureFixture) -> None:
    st = fuzz_stack
    caplog.set_level(logging.ERROR)
    port = st.run(st.backend.start())
    st.start_proxy([ModelView(name=MODEL, endpoints=(Endpoint("127.0.0.1", port),))], fast_settings())

    rng = random.Random(SEED)
    outcomes, chunks = [], []
    for i in range(N_INPUTS):
        data, pieces, ops = _mutate.mutate(rng, SEEDS)
        outcomes.append(Outcome(i, data, ops, parse_httptools(data)))
        chunks.append(pieces)

    t0 = time.monotonic()
    asyncio.run(run_all(st.port, outcomes, chunks))
    st.run(asyncio.sleep(0.2))  # let the last upstream bytes land
    wall = time.monotonic() - t0

    problems: list[str] = []
    by_ip = {source_ip(o.index): o for o in outcomes}
    msgs = st.call(lambda: backend_messages(st.backend, problems))
    for seq, m in msgs:
        xff = [v for n, v in m.headers if n == b"x-forwarded-for"]
        o = by_ip.get(xff[0].decode("latin-1")) if len(xff) == 1 else None
        if o is None:
            problems.append(f"forwarded message with no input: x-forwarded-for {xff!r}")
            continue
        o.fwd.append((seq, m))
    for o in outcomes:
        for p in judge(o):
            problems.append(f"input #{o.index} [{o.ops}] {p}\n    bytes: {o.data[:600]!r}")
    for rec in caplog.records:
        if rec.name.startswith(("flexinfer", "asyncio")) and (rec.levelno >= logging.ERROR or rec.exc_info):
            problems.append(f"(6) log {rec.name} {rec.levelname}: {rec.getMessage()[:300]}")

    hist: Counter[str] = Counter()
    for o in outcomes:
        if not o.resps:
            hist["none"] += 1
        for r in o.resps:
            hist[f"{r.status // 100}xx"] += 1
    exact = Counter(r.status for o in outcomes for r in o.resps)
    print(f"\nmutation fuzz: seed {SEED}, {N_INPUTS} inputs in {wall:.1f} s, {len(msgs)} messages forwarded, "
          f"{sum(1 for o in outcomes if o.fwd)} inputs forwarded something")
    print(f"  responses by class: {dict(sorted(hist.items()))}")
    print(f"  by status: {dict(sorted(exact.items()))}")
    print(f"  proxy rejections: {dict(sorted(st.server.stats.rejections.items()))}")
    print(f"  upstream connections: {len(st.backend.conns)}, "
          f"{sum(1 for c in st.backend.conns if not c)} of them closed unused")
    print(f"  problems: {len(problems)}")
    assert not problems, f"{len(problems)} oracle failures; first {REPORT_MAX}:\n" + "\n".join(problems[:REPORT_MAX])


def test_oracle_catches_known_bad() -> None:
    """The oracle is not vacuous: each clause fires on a hand-made bad case."""
    body = b'{"model":"m"}'
    good = (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\nhost: b\r\n"
            b"x-forwarded-for: 127.1.1.1\r\ncontent-length: 13")
    assert canonical_problems(good, body) == []
    for bad in (good + b"\r\ntransfer-encoding: chunked", good + b"\r\ncontent-length: 13",
                good.replace(b"content-type", b"Content-Type"), good + b"\r\nx-a: a\r\n b",
                good + b"\r\nconnection: keep-alive", good.replace(b"13", b"12"), good + b"\r\nx-a: \xa0"):
        assert canonical_problems(bad, body), bad
    # (2): CL+TE on the upstream side -- h11 takes the chunked body, httptools refuses
    backend = RawBackend()
    backend.conns.append(bytearray(good + b"\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"))
    backend.starts.append({})
    problems: list[str] = []
    backend_messages(backend, problems)
    assert any(p.startswith("(2)") for p in problems), problems
    # (1), (4a), (4d), (5) on one input
    data = _post(CHAT)
    ref = parse_httptools(data)
    fwd = Msg(b"POST", b"/v1/chat/completions", [(b"x-evil", b"1")], b'{"model":"other"}')
    o = Outcome(0, data, "test", ref, resps=[Resp(500, False)], fwd=[(0, fwd)])
    found = " ".join(judge(o))
    for clause in ("(1) status 500", "(4a)", "(5)"):
        assert clause in found, found
    o = Outcome(0, data, "test", ref, resps=[Resp(200, True)], fwd=[(0, fwd)])
    found = " ".join(judge(o))
    # (5): a second model key spelled with escapes; a target with an empty segment
    dup = Msg(b"POST", b"/v1/chat/completions", [], b'{"\\u006dodel":"x","model":"m"}')
    assert "top-level model keys" in " ".join(judge(Outcome(0, data, "test", ref, resps=[Resp(200, True)],
                                                            fwd=[(0, dup)])))
    slashes = Msg(b"POST", b"//v1/chat/completions", [], b'{"model":"m"}')
    assert "canonical /v1/ path" in " ".join(judge(Outcome(0, data, "test", ref, resps=[Resp(200, True)],
                                                           fwd=[(0, slashes)])))
    assert "(4d) forwarded header b'x-evil'" in found and "(4d) forwarded body" in found, found
    # (4b): two forwarded for one request h11 finds; (4c): h11 rejects the first, proxy said 400
    o = Outcome(0, data, "test", ref, resps=[Resp(200, True), Resp(200, True)],
                fwd=[(0, ref.msgs[0]), (1, ref.msgs[0])])
    assert "(4b)" in " ".join(judge(o))
    bad_first = b"GET / HTTP/1.1\r\n\r\n" + data  # no Host: h11 refuses
    o = Outcome(0, bad_first, "test", parse_httptools(bad_first), resps=[Resp(400, False)], fwd=[(0, ref.msgs[0])])
    assert "(4c)" in " ".join(judge(o))
