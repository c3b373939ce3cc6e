# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
"""Consistent-hash ring with bounded-load lookup: the compiled twin of ``hashring_py``.

Owns: the same ``HashRing`` API with the same placements and answers (see ``hashring_py``
for the spec). Points live in two C arrays (uint32 hashes, uint32 owner indexes) searched
through a bucket index on the top hash bits, then a short scan. CRC-32 (equal to
``zlib.crc32``) is computed in C, slicing-by-8, so no libz link is needed. ``get`` allocates nothing for
``str``/``bytes`` keys (non-ASCII ``str`` keys use the string's cached UTF-8).
Must not: import anything from flexinfer.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.number cimport PyNumber_Index
from cpython.object cimport PyObject
from libc.math cimport INFINITY, ceil
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdio cimport snprintf
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memmove

from collections.abc import Mapping

__all__ = ["DEFAULT_VNODES", "MAX_LOAD", "HashRing", "ring_hash"]

DEFAULT_VNODES = 150
MAX_LOAD = 1 << 32  # exclusive upper bound of one node's load
cdef int64_t _MAX_LOAD = 1 << 32

cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>

    /* CRC-32 (reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF): the value
       zlib.crc32 returns. Slicing-by-8 tables, filled once at import. */
    static uint32_t fi_crc_tab[8][256];

    static void fi_crc32_init(void) {
        uint32_t i, c;
        int k;
        for (i = 0; i < 256; i++) {
            c = i;
            for (k = 0; k < 8; k++) c = (c & 1U) ? (c >> 1) ^ 0xEDB88320U : c >> 1;
            fi_crc_tab[0][i] = c;
        }
        for (i = 0; i < 256; i++)
            for (k = 1; k < 8; k++)
                fi_crc_tab[k][i] = (fi_crc_tab[k - 1][i] >> 8) ^ fi_crc_tab[0][fi_crc_tab[k - 1][i] & 0xFFU];
    }

    static inline uint32_t fi_crc_r32(const unsigned char *p) {
        return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    }

    /* Knuth's multiplicative hash: breaks CRC-32's linearity (see hashring_py) */
    static inline uint32_t fi_mix32(uint32_t h) { return (uint32_t)(h * 0x9E3779B1U); }

    /* continue a CRC: fi_crc32(fi_crc32(0, a), b) == crc32(a + b) */
    static uint32_t fi_crc32(uint32_t crc, const unsigned char *p, size_t n) {
        crc = ~crc;
        while (n >= 8) {
            uint32_t a = crc ^ fi_crc_r32(p), b = fi_crc_r32(p + 4);
            crc = fi_crc_tab[7][a & 0xFFU] ^ fi_crc_tab[6][(a >> 8) & 0xFFU]
                ^ fi_crc_tab[5][(a >> 16) & 0xFFU] ^ fi_crc_tab[4][a >> 24]
                ^ fi_crc_tab[3][b & 0xFFU] ^ fi_crc_tab[2][(b >> 8) & 0xFFU]
                ^ fi_crc_tab[1][(b >> 16) & 0xFFU] ^ fi_crc_tab[0][b >> 24];
            p += 8;
            n -= 8;
        }
        while (n--) crc = (crc >> 8) ^ fi_crc_tab[0][(crc ^ *p++) & 0xFFU];
        return ~crc;
    }

    /* index of the first element >= x in a sorted array (n when none) */
    static inline size_t fi_lower_bound(const uint32_t *a, size_t n, uint32_t x) {
        const uint32_t *base = a;
        if (n == 0) return 0;
        while (n > 1) {
            size_t half = n / 2;
            base = (base[half] < x) ? base + half : base;
            n -= half;
        }
        return (size_t)(base - a) + (*base < x);
    }

    /* lower_bound through a bucket index: idx[b] = first point with hash >= b << shift, so
       the answer for x lies in [idx[x >> shift], idx[(x >> shift) + 1]] (usually 0-2 points) */
    static inline size_t fi_ring_find(const uint32_t *a, const uint32_t *idx, int shift, uint32_t x) {
        uint32_t b = x >> shift;
        size_t lo = idx[b], hi = idx[b + 1];
        if (hi - lo > 8) return lo + fi_lower_bound(a + lo, hi - lo, x);
        while (lo < hi && a[lo] < x) lo++;
        return lo;
    }

    static int fi_cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return (x > y) - (x < y);
    }
    """
    void fi_crc32_init()
    uint32_t fi_crc32(uint32_t crc, const unsigned char* p, size_t n) nogil
    uint32_t fi_mix32(uint32_t h) nogil
    size_t fi_lower_bound(const uint32_t* a, size_t n, uint32_t x) nogil
    size_t fi_ring_find(const uint32_t* a, const uint32_t* idx, int shift, uint32_t x) nogil
    int fi_cmp_u64(const void* a, const void* b) noexcept nogil

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL

