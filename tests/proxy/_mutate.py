"""Seeded mutation operators for byte-level HTTP/1.1 request fuzzing (reliability plan §3.1, F2).

The operators re-implement, without copied code, the kinds of change http-garden's mutator makes:
byte edits that favour the bytes parsers disagree on, header insert/delete/replace (duplicate
Content-Length, Transfer-Encoding variants, obs-fold, ...), method replacement, request-boundary
edits (concatenate, split, duplicate, shift) and random TCP chunking of the send.

An input is built from a list of whole request messages (one seed); every operator takes and
returns such a list, so boundary operators can work on messages while byte and header operators
work inside one. Everything draws from the ``random.Random`` it is given: the same seed gives the
same inputs, byte for byte. No I/O here.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

Messages = list[bytes]

#: Bytes that parsers and proxies disagree on: line ends, whitespace, separators, NUL, NEL, NBSP.
FAVOURED = b"\r\n\t :;,\x00\x85\xa0"

#: Header lines an operator may insert or substitute (no CRLF: it is added around them).
HEADER_POOL: tuple[bytes, ...] = (
    b"Content-Length: 0",
    b"Content-Length: 1",
    b"Content-Length: 5",
    b"Content-Length: 40",
    b"Content-Length: +5",
    b"Content-Length: 5, 5",
    b"Content-Length : 5",
    b"Content-Length:\t5",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: Chunked",
    b"Transfer-Encoding: ,chunked",
    b"Transfer-Encoding: chunked, identity",
    b"Transfer-Encoding: identity",
    b"Transfer-Encoding: gzip, chunked",
    b"Transfer-Encoding:\r\n chunked",
    b"Transfer-Encoding: \x0bchunked",
    b"Transfer_Encoding: chunked",
    b"X-Folded: a\r\n b",
    b"X-Folded: a\r\n\tb",
    b" X-Leading: space",
    b"Host: b",
    b"Host: a",
    b"Connection: close",
    b"Connection: keep-alive",
    b"Connection: close, X-Model-ID",
    b"Keep-Alive: timeout=5",
    b"TE: trailers",
    b"Trailer: X-T",
    b"Upgrade: h2c",
    b"Expect: 100-continue",
    b"X-Model-ID: m",
    b"X-Model-ID: m2",
    b"X_Model_ID: m",
    b"X-Model-ID: m\rX-Evil: 1",
    b"Content-Type: application/json",
    b"Content-Type: text/plain",
    b"X-Forwarded-For: 6.6.6.6",
    b"X-Request-ID: fuzz-1",
    b"Proxy-Connection: keep-alive",
    b"X-A: \xa0b\x85",
    b"X-Empty:",
    b": no-name",
)

METHOD_POOL: tuple[bytes, ...] = (
    b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"CONNECT",
    b"PRI", b"get", b"Post", b"POST ", b" POST", b"P\x00ST", b"GE\tT", b"XPOST", b"",
    b"MKCOL", b"PROPFIND", b"QUERY", b"A" * 40,
)


def _favoured_byte(rng: random.Random) -> int:
    """A byte to write: three times in four one of FAVOURED, otherwise any byte."""
    if rng.random() < 0.75:
        return FAVOURED[rng.randrange(len(FAVOURED))]
    return rng.randrange(256)


def _pick_pos(rng: random.Random, data: bytes, end_inclusive: bool = False) -> int:
    """A position in ``data``; half the time next to a favoured byte already there (a line end,
    a colon, a space), where a change is most likely to move a parser's view of the framing."""
    n = len(data) + (1 if end_inclusive else 0)
    if n == 0:
        return 0
    if rng.random() < 0.5:
        spots = [i for i, b in enumerate(data) if b in FAVOURED]
        if spots:
            return min(n - 1, spots[rng.randrange(len(spots))] + rng.choice((0, 0, 1)))
    return rng.randrange(n)


def _one(rng: random.Random, msgs: Messages) -> int:
    """Index of the message an in-message operator edits."""
    return rng.randrange(len(msgs))


