"""A response body's framing, read by the proxy itself once httptools has read the head: the
reference twin of bodyframe_c.

Owns: :func:`head_end` (where a response head that arrived whole and names ``chunked`` ends, when
its line ends are all CRLF, so that the bytes after it are the body's and nothing else's) and :class:`ChunkedBody` (an
HTTP/1.1 chunked body, fed read by read: the payload each read carries, joined, and where the
message ends) and :class:`LengthBody` (the same for a Content-Length body, after a head the
connection read itself). The upstream connection (flexinfer/http/client.py) hands httptools the head alone and
the body to a :class:`ChunkedBody`: one call per read instead of httptools' callback per chunk (a
burst of 35 events is 35 callbacks), and one payload per read for the relay.
Rules (RFC 9112 section 7.1; where the framing is concerned, what llhttp accepts by default, checked
case by case in tests/speedups/test_bodyframe.py): a chunk size is hex digits (no sign, no
spaces, no ``0x``; leading zeros allowed; below 2**64), optionally followed by extensions (``;``
then any bytes but CR, LF and NUL: their content is not checked, unlike llhttp's, as it frames
nothing) up to CRLF; the data is followed by exactly CRLF; the last chunk (size 0) is followed by
trailer lines (a token, ``:``, a value without CR, LF or NUL, CRLF; dropped) and an empty line. A size line longer than
``max_line``, or trailers longer than ``max_line`` in all, is an error. Bytes after the end are not
part of the body: :attr:`ChunkedBody.extra` counts them (the connection is then never reused).
Must not: import anything of ours; accept a framing byte that is not the grammar's.
"""

from __future__ import annotations

__all__ = ["BodyFrame", "ChunkedBody", "FramingError", "LengthBody", "head_end"]

_HEX = {c: i for i, c in enumerate(b"0123456789abcdef")} | {c: 10 + i for i, c in enumerate(b"ABCDEF")}
#: the bytes of a token (RFC 9110 section 5.6.2): a trailer's name
TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

# states
(_SIZE0, _SIZE, _EXT, _SIZE_LF, _DATA, _DATA_CR, _DATA_LF, _TRAILER, _TRAILER_NAME, _TRAILER_LINE, _TRAILER_LF,
 _END_LF, _DONE) = range(13)


class FramingError(ValueError):
    """The body's framing is not HTTP/1.1 chunked framing (the message names the first fault)."""


def head_end(data: bytes) -> int:
    """The offset just after the first empty line (CRLF CRLF) of ``data`` when every LF before it
    follows a CR and the head before it names ``chunked`` (in any case, anywhere); else -1, and the
    caller leaves the whole read to its HTTP parser (which decides what the head says: this only
    picks the reads worth cutting, as a body of another framing is cheaper left to the parser)."""
    i = 0
    while True:
        j = data.find(b"\n", i)
        if j <= 0 or data[j - 1] != 13:
            return -1
        if j >= 3 and data[j - 2] == 10 and data[j - 3] == 13:
            return j + 1 if b"chunked" in data[:j].lower() else -1
        i = j + 1


class BodyFrame:
    """What the connection reads of either body reader: :meth:`feed` per read, then ``done`` (the
    body is complete) and ``extra`` (bytes after its end, in the read that ended it). The compiled
    twin's base type, which the compiled connection holds its reader as (bodyframe_c.pxd)."""

    __slots__ = ("done", "extra")

    def __init__(self) -> None:
        self.done = False
        self.extra = 0

    def feed(self, data: bytes) -> bytes:
        raise NotImplementedError


