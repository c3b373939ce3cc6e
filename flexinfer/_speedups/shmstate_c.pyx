# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
# distutils: extra_compile_args = -ffp-contract=off
"""State shared by the forked worker processes of one machine: the compiled twin of ``shmstate_py``.

Owns: the same ``SharedBuckets`` / ``SharedCounts`` / ``SharedPrefixes`` API, buffer layout and
results (see ``shmstate_py`` for the spec). Read-modify-writes of shared words are GCC/Clang
``__atomic`` operations on 8-byte aligned words (CAS loops for TATs and slot claims, plain
atomic loads and stores for the single-writer counters and the prefix hints), so the ``lock``
argument is accepted and ignored. ``-ffp-contract=off`` keeps ``n * 1e9 / rate`` and
``burst - ahead * rate / 1e9`` rounded exactly as Python rounds them. With ``now_ns=None`` the
clock is ``clock_gettime(CLOCK_MONOTONIC)`` read in C (on Linux the value ``time.monotonic_ns()``
returns). On a known key, an admitted ``take``, ``acquire`` and ``release`` allocate nothing
(one dict lookup, one compare of the slot's hash word, then one CAS or one load and store).
Must not: import anything from flexinfer, allocate shared memory, sleep, or log.
"""

cimport cython
from cpython cimport array
from cpython.object cimport Py_SIZE
from cpython.buffer cimport PyBUF_FULL_RO, PyBuffer_IsContiguous, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError
from cpython.long cimport PyLong_AsLongAndOverflow, PyLong_AsSsize_t
from cpython.number cimport PyNumber_Index
from cpython.object cimport PyObject
from libc.math cimport INFINITY
from libc.stdint cimport int8_t, int64_t, uint16_t, uint64_t, uintptr_t
from libc.string cimport memset
from libc.stdlib cimport free, malloc

import time

__all__ = [
    "MAX_NS",
    "PROBE",
    "WAYS",
    "SharedBuckets",
    "SharedCounts",
    "SharedPrefixes",
    "TableFull",
    "key_hash",
]

cdef enum:
    _PROBE = 16
    _WAYS = 8

PROBE = _PROBE  # slots probed per key
WAYS = _WAYS  # entries per prefix set (one 64-byte cache line)
cdef int64_t _MAX_NS = (<int64_t>1) << 61
MAX_NS = _MAX_NS  # exclusive bound of now_ns and of burst / rate in ns
cdef double _MAX_NS_F = <double>_MAX_NS
cdef object _ZERO = 0.0  # the "admitted" answer, shared
cdef object _INF = float("inf")
cdef uint64_t _TAG = ~(<uint64_t>0xFFFF)  # the stored bits of a block hash

cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    #include <time.h>

    /* shared words: every access is an __atomic one on an 8-byte aligned word */
    static inline uint64_t fi_ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline int64_t fi_ldi(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline uint64_t fi_ld_relaxed(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    static inline int64_t fi_ldi_relaxed(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    static inline void fi_st_relaxed(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
    static inline void fi_sti_relaxed(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
    /* compare-and-swap; on failure *expected becomes the value found */
    static inline int fi_cas(uint64_t *p, uint64_t *expected, uint64_t desired) {
        return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    static inline int fi_casi(int64_t *p, int64_t *expected, int64_t desired) {
        return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }

    /* a + b + c, evaluated as Python would (exactly); 1 when the result is outside int64 */
    static inline int fi_add3(int64_t a, int64_t b, int64_t c, int64_t *out) {
    #ifdef __SIZEOF_INT128__
        __int128 x = (__int128)a + b + c;
        if (x < INT64_MIN || x > INT64_MAX) return 1;
        *out = (int64_t)x;
        return 0;
    #else
        int64_t t;
        if (__builtin_add_overflow(a, b, &t)) return 1;
        return __builtin_add_overflow(t, c, out);
    #endif
    }

    /* FNV-1a 64; 0 becomes 1 (0 marks an empty slot) */
    static inline uint64_t fi_fnv1a(const unsigned char *p, size_t n) {
        uint64_t h = 0xCBF29CE484222325ULL;
        while (n--) { h ^= *p++; h *= 0x100000001B3ULL; }
        return h ? h : 1;
    }

    /* time.monotonic_ns() without the Python call: on Linux CPython reads CLOCK_MONOTONIC */
    #if defined(__linux__)
    static int fi_monotonic_ns(int64_t *out) {
        struct timespec ts;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return -1;
        *out = (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
        return 0;
    }
    #else
    static int fi_monotonic_ns(int64_t *out) { (void)out; return -1; }
    #endif
    """
    uint64_t fi_ld(const uint64_t* p) nogil
    int64_t fi_ldi(const int64_t* p) nogil
    uint64_t fi_ld_relaxed(const uint64_t* p) nogil
    int __builtin_ctzll(unsigned long long x) nogil
    int64_t fi_ldi_relaxed(const int64_t* p) nogil
    void fi_st_relaxed(uint64_t* p, uint64_t v) nogil
    void fi_sti_relaxed(int64_t* p, int64_t v) nogil
    bint fi_cas(uint64_t* p, uint64_t* expected, uint64_t desired) nogil
    bint fi_casi(int64_t* p, int64_t* expected, int64_t desired) nogil
    bint fi_add3(int64_t a, int64_t b, int64_t c, int64_t* out) nogil
    uint64_t fi_fnv1a(const unsigned char* p, size_t n) nogil
    int fi_monotonic_ns(int64_t* out) nogil

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL
    PyObject* PyList_GET_ITEM(object o, Py_ssize_t i)
    Py_ssize_t PyList_GET_SIZE(object o)
    PyObject* PyTuple_GET_ITEM(object o, Py_ssize_t i)


class TableFull(Exception):
    """No slot could be found or claimed for a key."""


cdef uint64_t _key_hash(object key) except 0:  # key: a str (or subclass), checked by the caller
    cdef Py_ssize_t n
    cdef const char* p
    if PyUnicode_IS_COMPACT_ASCII(key):
        return fi_fnv1a(<const unsigned char*>PyUnicode_DATA(key), <size_t>PyUnicode_GET_LENGTH(key))
    try:
        p = PyUnicode_AsUTF8AndSize(key, &n)
    except UnicodeEncodeError:  # lone surrogates: encode them like the reference does
        b = key.encode("utf-8", "surrogatepass")
        return fi_fnv1a(<const unsigned char*>PyBytes_AS_STRING(b), <size_t>PyBytes_GET_SIZE(b))
    return fi_fnv1a(<const unsigned char*>p, <size_t>n)


def key_hash(key) -> int:
    """FNV-1a 64 of ``key``'s UTF-8 (surrogatepass); never 0 (0 marks an empty slot)."""
    if not isinstance(key, str):
        raise TypeError(f"a key must be a str, not {type(key).__name__}")
    return _key_hash(key)


cdef inline int _check_key(object key) except -1:
    if not isinstance(key, str):
        raise TypeError(f"a key must be a str, not {type(key).__name__}")
    return 0


cdef Py_ssize_t _count(object x, str name, Py_ssize_t low) except -1:
    v = PyNumber_Index(x)
    if v < low:
        raise ValueError(f"{name} must be >= {low}")
    if v > (<Py_ssize_t>1 << 40):
        raise ValueError(f"{name} is too large")
    return v


cdef int64_t _now(object now_ns) except -1:
    cdef int64_t v
    if now_ns is None:
        if fi_monotonic_ns(&v) == 0:
            return v
        return time.monotonic_ns()
    if type(now_ns) is not int:
        now_ns = PyNumber_Index(now_ns)
    try:
        v = now_ns
    except OverflowError:
        raise ValueError("now_ns must be in [0, 2**61)") from None
    if v < 0 or v >= _MAX_NS:
        raise ValueError("now_ns must be in [0, 2**61)")
    return v


cdef inline int _limits(double rate, double burst) except -1:
    if not (0.0 < rate < INFINITY):
        raise ValueError("rate must be finite and > 0")
    if not (0.0 < burst < INFINITY):
        raise ValueError("burst must be finite and > 0")
    return 0


# take a buffer view: writable, C-contiguous, at least nbytes, 8-byte aligned
cdef int _attach(Py_buffer* view, object buf, Py_ssize_t nbytes) except -1:
    PyObject_GetBuffer(buf, view, PyBUF_FULL_RO)
    if view.readonly:
        PyBuffer_Release(view)
        raise TypeError("the buffer must be writable")
    if not PyBuffer_IsContiguous(view, b'C'):
        PyBuffer_Release(view)
        raise ValueError("the buffer must be C-contiguous")
    if view.len < nbytes:
        n = view.len
        PyBuffer_Release(view)
        raise ValueError(f"the buffer has {n} bytes, {nbytes} needed")
    if (<uintptr_t>view.buf) & 7:
        PyBuffer_Release(view)
        raise ValueError("the buffer must be 8-byte aligned")
    return 0


cdef class _Table:
    """Key hashes in a buffer, and this process's validated ``key -> slot`` records."""

    cdef Py_buffer _view
    cdef uint64_t* _w         # the buffer's words; NULL when closed
    cdef Py_ssize_t _slots
    cdef Py_ssize_t _stride   # words per slot; slot s's hash is _w[s * _stride]
    cdef Py_ssize_t _probe
    cdef dict _cache          # key -> slot, valid while the hash word == _expect[slot]
    cdef list _owner          # slot -> the key cached there, or None
    cdef uint64_t* _expect

    def __cinit__(self, *args, **kwargs):
        self._w = NULL
        self._expect = NULL
        self._cache = {}
        self._owner = []

    def __dealloc__(self):
        if self._w != NULL:
            PyBuffer_Release(&self._view)
        free(self._expect)

    cdef int _open(self, object buf, Py_ssize_t slots, Py_ssize_t stride, Py_ssize_t nbytes) except -1:
        self.close()
        _attach(&self._view, buf, nbytes)
        free(self._expect)
        self._expect = <uint64_t*>malloc(<size_t>slots * sizeof(uint64_t))
        if self._expect == NULL:
            PyBuffer_Release(&self._view)
            raise MemoryError()
        for s in range(slots):
            self._expect[s] = 0
        self._w = <uint64_t*>self._view.buf
        self._slots = slots
        self._stride = stride
        self._probe = _PROBE if slots > _PROBE else slots
        self._cache = {}
        self._owner = [None] * slots
        return 0

    cdef inline int _check(self) except -1:
        if self._w == NULL:
            raise ValueError("operation on a closed table")
        return 0

    @property
    def slots(self) -> int:
        return self._slots

    def __len__(self) -> int:
        """Slots in use."""
        cdef Py_ssize_t s, n = 0
        self._check()
        for s in range(self._slots):
            if fi_ld_relaxed(&self._w[s * self._stride]) != 0:
                n += 1
        return n

    def close(self) -> None:
        """Release the buffer; the object is unusable afterwards."""
        if self._w != NULL:
            self._w = NULL
            PyBuffer_Release(&self._view)

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        self.close()

    # the key's validated cached slot, or -1
    cdef inline Py_ssize_t _cached(self, object key) except -2:
        cdef PyObject* item = PyDict_GetItemWithError(self._cache, key)
        cdef Py_ssize_t s
        if item == NULL:
            return -1
        s = PyLong_AsSsize_t(<object>item)
        if fi_ld(&self._w[s * self._stride]) == self._expect[s]:
            return s
        return -1

    # the slot holding h, or -1; reads only (stops at the first empty slot)
    cdef Py_ssize_t _find(self, uint64_t h) noexcept:
        cdef Py_ssize_t s = <Py_ssize_t>(h % <uint64_t>self._slots)
        cdef Py_ssize_t i
        cdef uint64_t v
        for i in range(self._probe):
            v = fi_ld(&self._w[s * self._stride])
            if v == h:
                return s
            if v == 0:
                return -1
            s = s + 1 if s + 1 < self._slots else 0
        return -1

    cdef Py_ssize_t _lookup(self, object key) except -2:
        cdef Py_ssize_t s = self._cached(key)
        if s >= 0:
            return s
        return self._find(_key_hash(key))

    cdef bint _reclaimable(self, Py_ssize_t s, int64_t arg) noexcept:
        return False

    # the slot for h: its own, else the first empty one (CAS 0 -> h), else the first
    # reclaimable one (CAS old -> h); TableFull when none
    cdef Py_ssize_t _claim(self, uint64_t h, int64_t arg) except -1:
        cdef Py_ssize_t start = <Py_ssize_t>(h % <uint64_t>self._slots)
        cdef Py_ssize_t s = start
        cdef Py_ssize_t i, j
        cdef uint64_t v
        cdef uint64_t* p
        for i in range(self._probe):
            p = &self._w[s * self._stride]
            v = fi_ld(p)
            if v == h:
                return s
            if v == 0:
                if fi_cas(p, &v, h) or v == h:  # a lost race: the winner may have claimed it for h
                    return s
            s = s + 1 if s + 1 < self._slots else 0
        s = start
        for i in range(self._probe):
            p = &self._w[s * self._stride]
            v = fi_ld(p)
            if v == h:
                return s
            if self._reclaimable(s, arg):
                if fi_cas(p, &v, h):
                    # another process may have reclaimed an earlier slot for h meanwhile:
                    # the first slot holding h is the key's
                    j = start
                    while j != s:
                        if fi_ld(&self._w[j * self._stride]) == h:
                            return j
                        j = j + 1 if j + 1 < self._slots else 0
                    return s
                if v == h:
                    return s
            s = s + 1 if s + 1 < self._slots else 0
        raise TableFull(f"no free slot among {self._probe} for this key")

    # record key at s (dropping its stale record and any other key's record at s)
    cdef int _remember(self, object key, uint64_t h, Py_ssize_t s) except -1:
        cdef PyObject* item = PyDict_GetItemWithError(self._cache, key)
        if item != NULL:
            prev = <object>item
            if prev != s:
                self._owner[prev] = None
        old = self._owner[s]
        if old is not None and old != key:
            del self._cache[old]
        self._owner[s] = key
        self._expect[s] = h
        self._cache[key] = s
        return 0


@cython.final
cdef class SharedBuckets(_Table):
    """GCRA rate-limit buckets by key in a shared buffer (compiled; see shmstate_py)."""

    def __init__(self, buf, slots, lock=None):
        cdef Py_ssize_t n = _count(slots, "slots", 1)
        self._open(buf, n, 2, 16 * n)

    @staticmethod
    def size(slots) -> int:
        """Bytes used by ``slots`` buckets."""
        return 16 * _count(slots, "slots", 1)

    cdef bint _reclaimable(self, Py_ssize_t s, int64_t arg) noexcept:
        return fi_ldi(<int64_t*>&self._w[2 * s + 1]) <= arg

    cdef inline Py_ssize_t _slot(self, object key, int64_t now) except -1:
        cdef Py_ssize_t s = self._cached(key)
        cdef uint64_t h
        if s < 0:
            h = _key_hash(key)
            s = self._claim(h, now)
            self._remember(key, h, s)
        return s

    def take(self, key, double rate, double burst, double n=1.0, now_ns=None):
        """Charge ``n`` to ``key``: 0.0 when admitted, else the seconds to wait (nothing charged)."""
        cdef double tol_f
        cdef int64_t now, cost, tol, tat, new
        cdef int64_t* p
        _limits(rate, burst)
        if not n >= 0.0:
            raise ValueError("n must be >= 0")
        tol_f = burst * 1e9 / rate
        if not tol_f < _MAX_NS_F:
            raise ValueError("burst / rate must be under 2**61 ns")
        now = _now(now_ns)
        if n > burst:
            return _INF
        _check_key(key)
        cost = <int64_t>(n * 1e9 / rate)
        tol = <int64_t>tol_f
        self._check()
        p = <int64_t*>&self._w[2 * self._slot(key, now) + 1]
        tat = fi_ldi(p)
        while True:
            new = (tat if tat > now else now) + cost
            if new - now > tol:
                return <double>(new - now - tol) / 1e9
            if fi_casi(p, &tat, new):  # else tat is the value another process stored: retry
                return _ZERO

    def charge(self, key, double rate, double burst, double n, now_ns=None):
        """Charge ``n`` (may be negative) to ``key`` without an admission check: the debt wait."""
        cdef double tol_f, cap_f, c
        cdef int64_t now, cost, tol, cap, tat, ahead, new
        cdef int64_t* p
        _limits(rate, burst)
        if not -INFINITY < n < INFINITY:
            raise ValueError("n must be finite")
        tol_f = burst * 1e9 / rate
        if not tol_f < _MAX_NS_F:
            raise ValueError("burst / rate must be under 2**61 ns")
        now = _now(now_ns)
        _check_key(key)
        tol = <int64_t>tol_f
        cap = 2 * tol
        cap_f = 2.0 * tol_f
        c = n * 1e9 / rate
        if c > cap_f:
            c = cap_f
        elif c < -cap_f:
            c = -cap_f
        cost = <int64_t>c
        self._check()
        p = <int64_t*>&self._w[2 * self._slot(key, now) + 1]
        tat = fi_ldi(p)
        while True:
            ahead = tat - now if tat > now else 0
            if ahead > cap:
                ahead = cap
            new = ahead + cost
            if new < 0:
                new = 0
            elif new > cap:
                new = cap
            if new == 0 and tat <= now:
                break
            if fi_casi(p, &tat, now + new):  # else tat is the value another process stored: retry
                break
        return <double>(new - tol) / 1e9 if new > tol else _ZERO

    def available(self, key, double rate, double burst, now_ns=None) -> float:
        """Tokens ``key`` has at ``now_ns`` (``burst`` when unknown); changes nothing."""
        cdef int64_t now, tat, ahead
        cdef Py_ssize_t s
        cdef double x
        _limits(rate, burst)
        now = _now(now_ns)
        _check_key(key)
        self._check()
        s = self._lookup(key)
        if s < 0:
            return burst
        tat = fi_ldi(<int64_t*>&self._w[2 * s + 1])
        ahead = tat - now if tat > now else 0
        x = burst - <double>ahead * rate / 1e9
        return x if x > 0.0 else 0.0


@cython.final
cdef class SharedCounts(_Table):
    """In-flight counts by key, one row per worker, in a shared buffer (compiled; see shmstate_py)."""

    cdef Py_ssize_t _workers
    cdef Py_ssize_t _worker
    cdef int64_t* _counts     # row w, slot s: _counts[w * _slots + s]
    cdef int64_t* _row        # this worker's row

    def __init__(self, buf, slots, workers, worker, lock=None):
        cdef Py_ssize_t n = _count(slots, "slots", 1)
        cdef Py_ssize_t k = _count(workers, "workers", 1)
        w = PyNumber_Index(worker)
        if not 0 <= w < k:
            raise ValueError("worker must be in [0, workers)")
        self._open(buf, n, 1, 8 * n * (1 + k))
        self._workers = k
        self._worker = w
        self._counts = <int64_t*>(self._w + n)
        self._row = self._counts + self._worker * n

    @staticmethod
    def size(slots, workers) -> int:
        """Bytes used by ``slots`` keys counted by ``workers`` workers."""
        return 8 * _count(slots, "slots", 1) * (1 + _count(workers, "workers", 1))

    @property
    def workers(self) -> int:
        return self._workers

    @property
    def worker(self) -> int:
        return self._worker

    cdef inline int64_t _sum(self, Py_ssize_t s) noexcept:
        cdef uint64_t total = 0  # unsigned: wraps instead of overflowing (counters stay small)
        cdef Py_ssize_t w
        for w in range(self._workers):
            total += <uint64_t>fi_ldi_relaxed(&self._counts[w * self._slots + s])
        return <int64_t>total

    cdef bint _reclaimable(self, Py_ssize_t s, int64_t arg) noexcept:
        return self._sum(s) == 0

    # this worker's counter of key += delta: the hot path is a dict hit, one compare, one store
    cdef inline int _add(self, object key, int64_t delta) except -1:
        cdef Py_ssize_t s
        cdef int64_t v
        self._check()
        s = self._cached(key)
        if s >= 0:
            if fi_add3(fi_ldi_relaxed(&self._row[s]), delta, 0, &v):
                raise OverflowError("a counter must stay within int64")
            fi_sti_relaxed(&self._row[s], v)
            return 0
        _check_key(key)
        return self._add_slow(key, delta)

    # add when key has no valid record: move a stale count of it along, claim its slot, then
    # move along a stale count of another key found there, at most _slots times (see shmstate_py)
    cdef int _add_slow(self, object key, int64_t delta) except -1:
        cdef int64_t* row = self._row
        cdef int64_t carry
        cdef int64_t moved
        cdef int64_t v
        cdef Py_ssize_t s
        cdef Py_ssize_t moves = 0
        cdef uint64_t h
        cdef PyObject* item
        while True:
            carry = 0
            moved = 0
            item = PyDict_GetItemWithError(self._cache, key)
            if item != NULL:  # its slot was reclaimed: its count there goes with it
                s = PyLong_AsSsize_t(<object>item)
                carry = fi_ldi_relaxed(&row[s])
                fi_sti_relaxed(&row[s], 0)
                del self._cache[key]
                self._owner[s] = None
            h = _key_hash(key)
            try:
                s = self._claim(h, 0)
            except TableFull:
                if moves:
                    return 0  # no room for the moved count: it is dropped (see shmstate_py)
                raise
            other = self._owner[s]
            if other is not None and other != key:
                if self._expect[s] != h:  # another key's count, made before the slot was reclaimed
                    moved = fi_ldi_relaxed(&row[s])
                    fi_sti_relaxed(&row[s], 0)
                # (else the two keys have one hash, hence one counter: it stays)
                del self._cache[other]
            self._owner[s] = key
            self._expect[s] = h
            self._cache[key] = s
            if fi_add3(fi_ldi_relaxed(&row[s]), carry, delta, &v):
                raise OverflowError("a counter must stay within int64")
            fi_sti_relaxed(&row[s], v)
            if moved == 0 or other is None or moves == self._slots:
                return 0
            key = other
            delta = moved
            moves += 1

    def add(self, key, delta) -> None:
        """Add ``delta`` to this worker's counter of ``key``."""
        cdef int64_t d
        if type(delta) is not int:
            delta = PyNumber_Index(delta)  # like the twin: no floats
        try:
            d = delta
        except OverflowError:
            raise OverflowError("a counter must stay within int64") from None
        self._add(key, d)

    def acquire(self, key) -> None:
        """One more in flight for ``key`` (this worker)."""
        self._add(key, 1)

    def release(self, key) -> None:
        """One less in flight for ``key`` (this worker)."""
        self._add(key, -1)

    cdef inline int64_t _get(self, object key) except -1:
        cdef Py_ssize_t s
        cdef int64_t total
        _check_key(key)
        s = self._lookup(key)
        if s < 0:
            return 0
        total = self._sum(s)
        return total if total > 0 else 0

    def get(self, key) -> int:
        """In flight for ``key`` over all workers (``>= 0``; 0 when unknown); claims nothing."""
        self._check()
        return self._get(key)

    def loads(self, keys) -> list:
        """``[get(k) for k in keys]``."""
        self._check()
        return [self._get(k) for k in keys]

    def own(self, key) -> int:
        """This worker's counter of ``key``."""
        cdef PyObject* item
        self._check()
        item = PyDict_GetItemWithError(self._cache, key)
        if item == NULL:
            return 0
        return fi_ldi_relaxed(&self._row[PyLong_AsSsize_t(<object>item)])

    def own_items(self) -> dict:
        """This worker's non-zero counters by key."""
        cdef dict out = {}
        cdef Py_ssize_t s
        cdef int64_t v
        self._check()
        for s in range(self._slots):
            key = self._owner[s]
            if key is not None:
                v = fi_ldi_relaxed(&self._row[s])
                if v != 0:
                    out[key] = v
        return out

    def totals(self) -> dict:
        """``{key hash: sum over workers}`` of every used slot with a positive sum."""
        cdef dict out = {}
        cdef Py_ssize_t s
        cdef uint64_t h
        cdef int64_t total
        self._check()
        for s in range(self._slots):
            h = fi_ld(&self._w[s])
            if h != 0:
                total = self._sum(s)
                if total > 0:
                    out[h] = total
        return out

    def slot_of(self, key):
        """The slot index of ``key`` when it has one, else None (claims nothing)."""
        cdef Py_ssize_t s
        _check_key(key)
        self._check()
        s = self._lookup(key)
        return None if s < 0 else s

    def reset_worker(self, worker) -> None:
        """Zero row ``worker`` (after that worker died)."""
        cdef Py_ssize_t s, w
        wi = PyNumber_Index(worker)
        if not 0 <= wi < self._workers:
            raise ValueError("worker must be in [0, workers)")
        w = wi
        self._check()
        for s in range(self._slots):
            fi_sti_relaxed(&self._counts[w * self._slots + s], 0)
        if w == self._worker:
            self._cache = {}
            self._owner = [None] * self._slots
            for s in range(self._slots):
                self._expect[s] = 0


cdef Py_ssize_t _sets(object sets) except -1:
    n = PyNumber_Index(sets)
    if n < 1 or n & (n - 1) or n > (1 << 40):
        raise ValueError("sets must be a power of two >= 1")
    return n


cdef uint64_t _ep(object ep_id) except 0:
    cdef long v
    cdef int overflow = 0
    if type(ep_id) is int:  # the common case, compared in C
        v = PyLong_AsLongAndOverflow(ep_id, &overflow)
        if overflow or not 1 <= v <= 0xFFFF:
            raise ValueError("ep_id must be in 1..65535")
        return <uint64_t>v
    ep = PyNumber_Index(ep_id)
    if not 1 <= ep <= 0xFFFF:
        raise ValueError("ep_id must be in 1..65535")
    return ep


cdef inline uint64_t _block(object h) except? 0:
    if type(h) is not int:
        h = PyNumber_Index(h)  # like the twin: no floats
    try:
        return h
    except OverflowError:
        raise OverflowError("a block hash must be in [0, 2**64)") from None


cdef bint _match_lens_bits(const uint64_t* entries, uint64_t mask, const uint64_t* eps, Py_ssize_t* got,
                          Py_ssize_t k, object hashes) except -1:
    """``match_lens`` for at most 64 distinct ids: each block's set is scanned once (8 ways), every
    way holding this block's tag marks its endpoint's bit, and the ids still matching are one
    64-bit mask. False (nothing written) when the ids repeat: the caller walks the general way."""
    cdef uint16_t tab_ep[256]
    cdef int8_t tab_j[256]
    cdef Py_ssize_t j, n = 0
    cdef unsigned int slot
    cdef uint64_t alive, hit, dead, h, tag, e, ep
    cdef const uint64_t* ways
    cdef int i, b
    memset(tab_ep, 0, sizeof(tab_ep))
    for j in range(k):  # ep id -> bit j, open addressing on the id's low byte (ids are >= 1)
        slot = <unsigned int>(eps[j] & 255)
        while tab_ep[slot] != 0:
            if tab_ep[slot] == eps[j]:
                return False  # a repeated id
            slot = (slot + 1) & 255
        tab_ep[slot] = <uint16_t>eps[j]
        tab_j[slot] = <int8_t>j
    alive = 0xFFFFFFFFFFFFFFFF if k == 64 else ((<uint64_t>1 << k) - 1)
    cdef const unsigned long long* hv = NULL
    cdef Py_ssize_t nh = 0, t = 0
    cdef bint packed = _packed(hashes)
    if packed:  # an array('Q'): machine words, read in place
        hv = (<array.array>hashes).data.as_ulonglongs
        nh = Py_SIZE(hashes)
    else:
        hashes = iter(hashes)
    while alive:
        if packed:
            if t == nh:
                break
            h = hv[t]
            t += 1
        else:
            item = next(hashes, _END)
            if item is _END:
                break
            h = _block(item)
        tag = h & _TAG
        ways = entries + (h & mask) * _WAYS
        hit = 0
        for i in range(_WAYS):
            e = fi_ld_relaxed(&ways[i])
            if (e & _TAG) == tag and e != 0:
                ep = e & 0xFFFF
                slot = <unsigned int>(ep & 255)
                while tab_ep[slot] != 0:
                    if tab_ep[slot] == ep:
                        hit |= <uint64_t>1 << tab_j[slot]
                        break
                    slot = (slot + 1) & 255
        dead = alive & ~hit
        while dead:
            b = __builtin_ctzll(dead)
            got[b] = n
            dead &= dead - 1
        alive &= hit
        n += 1
    while alive:
        b = __builtin_ctzll(alive)
        got[b] = n
        alive &= alive - 1
    return True


cdef object _END = object()


cdef inline bint _packed(object hashes):
    return type(hashes) is array.array and (<array.array>hashes).ob_descr.typecode == b"Q"


@cython.final
cdef class SharedPrefixes:
    """Prompt-block hints by endpoint id in a shared set-associative table (compiled; see shmstate_py)."""

    cdef Py_buffer _view
    cdef uint64_t* _e         # NULL when closed
    cdef Py_ssize_t _sets
    cdef uint64_t _mask
    cdef uint64_t _evictions

    def __cinit__(self, *args, **kwargs):
        self._e = NULL

    def __dealloc__(self):
        if self._e != NULL:
            PyBuffer_Release(&self._view)

    def __init__(self, buf, sets):
        cdef Py_ssize_t n = _sets(sets)
        self.close()
        _attach(&self._view, buf, 64 * n)
        self._e = <uint64_t*>self._view.buf
        self._sets = n
        self._mask = <uint64_t>(n - 1)
        self._evictions = 0

    @staticmethod
    def size(sets) -> int:
        """Bytes used by ``sets`` sets (a power of two)."""
        return 64 * _sets(sets)

    @property
    def sets(self) -> int:
        return self._sets

    def close(self) -> None:
        """Release the buffer; the object is unusable afterwards."""
        if self._e != NULL:
            self._e = NULL
            PyBuffer_Release(&self._view)

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        self.close()

    cdef inline int _check(self) except -1:
        if self._e == NULL:
            raise ValueError("operation on a closed table")
        return 0

    cdef inline bint _has(self, uint64_t h, uint64_t ep) noexcept:
        cdef const uint64_t* ways = self._e + (h & self._mask) * _WAYS
        cdef uint64_t entry = (h & _TAG) | ep
        cdef int i
        for i in range(_WAYS):
            if fi_ld_relaxed(&ways[i]) == entry:
                return True
        return False

    def match_len(self, ep_id, hashes) -> int:
        """Longest ``i`` such that ``hashes[:i]`` were recorded for ``ep_id`` (binary search)."""
        cdef uint64_t ep = _ep(ep_id)
        cdef Py_ssize_t lo = 0, hi, mid
        cdef uint64_t h
        cdef bint fast_list = type(hashes) is list
        cdef bint fast_tuple = type(hashes) is tuple
        self._check()
        hi = len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fast_list and mid <= PyList_GET_SIZE(hashes):
                h = _block(<object>PyList_GET_ITEM(hashes, mid - 1))
            elif fast_tuple:
                h = _block(<object>PyTuple_GET_ITEM(hashes, mid - 1))
            else:
                h = _block(hashes[mid - 1])
            if self._has(h, ep):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def match_lens(self, ep_ids, hashes) -> list:
        """Per id, the longest ``i`` with all of ``hashes[:i]`` recorded for it (one walk from block 0)."""
        cdef Py_ssize_t k, j, w, alive, still, n = 0
        cdef uint64_t h, tag, want
        cdef const uint64_t* ways
        cdef uint64_t set_[_WAYS]
        cdef uint64_t* eps
        cdef Py_ssize_t* idx
        cdef Py_ssize_t* got
        cdef int i
        cdef bint hit
        self._check()
        ids = list(ep_ids)
        k = len(ids)
        if k == 0:
            return []
        eps = <uint64_t*>malloc(k * sizeof(uint64_t))
        idx = <Py_ssize_t*>malloc(k * sizeof(Py_ssize_t))
        got = <Py_ssize_t*>malloc(k * sizeof(Py_ssize_t))
        if eps == NULL or idx == NULL or got == NULL:
            free(eps)
            free(idx)
            free(got)
            raise MemoryError()
        try:
            for j in range(k):
                eps[j] = _ep(ids[j])
                idx[j] = j
                got[j] = 0
            if k <= 64:
                if _match_lens_bits(self._e, self._mask, eps, got, k, hashes):
                    return [got[j] for j in range(k)]
            alive = k
            for item in hashes:
                if alive == 0:
                    break
                h = _block(item)
                tag = h & _TAG
                ways = self._e + (h & self._mask) * _WAYS
                for i in range(_WAYS):
                    set_[i] = fi_ld_relaxed(&ways[i])
                still = 0
                for w in range(alive):
                    j = idx[w]
                    want = tag | eps[j]
                    hit = False
                    for i in range(_WAYS):
                        if set_[i] == want:
                            hit = True
                            break
                    if hit:
                        idx[still] = j
                        still += 1
                    else:
                        got[j] = n
                alive = still
                n += 1
            for w in range(alive):
                got[idx[w]] = n
            return [got[j] for j in range(k)]
        finally:
            free(eps)
            free(idx)
            free(got)

    def record(self, ep_id, hashes) -> None:
        """Remember that ``ep_id`` served ``hashes``."""
        cdef uint64_t ep = _ep(ep_id)
        cdef uint64_t h, entry
        cdef uint64_t* ways
        cdef int i, empty
        cdef const unsigned long long* hv = NULL
        cdef Py_ssize_t nh = 0, t = 0
        cdef bint packed = _packed(hashes)
        self._check()
        if packed:  # an array('Q'): machine words, read in place
            hv = (<array.array>hashes).data.as_ulonglongs
            nh = Py_SIZE(hashes)
        else:
            hashes = iter(hashes)
        while True:
            if packed:
                if t == nh:
                    break
                h = hv[t]
                t += 1
            else:
                item = next(hashes, _END)
                if item is _END:
                    break
                h = _block(item)
            entry = (h & _TAG) | ep
            ways = self._e + (h & self._mask) * _WAYS
            empty = -1
            for i in range(_WAYS):
                if fi_ld_relaxed(&ways[i]) == entry:
                    break
                if empty < 0 and fi_ld_relaxed(&ways[i]) == 0:
                    empty = i
            else:
                if empty < 0:
                    empty = <int>(self._evictions % _WAYS)
                    self._evictions += 1
                fi_st_relaxed(&ways[empty], entry)

    def forget(self, ep_id) -> None:
        """Clear every entry of ``ep_id``."""
        cdef uint64_t ep = _ep(ep_id)
        cdef Py_ssize_t i, n
        cdef uint64_t e
        self._check()
        n = self._sets * _WAYS
        for i in range(n):
            e = fi_ld_relaxed(&self._e[i])
            if e != 0 and (e & 0xFFFF) == ep:
                fi_cas(&self._e[i], &e, 0)  # an entry written meanwhile by another process stays
