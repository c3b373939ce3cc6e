# The compiled build of pipeline.py: the proxy's handler as an extension type (its attributes in C
# slots, read on every request; a __dict__ for what a wrapper or a test sets on the instance:
# tracing and the access log replace handle/on_headers there). The .py is the pure twin; every slot
# is a public object, so semantics and visibility are the source's. Keep the list equal to the
# class's __slots__ (tests/test_compiled.py).
# The cimports type the arguments and locals the .py annotates with these classes (forward.pxd says
# what that changes).
from flexinfer.http.request cimport Request, ResponseWriter
from flexinfer.proxy.context cimport RequestContext, RequestIds
from flexinfer.proxy.metrics cimport ProxyMetrics
from flexinfer.proxy.extract cimport body_model, normalize_path, parse_json_counted, rewrite_model, route_path

cdef class ProxyHandler:
    cdef dict __dict__
    cdef public object _ask_usage, _key_ids, _open, access_log, activator, admin, auth, forwarder, inventory
    cdef public object limiter, pools, router, scaler, server, settings, token_counter
    cdef public object token_limiter, tracer
    cdef public ProxyMetrics metrics
    cdef public RequestIds request_ids
    cpdef _authenticate(self, Request req, RequestContext ctx)
    cpdef bint _is_draining(self)
