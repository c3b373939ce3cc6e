# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
# distutils: extra_compile_args = -ffp-contract=off
"""Token buckets and a bounded keyed registry of them: the compiled twin of ``tokenbucket_py``.

Owns: the same API with bit-identical float results (see ``tokenbucket_py`` for the spec;
``-ffp-contract=off`` keeps ``tokens + dt * rate`` and ``n - rate * GRACE`` from being
fused into FMAs, which would round differently from Python). State is C doubles; an
admitted ``take`` allocates nothing; the registry keeps its LRU order in an intrusive list
(no OrderedDict). With the default clock on Linux, ``time.monotonic`` is read in C (same
value, no Python call). Must not: import anything from flexinfer, sleep, or log.
"""

cimport cython
from cpython.dict cimport PyDict_GetItemWithError
from cpython.number cimport PyNumber_Index
from cpython.object cimport PyObject
from libc.math cimport INFINITY

import time

__all__ = ["EVICTION_SCAN", "GRACE", "BucketRegistry", "TokenBucket"]

cdef double _GRACE = 1e-6
GRACE = _GRACE  # seconds; see tokenbucket_py

cdef enum:
    _EVICTION_SCAN = 8
EVICTION_SCAN = _EVICTION_SCAN  # how many of the oldest buckets a full registry checks for a full one

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX

cdef extern from *:
    """
    /* time.monotonic() without the Python call: on Linux CPython reads CLOCK_MONOTONIC as
       integer nanoseconds and converts them to seconds exactly like this, so the value is the
       one time.monotonic() would have returned at that instant. Elsewhere: not available. */
    #if defined(__linux__)
    #include <time.h>
    #include <stdint.h>
    static int fi_monotonic(double *out) {
        struct timespec ts;
        int64_t ns;
        volatile double d;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return -1;
        ns = (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
        if (ns % 1000000000 == 0) {
            d = (double)(ns / 1000000000);
        } else {
            d = (double)ns;
            d /= 1e9;
        }
        *out = d;
        return 0;
    }
    #define FI_HAVE_MONOTONIC 1
    #else
    static int fi_monotonic(double *out) { (void)out; return -1; }
    #define FI_HAVE_MONOTONIC 0
    #endif
    """
    int fi_monotonic(double* out) nogil
    const int FI_HAVE_MONOTONIC

# the clock is time.monotonic: read it in C (see fi_monotonic), else call it
cdef inline double _now(object clock, bint fast) except? -1.0:
    cdef double t
    if fast and fi_monotonic(&t) == 0:
        return t
    return clock()

# ``now`` if given, else the clock
cdef inline double _at(object now, object clock, bint fast) except? -1.0:
    if now is None:
        return _now(clock, fast)
    return now

cdef object _ZERO = 0.0  # the "admitted" answer, shared
cdef object _INF = float("inf")


cdef tuple _check_params(object rate, object burst):
    cdef double r = rate
    cdef double b = burst
    if not (0.0 <= r < INFINITY):
        raise ValueError("rate must be finite and >= 0")
    if not (0.0 < b < INFINITY):
        raise ValueError("burst must be finite and > 0")
    return r, b


cdef inline double _refilled(double tokens, double last, double rate, double burst, double t) noexcept:
    if t > last:
        tokens = tokens + (t - last) * rate
        if tokens > burst:
            tokens = burst
    return tokens


# ``take`` on one bucket's state (``tokens``, ``last``), updated in place (see tokenbucket_py's spec)
cdef inline object _take(double* tokens, double* last, double rate, double burst, double n, double t):
    cdef double have = _refilled(tokens[0], last[0], rate, burst, t)
    if t > last[0]:
        last[0] = t
    if have >= n - rate * _GRACE:
        have = have - n
        tokens[0] = have if have > 0.0 else 0.0
        return _ZERO
    tokens[0] = have
    if n > burst or rate == 0.0:
        return _INF
    return (n - have) / rate


@cython.final
cdef class TokenBucket:
    """One token bucket (compiled)."""

    cdef double _rate
    cdef double _burst
    cdef double _tokens
    cdef double _last
    cdef object _clock
    cdef bint _fast

    def __init__(self, rate, burst, clock=time.monotonic, now=None):
        self._rate, self._burst = _check_params(rate, burst)
        self._clock = clock
        self._fast = FI_HAVE_MONOTONIC and clock is time.monotonic
        self._tokens = self._burst
        self._last = clock() if now is None else now

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> float:
        return self._burst

    @property
    def tokens(self) -> float:
        """Tokens as of the last update (no refill applied)."""
        return self._tokens

    @property
    def last(self) -> float:
        """Clock reading of the last refill."""
        return self._last

    def take(self, double n=1.0, now=None):
        """Take ``n`` tokens: 0.0 when admitted, else the seconds to wait (nothing taken)."""
        if not n >= 0.0:
            raise ValueError("n must be >= 0")
        return _take(&self._tokens, &self._last, self._rate, self._burst, n, _at(now, self._clock, self._fast))

    def available(self, now=None) -> float:
        """Tokens that would be available at ``now``; changes nothing."""
        return _refilled(self._tokens, self._last, self._rate, self._burst, _at(now, self._clock, self._fast))


