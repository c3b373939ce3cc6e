# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, binding=False
"""Chained block hashes of a prompt prefix: the compiled twin of ``prefixhash_py``.

Owns: the same ``chained_block_hashes`` with bit-identical results, using its own XXH3-64
(all input lengths, any seed) written in C from the public XXH3 specification
(xxHash ``doc/xxhash_spec.md``); nothing is vendored and nothing is called per block.
Must not: import anything from flexinfer. ASCII ``str`` input is hashed in place (no copy);
other ``str`` input is encoded to UTF-8 here, only as far as the bytes that count (into a
stack buffer for the default 8 KiB), with the reference's ``surrogatepass`` result.
"""

from cpython cimport array
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromUnsignedLongLong
from cpython.number cimport PyNumber_Index
from cpython.ref cimport Py_INCREF
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc

__all__ = ["DEFAULT_BLOCK_SIZE", "DEFAULT_MAX_BLOCKS", "chained_block_hashes", "xxh3_64"]

DEFAULT_BLOCK_SIZE = 64
DEFAULT_MAX_BLOCKS = 128
cdef enum:
    STACK_BYTES = 16384  # encode str prefixes up to this size without malloc

cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    #include <string.h>

    /* XXH3-64, written from the XXH3 specification. Reads are little-endian, byte-wise
       (compilers fold them into single loads), so the result is endian-independent. */
    static const uint8_t fi_x3_ksecret[192] = {
      0xb8,0xfe,0x6c,0x39,0x23,0xa4,0x4b,0xbe,0x7c,0x01,0x81,0x2c,0xf7,0x21,0xad,0x1c,
      0xde,0xd4,0x6d,0xe9,0x83,0x90,0x97,0xdb,0x72,0x40,0xa4,0xa4,0xb7,0xb3,0x67,0x1f,
      0xcb,0x79,0xe6,0x4e,0xcc,0xc0,0xe5,0x78,0x82,0x5a,0xd0,0x7d,0xcc,0xff,0x72,0x21,
      0xb8,0x08,0x46,0x74,0xf7,0x43,0x24,0x8e,0xe0,0x35,0x90,0xe6,0x81,0x3a,0x26,0x4c,
      0x3c,0x28,0x52,0xbb,0x91,0xc3,0x00,0xcb,0x88,0xd0,0x65,0x8b,0x1b,0x53,0x2e,0xa3,
      0x71,0x64,0x48,0x97,0xa2,0x0d,0xf9,0x4e,0x38,0x19,0xef,0x46,0xa9,0xde,0xac,0xd8,
      0xa8,0xfa,0x76,0x3f,0xe3,0x9c,0x34,0x3f,0xf9,0xdc,0xbb,0xc7,0xc7,0x0b,0x4f,0x1d,
      0x8a,0x51,0xe0,0x4b,0xcd,0xb4,0x59,0x31,0xc8,0x9f,0x7e,0xc9,0xd9,0x78,0x73,0x64,
      0xea,0xc5,0xac,0x83,0x34,0xd3,0xeb,0xc3,0xc5,0x81,0xa0,0xff,0xfa,0x13,0x63,0xeb,
      0x17,0x0d,0xdd,0x51,0xb7,0xf0,0xda,0x49,0xd3,0x16,0x55,0x26,0x29,0xd4,0x68,0x9e,
      0x2b,0x16,0xbe,0x58,0x7d,0x47,0xa1,0xfc,0x8f,0xf8,0xb8,0xd1,0x7a,0xd0,0x31,0xce,
      0x45,0xcb,0x3a,0x8f,0x95,0x16,0x04,0x28,0xaf,0xd7,0xfb,0xca,0xbb,0x4b,0x40,0x7e,
    };

    #define FI_P32_1 0x9E3779B1U
    #define FI_P32_2 0x85EBCA77U
    #define FI_P32_3 0xC2B2AE3DU
    #define FI_P64_1 0x9E3779B185EBCA87ULL
    #define FI_P64_2 0xC2B2AE3D27D4EB4FULL
    #define FI_P64_3 0x165667B19E3779F9ULL
    #define FI_P64_4 0x85EBCA77C2B2AE63ULL
    #define FI_P64_5 0x27D4EB2F165667C5ULL
    #define FI_PMX_1 0x165667919E3779F9ULL
    #define FI_PMX_2 0x9FB21C651E98DF25ULL

    static inline uint32_t fi_x3_r32(const uint8_t *p) {
        return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    }
    static inline uint64_t fi_x3_r64(const uint8_t *p) {
        return (uint64_t)fi_x3_r32(p) | ((uint64_t)fi_x3_r32(p + 4) << 32);
    }
    static inline void fi_x3_w64(uint8_t *p, uint64_t v) {
        int i;
        for (i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
    }
    static inline uint32_t fi_x3_swap32(uint32_t x) {
        return (x << 24) | ((x << 8) & 0x00FF0000U) | ((x >> 8) & 0x0000FF00U) | (x >> 24);
    }
    static inline uint64_t fi_x3_swap64(uint64_t x) {
        return ((uint64_t)fi_x3_swap32((uint32_t)x) << 32) | (uint64_t)fi_x3_swap32((uint32_t)(x >> 32));
    }
    static inline uint64_t fi_x3_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

    /* low 64 bits XOR high 64 bits of the full 128-bit product */
    static inline uint64_t fi_x3_fold(uint64_t a, uint64_t b) {
    #if defined(__SIZEOF_INT128__) && !defined(FI_NO_INT128)
        __uint128_t p = (__uint128_t)a * (__uint128_t)b;
        return (uint64_t)p ^ (uint64_t)(p >> 64);
    #else
        uint64_t al = a & 0xFFFFFFFFULL, ah = a >> 32, bl = b & 0xFFFFFFFFULL, bh = b >> 32;
        uint64_t ll = al * bl, hl = ah * bl, lh = al * bh, hh = ah * bh;
        uint64_t mid = (ll >> 32) + (hl & 0xFFFFFFFFULL) + lh;
        uint64_t hi = hh + (hl >> 32) + (mid >> 32);
        uint64_t lo = (mid << 32) | (ll & 0xFFFFFFFFULL);
        return lo ^ hi;
    #endif
    }
    static inline uint64_t fi_x3_av64(uint64_t h) {  /* the XXH64 avalanche */
        h ^= h >> 33; h *= FI_P64_2; h ^= h >> 29; h *= FI_P64_3; h ^= h >> 32; return h;
    }
    static inline uint64_t fi_x3_av(uint64_t h) {    /* the XXH3 avalanche */
        h ^= h >> 37; h *= FI_PMX_1; h ^= h >> 32; return h;
    }
    static inline uint64_t fi_x3_mix16(const uint8_t *in, const uint8_t *sec, uint64_t seed) {
        return fi_x3_fold(fi_x3_r64(in) ^ (fi_x3_r64(sec) + seed),
                          fi_x3_r64(in + 8) ^ (fi_x3_r64(sec + 8) - seed));
    }

    static uint64_t fi_x3_small(const uint8_t *in, size_t len, uint64_t seed) {  /* 0..16 */
        const uint8_t *s = fi_x3_ksecret;
        if (len > 8) {
            uint64_t lo = ((fi_x3_r64(s + 24) ^ fi_x3_r64(s + 32)) + seed) ^ fi_x3_r64(in);
            uint64_t hi = ((fi_x3_r64(s + 40) ^ fi_x3_r64(s + 48)) - seed) ^ fi_x3_r64(in + len - 8);
            return fi_x3_av((uint64_t)len + fi_x3_swap64(lo) + hi + fi_x3_fold(lo, hi));
        }
        if (len >= 4) {
            uint64_t mseed = seed ^ ((uint64_t)fi_x3_swap32((uint32_t)seed) << 32);
            uint64_t both = (uint64_t)fi_x3_r32(in + len - 4) | ((uint64_t)fi_x3_r32(in) << 32);
            uint64_t v = ((fi_x3_r64(s + 8) ^ fi_x3_r64(s + 16)) - mseed) ^ both;
            v ^= fi_x3_rotl(v, 49) ^ fi_x3_rotl(v, 24);
            v *= FI_PMX_2;
            v ^= (v >> 35) + (uint64_t)len;
            v *= FI_PMX_2;
            return v ^ (v >> 28);
        }
        if (len > 0) {
            uint32_t c = (uint32_t)in[len - 1] | ((uint32_t)len << 8) | ((uint32_t)in[0] << 16)
                         | ((uint32_t)in[len >> 1] << 24);
            uint64_t v = ((uint64_t)(fi_x3_r32(s) ^ fi_x3_r32(s + 4)) + seed) ^ (uint64_t)c;
            return fi_x3_av64(v);
        }
        return fi_x3_av64(seed ^ fi_x3_r64(s + 56) ^ fi_x3_r64(s + 64));
    }

    static uint64_t fi_x3_medium(const uint8_t *in, size_t len, uint64_t seed) {  /* 17..240 */
        const uint8_t *s = fi_x3_ksecret;
        uint64_t acc = (uint64_t)len * FI_P64_1;
        if (len <= 128) {
            ptrdiff_t i;
            for (i = (ptrdiff_t)((len - 1) >> 5); i >= 0; i--) {
                acc += fi_x3_mix16(in + 16 * i, s + 32 * i, seed);
                acc += fi_x3_mix16(in + len - 16 * i - 16, s + 32 * i + 16, seed);
            }
            return fi_x3_av(acc);
        } else {
            size_t i, chunks = len >> 4;
            for (i = 0; i < 8; i++) acc += fi_x3_mix16(in + 16 * i, s + 16 * i, seed);
            acc = fi_x3_av(acc);
            for (i = 8; i < chunks; i++) acc += fi_x3_mix16(in + 16 * i, s + 16 * (i - 8) + 3, seed);
            acc += fi_x3_mix16(in + len - 16, s + 119, seed);
            return fi_x3_av(acc);
        }
    }

    static inline void fi_x3_accumulate(uint64_t *acc, const uint8_t *stripe, const uint8_t *sec) {
        int i;
        for (i = 0; i < 8; i++) {
            uint64_t v = fi_x3_r64(stripe + 8 * i);
            uint64_t k = v ^ fi_x3_r64(sec + 8 * i);
            acc[i ^ 1] += v;
            acc[i] += (k & 0xFFFFFFFFULL) * (k >> 32);
        }
    }

    static uint64_t fi_x3_large(const uint8_t *in, size_t len, uint64_t seed) {  /* 241.. */
        uint8_t derived[192];
        const uint8_t *s = fi_x3_ksecret;
        uint64_t acc[8] = {FI_P32_3, FI_P64_1, FI_P64_2, FI_P64_3, FI_P64_4, FI_P32_2, FI_P64_5, FI_P32_1};
        size_t blocks, b, n, stripes;
        uint64_t result;
        int i;
        if (seed != 0) {
            for (i = 0; i < 12; i++) {
                fi_x3_w64(derived + 16 * i, fi_x3_r64(s + 16 * i) + seed);
                fi_x3_w64(derived + 16 * i + 8, fi_x3_r64(s + 16 * i + 8) - seed);
            }
            s = derived;
        }
        blocks = (len - 1) / 1024;  /* 16 stripes of 64 bytes per block with a 192-byte secret */
        for (b = 0; b < blocks; b++) {
            for (n = 0; n < 16; n++) fi_x3_accumulate(acc, in + 1024 * b + 64 * n, s + 8 * n);
            for (i = 0; i < 8; i++) {
                uint64_t a = acc[i];
                a ^= a >> 47;
                a ^= fi_x3_r64(s + 128 + 8 * i);
                acc[i] = a * FI_P32_1;
            }
        }
        stripes = ((len - 1) - 1024 * blocks) / 64;
        for (n = 0; n < stripes; n++) fi_x3_accumulate(acc, in + 1024 * blocks + 64 * n, s + 8 * n);
        fi_x3_accumulate(acc, in + len - 64, s + 192 - 71);
        result = (uint64_t)len * FI_P64_1;
        for (i = 0; i < 4; i++)
            result += fi_x3_fold(acc[2 * i] ^ fi_x3_r64(s + 11 + 16 * i),
                                 acc[2 * i + 1] ^ fi_x3_r64(s + 11 + 16 * i + 8));
        return fi_x3_av(result);
    }

    static inline uint64_t fi_xxh3_64(const uint8_t *in, size_t len, uint64_t seed) {
        if (len <= 16) return fi_x3_small(in, len, seed);
        if (len <= 240) return fi_x3_medium(in, len, seed);
        return fi_x3_large(in, len, seed);
    }

    /* UTF-8 of a PEP 393 string's code points, surrogates written like "surrogatepass"
       (the plain 3-byte form), stopping once `limit` bytes are out. `out` must hold
       limit + 3 bytes; the answer may exceed limit by up to 3 (the caller clamps). */
    #define FI_UTF8_LOOP(T)                                                        \
        {                                                                          \
            const T *d = (const T *)data;                                          \
            for (i = 0; i < len && o < limit; i++) {                               \
                uint32_t c = d[i];                                                 \
                if (c < 0x80) {                                                    \
                    out[o++] = (uint8_t)c;                                         \
                } else if (c < 0x800) {                                            \
                    out[o++] = (uint8_t)(0xC0 | (c >> 6));                         \
                    out[o++] = (uint8_t)(0x80 | (c & 0x3F));                       \
                } else if (c < 0x10000) {                                          \
                    out[o++] = (uint8_t)(0xE0 | (c >> 12));                        \
                    out[o++] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));                \
                    out[o++] = (uint8_t)(0x80 | (c & 0x3F));                       \
                } else {                                                           \
                    out[o++] = (uint8_t)(0xF0 | (c >> 18));                        \
                    out[o++] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));               \
                    out[o++] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));                \
                    out[o++] = (uint8_t)(0x80 | (c & 0x3F));                       \
                }                                                                  \
            }                                                                      \
        }
    static size_t fi_utf8_prefix(int kind, const void *data, size_t len, uint8_t *out, size_t limit) {
        size_t i = 0, o = 0;
        if (kind == 1) {  /* Latin-1: copy 8 ASCII characters at a time */
            const uint8_t *d = (const uint8_t *)data;
            uint64_t w;
            for (;;) {
                while (i + 8 <= len && o + 8 <= limit) {
                    memcpy(&w, d + i, 8);
                    if (w & 0x8080808080808080ULL) break;
                    memcpy(out + o, d + i, 8);
                    i += 8;
                    o += 8;
                }
                if (i >= len || o >= limit) break;
                if (d[i] < 0x80) {
                    out[o++] = d[i];
                } else {
                    out[o++] = (uint8_t)(0xC0 | (d[i] >> 6));
                    out[o++] = (uint8_t)(0x80 | (d[i] & 0x3F));
                }
                i++;
            }
        }
        else if (kind == 2) FI_UTF8_LOOP(uint16_t)
        else FI_UTF8_LOOP(uint32_t)
        return o;
    }
    """
    uint64_t fi_xxh3_64(const uint8_t* data, size_t length, uint64_t seed) nogil
    size_t fi_utf8_prefix(int kind, const void* data, size_t length, uint8_t* out, size_t limit) nogil

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void* PyUnicode_DATA(object o)
    int PyUnicode_KIND(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)


cdef array.array _Q = array.array("Q")


cdef object _chain(const uint8_t* p, Py_ssize_t end, Py_ssize_t block_size, bint packed, uint64_t seed):
    cdef Py_ssize_t count = end // block_size + (1 if end % block_size else 0)
    cdef Py_ssize_t i, start, size
    cdef object value
    cdef list out
    cdef array.array arr
    cdef unsigned long long* slots
    if packed:  # the hashes as machine words: no Python int per block
        arr = array.clone(_Q, count, zero=False)
        slots = arr.data.as_ulonglongs
        for i in range(count):
            start = i * block_size
            size = end - start if end - start < block_size else block_size
            seed = fi_xxh3_64(p + start, <size_t>size, seed)
            slots[i] = seed
        return arr
    out = PyList_New(count)
    for i in range(count):
        start = i * block_size
        size = end - start if end - start < block_size else block_size
        seed = fi_xxh3_64(p + start, <size_t>size, seed)
        value = PyLong_FromUnsignedLongLong(seed)
        Py_INCREF(value)
        PyList_SET_ITEM(out, i, value)
    return out


def chained_block_hashes(data, block_size=DEFAULT_BLOCK_SIZE, max_blocks=DEFAULT_MAX_BLOCKS, bint packed=False,
                         seed=0):
    """Chained XXH3-64 hashes of ``data``'s first ``max_blocks`` blocks (see ``prefixhash_py``);
    ``packed``: as an ``array('Q')`` instead of a list; ``seed``: the chain's start."""
    cdef uint64_t chain_seed = seed
    cdef Py_ssize_t bs, mb, limit, end
    cdef Py_buffer view
    cdef Py_ssize_t chars
    cdef int kind
    cdef uint8_t stack[STACK_BYTES + 4]
    cdef uint8_t* buf
    bs_o = PyNumber_Index(block_size)
    mb_o = PyNumber_Index(max_blocks)
    if bs_o < 1:
        raise ValueError("block_size must be >= 1")
    if mb_o < 0:
        raise ValueError("max_blocks must be >= 0")
    # clamping changes nothing: no input is longer than PY_SSIZE_T_MAX bytes
    bs = bs_o if bs_o < PY_SSIZE_T_MAX else PY_SSIZE_T_MAX
    mb = mb_o if mb_o < PY_SSIZE_T_MAX else PY_SSIZE_T_MAX
    limit = bs * mb if mb == 0 or bs <= PY_SSIZE_T_MAX // mb else PY_SSIZE_T_MAX
    if isinstance(data, str):
        if PyUnicode_IS_COMPACT_ASCII(data):
            end = PyUnicode_GET_LENGTH(data)
            if end > limit:
                end = limit
            return _chain(<const uint8_t*>PyUnicode_DATA(data), end, bs, packed, chain_seed)
        kind = PyUnicode_KIND(data)
        if kind != 1 and kind != 2 and kind != 4:  # a legacy (not ready) string: let Python encode
            raw = (<str>data)[:limit].encode("utf-8", "surrogatepass")
            end = PyBytes_GET_SIZE(raw)
            return _chain(<const uint8_t*>PyBytes_AS_STRING(raw), end if end < limit else limit, bs, packed, chain_seed)
        # encode only the bytes that count, straight from the string's code points
        chars = PyUnicode_GET_LENGTH(data)
        if chars > limit:
            chars = limit
        if limit <= STACK_BYTES:
            buf = &stack[0]
        else:
            buf = <uint8_t*>malloc(<size_t>limit + 4)
            if buf == NULL:
                raise MemoryError()
        try:
            end = <Py_ssize_t>fi_utf8_prefix(kind, PyUnicode_DATA(data), <size_t>chars,
                                             buf, <size_t>limit)
            return _chain(buf, end if end < limit else limit, bs, packed, chain_seed)
        finally:
            if buf != &stack[0]:
                free(buf)
    if isinstance(data, bytes):
        end = PyBytes_GET_SIZE(data)
        return _chain(<const uint8_t*>PyBytes_AS_STRING(data), end if end < limit else limit, bs, packed, chain_seed)
    mv = memoryview(data).cast("B")
    PyObject_GetBuffer(mv, &view, PyBUF_SIMPLE)
    try:
        end = view.len if view.len < limit else limit
        return _chain(<const uint8_t*>view.buf, end, bs, packed, chain_seed)
    finally:
        PyBuffer_Release(&view)


def xxh3_64(data, seed=0) -> int:
    """XXH3-64 of a bytes-like object (equals ``xxhash.xxh3_64_intdigest``); for tests and tools."""
    cdef Py_buffer view
    cdef uint64_t s = seed
    cdef uint64_t h
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        h = fi_xxh3_64(<const uint8_t*>view.buf, <size_t>view.len, s)
    finally:
        PyBuffer_Release(&view)
    return h
