"""Simulation entities: jobs, their allocations, and the per-GPU-type node pools (buddy allocation)."""

from libarena.schedule.entities.allocation import Allocation, count_index, count_index_at_least
from libarena.schedule.entities.cluster import ClusterState, TypePool
from libarena.schedule.entities.job import Job, JobSpec, JobState

__all__ = ["Allocation", "count_index", "count_index_at_least", "ClusterState", "Job", "JobSpec", "JobState", "TypePool"]
