# The compiled build of request.py: Request, ResponseWriter as extension types (attributes in C
# slots, not dict lookups). The .py is the pure twin; every slot is a public object, so semantics and
# visibility are the source's. Keep each list equal to the class's __slots__ (tests/test_compiled.py).
cdef class Request:
    cdef public object body, content_type, ctx, headers, keep_alive, method, path, peer, query, target, version

cdef class ResponseWriter:
    cdef public object _callbacks, _cancel_task, _chunked, _close_delimited, _head_only, _pending_head
    cdef public object _proto, _remaining, _transport, _v10, client_abort, disconnected, finished, flow
    cdef public object keep_alive, sent, started, status, task
