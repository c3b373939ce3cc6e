"""The ``scored`` scheduler's per-candidate loops (pure Python twin of ``schedkern_c``).

Owns: the arithmetic of the plugins that read engine figures, over columns (one list per figure,
one entry per candidate, ``None`` = unknown): Kthena's least-request score, the least-latency
blend, the free KV cache, and the waiting-queue filter. Same results as the compiled twin, bit
for bit (the same operations in the same order on doubles).
Must not: import anything from flexinfer, or keep state.

Contracts (the plugins in ``flexinfer.proxy.scorers`` document them): every score is in 0..100,
higher is better, and an unknown figure scores 0, the floor of the scale, so unknown never looks
better than the worst known value.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["best_of", "keep_below", "kv_free", "least_latency", "least_request"]

EXCESS_FACTOR = 100.0
_INF = float("inf")


def least_request(in_flight: Sequence[int], running: Sequence[float | None]) -> list[float]:
    """base = f + 100 x max(f - r, 0) (unknown r: f x 101); score = 100 x (max - base) / max
    (all bases 0: 100 each)."""
    n = len(in_flight)
    if len(running) != n:
        raise ValueError("in_flight and running differ in length")
    bases: list[float] = []
    add = bases.append
    mx = 0.0
    for i in range(n):
        f = float(in_flight[i])
        r = running[i]
        if r is None:
            b = f * (1.0 + EXCESS_FACTOR)
        else:
            r = float(r)
            b = f + EXCESS_FACTOR * (f - r) if f > r else f
        add(b)
        if b > mx:
            mx = b
    if mx <= 0.0:
        return [100.0] * n
    k = 100.0 / mx
    return [(mx - b) * k for b in bases]


def least_latency(ttft: Sequence[float | None], tpot: Sequence[float | None]) -> list[float]:
    """Each half: 50 at the lowest known value, 0 at the highest, 50 when all known are equal;
    unknown 0. Score = TTFT half + TPOT half."""
    n = len(ttft)
    if len(tpot) != n:
        raise ValueError("ttft and tpot differ in length")
    inf = float("inf")
    tlo = plo = inf
    thi = phi = -inf
    for i in range(n):
        t = ttft[i]
        if t is not None:
            t = float(t)
            if t < tlo:
                tlo = t
            if t > thi:
                thi = t
        p = tpot[i]
        if p is not None:
            p = float(p)
            if p < plo:
                plo = p
            if p > phi:
                phi = p
    out: list[float] = []
    add = out.append
    for i in range(n):
        t = ttft[i]
        p = tpot[i]
        add((0.0 if t is None else _half(float(t), tlo, thi)) + (0.0 if p is None else _half(float(p), plo, phi)))
    return out


def _half(v: float, lo: float, hi: float) -> float:
    """50 at ``lo``, 0 at ``hi``, linear between (50 when ``lo == hi``). The position is a quotient
    of two differences, not a product with 50 / (hi - lo): a subnormal span would make that
    factor infinite (and 0 x inf a NaN); a span past the largest double is halved first."""
    if not hi > lo:
        return 50.0
    span = hi - lo
    if span == _INF:
        return 50.0 - 50.0 * ((v * 0.5 - lo * 0.5) / (hi * 0.5 - lo * 0.5))
    return 50.0 - 50.0 * ((v - lo) / span)


def kv_free(kv: Sequence[float | None]) -> list[float]:
    """100 x (1 - usage), usage clamped to 0..1; unknown 0 (as if full)."""
    out: list[float] = []
    add = out.append
    for u in kv:
        if u is None:
            add(0.0)
        else:
            u = float(u)
            add(100.0 * (1.0 - (0.0 if u < 0.0 else 1.0 if u > 1.0 else u)))
    return out


def keep_below(values: Sequence[float | None], limit: float) -> list[int] | None:
    """Indices whose value is unknown or < ``limit``; None when that is every index (nothing to
    drop) or no index (a filter never empties the set)."""
    limit = float(limit)
    keep: list[int] = []
    add = keep.append
    for i, v in enumerate(values):
        if v is None or float(v) < limit:
            add(i)
    if not keep or len(keep) == len(values):
        return None
    return keep


def best_of(codes: Sequence[int], weights: Sequence[float], max_waiting: float, in_flight: Sequence[int],
            waiting: Sequence[float | None], running: Sequence[float | None], kv: Sequence[float | None],
            ttft: Sequence[float | None], tpot: Sequence[float | None], extra: Sequence[Sequence[float] | None],
            turn: int) -> tuple[int, bool]:
    """The whole ``pick=best`` chain of built-in plugins in one call: the waiting filter (when
    ``max_waiting`` >= 0), then per scorer ``codes[j]`` (1 least-request, 2 least-latency,
    3 kv-cache, 0 the precomputed per-candidate scores ``extra[j]``) weighted by ``weights[j]``
    and summed in that order, then the highest total; candidates tied for it take turns
    (``turn``: the caller's counter, used only when there is a tie). Returns (index into the
    inputs, whether a tie used the turn). The scores equal the scheduler's plugins' exactly."""
    n = len(in_flight)
    if n == 0:
        raise ValueError("no candidates")
    idx = keep_below(waiting, max_waiting) if max_waiting >= 0.0 else None
    f, r, k, t, p = in_flight, running, kv, ttft, tpot
    if idx is not None:
        f = [in_flight[i] for i in idx]
        r = [running[i] for i in idx]
        k = [kv[i] for i in idx]
        t = [ttft[i] for i in idx]
        p = [tpot[i] for i in idx]
    m = len(f)
    totals: list[float] | None = None
    for j, code in enumerate(codes):
        if code == 1:
            s = least_request(f, r)
        elif code == 2:
            s = least_latency(t, p)
        elif code == 3:
            s = kv_free(k)
        else:
            ex = extra[j]
            if ex is None or len(ex) != n:
                raise ValueError("extra scores must give one per candidate")
            s = [float(ex[i]) for i in idx] if idx is not None else [float(x) for x in ex]
        w = float(weights[j])
        if w != 1.0:
            s = [x * w for x in s]
        totals = s if totals is None else [a + b for a, b in zip(totals, s, strict=True)]
    if totals is None:
        raise ValueError("no scorer")
    best = max(totals)
    i = totals.index(best)
    tied = m > 1 and totals.count(best) > 1
    if tied:
        ties = [j for j, x in enumerate(totals) if x == best]
        i = ties[turn % len(ties)]
    return (idx[i] if idx is not None else i), tied
