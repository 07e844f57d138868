"""Simulation entities: jobs, their allocations, and the per-GPU-type node pools (buddy allocation)."""

from libarena.schedule.entities.allocation import Allocation
from libarena.schedule.entities.cluster import ClusterState, TypePool
from libarena.schedule.entities.job import Job, JobSpec, JobState

__all__ = ["Allocation", "ClusterState", "Job", "JobSpec", "JobState", "TypePool"]
