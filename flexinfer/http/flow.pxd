# The compiled build of flow.py: FlowControl as extension type (attributes in C
# slots, not dict lookups). The .py is the pure twin; every slot is a public object, so semantics and
# visibility are the source's. Keep each list equal to the class's __slots__ (tests/test_compiled.py).
cdef class FlowControl:
    cdef public object _drain_waiter, _listener, _transport, closed, read_paused, write, write_paused
    cpdef set_listener(self, listener)  # per relayed response, from a typed caller: a C call
