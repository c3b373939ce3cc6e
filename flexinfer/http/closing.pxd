# The compiled build of closing.py: Closing as an extension type (attributes in C slots, not dict
# lookups). The .py is the pure twin; slots are public, so visibility is the source's. Declared: the
# class's __slots__, then the attributes it reads that HttpProtocol owns (its class annotations).
# tests/test_compiled.py keeps these lists equal to the source's.
# A slot declared with a type (cdef public <Type>) holds that type or None: the build refuses any
# other value (TypeError) where the source would take it; only that type is ever stored there.
from flexinfer.http.flow cimport FlowControl
from flexinfer.http.request cimport ResponseWriter

cdef class Closing:
    cdef public object _closing, _dl_kind, _final, _lingered, _rejected, deadline
    cdef public object _lost, _settings, _stats, _transport, loop
    cdef public ResponseWriter _active
    cdef public FlowControl flow
