# The compiled build of closing.py: Closing as an extension type (attributes in C slots, not dict
# lookups). The .py is the pure twin; every attribute is a public object, so semantics and visibility
# are the source's. Declared: the class's __slots__, then the attributes it reads that HttpProtocol
# owns (its class annotations). tests/test_compiled.py keeps these lists equal to the source's.
cdef class Closing:
    cdef public object _closing, _dl_kind, _final, _lingered, _rejected, deadline
    cdef public object _active, _lost, _settings, _stats, _transport, flow, loop
