"""Standard errors of the scores: how far a score measured on n evaluation items moves from one
draw of the items to another."""

from __future__ import annotations

import math


def standard_error(percent: float, n: int) -> float:
    """The binomial standard error, in points, of a percentage measured on `n` independent items:
    100 sqrt(p (1 - p) / n) with p = percent / 100 (VQA's soft accuracy, whose credits lie in
    [0, 1], varies no more than this)."""
    if n < 1:
        raise ValueError(f"a standard error needs at least one item, got n={n}")
    p = percent / 100
    return 100 * math.sqrt(max(0.0, p * (1 - p)) / n)
