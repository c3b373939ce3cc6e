# The compiled build of client.py: the upstream connection and its pool as extension types (their
# attributes in C slots: every parsed header, every checkout and checkin reads them). The .py is the
# pure twin; every slot is a public object, so semantics and visibility are the source's. Keep each
# list equal to the class's __slots__ (tests/test_compiled.py).
cdef class _Compiled:
    pass

cdef class _Conn(_Compiled):
    cdef public object broken, checked_out, chunks, close_delimited, cut, expect_response, hdr_bytes, head_due
    cdef public object head_only, head_raw, headers, idle_since, idle_watch, in_head, interim, keep_alive, last_rx
    cdef public object loop, lost, msg_done, on_head, parser, paused, poller, pool, resp, reused, rx
    cdef public object timer, timer_at, transport, waiter

cdef class UpstreamPool:
    cdef public object _closed, _host_line, _idle, _name, _settings, _sni, _ssl, _sweep_handle, active, host
    cdef public object port
