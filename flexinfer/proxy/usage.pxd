# The compiled build of usage.py: UsageTap as an extension type (its attributes in C slots, read
# once per upstream read of every stream). The .py is the pure twin; every slot is a public object,
# so semantics and visibility are the source's. Keep the list equal to the class's __slots__
# (tests/test_compiled.py).
cimport cython
from flexinfer.http.upstream cimport BodyTap
from flexinfer._speedups.ssescan_c cimport SseClock as _SseClock_t  # feed per read: a C method call

cdef long _KEEP, _WHOLE, _USAGE_OBJECT

# a BodyTap: the relay calls its observe as a C method per upstream read (upstream.pxd)
cdef class UsageTap(BodyTap):
    cdef public object _held, _parsed, _usage, charge, stats, status, stripped, t0, tail
    cdef public bint _mid, strip  # tested per read: C flags
    cdef public double ttft  # compared per read: a C double
    cdef public _SseClock_t clock
    @cython.locals(scan=long, clock=_SseClock_t)
    cpdef observe(self, buf, end)
    cpdef complete(self)
