"""The benchmark gate's verdict: pure functions over the measured figures (no I/O, no clocks).

Owns: :data:`THRESHOLDS` (the ONE place the gate's limits live), :func:`judge` (per-side medians,
per-round HEAD/baseline ratios and their median, pass/fail per metric), :func:`confirmed` (a
failure stands only when a second run fails the same metric), :func:`micro_ratios` (the
micro suites' per-case median ratio, cases absent at the baseline marked new) and the text tables.
Must not: run anything, read files or the environment, or depend on flexinfer.

A judged metric fails when two estimators of HEAD/baseline both exceed its limit:

- the median of the per-round ratios: baseline and HEAD are measured back to back in every round,
  so a burst of foreign load on the shared machine that moves both sides of a round cancels in that
  round's ratio, and the median drops a round where it hit one side only;
- for CPU time, the ratio of the per-side best (minimum) figures: foreign load only ever adds CPU
  time, so each side's best window is the one least disturbed; for a percentile of samples
  (:data:`POOLED`: TTFE p99), the ratio of that percentile over each side's samples of all rounds
  pooled (a window's p99 is its 3rd-largest sample or so, far noisier than the p99 of all of them).

A real regression moves both; a noise burst on the 2 shared cores rarely moves both past the limit.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: metric -> largest allowed HEAD/baseline ratio minus 1 (all metrics: lower is better)
THRESHOLDS: dict[str, float] = {
    "nonstream_cpu_us": 0.10,  # proxy CPU time per non-streaming request
    "stream_cpu_us": 0.10,  # proxy CPU time per 35-event stream
    "ttfe_p99_ms": 0.25,  # paced probe's time to first event, p99, under the stream load
}
#: reported next to the judged metrics, never judged
INFORMATIVE = ("ttfe_p50_ms", "nonstream_rps", "stream_rps")
#: metric -> (the per-round list of raw samples it is a percentile of, the percentile): its second
#: estimator is that percentile over all rounds' samples of a side, pooled
POOLED: dict[str, tuple[str, float]] = {"ttfe_p99_ms": ("ttfe_ms", 0.99), "ttfe_p50_ms": ("ttfe_ms", 0.50)}

Round = Mapping[str, Mapping[str, Any]]  # side ("base"/"head") -> metric -> value (or raw samples)


@dataclass
class Row:
    metric: str
    base: float  # median over the rounds
    head: float
    ratio: float  # median of the per-round HEAD/baseline ratios
    ratio_min: float  # the smallest and largest per-round ratio (the spread)
    ratio_max: float
    best_ratio: float  # min(HEAD) / min(baseline); for a POOLED metric, pooled(HEAD) / pooled(baseline)
    limit: float | None  # allowed ratio (1 + threshold), None when informative
    ok: bool


@dataclass
class Verdict:
    rows: list[Row]
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def judge(rounds: Sequence[Round], thresholds: Mapping[str, float] = THRESHOLDS,
          informative: Sequence[str] = INFORMATIVE) -> Verdict:
    """Judge HEAD against the baseline from rounds of paired measurements.

    A judged metric fails when the median of its per-round ratios AND the ratio of the per-side
    minimums both exceed ``1 + threshold`` (module doc). A metric missing from a round, or a non-positive baseline figure, is a failure (a gate that cannot
    measure must not pass). ValueError for no rounds.
    """
    if not rounds:
        raise ValueError("no rounds to judge")
    rows: list[Row] = []
    failures: list[str] = []
    for metric in [*thresholds, *informative]:
        limit = 1.0 + thresholds[metric] if metric in thresholds else None
        try:
            base = [float(r["base"][metric]) for r in rounds]
            head = [float(r["head"][metric]) for r in rounds]
        except KeyError:
            if limit is not None:
                failures.append(f"{metric}: not measured in every round")
            continue
        if min(base) <= 0:
            if limit is not None:
                failures.append(f"{metric}: baseline figure <= 0 ({min(base)})")
            continue
        ratios = [h / b for h, b in zip(head, base, strict=True)]
        ratio = statistics.median(ratios)
        best = min(head) / min(base)
        pooled = _pooled(rounds, metric)
        if pooled is not None:
            best = pooled
        ok = limit is None or ratio <= limit or best <= limit
        if not ok:
            second = "all rounds pooled" if metric in POOLED and pooled is not None else "best windows"
            failures.append(f"{metric}: HEAD/baseline {ratio:.3f} (median of rounds) and {best:.3f} ({second}) "
                            f"> {limit:.2f} (baseline {statistics.median(base):.2f}, "
                            f"HEAD {statistics.median(head):.2f})")
        rows.append(Row(metric, statistics.median(base), statistics.median(head), ratio, min(ratios),
                        max(ratios), best, limit, ok))
    return Verdict(rows, failures)


def confirmed(first: Verdict, second: Verdict) -> Verdict:
    """The verdict of a confirmation run: ``second``'s table, failing only the metrics that failed in
    both runs (each failure line says so)."""
    failed_first = {f.split(":", 1)[0] for f in first.failures}
    failures = [f"{f} (and in the first run)" for f in second.failures if f.split(":", 1)[0] in failed_first]
    return Verdict(second.rows, failures)


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _pooled(rounds: Sequence[Round], metric: str) -> float | None:
    """HEAD/baseline of ``metric``'s percentile over every round's samples pooled per side; None when
    the metric is not POOLED or a round lacks its samples."""
    spec = POOLED.get(metric)
    if spec is None:
        return None
    key, q = spec
    pools: dict[str, list[float]] = {"base": [], "head": []}
    for r in rounds:
        for side, pool in pools.items():
            samples = r[side].get(key)
            if not isinstance(samples, Sequence) or not samples:
                return None
            pool.extend(float(x) for x in samples)
    b = percentile(pools["base"], q)
    return percentile(pools["head"], q) / b if b > 0 else None


def micro_ratios(base: Mapping[str, float], head: Mapping[str, float]) -> list[tuple[str, float | None,
                                                                                      float | None, str]]:
    """(case, baseline median s, HEAD median s, ratio text) for every HEAD case, then cases gone at
    HEAD; ``new`` for a case absent at the baseline, ``gone`` for one absent at HEAD."""
    out: list[tuple[str, float | None, float | None, str]] = []
    for case in sorted(head):
        b = base.get(case)
        out.append((case, b, head[case], "new" if b is None or b <= 0 else f"{head[case] / b:.3f}"))
    out.extend((case, base[case], None, "gone") for case in sorted(set(base) - set(head)))
    return out


def macro_table(v: Verdict) -> str:
    lines = [f"{'metric':18s} {'baseline':>10s} {'HEAD':>10s} {'ratio':>7s} {'min':>6s} {'max':>6s} "
             f"{'best':>6s} {'limit':>6s}  verdict"]
    for r in v.rows:
        limit = f"{r.limit:.2f}" if r.limit is not None else "-"
        verdict = ("ok" if r.ok else "FAIL") if r.limit is not None else "(info)"
        lines.append(f"{r.metric:18s} {r.base:10.2f} {r.head:10.2f} {r.ratio:7.3f} {r.ratio_min:6.3f} "
                     f"{r.ratio_max:6.3f} {r.best_ratio:6.3f} {limit:>6s}  {verdict}")
    return "\n".join(lines)


def micro_table(rows: Sequence[tuple[str, float | None, float | None, str]]) -> str:
    def us(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e6:.3f}"

    lines = [f"{'case':70s} {'base us':>10s} {'HEAD us':>10s} {'HEAD/base':>9s}"]
    lines += [f"{c[:70]:70s} {us(b):>10s} {us(h):>10s} {r:>9s}" for c, b, h, r in rows]
    return "\n".join(lines)
