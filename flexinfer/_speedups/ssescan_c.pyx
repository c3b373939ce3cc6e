# cython: language_level=3, boundscheck=False, wraparound=False
"""One pass over a piece of an SSE body for the proxy's usage tap, compiled: the twin of ssescan_py.

Same results as :mod:`ssescan_py` (the rules are in its docstring). It goes from colon to colon,
finding them sixteen bytes at a time (one SSE2 compare on x86-64, byte by byte elsewhere; a
``memchr`` call per colon cost more than the rest of the scan), and compares the few key names
before each, so a stream's read costs a few hundred instructions instead of several ``bytes.find``
calls from Python. Must not: parse JSON, allocate, or import anything of ours.
"""

from libc.string cimport memchr, memcmp


cdef extern from *:
    """
    #include <string.h>
    #if defined(__SSE2__)
    #include <emmintrin.h>
    #endif

    /* A bit for each ':' of the 16 bytes at p (bit k: p[k]), by one compare where SSE2 is (every
       x86-64), else byte by byte. */
    static inline unsigned fx_colons16(const char* p, int portable) {
        unsigned m = 0;
        int k;
    #if defined(__SSE2__)
        if (!portable)
            return (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128((const __m128i*)p),
                                                              _mm_set1_epi8(':')));
    #endif
        for (k = 0; k < 16; k++)
            m |= (unsigned)(p[k] == ':') << k;
        return m;
    }

    /* The same for b[i:size], at most 16 bytes: a short tail is read through a zeroed copy. */
    static inline unsigned fx_colons(const char* b, Py_ssize_t i, Py_ssize_t size, int portable) {
        char tail[16];
        if (size - i >= 16)
            return fx_colons16(b + i, portable);
        memset(tail, 0, 16);
        if (size > i)
            memcpy(tail, b + i, (size_t)(size - i));
        return fx_colons16(tail, portable);
    }

    static inline int fx_low_bit(unsigned m) { return __builtin_ctz(m); }
    """
    unsigned fx_colons(const char* b, Py_ssize_t i, Py_ssize_t size, int portable) noexcept nogil
    int fx_low_bit(unsigned m) noexcept nogil


cdef extern from "Python.h":
    char* PyBytes_AS_STRING(object)
    Py_ssize_t PyBytes_GET_SIZE(object)


USAGE_OBJECT = 2
WHOLE = 1


cdef inline Py_ssize_t _skip_ws(const char* buf, Py_ssize_t j, Py_ssize_t size) noexcept:
    while j < size and (buf[j] == 32 or buf[j] == 9 or buf[j] == 13 or buf[j] == 10):
        j += 1
    return j


def _colons(bytes buf not None, Py_ssize_t i, bint portable=False):
    """Tests only: the bits :func:`_scan` reads for the colons of ``buf[i:i + 16]`` (bit k: byte
    i + k), by the SSE2 compare where built with it or, ``portable=True``, byte by byte as other
    builds do."""
    if i < 0:
        i = 0
    return fx_colons(PyBytes_AS_STRING(buf), i, PyBytes_GET_SIZE(buf), portable)


def sse_scan(bytes buf not None):
    """``(content events << 2) | USAGE_OBJECT? | WHOLE?`` for ``buf`` (see ssescan_py)."""
    return _scan(PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf))


cdef long _scan(const char* b, Py_ssize_t size) noexcept:
    # Colon by colon (a JSON key is followed by one; a stream's event has about half as many
    # colons as quotes), sixteen bytes of colon bits at a time: the key before each colon
    # (whitespace skipped back) is compared with ours. Key occurrences cannot overlap, so this finds
    # exactly the twin's left-to-right matches.
    cdef long n = 0
    cdef int flags = 0
    cdef Py_ssize_t base = 0, j, k, c
    cdef unsigned m
    cdef int usage
    if (size >= 2 and b[size - 1] == 10 and b[size - 2] == 10) or (
            size >= 4 and memcmp(b + size - 4, b"\r\n\r\n", 4) == 0):
        flags = 1
    while base < size:
        m = fx_colons(b, base, size, 0)
        while m:
            c = base + fx_low_bit(m)
            m &= m - 1
            k = c - 1
            if k >= 0 and b[k] != 34:  # whitespace between the key and its colon (rare)
                while k >= 0 and (b[k] == 32 or b[k] == 9 or b[k] == 13 or b[k] == 10):
                    k -= 1
            if k < 5 or b[k] != 34:  # the shortest key of ours, '"text"', ends at k >= 5
                continue
            usage = 0
            if b[k - 1] == 116:  # ...t": content, reasoning_content, text
                if not ((k >= 8 and memcmp(b + k - 8, b'"content"', 9) == 0) or
                        (k >= 18 and memcmp(b + k - 18, b'"reasoning_content"', 19) == 0) or
                        memcmp(b + k - 5, b'"text"', 6) == 0):
                    continue
            elif b[k - 1] == 101:  # ...e": usage
                if k < 6 or memcmp(b + k - 6, b'"usage"', 7) != 0:
                    continue
                usage = 1
            else:
                continue
            j = _skip_ws(b, c + 1, size)
            if j < size:
                if usage:
                    if b[j] == 123:  # '{'
                        flags |= 2
                elif b[j] == 34 and j + 1 < size and b[j + 1] != 34:
                    n += 1
        base += 16
    return (n << 2) | flags


