# The compiled build of protocol.py: HttpProtocol as an extension type (attributes in C slots, not
# dict lookups). The .py is the pure twin; every attribute is a public object, so semantics and
# visibility are the source's. Declared: its __slots__ less those its base Closing declares
# (closing.pxd). tests/test_compiled.py keeps these lists equal to the source's.
from flexinfer.http.closing cimport Closing

cdef class HttpProtocol(Closing):
    cdef public object _body_len, _body_limit, _body_parts, _cb_exc, _chunk_mark, _chunk_min, _chunk_slice_min
    cdef public object _continue, _feed_len, _handler, _head_limit, _headers, _length, _max_hdr_bytes
    cdef public object _max_headers, _max_url, _parser, _peer, _pending, _phase, _queue, _raw, _req, _server
    cdef public object _tail, _url, _url_len, _write_wait
