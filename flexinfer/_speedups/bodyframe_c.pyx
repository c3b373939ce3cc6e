# cython: language_level=3, boundscheck=False, wraparound=False
"""A response body's framing, read by the proxy itself, compiled: the twin of bodyframe_py.

Same results as :mod:`bodyframe_py` (its docstring has the rules). One pass over a read with
``memchr`` for the head's line ends and ``memcpy`` for chunk data; a read's payload is one bytes
object, allocated once at the read's size and shrunk to the payload's.
Must not: import anything of ours.
"""

from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.string cimport memchr, memcpy


cdef extern from "Python.h":
    char* PyBytes_AS_STRING(object)
    Py_ssize_t PyBytes_GET_SIZE(object)
    object PyBytes_FromStringAndSize(const char*, Py_ssize_t)
    int _PyBytes_Resize(PyObject**, Py_ssize_t) except -1


class FramingError(ValueError):
    """The body's framing is not HTTP/1.1 chunked framing (the message names the first fault)."""


cdef bint _names_chunked(const char* buf, Py_ssize_t n):
    """Whether ``chunked`` is in buf[:n], in any case: memchr finds each ``c`` and ``C``."""
    cdef const char* word = b"chunked"
    cdef const char* end = buf + n - 6  # the last place a match can start, plus one
    cdef const char* p
    cdef int first, k
    for first in (99, 67):
        p = buf
        while p < end:
            p = <const char*>memchr(p, first, end - p)
            if p == NULL:
                break
            k = 1
            while k < 7 and (p[k] | 0x20) == word[k]:
                k += 1
            if k == 7:
                return True
            p += 1
    return False


def head_end(bytes data not None):
    """The offset just after the first empty line (CRLF CRLF) of ``data`` when every LF before it
    follows a CR and the head before it names ``chunked``; else -1 (see bodyframe_py)."""
    cdef const char* buf = PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef const char* p = buf
    cdef const char* hit
    cdef Py_ssize_t j
    while True:
        hit = <const char*>memchr(p, 10, n - (p - buf))
        if hit == NULL:
            return -1
        j = hit - buf
        if j == 0 or buf[j - 1] != 13:
            return -1
        if j >= 3 and buf[j - 2] == 10 and buf[j - 3] == 13:
            return j + 1 if _names_chunked(buf, j) else -1
        p = hit + 1


cdef enum:
    _SIZE0 = 0
    _SIZE
    _EXT
    _SIZE_LF
    _DATA
    _DATA_CR
    _DATA_LF
    _TRAILER
    _TRAILER_NAME
    _TRAILER_LINE
    _TRAILER_LF
    _END_LF
    _DONE


cdef inline int _hex(unsigned char c):
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


cdef bint _TCHAR[256]
cdef bytes _TOKEN = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
cdef Py_ssize_t _k
for _k in range(256):
    _TCHAR[_k] = False
for _k in range(len(_TOKEN)):
    _TCHAR[<unsigned char>_TOKEN[_k]] = True


cdef class BodyFrame:
    """What the connection reads of either body reader (see bodyframe_py): ``feed``, ``done``,
    ``extra`` (fields and method declared in bodyframe_c.pxd, so a cimporting module calls and reads
    them in C)."""

    cpdef bytes feed(self, bytes data):
        raise NotImplementedError


cdef class ChunkedBody(BodyFrame):
    """One chunked body, fed by :meth:`feed` read by read (see bodyframe_py)."""

    def __init__(self, Py_ssize_t max_line):
        self.max_line = max_line
        self.done = False
        self.extra = 0
        self.left = 0
        self._state = _SIZE0
        self._line = 0

    cpdef bytes feed(self, bytes data):
        """The payload ``data`` carries (b"" for none); raises FramingError on the first byte that
        breaks the framing."""
        if data is None:
            raise TypeError("feed() takes bytes, not NoneType")
        cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t i = 0
        cdef Py_ssize_t take
        cdef Py_ssize_t got = 0  # payload bytes so far
        cdef Py_ssize_t first = -1  # offset of the only payload span, while there is one
        cdef int spans = 0
        cdef int state = self._state
        cdef int d
        cdef unsigned char c
        cdef object out = None
        cdef char* dst = NULL
        cdef PyObject* raw
        try:
            while i < n:
                if state == _DATA:
                    take = n - i
                    if <unsigned long long>take > self.left:
                        take = <Py_ssize_t>self.left
                    if spans == 0:
                        first = i
                    elif spans == 1:  # a second span: the payload is copied into one buffer
                        out = PyBytes_FromStringAndSize(NULL, n)
                        dst = PyBytes_AS_STRING(out)
                        memcpy(dst, buf + first, got)
                    if spans >= 1:
                        memcpy(dst + got, buf + i, take)
                    spans += 1
                    got += take
                    self.left -= <unsigned long long>take
                    i += take
                    if self.left == 0:
                        state = _DATA_CR
                    continue
                if state == _DONE:
                    self.extra = n - i
                    break
                c = buf[i]
                i += 1
                if state == _SIZE0 or state == _SIZE:
                    d = _hex(c)
                    if d >= 0:
                        if self.left >> 60:
                            raise FramingError("chunk size too large")
                        self.left = self.left * 16 + <unsigned long long>d
                        self._line += 1
                        if self._line > self.max_line:
                            raise FramingError("chunk size line too long")
                        state = _SIZE
                        continue
                    if state == _SIZE0:
                        raise FramingError("invalid chunk size")
                    if c == 13:
                        state = _SIZE_LF
                    elif c == 59:
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
                elif state == _TRAILER:
                    if c == 13:
                        state = _END_LF
                    elif _TCHAR[c]:
                        state = _TRAILER_NAME
                        self._line += 1
                    else:
                        raise FramingError("invalid trailer")
                elif state == _TRAILER_NAME:
                    if c == 58:
                        state = _TRAILER_LINE
                    elif not _TCHAR[c]:
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
        finally:
            self._state = state
        if spans == 0:
            return b""
        if spans == 1:
            if first == 0 and got == n:
                return data
            return PyBytes_FromStringAndSize(<const char*>buf + first, got)
        raw = <PyObject*>out
        Py_INCREF(out)
        out = None  # the one reference left is raw's: _PyBytes_Resize needs the only one
        _PyBytes_Resize(&raw, got)  # shrinks in place (or raises, the object freed)
        result = <object>raw  # a second reference ...
        Py_DECREF(result)  # ... and raw's given up: result holds the only one
        return result


cdef class LengthBody(BodyFrame):
    """One body of ``length`` bytes, fed read by read (see bodyframe_py): the same surface as
    ChunkedBody."""

    def __init__(self, Py_ssize_t length):
        if length <= 0:
            raise ValueError("a LengthBody has at least one byte")
        self.done = False
        self.extra = 0
        self.left = length

    cpdef bytes feed(self, bytes data):
        """The body bytes ``data`` carries (see bodyframe_py)."""
        if data is None:
            raise TypeError("feed() takes bytes, not NoneType")
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t left = self.left
        if n < left:
            self.left = left - n
            return data
        self.left = 0
        self.done = True
        self.extra = n - left
        return data if n == left else data[:left]