fi_crc32_init()


cdef inline uint32_t _ring_hash(object key) except? 0:
    return fi_mix32(_key_crc(key))


cdef uint32_t _key_crc(object key) except? 0:
    cdef Py_ssize_t n
    cdef const char* p
    cdef Py_buffer view
    cdef uint32_t h
    if isinstance(key, str):
        if PyUnicode_IS_COMPACT_ASCII(key):
            return fi_crc32(0, <const unsigned char*>PyUnicode_DATA(key), <size_t>PyUnicode_GET_LENGTH(key))
        try:
            p = PyUnicode_AsUTF8AndSize(key, &n)
        except UnicodeEncodeError:  # lone surrogates: encode them like the reference does
            b = (<str>key).encode("utf-8", "surrogatepass")
            return fi_crc32(0, <const unsigned char*>PyBytes_AS_STRING(b), <size_t>PyBytes_GET_SIZE(b))
        return fi_crc32(0, <const unsigned char*>p, <size_t>n)
    if isinstance(key, bytes):
        return fi_crc32(0, <const unsigned char*>PyBytes_AS_STRING(key), <size_t>PyBytes_GET_SIZE(key))
    PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
    h = fi_crc32(0, <const unsigned char*>view.buf, <size_t>view.len)
    PyBuffer_Release(&view)
    return h


def ring_hash(data) -> int:
    """The ring position of ``data``: ``crc32(utf8 or bytes) * 0x9E3779B1 mod 2**32``."""
    return _ring_hash(data)


cdef int64_t _as_load(object v) except -1:
    cdef int64_t x
    if type(v) is not int:
        v = PyNumber_Index(v)  # like operator.index: TypeError for floats
    try:
        x = v
    except OverflowError:
        raise ValueError("a load must be in [0, 2**32)") from None
    if x < 0 or x >= _MAX_LOAD:
        raise ValueError("a load must be in [0, 2**32)")
    return x