def byte_delete(rng: random.Random, msgs: Messages) -> Messages:
    """Delete one byte (favouring line ends, colons and whitespace)."""
    i = _one(rng, msgs)
    m = msgs[i]
    if not m:
        return msgs
    p = _pick_pos(rng, m)
    return [*msgs[:i], m[:p] + m[p + 1:], *msgs[i + 1:]]


def byte_replace(rng: random.Random, msgs: Messages) -> Messages:
    """Replace one byte with a favoured (CR, LF, HT, SP, ``:;,``, NUL, NEL, NBSP) or random byte."""
    i = _one(rng, msgs)
    m = msgs[i]
    if not m:
        return msgs
    p = _pick_pos(rng, m)
    return [*msgs[:i], m[:p] + bytes((_favoured_byte(rng),)) + m[p + 1:], *msgs[i + 1:]]


def byte_insert(rng: random.Random, msgs: Messages) -> Messages:
    """Insert one favoured or random byte."""
    i = _one(rng, msgs)
    m = msgs[i]
    p = _pick_pos(rng, m, end_inclusive=True)
    return [*msgs[:i], m[:p] + bytes((_favoured_byte(rng),)) + m[p:], *msgs[i + 1:]]


def _header_spans(m: bytes) -> list[tuple[int, int]]:
    """(start, end) of each header line of ``m`` (end excludes its CRLF); [] without a head."""
    head_end = m.find(b"\r\n\r\n")
    first = m.find(b"\r\n")
    if first < 0 or head_end < 0:
        return []
    spans = []
    pos = first + 2
    while pos < head_end + 2:
        nxt = m.find(b"\r\n", pos)
        spans.append((pos, nxt))
        pos = nxt + 2
    return spans


def header_insert(rng: random.Random, msgs: Messages) -> Messages:
    """Insert a header line from HEADER_POOL (or a copy of an existing one: a duplicate) at a
    random place in one message's header block."""
    i = _one(rng, msgs)
    m = msgs[i]
    spans = _header_spans(m)
    first = m.find(b"\r\n")
    if first < 0:
        return msgs
    if spans and rng.random() < 0.3:
        s, e = spans[rng.randrange(len(spans))]
        line = m[s:e]
    else:
        line = HEADER_POOL[rng.randrange(len(HEADER_POOL))]
    at = rng.choice([first + 2] + [e + 2 for _, e in spans])
    return [*msgs[:i], m[:at] + line + b"\r\n" + m[at:], *msgs[i + 1:]]


def _pick_header(rng: random.Random, msgs: Messages) -> tuple[int, bytes, int, int] | None:
    """(message index, message, start, end) of one random header line; None when it has none."""
    i = _one(rng, msgs)
    m = msgs[i]
    spans = _header_spans(m)
    if not spans:
        return None
    s, e = spans[rng.randrange(len(spans))]
    return i, m, s, e


def header_delete(rng: random.Random, msgs: Messages) -> Messages:
    """Delete one header line (Host, Content-Length, Transfer-Encoding, ... alike)."""
    picked = _pick_header(rng, msgs)
    if picked is None:
        return msgs
    i, m, s, e = picked
    return [*msgs[:i], m[:s] + m[e + 2:], *msgs[i + 1:]]


def header_replace(rng: random.Random, msgs: Messages) -> Messages:
    """Replace one header line by one from HEADER_POOL, or change its value's case or spacing."""
    picked = _pick_header(rng, msgs)
    if picked is None:
        return msgs
    i, m, s, e = picked
    line = m[s:e]
    r = rng.random()
    if r < 0.5:
        new = HEADER_POOL[rng.randrange(len(HEADER_POOL))]
    elif r < 0.7:
        new = line.upper()
    elif r < 0.85:
        name, _, value = line.partition(b":")
        new = name + b":" + rng.choice((b"", b" ", b"  ", b"\t")) + value.strip() + rng.choice((b"", b" ", b"\t"))
    else:
        name, _, value = line.partition(b":")
        new = name + rng.choice((b" :", b":\r\n ", b": \x00")) + value
    return [*msgs[:i], m[:s] + new + m[e:], *msgs[i + 1:]]


