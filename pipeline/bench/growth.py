"""How a cost grows with the size: the exponent k of cost ~ a * n^k, fitted to measured points."""

from __future__ import annotations

import numpy as np


def exponent(points: list[tuple[float, float | None]]) -> float | None:
    """k of the least-squares fit log(cost) = log(a) + k log(n) to (n, cost) points; None for
    fewer than two points or a cost that is missing or not positive."""
    if len(points) < 2 or any(cost is None or cost <= 0 for _, cost in points):
        return None
    n, cost = zip(*points)
    return float(np.polyfit(np.log(n), np.log(cost), 1)[0])


def fitted_line(fitted: dict[str, float]) -> str:
    """The exponents of a benchmark's table, as its last line."""
    return "fitted exponent k (cost ~ n^k): " + ", ".join(f"{cost} {k:.2f}"
                                                           for cost, k in fitted.items())