KEEP = 4 << 30

cdef extern from "string.h":
    void* memmem(const void* hay, size_t hlen, const void* needle, size_t nlen) nogil


cdef inline Py_ssize_t _event_end(const char* b, Py_ssize_t size, Py_ssize_t pos) noexcept:
    cdef const char* hit
    if pos < 0:
        pos = 0
    while pos < size:
        hit = <const char*>memchr(b + pos, 10, size - pos)
        if hit == NULL:
            return -1
        pos = hit - b + 1
        if pos < size:
            if b[pos] == 10:
                return pos + 1
            if b[pos] == 13 and pos + 1 < size and b[pos + 1] == 10:
                return pos + 2
    return -1


def event_end(bytes buf not None, Py_ssize_t pos):
    """The end of the first event boundary at or after ``pos``, or -1 (see ssescan_py.event_end)."""
    return _event_end(PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf), pos)


cdef inline bint _space(char c) noexcept:  # the bytes regex \s
    return c == 32 or 9 <= c <= 13


cdef bint _no_choices(const char* e, Py_ssize_t n) noexcept:
    """``"choices"\\s*:\\s*\\[\\s*\\]`` somewhere in e[:n]."""
    cdef const char* hit
    cdef Py_ssize_t i = 0, j
    while i < n:
        hit = <const char*>memmem(e + i, n - i, b'"choices"', 9)
        if hit == NULL:
            return 0
        i = hit - e + 9
        j = i
        while j < n and _space(e[j]):
            j += 1
        if j >= n or e[j] != 58:  # ':'
            continue
        j += 1
        while j < n and _space(e[j]):
            j += 1
        if j >= n or e[j] != 91:  # '['
            continue
        j += 1
        while j < n and _space(e[j]):
            j += 1
        if j < n and e[j] == 93:  # ']'
            return 1
    return 0


cdef inline Py_ssize_t _find_usage(const char* b, Py_ssize_t size, Py_ssize_t pos) noexcept:
    cdef const char* hit = <const char*>memmem(b + pos, size - pos, b'"usage"', 7) if pos < size else NULL
    return -1 if hit == NULL else hit - b


cdef bint _usage_only(const char* e, Py_ssize_t n) noexcept:
    """e[:n], a whole event holding '"usage"', is the usage-only data: event."""
    if not (n >= 5 and memcmp(e, b"data:", 5) == 0) and memmem(e, n, b"\ndata:", 6) == NULL:
        return 0
    return (_scan(e, n) & 2) != 0 and _no_choices(e, n)


def usage_cuts(bytes buf not None, bint mid):
    """``(pos, mid, cuts)`` for ``buf`` (see ssescan_py.usage_cuts: same results)."""
    cdef const char* b = PyBytes_AS_STRING(buf)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(buf)
    cdef Py_ssize_t pos = 0, stop
    cdef Py_ssize_t u = _find_usage(b, size, 0)  # the next '"usage"': only its event is looked at
    cdef list cuts = []
    while True:
        stop = _event_end(b, size, pos)
        if stop < 0:
            break
        if mid:
            mid = 0
        elif u >= 0:
            if u < pos:  # it was in the event let through
                u = _find_usage(b, size, pos)
            if 0 <= u < stop:
                if _usage_only(b + pos, stop - pos):
                    cuts.append(pos)
                    cuts.append(stop)
                u = _find_usage(b, size, stop)
        pos = stop
    return pos, mid, cuts


