# The compiled build of routing.py: the router and a model's routing state as extension types
# (their attributes in C slots, read by every pick, acquire and release; the router keeps a
# __dict__ for the rest). The .py is the pure twin; every slot is a public object, so semantics
# and visibility are the source's. Keep each list equal to the class's __slots__ (tests/test_compiled.py).
# cpdef: acquire and release, called per request from the forwarder's typed slot; pick stays def
# (a cpdef cannot hold its generator expressions).

cdef class _ModelState:
    cdef public object by_key, endpoints, eng, eng_at, eng_keys, keys, ring, ring_nodes, rr, sched, sched_view
    cdef public object wrr

cdef class Router:
    cdef dict __dict__
    cdef public object _last_model, _models, _picks, _schedulers, ejector, engine_last, engine_state, load
    cdef public object prefixes, scheduler_errors
    cpdef acquire(self, ep)
    cpdef release(self, ep)
