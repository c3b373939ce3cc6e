# The compiled build of usage.py: UsageTap as an extension type (its attributes in C slots, read
# once per upstream read of every stream). The .py is the pure twin; every slot is a public object,
# so semantics and visibility are the source's. Keep the list equal to the class's __slots__
# (tests/test_compiled.py).
cimport cython

cdef long _KEEP, _WHOLE, _USAGE_OBJECT

cdef class UsageTap:
    cdef public object _held, _mid, _parsed, _usage, clock, stats, status, strip, stripped, t0, tail, ttft
    @cython.locals(scan=long)
    cpdef _read(self, pieces, end)
