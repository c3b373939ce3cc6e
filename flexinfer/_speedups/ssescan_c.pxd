# The declaration of ssescan_c's SseClock and its clock, for a module that cimports them: the
# compiled usage tap (flexinfer/proxy/usage.pxd) holds the clock as this type and calls feed per
# relayed read of a stream as a C method, reading ttft as a C field (a call and a lookup by name
# otherwise); the upstream connection stamps its reads with _now (client.pxd). The .pyx has the
# rest of the code; ssescan_py the pure twin.
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


# The clock of SseClock's stamps (= time.perf_counter() on Linux), here so that a cimporting module
# stamps with the same one (the upstream connection's read stamp, client.pxd).
cdef inline double _now() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9

cdef class SseClock:
    cdef public object bounds
    cdef public double t0, ttft, t_last, itl_sum
    cdef public long events
    cdef long _counts[64]
    cdef double _bounds[63]
    cdef int _nb
    cdef bint _open
    cpdef long feed(self, bytes buf) except -1