@cython.final
@cython.no_gc
cdef class _Entry:
    """One key's bucket state and its links in the registry's LRU list (links are borrowed:
    the registry's dict owns every entry)."""

    cdef double tokens
    cdef double last
    cdef object key
    cdef PyObject* prev
    cdef PyObject* next


@cython.final
cdef class BucketRegistry:
    """Keyed token buckets with bounded size and idle eviction (compiled)."""

    cdef double _rate
    cdef double _burst
    cdef double _idle_ttl
    cdef Py_ssize_t _max_keys
    cdef object _clock
    cdef bint _fast
    cdef dict _map
    cdef PyObject* _head  # least recently used
    cdef PyObject* _tail  # most recently used

    def __cinit__(self, *args, **kwargs):
        self._map = {}
        self._head = NULL
        self._tail = NULL

    def __init__(self, rate, burst, max_keys=10000, idle_ttl=300.0, clock=time.monotonic):
        cdef double ttl
        self._rate, self._burst = _check_params(rate, burst)
        mk = PyNumber_Index(max_keys)
        if mk < 1:
            raise ValueError("max_keys must be >= 1")
        ttl = idle_ttl
        if not ttl > 0.0:
            raise ValueError("idle_ttl must be > 0")
        self._max_keys = mk if mk < PY_SSIZE_T_MAX else PY_SSIZE_T_MAX
        self._idle_ttl = ttl
        self._clock = clock
        self._fast = FI_HAVE_MONOTONIC and clock is time.monotonic
        self.clear()

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> float:
        return self._burst

    @property
    def max_keys(self) -> int:
        return self._max_keys

    @property
    def idle_ttl(self) -> float:
        return self._idle_ttl

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key) -> bool:
        return key in self._map

    def keys(self) -> list:
        """Keys from least to most recently used."""
        cdef list out = []
        cdef PyObject* p = self._head
        while p != NULL:
            out.append((<_Entry>p).key)
            p = (<_Entry>p).next
        return out

    def clear(self) -> None:
        self._head = NULL
        self._tail = NULL
        self._map.clear()

    cdef inline void _unlink(self, _Entry e) noexcept:
        if e.prev != NULL:
            (<_Entry>e.prev).next = e.next
        else:
            self._head = e.next
        if e.next != NULL:
            (<_Entry>e.next).prev = e.prev
        else:
            self._tail = e.prev
        e.prev = NULL
        e.next = NULL

    cdef inline void _append(self, _Entry e) noexcept:
        e.prev = self._tail
        e.next = NULL
        if self._tail != NULL:
            (<_Entry>self._tail).next = <PyObject*>e
        else:
            self._head = <PyObject*>e
        self._tail = <PyObject*>e

    cdef int _drop(self, PyObject* p) except -1:
        cdef _Entry e = <_Entry>p
        self._unlink(e)
        del self._map[e.key]
        return 0

    cdef int _make_room(self, double t) except -1:
        cdef _Entry e
        cdef PyObject* p
        cdef int i
        while self._head != NULL:
            e = <_Entry>self._head
            if t - e.last >= self._idle_ttl or _refilled(e.tokens, e.last, self._rate, self._burst, t) >= self._burst:
                self._drop(self._head)
            else:
                break
        if len(self._map) >= self._max_keys:
            p = self._head  # LRU, unless one of the next oldest is full
            i = 0
            while p != NULL and i < _EVICTION_SCAN:
                e = <_Entry>p
                if _refilled(e.tokens, e.last, self._rate, self._burst, t) >= self._burst:
                    break
                p = e.next
                i += 1
            self._drop(p if p != NULL and i < _EVICTION_SCAN else self._head)
        return 0

    def take(self, key, double n=1.0, now=None):
        """``TokenBucket.take`` on ``key``'s bucket (created full when new)."""
        cdef double t
        cdef _Entry e
        cdef PyObject* item
        if not n >= 0.0:
            raise ValueError("n must be >= 0")
        t = _at(now, self._clock, self._fast)
        item = PyDict_GetItemWithError(self._map, key)
        if item == NULL:
            self._make_room(t)
            e = _Entry.__new__(_Entry)
            e.tokens = self._burst
            e.last = t
            e.key = key
            self._map[key] = e
            self._append(e)
        else:
            e = <_Entry>item
            if item != self._tail:
                self._unlink(e)
                self._append(e)
        return _take(&e.tokens, &e.last, self._rate, self._burst, n, t)

    def available(self, key, now=None) -> float:
        """Tokens ``key`` would have at ``now`` (burst for an unknown key); changes nothing."""
        cdef double t = _at(now, self._clock, self._fast)
        cdef PyObject* item = PyDict_GetItemWithError(self._map, key)
        if item == NULL:
            return self._burst
        return _refilled((<_Entry>item).tokens, (<_Entry>item).last, self._rate, self._burst, t)
