# cython: language_level=3, boundscheck=False, wraparound=False
"""The framing check of an HTTP head we wrote, compiled: the twin of headscan_py.

Same results as :mod:`headscan_py`. Three ``memchr`` walks (NUL, LF, CR) that stop as soon as the
count is past ``lines``, instead of two ``bytes.count`` calls (each a method call that parses its
arguments as a tuple: about 1,700 instructions of the proxy's per-request work apiece, for a
300-byte head). Must not: import anything of ours.
"""

from libc.string cimport memchr


cdef extern from "Python.h":
    char* PyBytes_AS_STRING(object)
    Py_ssize_t PyBytes_GET_SIZE(object)


cdef Py_ssize_t _count(const char* buf, Py_ssize_t n, int byte, Py_ssize_t stop):
    """Occurrences of ``byte`` in ``buf[:n]``; stops counting once past ``stop``."""
    cdef const char* p = buf
    cdef const char* end = buf + n
    cdef const char* hit
    cdef Py_ssize_t count = 0
    while p < end:
        hit = <const char*>memchr(p, byte, end - p)
        if hit == NULL:
            break
        count += 1
        if count > stop:
            break
        p = hit + 1
    return count


def head_lines_ok(bytes head not None, Py_ssize_t lines):
    """Whether ``head`` holds exactly ``lines`` CR and ``lines`` LF bytes and no NUL."""
    cdef const char* buf = PyBytes_AS_STRING(head)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(head)
    if memchr(buf, 0, n) != NULL:
        return False
    return _count(buf, n, 10, lines) == lines and _count(buf, n, 13, lines) == lines
