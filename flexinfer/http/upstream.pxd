# The compiled build of upstream.py: UpstreamResponse as extension type (attributes in C
# slots, not dict lookups). The .py is the pure twin; every slot is a public object, so semantics and
# visibility are the source's. Keep each list equal to the class's __slots__ (tests/test_compiled.py).
cdef class UpstreamResponse:
    cdef public object _attached, _batch, _buffered, _client_gone, _conn, _done_arg, _done_cb, _eof, _error
    cdef public object _high, _loop, _pieces, _relayed, _sink, _sink_error, _waiter, chunked, content_length
    cdef public object headers, status, tap
