# The declaration of ssescan_c's SseClock, for a module that cimports it: the compiled usage tap
# (flexinfer/proxy/usage.pxd) holds the clock as this type and calls feed per relayed read of a
# stream as a C method, reading ttft as a C field (a call and a lookup by name otherwise). The .pyx
# has the code; ssescan_py the pure twin.

cdef class SseClock:
    cdef public object bounds
    cdef public double t0, ttft, t_last, itl_sum
    cdef public long events
    cdef long _counts[64]
    cdef double _bounds[63]
    cdef int _nb
    cdef bint _open
    cpdef long feed(self, bytes buf) except -1
