"""Relative spreads of repeated timings, shared by the benchmarks: the timing protocol's own
(libarena.profile.host), so a benchmark's figure and the quiet check's noise probe are the same statistic."""

from libarena.profile.host import relative_iqr, relative_spread

__all__ = ["relative_iqr", "relative_spread"]
