# cython: language_level=3, boundscheck=False, wraparound=False
"""The framing check of an HTTP head we write, and the builder of its header lines, compiled: the
twin of headscan_py.

Same results as :mod:`headscan_py`. Three ``memchr`` walks (NUL, LF, CR) that stop as soon as the
count is past ``lines``, instead of two ``bytes.count`` calls (each a method call that parses its
arguments as a tuple: about 1,700 instructions of the proxy's per-request work apiece, for a
300-byte head). ``request_fields`` walks a request head once with three byte tables.
Must not: import anything of ours.
"""

from libc.string cimport memchr


cdef extern from "Python.h":
    char* PyBytes_AS_STRING(object)
    Py_ssize_t PyBytes_GET_SIZE(object)


cdef Py_ssize_t _count(const char* buf, Py_ssize_t n, int byte, Py_ssize_t stop):
    """Occurrences of ``byte`` in ``buf[:n]``; stops counting once past ``stop``."""
    cdef const char* p = buf
    cdef const char* end = buf + n
    cdef const char* hit
    cdef Py_ssize_t count = 0
    while p < end:
        hit = <const char*>memchr(p, byte, end - p)
        if hit == NULL:
            break
        count += 1
        if count > stop:
            break
        p = hit + 1
    return count


def head_lines_ok(bytes head not None, Py_ssize_t lines):
    """Whether ``head`` holds exactly ``lines`` CR and ``lines`` LF bytes and no NUL."""
    cdef const char* buf = PyBytes_AS_STRING(head)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(head)
    if memchr(buf, 0, n) != NULL:
        return False
    return _count(buf, n, 10, lines) == lines and _count(buf, n, 13, lines) == lines


from cpython.ref cimport PyObject
from libc.string cimport memcpy

cdef extern from "Python.h":
    bint PyTuple_CheckExact(object)
    bint PyList_CheckExact(object)
    object PyBytes_FromStringAndSize(const char*, Py_ssize_t)
    PyObject* PyDict_GetItemWithError(object, PyObject*) except? NULL
    Py_ssize_t PyTuple_GET_SIZE(object)
    PyObject* PyTuple_GET_ITEM(object, Py_ssize_t)
    Py_ssize_t PySequence_Fast_GET_SIZE(object)
    PyObject** PySequence_Fast_ITEMS(object)
    bint Py_IS_TYPE "Py_IS_TYPE" (PyObject*, void*)
    PyObject* Py_True "Py_True"
    void* PyBytes_Type_ptr "(&PyBytes_Type)"
    void* PyTuple_Type_ptr "(&PyTuple_Type)"

#: more headers than this go to the caller's own builder (the keep marks below are this wide)
MAX_BLOCK_HEADERS = 64
cdef enum:
    _MAX = 64

# 1 for the bytes a lower-case header name may hold: RFC 9110's tchar less A-Z
cdef unsigned char _LTOK[256]


cdef void _init_table():
    cdef int c
    for c in range(256):
        _LTOK[c] = 0
    for c in b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz":
        _LTOK[c] = 1


_init_table()


cdef inline bint _lower_token(PyObject* name):
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(<object>name)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(<object>name)
    cdef Py_ssize_t i
    if n == 0:
        return False
    for i in range(n):
        if not _LTOK[p[i]]:
            return False
    return True


cdef extern from *:
    """
    /* whether any of the 8 bytes of v is 0x00, 0x0a or 0x0d: the classic has-zero-byte test on v,
       v ^ LF..LF and v ^ CR..CR (nonzero exactly when the word holds one; the byte loop after it
       then looks at the bytes themselves) */
    #define FI_ONES 0x0101010101010101ULL
    #define FI_HIGH 0x8080808080808080ULL
    #define FI_ZERO(v) (((v) - FI_ONES) & ~(v) & FI_HIGH)
    static inline int fi_word_has_ctl(unsigned long long v) {
        return (FI_ZERO(v) | FI_ZERO(v ^ (FI_ONES * 0x0a)) | FI_ZERO(v ^ (FI_ONES * 0x0d))) != 0;
    }
    """
    bint fi_word_has_ctl(unsigned long long v) nogil


