"""Relative spreads of repeated timings, shared by the benchmarks."""

from __future__ import annotations

import statistics


def relative_spread(values: list[float]) -> float:
    """(max - min) / median; 0 for fewer than two values."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def relative_iqr(samples: list[float]) -> float:
    """Interquartile range / median (the relative spread for fewer than four samples)."""
    if len(samples) < 4:
        return relative_spread(samples)
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / statistics.median(samples)
