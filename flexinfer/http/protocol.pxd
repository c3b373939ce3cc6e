# The compiled build of protocol.py: HttpProtocol as an extension type (attributes in C slots, not
# dict lookups). The .py is the pure twin; slots are public, so visibility is the source's. Declared:
# its __slots__ less those its base Closing declares (closing.pxd). tests/test_compiled.py keeps
# these lists equal to the source's.
# A slot declared with a type (cdef public <Type>) holds that type or None: the build refuses any
# other value (TypeError) where the source would take it; only that type is ever stored there.
# cpdef: the methods it calls on itself per request (a C call there, a method from Python). Cython
# refuses the declaration against a def whose arguments are annotated int or list[...]: those defs
# say @cython.annotation_typing(False) in the .py (flexinfer/_nocython.py), so that their untyped
# declarations here match.
cimport cython
from flexinfer.http.closing cimport Closing
from flexinfer.http.head cimport plain_connection, read_headers, request_line
cimport flexinfer.http.request as _request_t  # typed slots only: the .py re-exports Request, ResponseWriter

cdef class HttpProtocol(Closing):
    cdef public object _body_len, _body_limit, _body_parts, _cb_exc, _chunk_mark, _chunk_min, _chunk_slice_min
    cdef public object _continue, _feed_len, _handler, _head_limit, _headers, _length, _max_hdr_bytes
    cdef public object _max_headers, _max_url, _parser, _peer, _pending, _phase, _queue, _raw, _server
    cdef public object _tail, _url, _url_len, _version, _write_wait
    cdef public bint _plain_body
    cdef public _request_t.Request _req
    cpdef _reset_message(self)
    cpdef _next(self)
    cpdef _start(self, req)
    @cython.locals(n=Py_ssize_t, pos=Py_ssize_t, end=Py_ssize_t, i=Py_ssize_t)
    cpdef _feed(self, data)
    cpdef _feed_slice(self, data, phase)
    cpdef _admit(self, ctype, length)
    @cython.locals(path=bytes, query=bytes)
    cpdef _new_request(self, method, url, version, headers, ctype, keep_alive)
    @cython.locals(stop=Py_ssize_t, length=Py_ssize_t, keep_alive=int, raw=list, conn=bytes, fields=tuple)
    cpdef Py_ssize_t _take_plain(self, data, Py_ssize_t pos, Py_ssize_t end) except? -2
    cpdef _plain_piece(self, piece)
    cpdef bint _message_done(self, req) except -1
    cpdef _arm_body(self, length, limit, expect)
