# cython: language_level=3, boundscheck=False, wraparound=False
"""One piece of a chunked body, framed, compiled: the twin of chunkframe_py.

Same results as :mod:`chunkframe_py`; anything but two ``bytes`` (a bytearray, a memoryview) is
framed by the twin's own expression, written here again because a compiled primitive imports nothing
of flexinfer, its twin included (tests/speedups/test_dispatch.py). One allocation of the exact size
and two copies instead of ``bytes % tuple`` (the format parser, a tuple, the hex formatting of an
int): about 830 instructions fewer per relayed read (bench/instr.py, paced streams).
Must not: import anything of ours.
"""

from libc.string cimport memcpy


cdef extern from "Python.h":
    char* PyBytes_AS_STRING(object)
    Py_ssize_t PyBytes_GET_SIZE(object)
    object PyBytes_FromStringAndSize(const char*, Py_ssize_t)


cdef const char* _HEX = b"0123456789abcdef"


cpdef bytes frame_chunk(prefix, data):
    """``prefix`` + the chunk that carries ``data`` (``data`` not empty: an empty chunk ends a body)."""
    if type(prefix) is not bytes or type(data) is not bytes:  # other bytes-likes: the twin's expression
        return b"%b%x\r\n%b\r\n" % (prefix, len(data), data)
    cdef Py_ssize_t p = PyBytes_GET_SIZE(prefix)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t digits = 1
    cdef size_t rest = (<size_t>n) >> 4
    while rest:
        digits += 1
        rest >>= 4
    out = PyBytes_FromStringAndSize(NULL, p + digits + n + 4)
    cdef char* buf = PyBytes_AS_STRING(out)
    if p:
        memcpy(buf, PyBytes_AS_STRING(prefix), p)
    buf += p
    rest = <size_t>n
    cdef Py_ssize_t i = digits
    while i > 0:
        i -= 1
        buf[i] = _HEX[rest & 15]
        rest >>= 4
    buf += digits
    buf[0] = 13
    buf[1] = 10
    memcpy(buf + 2, PyBytes_AS_STRING(data), n)
    buf += 2 + n
    buf[0] = 13
    buf[1] = 10
    return out
