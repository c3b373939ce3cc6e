# Cython declarations that compile request.py's classes as extension types (attributes in C
# slots, not dicts); the .py stays the pure twin. Every attribute is a public object: Python
# semantics and visibility as in the source.
cdef class Request:
    cdef public object body, content_type, ctx, headers, keep_alive, method, path, peer, query, target, version

cdef class ResponseWriter:
    cdef public object _callbacks, _cancel_task, _chunked, _close_delimited, _head_only, _pending_head
    cdef public object _proto, _remaining, _transport, _v10, disconnected, finished, flow, keep_alive
    cdef public object started, task
