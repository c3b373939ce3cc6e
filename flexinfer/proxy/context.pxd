# The compiled build of context.py: RequestContext, RequestIds as extension types (attributes in C
# slots, not dict lookups). The .py is the pure twin; every slot is a public object, so semantics and
# visibility are the source's. Keep each list equal to the class's __slots__ (tests/test_compiled.py).
cdef class RequestContext:
    cdef public object authenticated, explain, extra_headers, key_id, model_name, path, request_id, route
    cdef public object source, sse_open, t0, tokens
    cdef public object completion_tokens, endpoint, prompt_tokens, queue_wait, strip_usage, ttft, usage

cdef class RequestIds:
    cdef public object _next, _prefix
