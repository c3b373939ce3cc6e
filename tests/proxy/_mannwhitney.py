"""The two-sided Mann-Whitney U test (normal approximation with the tie correction).

scipy is not a dependency of this project, and one test is not a reason to add it (a large
compiled package); for the sample sizes used here (thousands per group) the normal approximation
is what scipy.stats.mannwhitneyu itself uses by default (``method="auto"`` switches to the exact
distribution only below 8 samples per group), so ~25 lines suffice.
"""

from __future__ import annotations

import math
from collections import Counter


def mann_whitney(a: list[float], b: list[float]) -> tuple[float, float]:
    """(U of ``a``, two-sided p-value) with continuity and tie correction."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples must be non-empty")
    merged = sorted([(x, 0) for x in a] + [(x, 1) for x in b])
    rank_sum_a = 0.0
    i = 0
    while i < len(merged):  # average ranks over ties
        j = i
        while j + 1 < len(merged) and merged[j + 1][0] == merged[i][0]:
            j += 1
        avg = (i + j) / 2 + 1
        rank_sum_a += avg * sum(1 for k in range(i, j + 1) if merged[k][1] == 0)
        i = j + 1
    u = rank_sum_a - n1 * (n1 + 1) / 2
    n = n1 + n2
    ties = sum(t ** 3 - t for t in Counter(a + b).values())
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return u, 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))
