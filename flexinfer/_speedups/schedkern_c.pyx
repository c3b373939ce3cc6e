# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The ``scored`` scheduler's per-candidate loops, compiled (twin of ``schedkern_py``: same results).

Owns and Must not: as ``schedkern_py``. Inputs are read as lists (other sequences are copied into
one first); intermediate values live in C arrays, and only the answer is boxed.
"""

from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from libc.stdlib cimport free, malloc

__all__ = ["best_of", "keep_below", "kv_free", "least_latency", "least_request"]

cdef double EXCESS_FACTOR = 100.0
cdef double INF = float("inf")

cdef extern from "Python.h":
    PyObject* PyList_GET_ITEM(object o, Py_ssize_t i)
    double PyFloat_AsDouble(object o) except? -1.0
    double PyFloat_AS_DOUBLE(object o)
    bint PyLong_CheckExact(object o)
    double PyLong_AsDouble(object o) except? -1.0


cdef inline list _as_list(object xs):
    return xs if type(xs) is list else list(xs)


cdef inline object _at(list xs, Py_ssize_t i):
    return <object>PyList_GET_ITEM(xs, i)


cdef inline double _f(object o) except? -1.0:
    if type(o) is float:
        return PyFloat_AS_DOUBLE(o)
    if PyLong_CheckExact(o):
        return PyLong_AsDouble(o)
    return PyFloat_AsDouble(o)


cdef list _boxed(const double* v, Py_ssize_t n):
    cdef list out = PyList_New(n)
    cdef Py_ssize_t i
    cdef object x
    for i in range(n):
        x = v[i]
        Py_INCREF(x)
        PyList_SET_ITEM(out, i, x)
    return out


cdef Py_ssize_t* _all(Py_ssize_t n) except NULL:
    """Indices 0..n-1 in a new C array (free it): the standalone kernels run the chain's loops."""
    cdef Py_ssize_t* idx = <Py_ssize_t*>malloc((n if n else 1) * sizeof(Py_ssize_t))
    cdef Py_ssize_t i
    if idx == NULL:
        raise MemoryError()
    for i in range(n):
        idx[i] = i
    return idx


def least_request(in_flight, running):
    cdef list f_ = _as_list(in_flight), r_ = _as_list(running)
    cdef Py_ssize_t n = len(f_)
    if len(r_) != n:
        raise ValueError("in_flight and running differ in length")
    if n == 0:
        return []
    cdef Py_ssize_t* idx = _all(n)
    cdef double* out = <double*>malloc(n * sizeof(double))
    try:
        if out == NULL:
            raise MemoryError()
        _lr(f_, r_, idx, n, out)
        return _boxed(out, n)
    finally:
        free(idx)
        free(out)


def least_latency(ttft, tpot):
    cdef list t_ = _as_list(ttft), p_ = _as_list(tpot)
    cdef Py_ssize_t n = len(t_)
    if len(p_) != n:
        raise ValueError("ttft and tpot differ in length")
    if n == 0:
        return []
    cdef Py_ssize_t* idx = _all(n)
    cdef double* out = <double*>malloc(2 * n * sizeof(double))
    try:
        if out == NULL:
            raise MemoryError()
        _ll(t_, p_, idx, n, out, out + n)
        return _boxed(out, n)
    finally:
        free(idx)
        free(out)


def kv_free(kv):
    cdef list k_ = _as_list(kv)
    cdef Py_ssize_t n = len(k_)
    if n == 0:
        return []
    cdef Py_ssize_t* idx = _all(n)
    cdef double* out = <double*>malloc(n * sizeof(double))
    try:
        if out == NULL:
            raise MemoryError()
        _kv(k_, idx, n, out)
        return _boxed(out, n)
    finally:
        free(idx)
        free(out)


def keep_below(values, double limit):
    cdef list v_ = _as_list(values)
    cdef Py_ssize_t n = len(v_), i
    cdef list keep = []
    cdef object v
    for i in range(n):
        v = _at(v_, i)
        if v is None or _f(v) < limit:
            keep.append(i)
    if not keep or len(keep) == n:
        return None
    return keep


cdef void _lr(list f_, list r_, Py_ssize_t* idx, Py_ssize_t m, double* out) except *:
    cdef Py_ssize_t i, j
    cdef double mx = 0.0, f, r, b, k
    cdef object ro
    for j in range(m):
        i = idx[j]
        f = _f(_at(f_, i))
        ro = _at(r_, i)
        if ro is None:
            b = f * (1.0 + EXCESS_FACTOR)
        else:
            r = _f(ro)
            b = f + EXCESS_FACTOR * (f - r) if f > r else f
        out[j] = b
        if b > mx:
            mx = b
    if mx <= 0.0:
        for j in range(m):
            out[j] = 100.0
        return
    k = 100.0 / mx
    for j in range(m):
        out[j] = (mx - out[j]) * k