def method_replace(rng: random.Random, msgs: Messages) -> Messages:
    """Replace the method token of one request line by one from METHOD_POOL."""
    i = _one(rng, msgs)
    m = msgs[i]
    sp = m.find(b" ")
    if sp < 0:
        return msgs
    return [*msgs[:i], METHOD_POOL[rng.randrange(len(METHOD_POOL))] + m[sp:], *msgs[i + 1:]]


def concatenate(rng: random.Random, msgs: Messages, others: list[Messages]) -> Messages:
    """Append the messages of another seed (pipelining a second, different request)."""
    return [*msgs, *others[rng.randrange(len(others))]]


def duplicate(rng: random.Random, msgs: Messages) -> Messages:
    """Send one message twice in a row."""
    i = _one(rng, msgs)
    return [*msgs[: i + 1], msgs[i], *msgs[i + 1:]]


def split(rng: random.Random, msgs: Messages) -> Messages:
    """Cut one message in two at a random byte: the tail is dropped (a truncated request), or
    moved after the next message (request bytes out of order)."""
    i = _one(rng, msgs)
    m = msgs[i]
    if len(m) < 2:
        return msgs
    p = rng.randrange(1, len(m))
    if rng.random() < 0.5 or i + 1 >= len(msgs):
        return [*msgs[:i], m[:p], *msgs[i + 1:]]
    return [*msgs[:i], m[:p], msgs[i + 1], m[p:], *msgs[i + 2:]]


def shift(rng: random.Random, msgs: Messages) -> Messages:
    """Move the boundary between two neighbouring messages by a few bytes either way, so one
    message's declared length no longer matches where the next begins."""
    if len(msgs) < 2:
        i = _one(rng, msgs)
        m = msgs[i]
        k = rng.randrange(1, 8)
        # no neighbour: grow or shrink the tail (the body no longer matches its length)
        new = m[:-k] if rng.random() < 0.5 else m + b"\r\n\r\n0123456789"[:k]
        return [*msgs[:i], new, *msgs[i + 1:]]
    i = rng.randrange(len(msgs) - 1)
    a, b = msgs[i], msgs[i + 1]
    k = rng.randrange(1, 8)
    if rng.random() < 0.5:
        a, b = a[:-k], a[-k:] + b
    else:
        a, b = a + b[:k], b[k:]
    return [*msgs[:i], a, b, *msgs[i + 2:]]


def tcp_chunks(rng: random.Random, data: bytes) -> list[bytes]:
    """Random TCP chunking: the bytes as 1 to 6 writes cut at random places (a third of the time
    one of the cuts falls inside a CRLF)."""
    if len(data) < 2 or rng.random() < 0.3:
        return [data]
    cuts = set()
    for _ in range(rng.randrange(1, 6)):
        if rng.random() < 0.33:
            crlf = [j + 1 for j in range(len(data) - 1) if data[j:j + 2] == b"\r\n"]
            if crlf:
                cuts.add(crlf[rng.randrange(len(crlf))])
                continue
        cuts.add(rng.randrange(1, len(data)))
    points = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


IN_MESSAGE: tuple[Callable[[random.Random, Messages], Messages], ...] = (
    byte_delete, byte_replace, byte_insert, byte_insert,
    header_insert, header_insert, header_delete, header_replace, header_replace,
    method_replace, duplicate, split, shift,
)


def mutate(rng: random.Random, seeds: list[Messages]) -> tuple[bytes, list[bytes], str]:
    """One fuzz input: (bytes, the writes to send them in, names of the operators applied).

    One seed, then 1 to 4 operators (a tenth of inputs stay unmutated: the valid baseline)."""
    msgs = list(seeds[rng.randrange(len(seeds))])
    applied: list[str] = []
    if rng.random() >= 0.1:
        for _ in range(rng.choice((1, 1, 2, 2, 3, 4))):
            if rng.random() < 0.08:
                msgs = concatenate(rng, msgs, seeds)
                applied.append("concatenate")
                continue
            op = IN_MESSAGE[rng.randrange(len(IN_MESSAGE))]
            msgs = op(rng, msgs)
            applied.append(op.__name__)
    data = b"".join(msgs)
    return data, tcp_chunks(rng, data), "+".join(applied) or "seed"
