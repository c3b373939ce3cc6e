# The compiled build of upstream.py: UpstreamResponse as extension type (attributes in C slots, not
# dict lookups). The .py is the pure twin; slots are public, so visibility is the source's. Keep the
# list equal to the class's __slots__ (tests/test_compiled.py).
# A slot declared with a type (cdef public <Type>) holds that type or None: the build refuses any
# other value (TypeError) where the source would take it; only that type is ever stored there.
# cpdef: the steps the connection (each read) and the forwarder call (a C call from a typed caller).
from flexinfer.http.flow cimport FlowControl
cimport flexinfer.http.request as _request_t  # a typed slot only (upstream.py imports ResponseWriter for typing only)

# cpdef: the request head every exchange writes (a C call from client.pxd's cimport); the .py says
# @cython.annotation_typing(False) (its list[...] and dict[...] annotations, flexinfer/_nocython.py).
cpdef bytes _checked(str value, dict cache, pattern)
cpdef bytes serialize_request(str method, str path, list headers, bytes body, bytes host_line)

# the observer of a relayed body: UpstreamResponse.tap is typed with it, so each read's observe is a
# C method call (a Python subclass that overrides observe is still called through its override)
cdef class BodyTap:
    cpdef observe(self, buf, end)
    cpdef complete(self)

cdef class UpstreamResponse:
    cdef public object _attached, _batch, _buffered, _client_gone, _conn, _done_arg, _done_cb, _eof, _error
    cdef public object _high, _loop, _pieces, _sink_error, _waiter, chunked, content_length
    # bytes relayed, added to per read: a C integer
    cdef public Py_ssize_t _relayed
    cdef public object headers, status
    cdef public BodyTap tap
    cdef public _request_t.ResponseWriter _sink
    cpdef on_body(self, bytes piece)
    cpdef on_read_end(self, bytes piece=*)
    cpdef on_complete(self)
    cpdef when_complete(self, cb, arg)
    cpdef start_relay(self, _request_t.ResponseWriter writer)
    cpdef Py_ssize_t relay_done(self, _request_t.ResponseWriter writer) except? -2
    cpdef Py_ssize_t _end_relay(self, _request_t.ResponseWriter writer, FlowControl flow) except? -2
    cpdef _feed(self, bytes buf, end)
    cpdef _tap_complete(self)
