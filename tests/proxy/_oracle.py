"""The reference side of the mutation run's oracle (:mod:`tests.proxy.test_mutation_fuzz`).

Owns: the two independent parsers every forwarded message must satisfy alike (httptools' request
parser and h11 in the server role, each turned into a list of :class:`Msg`), and the check that a
message the proxy sent upstream is canonically framed (:func:`canonical_problems`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import h11
import httptools

# ---- reference parsers ------------------------------------------------------------------------------

@dataclass
class Msg:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    version: str = "1.1"
    keep_alive: bool = True

    def key(self) -> tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes]:
        return self.method, self.target, self.headers, self.body


@dataclass
class Parsed:
    msgs: list[Msg]
    state: str  # idle | partial | error | closed (stopped after a non-keep-alive request)
    error: str = ""
    h10_keepalive_stop: bool = False  # h11 only: stopped at a 1.0 request that asked for keep-alive
    trailing: int = 0


class _Stop(Exception):
    pass


class _HttptoolsView:
    def __init__(self, stop_on_close: bool) -> None:
        self.msgs: list[Msg] = []
        self.cur: Msg | None = None
        self.stop_on_close = stop_on_close
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.cur = Msg(b"", b"", [], b"")

    def on_url(self, url: bytes) -> None:
        assert self.cur is not None
        self.cur.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.cur is not None
        self.cur.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        assert self.cur is not None
        self.cur.method = self.parser.get_method()
        self.cur.version = self.parser.get_http_version()
        self.cur.keep_alive = self.parser.should_keep_alive()
        self.headers_done = len(self.cur.headers)

    def on_body(self, body: bytes) -> None:
        assert self.cur is not None
        self.cur.body += body

    def on_message_complete(self) -> None:
        assert self.cur is not None
        cur, self.cur = self.cur, None
        del cur.headers[self.headers_done:]  # trailer fields are not part of the head
        self.msgs.append(cur)
        if self.stop_on_close and not cur.keep_alive:
            raise _Stop


def parse_httptools(data: bytes, stop_on_close: bool = True) -> Parsed:
    v = _HttptoolsView(stop_on_close)
    try:
        v.parser.feed_data(data)
    except httptools.HttpParserCallbackError as exc:
        if isinstance(exc.__context__, _Stop):
            return Parsed(v.msgs, "closed")
        return Parsed(v.msgs, "error", repr(exc))
    except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
        return Parsed(v.msgs, "error", repr(exc))
    return Parsed(v.msgs, "partial" if v.cur is not None else "idle")


def parse_h11(data: bytes) -> Parsed:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
    conn.receive_data(data)
    msgs: list[Msg] = []
    cur: Msg | None = None
    while True:
        try:
            ev = conn.next_event()
        except h11.RemoteProtocolError as exc:
            return Parsed(msgs, "error", repr(exc))
        if isinstance(ev, h11.Request):
            cur = Msg(ev.method, ev.target, [(k, v) for k, v in ev.headers.raw_items()], b"",
                      ev.http_version.decode())
            cur.headers = [(k.lower(), v) for k, v in cur.headers]
        elif isinstance(ev, h11.Data):
            assert cur is not None
            cur.body += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            assert cur is not None
            msgs.append(cur)
            try:  # 404: never accepts a CONNECT or an Upgrade, so h11 keeps parsing HTTP/1.1
                conn.send(h11.Response(status_code=404, headers=[("content-length", "0")]))
                conn.send(h11.EndOfMessage())
            except h11.LocalProtocolError as exc:
                return Parsed(msgs, "error", repr(exc))
            if conn.their_state is h11.MUST_CLOSE or conn.our_state is h11.MUST_CLOSE:
                ka = cur.version == "1.0" and any(
                    k == b"connection" and b"keep-alive" in v.lower() for k, v in cur.headers)
                return Parsed(msgs, "closed", h10_keepalive_stop=ka, trailing=len(conn.trailing_data[0]))
            conn.start_next_cycle()
            cur = None
        elif ev is h11.NEED_DATA:
            return Parsed(msgs, "partial" if cur is not None or conn.trailing_data[0] else "idle")
        else:  # PAUSED, ConnectionClosed: not expected without EOF
            return Parsed(msgs, "error", f"unexpected h11 event {ev!r}")


# ---- canonical framing ------------------------------------------------------------------------

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQ_LINE = re.compile(_TOKEN + rb" [!-~]+ HTTP/1\.1")
_HDR_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9a-z]+): ((?:[!-~](?:[\t -~]*[!-~])?)?)")
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade", b"http2-settings", b"expect"})
ADDED = frozenset({b"host", b"content-length", b"x-request-id", b"x-forwarded-for", b"x-forwarded-proto"})


def canonical_problems(head: bytes, body: bytes) -> list[str]:
    lines = head.split(b"\r\n")
    probs = []
    if not _REQ_LINE.fullmatch(lines[0]):
        probs.append(f"request line {lines[0][:80]!r}")
    names: Counter[bytes] = Counter()
    cl = None
    for line in lines[1:]:
        m = _HDR_LINE.fullmatch(line)
        if m is None:
            probs.append(f"header line {line[:80]!r}")
            continue
        names[m.group(1)] += 1
        if m.group(1) == b"content-length":
            cl = m.group(2)
    for n in HOP_BY_HOP:
        if names[n]:
            probs.append(f"hop-by-hop header {n!r}")
    if names[b"host"] != 1 or names[b"x-forwarded-for"] != 1:
        probs.append("Host / X-Forwarded-For not exactly once")
    if names[b"content-length"] > 1:
        probs.append("several Content-Length")
    if cl is None and body:
        probs.append("a body without Content-Length")
    if cl is not None and (not cl.isdigit() or int(cl) != len(body)):
        probs.append(f"Content-Length {cl!r} for a {len(body)}-byte body")
    return probs
