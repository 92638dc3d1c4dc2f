"""Standard errors of the scores: how far a score measured on n evaluation items moves from one
draw of the items to another."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping


def standard_error(percent: float, n: int) -> float:
    """The binomial standard error, in points, of a percentage measured on `n` independent items:
    100 sqrt(p (1 - p) / n) with p = percent / 100 (VQA's soft accuracy, whose credits lie in
    [0, 1], varies no more than this)."""
    if n < 1:
        raise ValueError(f"a standard error needs at least one item, got n={n}")
    p = percent / 100
    return 100 * math.sqrt(max(0.0, p * (1 - p)) / n)


def paired_difference(a: Mapping[Hashable, float],
                      b: Mapping[Hashable, float]) -> tuple[float, float]:
    """Two scores measured on the same items (item -> credit in [0, 1], the same items in both):
    their difference a - b in points and its standard error, 100 sd(d) / sqrt(n) over the items'
    differences d_i = a_i - b_i (sd with n - 1). Where both answer the same questions their errors
    correlate, and this is smaller than sqrt(SE_a^2 + SE_b^2), that of two independent sets."""
    if a.keys() != b.keys():
        only = sorted(map(str, a.keys() ^ b.keys()))
        raise ValueError(f"the two scores are not on the same items: {len(only)} differ "
                         f"(first: {only[0]})")
    n = len(a)
    if n < 2:
        raise ValueError(f"a paired standard error needs at least two items, got n={n}")
    d = [a[k] - b[k] for k in a]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return 100 * mean, 100 * math.sqrt(var / n)
