# The compiled build of metrics.py: the per-request numbers (a model's and an endpoint's series)
# and the proxy's metrics tables as extension types (their attributes in C slots, written by every
# request; ProxyMetrics keeps a __dict__ for its other metrics). The .py is the pure
# twin; every slot is a public object, so semantics and visibility are the source's. Keep each list
# equal to the class's __slots__ (tests/test_compiled.py).
# cpdef: the per-request calls of the forwarder (model, endpoint, count, decided, observe_*): C calls
# from its typed slots (count and decided say @cython.annotation_typing(False) in the .py: Cython
# would not match their int annotation with these declarations). The dict slots: their
# get and set are C dict operations.

cimport cython

@cython.locals(i=Py_ssize_t, b=double)
cpdef Py_ssize_t _latency_bucket(double seconds)

cdef class EndpointStats:
    cdef public object created, duration_sum
    cdef public list duration
    cpdef observe_duration(self, double seconds)

cdef class ModelStats(EndpointStats):
    cdef public object completion_tokens, in_flight, itl_sum, prompt_tokens, ttfb_sum, ttft_sum
    cdef public list itl, ttfb, ttft
    cpdef observe_ttfb(self, double seconds)

cdef class Tally:
    cdef public object created, labels
    cdef public Py_ssize_t n

cdef class ProxyMetrics:
    cdef dict __dict__
    cdef public dict _decisions, _endpoints, _models, _requests
    cpdef ModelStats model(self, str model)
    cpdef EndpointStats endpoint(self, str model, str endpoint)
    @cython.locals(codes=dict, tally=Tally)
    cpdef count(self, str model, code)
    @cython.locals(strategies=dict, sources=dict, tally=Tally)
    cpdef decided(self, str model, str strategy, str source)