cdef void _ll(list t_, list p_, Py_ssize_t* idx, Py_ssize_t m, double* out, double* tmp) except *:
    cdef Py_ssize_t i, j
    cdef double tlo = INF, plo = INF, thi = -INF, phi = -INF, t, p, s
    cdef object to, po
    for j in range(m):
        i = idx[j]
        to = _at(t_, i)
        if to is not None:
            t = _f(to)
            out[j] = t
            if t < tlo:
                tlo = t
            if t > thi:
                thi = t
        po = _at(p_, i)
        if po is not None:
            p = _f(po)
            tmp[j] = p
            if p < plo:
                plo = p
            if p > phi:
                phi = p
    for j in range(m):
        i = idx[j]
        s = 0.0 if _at(t_, i) is None else _half(out[j], tlo, thi)
        s = s + (0.0 if _at(p_, i) is None else _half(tmp[j], plo, phi))
        out[j] = s


cdef inline double _half(double v, double lo, double hi):
    """The pure twin's _half: 50 at lo, 0 at hi (a quotient, so a subnormal span gives no NaN)."""
    cdef double span
    if not hi > lo:
        return 50.0
    span = hi - lo
    if span == INF:
        return 50.0 - 50.0 * ((v * 0.5 - lo * 0.5) / (hi * 0.5 - lo * 0.5))
    return 50.0 - 50.0 * ((v - lo) / span)


cdef void _kv(list k_, Py_ssize_t* idx, Py_ssize_t m, double* out) except *:
    cdef Py_ssize_t j
    cdef double u
    cdef object uo
    for j in range(m):
        uo = _at(k_, idx[j])
        if uo is None:
            out[j] = 0.0
        else:
            u = _f(uo)
            out[j] = 100.0 * (1.0 - (0.0 if u < 0.0 else 1.0 if u > 1.0 else u))


def best_of(codes, weights, double max_waiting, in_flight, waiting, running, kv, ttft, tpot, extra, Py_ssize_t turn):
    cdef list f_ = _as_list(in_flight), w_ = _as_list(waiting), r_ = _as_list(running), k_ = _as_list(kv)
    cdef list t_ = _as_list(ttft), p_ = _as_list(tpot)
    cdef tuple codes_ = codes if type(codes) is tuple else tuple(codes)
    cdef tuple weights_ = weights if type(weights) is tuple else tuple(weights)
    cdef object extra_ = extra
    cdef Py_ssize_t n = len(f_), m = 0, i, j, c, nc = len(codes_), nties, pick, code
    cdef double w, best
    cdef object v, ex
    cdef list exl
    if n == 0:
        raise ValueError("no candidates")
    if nc == 0:
        raise ValueError("no scorer")
    if len(weights_) != nc or len(extra_) != nc:
        raise ValueError("codes, weights and extra differ in length")
    cdef Py_ssize_t* idx = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
    cdef double* buf = <double*>malloc(3 * n * sizeof(double))
    if idx == NULL or buf == NULL:
        free(idx)
        free(buf)
        raise MemoryError()
    cdef double* tot = buf
    cdef double* s = buf + n
    cdef double* tmp = buf + 2 * n
    try:
        if max_waiting >= 0.0:  # the least-request filter, as keep_below: all or none kept means all
            for i in range(n):
                v = _at(w_, i)
                if v is None or _f(v) < max_waiting:
                    idx[m] = i
                    m += 1
            if m == 0 or m == n:
                m = 0
        if m == 0:
            for i in range(n):
                idx[i] = i
            m = n
        for c in range(nc):
            code = <Py_ssize_t>codes_[c]
            if code == 1:
                _lr(f_, r_, idx, m, s)
            elif code == 2:
                _ll(t_, p_, idx, m, s, tmp)
            elif code == 3:
                _kv(k_, idx, m, s)
            else:
                ex = extra_[c]
                if ex is None or len(ex) != n:
                    raise ValueError("extra scores must give one per candidate")
                exl = _as_list(ex)
                for j in range(m):
                    s[j] = _f(_at(exl, idx[j]))
            w = _f(weights_[c])
            if w != 1.0:
                for j in range(m):
                    s[j] = s[j] * w
            if c == 0:
                for j in range(m):
                    tot[j] = s[j]
            else:
                for j in range(m):
                    tot[j] = tot[j] + s[j]
        best = tot[0]
        pick = 0
        for j in range(1, m):
            if tot[j] > best:
                best = tot[j]
                pick = j
        nties = 0
        for j in range(m):
            if tot[j] == best:
                nties += 1
        if m > 1 and nties > 1:
            c = turn % nties
            if c < 0:
                c += nties
            for j in range(m):
                if tot[j] == best:
                    if c == 0:
                        pick = j
                        break
                    c -= 1
            return idx[pick], True
        return idx[pick], False
    finally:
        free(idx)
        free(buf)
