# The compiled build of forward.py: the forwarder and the per-request head callback as extension
# types (their attributes in C slots, read on every request). The .py is the pure twin; every slot
# is a public object, so semantics and visibility are the source's. Keep each list equal to the
# class's __slots__ (tests/test_compiled.py).
# The cimports type the arguments and locals the .py annotates with these classes (an attribute is
# then a C struct read): the build refuses another type there (TypeError), the source would take
# it. So the .py imports each from the module that defines it (a cimported name is not a module
# global: a re-export from another module would be lost).
from flexinfer.http.request cimport Request, ResponseWriter
from flexinfer.http.upstream cimport UpstreamResponse
from flexinfer.proxy.context cimport RequestContext
from flexinfer.proxy.metrics cimport ModelStats

cdef class Forwarder:
    cdef public object _explain, disagg, metrics, pools, retries, router, settings, tracer

cdef class _Begin:
    cdef public object ctx, ep, fwd, resp, source, stats, strategy, up
