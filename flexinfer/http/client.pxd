# The compiled build of client.py: the upstream connection and its pool as extension types (their
# attributes in C slots: every parsed header, every checkout and checkin reads them). The .py is the
# pure twin; slots are public, so visibility is the source's. Keep each list equal to the class's
# __slots__ (tests/test_compiled.py).
# A slot declared with a type (cdef public <Type>) holds that type or None: the build refuses any
# other value (TypeError) where the source would take it; only that type is ever stored there.
# cpdef: the methods called per request on a typed connection or pool (a C call there, a method from
# Python); those with int, float or list[...] annotations say @cython.annotation_typing(False) in the
# .py, so that the untyped declarations here match (flexinfer/_nocython.py).
cimport cython
from flexinfer.http.head cimport plain_connection
cimport flexinfer.http.upstream as _upstream_t  # a typed slot only: the .py re-exports UpstreamResponse
from flexinfer.http.upstream cimport serialize_request  # (so the .py does not re-export it)
from flexinfer._speedups.bodyframe_c cimport BodyFrame as _BodyFrame_t  # the body reader: feed, done, extra in C
# _rx_clock's C clock (the .py calls it under cython.compiled): CLOCK_MONOTONIC, as time.monotonic()
from flexinfer._speedups.ssescan_c cimport _now as _monotonic_c
cdef double _rx_clock() noexcept

@cython.locals(cl=object, chunked=bint, name=bytes, value=bytes)
cpdef tuple _framing(list headers)

cdef class _Compiled:
    pass

cdef class UpstreamPool

cdef class _Conn(_Compiled):
    cdef public object _time, broken, checked_out, close_delimited, cut, expect_response, hdr_bytes
    cdef public _BodyFrame_t framing
    cdef public object head_due
    cdef public list headers
    cdef public object head_only, head_raw, idle_since, idle_watch, in_head, interim, keep_alive
    cdef public double last_rx  # the read clock (_rx_clock) per read: a C double
    cdef public object loop, lost, msg_done, on_head, parser, paused, poller, reused
    cdef public UpstreamPool pool
    cdef public _upstream_t.UpstreamResponse resp
    cdef public object timer, timer_at, transport, waiter
    cpdef exchange(self, head, body, timeout, head_only, on_head=*)
    cpdef _arm(self, due)
    @cython.locals(size=Py_ssize_t, end=Py_ssize_t, keep_alive=int, conn=bytes, name=bytes, value=bytes, got=tuple,
                   headers=list)
    cpdef Py_ssize_t _take_head(self, data) except? -2
    cpdef _head_in(self, status, cl, chunked, keep_alive, own_body)
    cpdef _cancel_timer(self)
    cpdef _finish(self)
    cpdef pause_reading(self)
    cpdef resume_reading(self)

cdef class UpstreamPool:
    cdef public list _idle
    cdef public object _closed, _host_line, _name, _settings, _sni, _ssl, _sweep_handle, active, host
    cdef public object port
    cdef public object _read_high, _response_timeout
    cdef public Py_ssize_t _head_max, _max_idle
    cdef public double _stream_idle, _pool_idle, _check_after
    cpdef _take_idle(self)
    cpdef _checkin(self, _Conn conn)
    cpdef _forget(self, _Conn conn)
