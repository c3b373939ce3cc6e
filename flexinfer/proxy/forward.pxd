# The compiled build of forward.py: the forwarder and the per-request head callback as extension
# types (their attributes in C slots, read on every request). The .py is the pure twin; every slot
# is a public object, so semantics and visibility are the source's. Keep each list equal to the
# class's __slots__ (tests/test_compiled.py).
cdef class Forwarder:
    cdef public object _explain, disagg, metrics, pools, retries, router, settings, tracer

cdef class _Begin:
    cdef public object ctx, ep, fwd, resp, source, stats, strategy, up
