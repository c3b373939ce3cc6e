# The compiled build of context.py: RequestContext, RequestIds as extension types (attributes in C
# slots, not dict lookups). The .py is the pure twin; every slot is public, so visibility is the
# source's (RequestIds' counter is a C integer: a request id is written in C, below). Keep each list
# equal to the class's __slots__ (tests/test_compiled.py).
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy

cdef class RequestContext:
    cdef public object authenticated, explain, extra_headers, key_id, model_name, path, request_id, route
    cdef public object source, sse_open, t0, tokens
    cdef public object completion_tokens, endpoint, prompt_tokens, queue_wait, strip_usage, ttft, usage

# RequestIds.new's id in one allocation: the prefix, then the counter as 16 lower-case hex digits
# (the source's b2a_hex of its 8 big-endian bytes)
ctypedef unsigned long long u64

cdef inline bytes _id_c(bytes prefix, u64 n):
    cdef Py_ssize_t p = PyBytes_GET_SIZE(prefix)
    out = PyBytes_FromStringAndSize(NULL, p + 16)
    cdef char* buf = PyBytes_AS_STRING(out)
    cdef const char* hexd = b"0123456789abcdef"
    memcpy(buf, PyBytes_AS_STRING(prefix), p)
    cdef int i = 16
    while i > 0:
        i -= 1
        buf[p + i] = hexd[n & 15]
        n >>= 4
    return out

cdef class RequestIds:
    cdef public object _prefix
    cdef public u64 _n
    @cython.locals(n=cython.ulonglong)
    cpdef bytes new(self)
