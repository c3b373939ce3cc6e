# cython: language_level=3, boundscheck=False, wraparound=False
"""The raw scan of a JSON request body for its ``model`` key, compiled: the twin of keyscan_py.

Same results as :mod:`keyscan_py`. It jumps between the rare bytes with ``memchr`` (``"`` for the
literal key, ``\\`` for the escapes) instead of running a substring search over every byte, so a
220 KB prompt of prose costs a few microseconds, not the ~130 us of ``bytes.count``. Must not:
parse JSON or import anything of ours.
"""

from libc.string cimport memchr, memcmp


cdef extern from "Python.h":
    char* PyBytes_AS_STRING(object)
    Py_ssize_t PyBytes_GET_SIZE(object)


def model_key_scan(bytes body not None):
    """(occurrences of ``"model"``, offset of the first or -1, whether ``\\u006`` occurs) in ``body``."""
    cdef const char* buf = PyBytes_AS_STRING(body)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
    cdef const char* p = buf
    cdef const char* end = buf + n
    cdef const char* hit
    cdef Py_ssize_t count = 0
    cdef Py_ssize_t first = -1
    cdef bint escaped = False
    while p + 7 <= end:
        hit = <const char*>memchr(p, 34, end - p - 6)  # '"', with room for the 6 bytes after it
        if hit == NULL:
            break
        if hit[1] == 109 and memcmp(hit + 1, b"model\"", 6) == 0:  # 'm' first: most quotes end there
            if count == 0:
                first = hit - buf
            count += 1
            p = hit + 7  # like bytes.count: occurrences do not overlap
        else:
            p = hit + 1
    p = buf
    while p + 5 <= end:
        hit = <const char*>memchr(p, 92, end - p - 4)  # '\\', with room for "u006" after it
        if hit == NULL:
            break
        if hit[1] == 117 and memcmp(hit + 1, b"u006", 4) == 0:  # 'u' first
            escaped = True
            break
        p = hit + 1
    return count, first, escaped