cdef class SseClock:
    """The per-read accounting of one SSE body (see ssescan_py.SseClock): typed fields, the
    bucket bounds in a C array, the clock read with clock_gettime."""

    def __init__(self, tuple bounds not None, double t0):
        cdef int i
        if len(bounds) > 63:
            raise ValueError("at most 63 bucket bounds")
        self.bounds = bounds
        self._nb = len(bounds)
        for i in range(self._nb):
            self._bounds[i] = bounds[i]
        for i in range(self._nb + 1):
            self._counts[i] = 0
        self.t0 = t0
        self.events = 0
        self.ttft = -1.0
        self.t_last = 0.0
        self.itl_sum = 0.0
        self._open = False

    @property
    def itl(self):
        return [self._counts[i] for i in range(self._nb + 1)]

    def add_to(self, list counts not None):
        """The gap counts added into ``counts`` in place (see ssescan_py.SseClock.add_to): a C loop
        over the buckets, Python arithmetic only for those that counted a gap."""
        cdef int i
        if len(counts) < self._nb + 1:
            raise ValueError(f"{len(counts)} buckets for {self._nb + 1} counts")
        for i in range(self._nb + 1):
            if self._counts[i]:
                counts[i] = counts[i] + self._counts[i]

    cpdef long feed(self, bytes buf) except -1:
        if buf is None:
            raise TypeError("feed() takes bytes, not NoneType")
        cdef long scan = _scan(PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf))
        cdef long n = scan >> 2
        cdef double t, g
        cdef int lo, hi, mid
        cdef bint keep
        if n:
            t = _now()
            self.events += n
            if self.ttft < 0:
                self.ttft = t - self.t0
                self._counts[0] += n - 1
            else:
                g = (t - self.t_last) / n
                lo = 0
                hi = self._nb
                while lo < hi:  # bisect_left
                    mid = (lo + hi) >> 1
                    if self._bounds[mid] < g:
                        lo = mid + 1
                    else:
                        hi = mid
                self._counts[lo] += n
                self.itl_sum += g * n
            self.t_last = t
        keep = (scan & 2) != 0 or (scan & 1) == 0 or self._open
        self._open = (scan & 1) == 0
        return scan | KEEP if keep else scan


MAX_TOKENS = 10**9

cdef extern from "Python.h":
    char* PyByteArray_AS_STRING(object)
    Py_ssize_t PyByteArray_GET_SIZE(object)


cdef inline bint _ws(char c) noexcept:
    return c == 32 or c == 9 or c == 13 or c == 10


cdef Py_ssize_t _object_at(const char* b, Py_ssize_t n, Py_ssize_t i) noexcept:
    cdef Py_ssize_t j = i + 7
    while j < n and _ws(b[j]):
        j += 1
    if j >= n or b[j] != 58:  # ':'
        return -1
    j += 1
    while j < n and _ws(b[j]):
        j += 1
    return j + 1 if j < n and b[j] == 123 else -1  # '{'


cdef long long _count(const char* b, Py_ssize_t lo, Py_ssize_t hi, const char* key, Py_ssize_t klen) noexcept:
    cdef Py_ssize_t i = lo, j, k
    cdef long long v = 0
    while i + klen <= hi:  # the first occurrence of key in b[lo:hi]
        if memcmp(b + i, key, klen) == 0:
            break
        i += 1
    else:
        return -1
    j = i + klen
    while j < hi and _ws(b[j]):
        j += 1
    if j >= hi or b[j] != 58:
        return -1
    j += 1
    while j < hi and _ws(b[j]):
        j += 1
    k = j
    while k < hi and k - j < 15 and 48 <= b[k] <= 57:
        v = v * 10 + (b[k] - 48)
        k += 1
    return v if k > j else -1


def parse_usage(tail):
    """(prompt_tokens, completion_tokens) of the last usage object in ``tail`` (bytes or
    bytearray), or None (see ssescan_py.parse_usage: same results)."""
    cdef const char* b
    cdef Py_ssize_t n, i, start = -1, j, close, inner_open, x
    cdef int depth
    cdef long long p, c
    if isinstance(tail, bytearray):
        b = PyByteArray_AS_STRING(tail)
        n = PyByteArray_GET_SIZE(tail)
    else:
        b = PyBytes_AS_STRING(tail)
        n = PyBytes_GET_SIZE(tail)
    i = n - 7
    while i >= 0:  # rfind '"usage"' whose value is an object
        if b[i] == 34 and memcmp(b + i, b'"usage"', 7) == 0:
            start = _object_at(b, n, i)
            if start >= 0:
                break
        i -= 1
    if start < 0:
        return None
    j = start
    depth = 1
    while depth:
        close = -1
        x = j
        while x < n:
            if b[x] == 125:  # '}'
                close = x
                break
            x += 1
        if close < 0:
            return None
        inner_open = -1
        x = j
        while x < close:
            if b[x] == 123:
                inner_open = x
                break
            x += 1
        if inner_open >= 0:
            depth += 1
            if depth > 4:
                return None
            j = inner_open + 1
        else:
            depth -= 1
            j = close + 1
    p = _count(b, start, j - 1, b'"prompt_tokens"', 15)
    c = _count(b, start, j - 1, b'"completion_tokens"', 19)
    if p < 0 and c < 0:
        return None
    return (min(p, MAX_TOKENS) if p >= 0 else -1, min(c, MAX_TOKENS) if c >= 0 else 0)