cdef class HashRing:
    """A consistent-hash ring of endpoint addresses (compiled)."""

    cdef list _nodes          # names, insertion order
    cdef dict _index          # name -> position in _nodes
    cdef int _vnodes
    cdef uint32_t* _vh        # vnode hashes, node-major in _nodes order
    cdef Py_ssize_t _vh_cap   # capacity of _vh, in nodes
    cdef uint32_t* _point_hash   # sorted point hashes
    cdef uint32_t* _point_owner  # node index of each point
    cdef Py_ssize_t _size     # number of points
    cdef uint32_t* _bucket    # (1 << (32 - _shift)) + 1 entries, see fi_ring_find
    cdef int _shift
    cdef int64_t* _loads      # scratch for get_bounded, _vh_cap entries

    def __cinit__(self, *args, **kwargs):
        self._vh = NULL
        self._point_hash = NULL
        self._point_owner = NULL
        self._loads = NULL
        self._bucket = NULL
        self._shift = 31
        self._vh_cap = 0
        self._size = 0
        self._nodes = []
        self._index = {}

    def __dealloc__(self):
        free(self._vh)
        free(self._point_hash)
        free(self._point_owner)
        free(self._loads)
        free(self._bucket)

    def __init__(self, nodes=(), vnodes=DEFAULT_VNODES):
        v = PyNumber_Index(vnodes)
        if not 1 <= v <= 65536:
            raise ValueError("vnodes must be in [1, 65536]")
        # start empty (also when __init__ runs again, like the twin)
        free(self._vh)
        free(self._loads)
        free(self._point_hash)
        free(self._point_owner)
        free(self._bucket)
        self._vh = self._point_hash = self._point_owner = self._bucket = NULL
        self._loads = NULL
        self._vh_cap = 0
        self._size = 0
        self._nodes = []
        self._index = {}
        self._vnodes = <int>v
        self.set_nodes(nodes)

    # -- membership ---------------------------------------------------------------------
    @property
    def nodes(self) -> tuple:
        """The nodes in insertion order (the index order of a loads sequence)."""
        return tuple(self._nodes)

    @property
    def vnodes(self) -> int:
        return self._vnodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node) -> bool:
        return node in self._index

    def add(self, node) -> bool:
        """Add ``node``; False when it was already there."""
        if not isinstance(node, str):
            raise TypeError("a node must be a str")
        if node in self._index:
            return False
        self._insert(node)
        self._rebuild()
        return True

    def remove(self, node) -> bool:
        """Remove ``node``; False when it was not there."""
        if node not in self._index:
            return False
        self._delete(node)
        self._rebuild()
        return True

    def set_nodes(self, nodes) -> bool:
        """Make the ring hold exactly ``nodes``, touching only what changed (see the twin)."""
        cdef dict wanted = {}
        for node in nodes:
            if not isinstance(node, str):
                raise TypeError("a node must be a str")
            wanted[node] = None
        gone = [node for node in self._nodes if node not in wanted]
        new = [node for node in wanted if node not in self._index]
        if not gone and not new:
            return False
        for node in gone:
            self._delete(node)
        for node in new:
            self._insert(node)
        self._rebuild()
        return True

    cdef int _reserve(self, Py_ssize_t count) except -1:
        cdef Py_ssize_t cap
        cdef uint32_t* vh
        cdef int64_t* loads
        if count <= self._vh_cap:
            return 0
        cap = max(count, 2 * self._vh_cap, 8)
        vh = <uint32_t*>malloc(<size_t>cap * <size_t>self._vnodes * sizeof(uint32_t))
        loads = <int64_t*>malloc(<size_t>cap * sizeof(int64_t))
        if vh == NULL or loads == NULL:
            free(vh)
            free(loads)
            raise MemoryError()
        if self._vh != NULL:
            memmove(vh, self._vh, <size_t>len(self._nodes) * <size_t>self._vnodes * sizeof(uint32_t))
        free(self._vh)
        free(self._loads)
        self._vh = vh
        self._loads = loads
        self._vh_cap = cap
        return 0

    cdef int _insert(self, str node) except -1:
        cdef Py_ssize_t idx = len(self._nodes)
        cdef bytes raw = node.encode("utf-8", "surrogatepass")
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(raw)
        cdef size_t n = <size_t>PyBytes_GET_SIZE(raw)
        cdef char prefix[16]
        cdef int i, k
        cdef uint32_t* out
        self._reserve(idx + 1)
        out = self._vh + idx * self._vnodes
        for i in range(self._vnodes):
            k = snprintf(prefix, 16, "%d:", i)
            out[i] = fi_mix32(fi_crc32(fi_crc32(0, <const unsigned char*>prefix, <size_t>k), p, n))
        self._nodes.append(node)
        self._index[node] = idx
        return 0

    cdef int _delete(self, str node) except -1:
        cdef Py_ssize_t idx = self._index.pop(node)
        cdef Py_ssize_t count = len(self._nodes)
        cdef size_t width = <size_t>self._vnodes
        memmove(self._vh + idx * width, self._vh + (idx + 1) * width,
                <size_t>(count - idx - 1) * width * sizeof(uint32_t))
        del self._nodes[idx]
        self._index = {name: i for i, name in enumerate(self._nodes)}
        return 0

    cdef int _rebuild(self) except -1:
        cdef Py_ssize_t n = len(self._nodes)
        cdef Py_ssize_t width = self._vnodes
        cdef Py_ssize_t size = n * width
        cdef Py_ssize_t i, r, k
        cdef uint64_t* tmp
        cdef uint32_t* hashes
        cdef uint32_t* owners
        cdef uint32_t* rank_of
        cdef uint32_t* by_rank
        cdef uint32_t* bucket
        cdef int bits = 1
        cdef Py_ssize_t b, nb
        # ties between equal hashes are broken by node name: sort (hash, rank of name)
        order = sorted(range(n), key=self._nodes.__getitem__)
        tmp = <uint64_t*>malloc(<size_t>(size if size else 1) * sizeof(uint64_t))
        hashes = <uint32_t*>malloc(<size_t>(size if size else 1) * sizeof(uint32_t))
        owners = <uint32_t*>malloc(<size_t>(size if size else 1) * sizeof(uint32_t))
        rank_of = <uint32_t*>malloc(<size_t>(n if n else 1) * 2 * sizeof(uint32_t))
        while bits < 16 and (<Py_ssize_t>1 << bits) < size:  # about one point per bucket
            bits += 1
        nb = <Py_ssize_t>1 << bits
        bucket = <uint32_t*>malloc(<size_t>(nb + 1) * sizeof(uint32_t))
        if tmp == NULL or hashes == NULL or owners == NULL or rank_of == NULL or bucket == NULL:
            free(tmp)
            free(hashes)
            free(owners)
            free(rank_of)
            free(bucket)
            raise MemoryError()
        by_rank = rank_of + n
        for r in range(n):
            i = order[r]
            rank_of[i] = <uint32_t>r
            by_rank[r] = <uint32_t>i
        k = 0
        for i in range(n):
            for r in range(width):
                tmp[k] = ((<uint64_t>self._vh[i * width + r]) << 32) | rank_of[i]
                k += 1
        qsort(tmp, <size_t>size, sizeof(uint64_t), fi_cmp_u64)
        for k in range(size):
            hashes[k] = <uint32_t>(tmp[k] >> 32)
            owners[k] = by_rank[<uint32_t>(tmp[k] & 0xFFFFFFFFu)]
        k = 0
        for b in range(nb):  # bucket[b] = first point with hash >= b << (32 - bits)
            while k < size and hashes[k] < (<uint32_t>b << (32 - bits)):
                k += 1
            bucket[b] = <uint32_t>k
        bucket[nb] = <uint32_t>size
        free(tmp)
        free(rank_of)
        free(self._point_hash)
        free(self._point_owner)
        free(self._bucket)
        self._point_hash = hashes
        self._point_owner = owners
        self._bucket = bucket
        self._shift = 32 - bits
        self._size = size
        return 0

    # -- lookups ------------------------------------------------------------------------
    cdef inline Py_ssize_t _position(self, object key) except -1:
        cdef uint32_t h = _ring_hash(key)
        cdef size_t i = fi_ring_find(self._point_hash, self._bucket, self._shift, h)
        return <Py_ssize_t>i if i < <size_t>self._size else 0

    def get(self, key):
        """The node owning ``key``, or None when the ring is empty."""
        if self._size == 0:
            return None
        return self._nodes[self._point_owner[self._position(key)]]

    def get_bounded(self, key, loads, double epsilon=0.25):
        """The first node clockwise from ``key`` whose load stays within the cap (see the twin)."""
        cdef Py_ssize_t n = len(self._nodes)
        cdef Py_ssize_t i, j, start, size
        cdef int64_t total = 0
        cdef int64_t* values = self._loads
        cdef PyObject* item
        cdef double cap
        cdef uint32_t o
        if not (0.0 <= epsilon < INFINITY):
            raise ValueError("epsilon must be finite and >= 0")
        if type(loads) is dict:
            for i in range(n):
                item = PyDict_GetItem(loads, self._nodes[i])
                values[i] = 0 if item == NULL else _as_load(<object>item)
        elif isinstance(loads, Mapping):
            for i in range(n):
                values[i] = _as_load(loads.get(self._nodes[i], 0))
        else:
            if len(loads) != n:
                raise ValueError(f"loads has {len(loads)} entries for {n} nodes")
            if type(loads) is list or type(loads) is tuple:
                for i in range(n):
                    values[i] = _as_load(loads[i])
            else:
                i = 0
                for v in loads:
                    if i >= n:
                        raise ValueError("loads changed size while read")
                    values[i] = _as_load(v)
                    i += 1
                if i != n:
                    raise ValueError("loads changed size while read")
        if n == 0:
            return None
        for i in range(n):
            total += values[i]
        cap = ceil((1.0 + epsilon) * <double>(total + 1) / <double>n)
        start = self._position(key)
        size = self._size
        for j in range(start, start + size):
            o = self._point_owner[j if j < size else j - size]
            if <double>(values[o] + 1) <= cap:
                return self._nodes[o]
        return self._nodes[self._point_owner[start]]  # unreachable: the cap guarantees a candidate
