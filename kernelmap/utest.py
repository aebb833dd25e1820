"""The Mann-Whitney U test, two-sided, in the standard library (no scipy): ``kernelmap diff`` judges a kernel's
per-step times on two sides with it, as google/benchmark's tools/compare.py judges repetitions (there with
scipy's ``mannwhitneyu``).

Without ties and with at most ``EXACT_MAX`` samples a side the p-value is exact: the U statistic's null
distribution counted over every split of the ranks (the recurrence of Mann & Whitney 1947). Otherwise it is the
normal approximation with the tie correction of the variance and a continuity correction of 0.5 (scipy's
``method="asymptotic"``, ``use_continuity=True``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

EXACT_MAX = 25
RULE = ("Mann-Whitney U, two-sided, over the per-step times of the two sides (each traced step one sample); exact "
        f"without ties up to {EXACT_MAX} steps a side, else the normal approximation with tie and continuity "
        "corrections (standard library, kernelmap/utest.py)")


def ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Mid-ranks (1-based) of ``values`` and the sizes of their groups of ties."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    ties, i = [], 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    return out, ties


@cache
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """Number of rank arrangements giving each U = 0 .. n1*n2 (``count(n1, n2, u)`` of Mann & Whitney)."""
    if n1 == 0 or n2 == 0:
        return (1,)
    a, b = _u_counts(n1 - 1, n2), _u_counts(n1, n2 - 1)
    out = [0] * (n1 * n2 + 1)
    for u, c in enumerate(a):  # the largest value is from the first sample: it beats all n2 of the second
        out[u + n2] += c
    for u, c in enumerate(b):
        out[u] += c
    return tuple(out)


def min_p(n1: int, n2: int) -> float:
    """The smallest two-sided p-value the exact test can give for these sample sizes."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return min(1.0, 2 / math.comb(n1 + n2, n1))


def p_value(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test of ``x`` against ``y``; 1.0 where a side is empty or every
    value is equal."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return 1.0
    r, ties = ranks([*x, *y])
    u1 = sum(r[:n1]) - n1 * (n1 + 1) / 2
    if max(ties) == n1 + n2:
        return 1.0
    if max(ties) == 1 and n1 <= EXACT_MAX and n2 <= EXACT_MAX:
        counts = _u_counts(n1, n2)
        total = math.comb(n1 + n2, n1)
        u = int(round(max(u1, n1 * n2 - u1)))
        return min(1.0, 2 * sum(counts[u:]) / total)
    n = n1 + n2
    mu = n1 * n2 / 2
    var = n1 * n2 / 12 * ((n + 1) - sum(t ** 3 - t for t in ties) / (n * (n - 1)))
    z = (abs(u1 - mu) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))
