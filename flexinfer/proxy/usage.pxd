# The compiled build of usage.py: UsageTap as an extension type (its attributes in C slots, read
# once per upstream read of every stream). The .py is the pure twin; every slot is a public object,
# so semantics and visibility are the source's. Keep the list equal to the class's __slots__
# (tests/test_compiled.py).
cimport cython
from flexinfer.http.upstream cimport BodyTap

cdef long _KEEP, _WHOLE, _USAGE_OBJECT

# a BodyTap: the relay calls its observe as a C method per upstream read (upstream.pxd)
cdef class UsageTap(BodyTap):
    cdef public object _feed, _held, _mid, _parsed, _usage, charge, clock, stats, status, strip, stripped, t0, tail, ttft
    @cython.locals(scan=long)
    cpdef observe(self, buf, end)
    cpdef complete(self)
