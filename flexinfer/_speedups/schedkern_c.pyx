# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The ``scored`` scheduler's per-candidate loops, compiled (twin of ``schedkern_py``: same results).

Owns and Must not: as ``schedkern_py``.
"""

__all__ = ["keep_below", "kv_free", "least_latency", "least_request"]

cdef double EXCESS_FACTOR = 100.0
cdef double INF = float("inf")


def least_request(in_flight, running):
    cdef Py_ssize_t n = len(in_flight), i
    if len(running) != n:
        raise ValueError("in_flight and running differ in length")
    cdef list bases = [0.0] * n
    cdef double mx = 0.0, f, r, b, k
    cdef object ro
    for i in range(n):
        f = <double>in_flight[i]
        ro = running[i]
        if ro is None:
            b = f * (1.0 + EXCESS_FACTOR)
        else:
            r = <double>ro
            b = f + EXCESS_FACTOR * (f - r) if f > r else f
        bases[i] = b
        if b > mx:
            mx = b
    if mx <= 0.0:
        return [100.0] * n
    k = 100.0 / mx
    cdef list out = [0.0] * n
    for i in range(n):
        out[i] = (mx - <double>bases[i]) * k
    return out


def least_latency(ttft, tpot):
    cdef Py_ssize_t n = len(ttft), i
    if len(tpot) != n:
        raise ValueError("ttft and tpot differ in length")
    cdef double tlo = INF, plo = INF, thi = -INF, phi = -INF, t, p, tk, pk, s
    cdef object to, po
    for i in range(n):
        to = ttft[i]
        if to is not None:
            t = <double>to
            if t < tlo:
                tlo = t
            if t > thi:
                thi = t
        po = tpot[i]
        if po is not None:
            p = <double>po
            if p < plo:
                plo = p
            if p > phi:
                phi = p
    tk = 50.0 / (thi - tlo) if thi > tlo else 0.0
    pk = 50.0 / (phi - plo) if phi > plo else 0.0
    cdef list out = [0.0] * n
    for i in range(n):
        to = ttft[i]
        po = tpot[i]
        s = 0.0 if to is None else 50.0 - (<double>to - tlo) * tk
        s = s + (0.0 if po is None else 50.0 - (<double>po - plo) * pk)
        out[i] = s
    return out


def kv_free(kv):
    cdef Py_ssize_t n = len(kv), i
    cdef list out = [0.0] * n
    cdef double u
    cdef object uo
    for i in range(n):
        uo = kv[i]
        if uo is not None:
            u = <double>uo
            out[i] = 100.0 * (1.0 - (0.0 if u < 0.0 else 1.0 if u > 1.0 else u))
    return out


def keep_below(values, double limit):
    cdef Py_ssize_t n = len(values), i
    cdef list keep = []
    cdef object v
    for i in range(n):
        v = values[i]
        if v is None or <double>v < limit:
            keep.append(i)
    if not keep or len(keep) == n:
        return None
    return keep
