"""``fcfs``: rigid first-come-first-served (Kubernetes-style default, §5.1 baseline i).

Each job gets the GPU count and type its user asked for, in arrival order, and is never rescaled. As the paper
runs it, there is one FIFO queue per GPU type: the head of a type's queue blocks the jobs behind it on that type
(no backfilling) but not the jobs queued for other types (``FcfsConfig.per_type_queues``; off: one global queue,
whose head blocks everything). FCFS profiles nothing and executes jobs with adaptive parallelism, so there is
no data-parallel memory check: a job runs where its execution (the ``truth`` view) fits, on the requested count
or, where that does not fit, the smallest larger count that does (the user would have had to ask for it).
"""

from __future__ import annotations

from collections import deque

from libarena.schedule.config import APSearch, FcfsConfig, ProfilingKind
from libarena.schedule.entities import Job
from libarena.schedule.policies.base import Policy, register_policy


@register_policy
class FCFSPolicy(Policy):
    name = "fcfs"
    description = "rigid first-come-first-served with the requested GPU count and type, one FIFO queue per GPU type"
    default_view = "truth"
    profiling = ProfilingKind.NONE
    ap_search = APSearch.FULL
    config_class = FcfsConfig
    config: FcfsConfig

    def attach(self, sim) -> None:
        super().attach(sim)
        # queue key -> FIFO; the key is the requested GPU type, or 0 for the single global queue
        self.queues: dict[int, deque[Job]] = {}

    def placement_types(self, job: Job) -> list[int]:
        return [job.requested_type_index]

    def on_arrival(self, job: Job) -> None:
        key = job.requested_type_index if self.config.per_type_queues else 0
        self.queues.setdefault(key, deque()).append(job)

    def withdraw(self, job: Job) -> None:
        for key, queue in self.queues.items():
            self.queues[key] = deque(j for j in queue if j is not job)

    def schedule(self) -> None:
        for key in sorted(self.queues):
            queue = self.queues[key]
            while queue:
                job = queue[0]
                t = job.requested_type_index
                if not self.sim.launch(job, t, self.requested_count_on(job, t)):
                    break
                queue.popleft()
