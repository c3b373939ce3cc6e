# The compiled build of request.py: Request, ResponseWriter as extension types (attributes in C
# slots, not dict lookups). The .py is the pure twin; slots are public, so visibility is the source's.
# Keep each list equal to the class's __slots__ (tests/test_compiled.py).
# A slot declared with a type (cdef public <Type>) holds that type or None: the build refuses any
# other value (TypeError) where the source would take it; only that type is ever stored there.
# cpdef: methods the request path calls on a typed writer (a C call there, a method from Python);
# the .py says @cython.annotation_typing(False) on those whose int or list[...] annotations Cython
# would not match with these declarations (flexinfer/_nocython.py).
# Py_ssize_t: a byte count kept as a C integer (only ints are stored there; an add per write is C
# arithmetic). cython.locals types write's length local so that add stays C (annotated "int" in the
# .py it would be a Python int: boxed, added, unboxed).
cimport cython
from flexinfer.http.flow cimport FlowControl
from flexinfer.http.responses cimport status_line
from flexinfer._speedups.chunkframe_c cimport frame_chunk as _frame_chunk_c  # per relayed read: a C call

cdef Py_ssize_t _JOIN_BELOW
cdef bytes _framed(bytes prefix, bytes data)

cdef class Request:
    cdef public object body, content_type, ctx, headers, keep_alive, method, path, peer, query, target, version
    cpdef get(self, name, default=*)

cdef class ResponseWriter:
    cdef public object _callbacks, _cancel_task, _chunked, _close_delimited, _head_only, _pending_head
    cdef public object _proto, _remaining, _transport, _v10, client_abort, disconnected, finished
    cdef public FlowControl flow
    cdef public object keep_alive, req, started, status, task
    cdef public Py_ssize_t sent
    @cython.locals(n=Py_ssize_t)
    cpdef write(self, bytes data)
    cpdef end(self)
    cpdef bytes _build_head(self, status, headers, bytes framing)
    cpdef start(self, status, headers, content_length=*)
    cpdef cancel_on_disconnect(self)
    cpdef on_disconnect(self, cb)