cdef inline bint _no_ctl(PyObject* value):
    """No CR, LF or NUL in ``value``: eight bytes at a time, then the rest byte by byte."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(<object>value)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(<object>value)
    cdef Py_ssize_t i = 0
    cdef unsigned long long word
    cdef unsigned char c
    while i + 8 <= n:
        memcpy(&word, p + i, 8)
        if fi_word_has_ctl(word):
            break  # one of them is in this word: the byte loop below finds it
        i += 8
    while i < n:
        c = p[i]
        if c <= 13 and (c == 13 or c == 10 or c == 0):
            return False
        i += 1
    return True


cdef Py_ssize_t _edges(tuple pieces, Py_ssize_t* crs, Py_ssize_t* lfs):
    """The bytes ``pieces`` hold in all, counting their CR and LF; -1 for a non-bytes piece or a NUL."""
    cdef Py_ssize_t total = 0, i, n
    cdef PyObject* piece
    cdef const char* p
    for i in range(PyTuple_GET_SIZE(pieces)):
        piece = PyTuple_GET_ITEM(pieces, i)
        if not Py_IS_TYPE(piece, PyBytes_Type_ptr):
            return -1
        p = PyBytes_AS_STRING(<object>piece)
        n = PyBytes_GET_SIZE(<object>piece)
        if n == 0:
            continue
        if memchr(p, 0, n) != NULL:
            return -1
        crs[0] += _count(p, n, 13, n)
        lfs[0] += _count(p, n, 10, n)
        total += n
    return total


cdef char* _put(char* out, tuple pieces):
    cdef Py_ssize_t i, n
    cdef PyObject* piece
    for i in range(PyTuple_GET_SIZE(pieces)):
        piece = PyTuple_GET_ITEM(pieces, i)
        n = PyBytes_GET_SIZE(<object>piece)
        memcpy(out, PyBytes_AS_STRING(<object>piece), n)
        out += n
    return out


def head_block(tuple lead not None, headers, dict rules not None, tuple tail not None, Py_ssize_t lines):
    """The head ``lead`` + one ``name: value`` CRLF line per header, in order + ``tail``, or None
    where the caller's own builder must decide (the rules are the twin's, headscan_py.head_block)."""
    if not PyList_CheckExact(headers) and not PyTuple_CheckExact(headers):
        return None
    cdef Py_ssize_t nh = PySequence_Fast_GET_SIZE(headers)
    if nh > _MAX:
        return None
    cdef PyObject** items = PySequence_Fast_ITEMS(headers)
    cdef unsigned char keep[_MAX]
    cdef Py_ssize_t i, total = 0, crs = 0, lfs = 0, edge
    cdef PyObject* item
    cdef PyObject* name
    cdef PyObject* value
    cdef PyObject* rule
    for i in range(nh):
        item = items[i]
        if not Py_IS_TYPE(item, PyTuple_Type_ptr) or PyTuple_GET_SIZE(<object>item) != 2:
            return None
        name = PyTuple_GET_ITEM(<object>item, 0)
        value = PyTuple_GET_ITEM(<object>item, 1)
        if not Py_IS_TYPE(name, PyBytes_Type_ptr) or not Py_IS_TYPE(value, PyBytes_Type_ptr):
            return None
        if not _lower_token(name):
            return None
        rule = PyDict_GetItemWithError(rules, name)
        if rule != NULL:
            if rule == Py_True:
                keep[i] = 0
                continue
            return None
        if not _no_ctl(value):
            return None
        keep[i] = 1
        total += PyBytes_GET_SIZE(<object>name) + PyBytes_GET_SIZE(<object>value) + 4
    edge = _edges(lead, &crs, &lfs)
    if edge < 0:
        return None
    i = _edges(tail, &crs, &lfs)
    if i < 0 or crs != lines or lfs != lines:
        return None
    total += edge + i
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* p = _put(PyBytes_AS_STRING(out), lead)
    cdef Py_ssize_t n
    for i in range(nh):
        if not keep[i]:
            continue
        item = items[i]
        name = PyTuple_GET_ITEM(<object>item, 0)
        value = PyTuple_GET_ITEM(<object>item, 1)
        n = PyBytes_GET_SIZE(<object>name)
        memcpy(p, PyBytes_AS_STRING(<object>name), n)
        p += n
        p[0] = 58  # ':'
        p[1] = 32
        p += 2
        n = PyBytes_GET_SIZE(<object>value)
        memcpy(p, PyBytes_AS_STRING(<object>value), n)
        p += n
        p[0] = 13
        p[1] = 10
        p += 2
    _put(p, tail)
    return out


cdef extern from "string.h":
    void* memmem(const void* hay, size_t hlen, const void* needle, size_t nlen) nogil
    int memcmp(const void* a, const void* b, size_t n) nogil

_V11 = "1.1"
_V10 = "1.0"
_NO_HEAD = (-1, None)


def request_head(bytes data not None, Py_ssize_t pos):
    """Where the request head that starts at ``data[pos]`` ends, and the version its request line
    plainly names (see headscan_py): ``memmem`` for the blank line, ``memchr`` for the first LF and
    the space ahead of the version."""
    cdef const char* b = PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef const char* hit
    cdef Py_ssize_t end, k
    if pos < 0:
        pos = 0
    if pos >= n:
        return _NO_HEAD
    hit = <const char*>memmem(b + pos, n - pos, b"\r\n\r\n", 4)
    if hit == NULL:
        return _NO_HEAD
    end = hit - b + 4
    k = <const char*>memchr(b + pos, 10, end - pos) - b  # found: the blank line's at the latest
    if (k - 10 >= pos and b[k - 1] == 13 and b[k - 10] == 32 and memcmp(b + k - 9, b"HTTP/1.", 7) == 0
            and memchr(b + pos, 32, k - 10 - pos) != NULL):
        if b[k - 2] == 49:
            return (end, _V11)
        if b[k - 2] == 48:
            return (end, _V10)
    return (end, None)


# request_fields: the byte classes of a plainly written request head (see headscan_py)
cdef unsigned char _URL[256]   # a target's path and query bytes
cdef unsigned char _NAME[256]  # a field name's: letters, digits, '-'
cdef unsigned char _VALUE[256]  # a field value's: visible ASCII, SP, HTAB


cdef void _init_plain():
    cdef int c
    for c in range(256):
        _URL[c] = 0
        _NAME[c] = 0
        _VALUE[c] = 1 if (0x20 <= c <= 0x7e or c == 9) else 0
    for c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-":
        _NAME[c] = 1
        _URL[c] = 1
    for c in b"._~!$&'()*+,;=:@/?%":
        _URL[c] = 1


_init_plain()

_M_GET = b"GET"
_M_POST = b"POST"
_M_PUT = b"PUT"
_M_DELETE = b"DELETE"
_M_HEAD = b"HEAD"
_M_OPTIONS = b"OPTIONS"
_M_PATCH = b"PATCH"
PLAIN_METHODS = {m: m for m in (_M_GET, _M_POST, _M_PUT, _M_DELETE, _M_HEAD, _M_OPTIONS, _M_PATCH)}


cdef object _plain_method(const char* p, Py_ssize_t n):
    """The method object for ``p[:n]``, or None."""
    if n == 3:
        if memcmp(p, b"GET", 3) == 0:
            return _M_GET
        if memcmp(p, b"PUT", 3) == 0:
            return _M_PUT
    elif n == 4:
        if memcmp(p, b"POST", 4) == 0:
            return _M_POST
        if memcmp(p, b"HEAD", 4) == 0:
            return _M_HEAD
    elif n == 5:
        if memcmp(p, b"PATCH", 5) == 0:
            return _M_PATCH
    elif n == 6:
        if memcmp(p, b"DELETE", 6) == 0:
            return _M_DELETE
    elif n == 7:
        if memcmp(p, b"OPTIONS", 7) == 0:
            return _M_OPTIONS
    return None


cdef extern from "strings.h":
    int strncasecmp(const char* a, const char* b, size_t n) nogil


cdef extern from "Python.h":
    object PyBytes_FromStringAndSize_NULL "PyBytes_FromStringAndSize" (const char*, Py_ssize_t)
    char* PyBytes_AS_STRING_W "PyBytes_AS_STRING" (object)
    object PyLong_FromLong(long)


cdef inline object _lower_bytes(const unsigned char* p, Py_ssize_t n):
    """A new bytes of ``p[:n]`` with A-Z lower-cased."""
    cdef object out = PyBytes_FromStringAndSize_NULL(NULL, n)
    cdef unsigned char* w = <unsigned char*>PyBytes_AS_STRING_W(out)
    cdef Py_ssize_t i
    cdef unsigned char c
    for i in range(n):
        c = p[i]
        w[i] = c + 32 if 65 <= c <= 90 else c
    return out


cdef object _plain_fields(const unsigned char* b, Py_ssize_t p, Py_ssize_t n, bint lower, Py_ssize_t* after):
    """The plain field lines from ``b[p]`` to the blank line, within ``b[:n]``, as a list of
    ``(name, value)`` (names lower-cased when ``lower``; the value without its leading whitespace);
    ``*after`` is set just past the blank line. None at the first byte that is not plain, or when
    ``b[:n]`` ends before the blank line (see headscan_py's request_fields)."""
    cdef Py_ssize_t start, vstart
    cdef list fields = []
    cdef object name
    while True:
        if p + 2 > n:
            return None
        if b[p] == 13:  # the blank line
            if b[p + 1] != 10:
                return None
            after[0] = p + 2
            return fields
        start = p
        while p < n and _NAME[b[p]]:
            p += 1
        if p == start or p >= n or b[p] != 58:  # ':'
            return None
        if p - start == 16 and strncasecmp(<const char*>b + start, b"proxy-connection", 16) == 0:
            return None
        if lower:
            name = _lower_bytes(b + start, p - start)
        else:
            name = PyBytes_FromStringAndSize(<const char*>b + start, p - start)
        p += 1
        while p < n and (b[p] == 32 or b[p] == 9):
            p += 1
        vstart = p
        while p < n and _VALUE[b[p]]:
            p += 1
        if p + 2 > n or b[p] != 13 or b[p + 1] != 10:
            return None
        fields.append((name, PyBytes_FromStringAndSize(<const char*>b + vstart, p - vstart)))
        p += 2


def request_fields(bytes data not None, Py_ssize_t pos, Py_ssize_t end):
    """The method, target and header fields of the plainly written request head ``data[pos:end]``,
    else None (see headscan_py): one walk over the head with three byte tables."""
    cdef const unsigned char* b = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t p, start, stop, after = 0
    cdef object method, target, fields
    if pos < 0 or end > n or end - pos < 18 or b[end - 2] != 13 or b[end - 1] != 10:
        return None
    stop = end - 2
    p = pos
    while p < stop and 65 <= b[p] <= 90:  # A-Z
        p += 1
    if p >= stop or b[p] != 32:
        return None
    method = _plain_method(<const char*>b + pos, p - pos)
    if method is None:
        return None
    p += 1
    start = p
    if p >= stop or b[p] != 47:  # '/'
        return None
    while p < stop and _URL[b[p]]:
        p += 1
    if p + 10 > stop or memcmp(b + p, b" HTTP/1.1\r\n", 11) != 0:
        return None
    target = PyBytes_FromStringAndSize(<const char*>b + start, p - start)
    fields = _plain_fields(b, p + 11, end, False, &after)
    if fields is None or after != end:
        return None
    return (method, target, fields)


def response_head(bytes data not None):
    """Where the plainly written response head at the start of ``data`` ends, its status and its
    fields (names lower-cased), else None (see headscan_py): one walk with the byte tables of
    request_fields, no search for the blank line first (the walk stops there)."""
    cdef const unsigned char* b = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t p, after = 0
    cdef int status
    cdef object fields
    if n < 17 or memcmp(b, b"HTTP/1.1 ", 9) != 0:
        return None
    if not (50 <= b[9] <= 53 and 48 <= b[10] <= 57 and 48 <= b[11] <= 57 and b[12] == 32):
        return None
    status = (b[9] - 48) * 100 + (b[10] - 48) * 10 + (b[11] - 48)
    p = 13
    while p < n and _VALUE[b[p]]:
        p += 1
    if p + 2 > n or b[p] != 13 or b[p + 1] != 10:
        return None
    fields = _plain_fields(b, p + 2, n, True, &after)
    if fields is None:
        return None
    return (after, PyLong_FromLong(status), fields)