class ChunkedBody(BodyFrame):
    """One chunked body, fed by :meth:`feed` read by read (see the module docstring)."""

    __slots__ = ("_line", "_state", "left", "max_line")

    def __init__(self, max_line: int) -> None:
        super().__init__()  # done: the last chunk and the trailers' empty line are in; extra: bytes after it
        self.max_line = max_line
        self.left = 0  # data bytes of the current chunk still to come (its size, while reading the size line)
        self._state = _SIZE0
        self._line = 0  # bytes of the current size line, or of the trailers

    def feed(self, data: bytes) -> bytes:
        """The payload ``data`` carries (b"" for none); raises :class:`FramingError` on the first
        byte that breaks the framing (the state is then undefined: the body is dead)."""
        out: list[bytes] = []
        n = len(data)
        i = 0
        state = self._state
        while i < n:
            if state == _DATA:
                take = min(self.left, n - i)
                out.append(data[i:i + take])
                self.left -= take
                i += take
                if self.left == 0:
                    state = _DATA_CR
                continue
            if state == _DONE:
                self.extra = n - i
                break
            c = data[i]
            i += 1
            if state in (_SIZE0, _SIZE):
                d = _HEX.get(c)
                if d is not None:
                    if self.left >> 60:
                        raise FramingError("chunk size too large")
                    self.left = self.left * 16 + d
                    self._line += 1
                    if self._line > self.max_line:
                        raise FramingError("chunk size line too long")
                    state = _SIZE
                    continue
                if state == _SIZE0:
                    raise FramingError("invalid chunk size")
                if c == 13:
                    state = _SIZE_LF
                elif c == 59:  # ;
                    state = _EXT
                    self._line += 1
                else:
                    raise FramingError("invalid chunk size")
            elif state == _EXT:
                if c == 13:
                    state = _SIZE_LF
                elif c == 10 or c == 0:
                    raise FramingError("invalid chunk extension")
                else:
                    self._line += 1
                    if self._line > self.max_line:
                        raise FramingError("chunk size line too long")
            elif state == _SIZE_LF:
                if c != 10:
                    raise FramingError("invalid chunk size line end")
                self._line = 0
                state = _DATA if self.left else _TRAILER
            elif state == _DATA_CR:
                if c != 13:
                    raise FramingError("invalid chunk data end")
                state = _DATA_LF
            elif state == _DATA_LF:
                if c != 10:
                    raise FramingError("invalid chunk data end")
                state = _SIZE0
            elif state == _TRAILER:  # at the start of a trailer line, or of the final empty line
                if c == 13:
                    state = _END_LF
                elif c in TCHAR:
                    state = _TRAILER_NAME
                    self._line += 1
                else:
                    raise FramingError("invalid trailer")
            elif state == _TRAILER_NAME:
                if c == 58:  # :
                    state = _TRAILER_LINE
                elif c not in TCHAR:
                    raise FramingError("invalid trailer")
                self._line += 1
                if self._line > self.max_line:
                    raise FramingError("trailers too long")
            elif state == _TRAILER_LINE:
                if c == 13:
                    state = _TRAILER_LF
                elif c == 10 or c == 0:
                    raise FramingError("invalid trailer")
                else:
                    self._line += 1
                    if self._line > self.max_line:
                        raise FramingError("trailers too long")
            elif state == _TRAILER_LF:
                if c != 10:
                    raise FramingError("invalid trailer line end")
                state = _TRAILER
            else:  # _END_LF
                if c != 10:
                    raise FramingError("invalid end of the last chunk")
                state = _DONE
                self.done = True
        self._state = state
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)


class LengthBody(BodyFrame):
    """One body of ``length`` bytes (a Content-Length), fed by :meth:`feed` read by read, with the
    same surface as :class:`ChunkedBody` (``done``, ``extra``, ``left``), so that the connection reads
    both framings alike once it has read the head itself."""

    __slots__ = ("left",)

    def __init__(self, length: int) -> None:
        if length <= 0:
            raise ValueError("a LengthBody has at least one byte")
        super().__init__()
        self.left = length  # body bytes still to come

    def feed(self, data: bytes) -> bytes:
        """The body bytes ``data`` carries (all of it until the last one; the bytes after the end
        are counted in :attr:`extra`, not returned)."""
        if type(data) is not bytes:
            raise TypeError(f"feed() takes bytes, not {type(data).__name__}")
        n = len(data)
        left = self.left
        if n < left:
            self.left = left - n
            return data
        self.left = 0
        self.done = True
        self.extra = n - left
        return data if n == left else data[:left]
