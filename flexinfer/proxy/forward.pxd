# The compiled build of forward.py: the forwarder and the per-request head callback as extension
# types (their attributes in C slots, read on every request). The .py is the pure twin; every slot
# is a public object, so semantics and visibility are the source's. Keep each list equal to the
# class's __slots__ (tests/test_compiled.py).
# The cimports type the arguments and locals the .py annotates with these classes (an attribute is
# then a C struct read): the build refuses another type there (TypeError), the source would take
# it. So the .py imports each from the module that defines it (a cimported name is not a module
# global: a re-export from another module would be lost).
# The typed slots hold those classes (and Router, ProxyMetrics) or None; the build refuses others.
cimport cython
from flexinfer.http.request cimport Request, ResponseWriter
from flexinfer.http.upstream cimport UpstreamResponse
from flexinfer.proxy.context cimport RequestContext
from flexinfer.proxy.metrics cimport ModelStats, ProxyMetrics
from flexinfer.proxy.routing cimport Router

# cpdef: the module's functions and the forwarder's methods called per request (C calls within the
# build, the same functions from Python); the .py says @cython.annotation_typing(False) on those
# whose int, bool, str or list[...] annotations Cython would not match with these declarations
# (flexinfer/_nocython.py).
cpdef bytes _forwarded_for(str peer)
cpdef list upstream_headers(Request req, bytes request_id, bint drop_auth)
cpdef list downstream_headers(UpstreamResponse up, bytes request_id, list extra)
cpdef bint _is_sse(UpstreamResponse up)
cpdef _account(tap, RequestContext ctx, ModelStats stats)  # (UsageTap not cimported: tests replace it)

cdef class Forwarder:
    cdef public object _explain, _release, disagg, pools, retries, settings, tracer
    cdef public ProxyMetrics metrics
    cdef public Router router
    cpdef _decided(self, Request req, view, ep, str strategy, str source)
    cpdef _outcome(self, view, ep, ok, kind)
    cpdef bint _answer(self, UpstreamResponse up, ResponseWriter resp, RequestContext ctx, ep, str strategy,
                       str source, ModelStats stats)

cdef class _Begin:
    cdef public object ep, source, strategy
    cdef public Forwarder fwd
    cdef public ResponseWriter resp
    cdef public RequestContext ctx
    cdef public ModelStats stats
    cdef public UpstreamResponse up
