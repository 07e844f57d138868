"""Where a plan's stages sit in the model: operator clusters resolved to ranges of model units.

arena-plan speaks in clustered operators (a stage is the clusters [first_cluster, end_cluster)); the
profiler and the runtime execute model units (layers). The operator table's cluster records list the units
each cluster covers, contiguously and in model order, so cluster c covers the units after those of the
clusters before it: a :class:`StageLayout` is built from the records alone (no model, no JAX), and checked
against a model's unit names where one is at hand (:meth:`StageLayout.check_units`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from libarena.errors import ArenaError


@dataclass(frozen=True)
class StageLayout:
    #: the unit names of each cluster, in cluster order
    cluster_units: tuple[tuple[str, ...], ...]

    @classmethod
    def from_cluster_records(cls, records: Sequence[Mapping[str, Any]], source: str = "plans metadata") -> StageLayout:
        """From the ``clusters`` records of an operator table or plans file (each with a list of ``units``)."""
        if not records:
            raise ArenaError(f"{source}: no clusters (not made from an operator table by arena-analyze)")
        out = []
        for c, record in enumerate(records):
            units = record.get("units") if isinstance(record, Mapping) else None
            if not isinstance(units, list) or not units or not all(isinstance(u, str) for u in units):
                raise ArenaError(f"{source}: clusters[{c}] must be a record with a non-empty list of 'units'")
            out.append(tuple(units))
        return cls(tuple(out))

    @classmethod
    def per_unit(cls, unit_names: Sequence[str]) -> StageLayout:
        """Every unit its own cluster (plans written directly in units: tests, examples)."""
        return cls(tuple((name,) for name in unit_names))

    @property
    def num_clusters(self) -> int:
        return len(self.cluster_units)

    @property
    def num_units(self) -> int:
        return sum(len(units) for units in self.cluster_units)

    def unit_range(self, first_cluster: int, end_cluster: int) -> tuple[int, int]:
        """Model units [start, stop) covered by the clusters [first_cluster, end_cluster)."""
        if not 0 <= first_cluster < end_cluster <= self.num_clusters:
            raise ArenaError(f"clusters [{first_cluster}, {end_cluster}) are outside the {self.num_clusters} clusters")
        starts = [0, *accumulate(len(units) for units in self.cluster_units)]
        return starts[first_cluster], starts[end_cluster]

    def stage_unit_ranges(self, plan: Any) -> tuple[tuple[int, int], ...]:
        """[start, stop) of every stage of ``plan`` (a ParallelPlan)."""
        return tuple(self.unit_range(st.first_cluster, st.end_cluster) for st in plan.stages)

    def check_units(self, unit_names: Sequence[str], model_name: str) -> None:
        """ArenaError unless the clusters cover exactly ``model_name``'s units, contiguously and in order."""
        index = {name: i for i, name in enumerate(unit_names)}
        expected = 0
        for c, names in enumerate(self.cluster_units):
            unknown = [n for n in names if n not in index]
            if unknown:
                raise ArenaError(f"plans metadata: cluster {c} names unit {unknown[0]!r}, which model {model_name} does not have")
            ids = sorted(index[n] for n in names)
            if ids[0] != expected or ids != list(range(ids[0], ids[-1] + 1)):
                raise ArenaError(f"plans metadata: cluster {c} units {list(names)} are not the contiguous units after unit {expected - 1}")
            expected = ids[-1] + 1
        if expected != len(unit_names):
            raise ArenaError(f"plans metadata: clusters cover {expected} of model {model_name}'s {len(unit_names)} units")
