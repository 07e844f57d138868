"""``fcfs``: rigid first-come-first-served (Kubernetes-style default, §5.1 baseline i).

Each job gets the GPU count and type its user asked for, in arrival order; the head of the queue blocks
everything behind it (no backfilling); no rescaling. A job whose requested count cannot run in the decision
view gets the smallest count that can (the user would have had to ask for it).
"""

from __future__ import annotations

from collections import deque

from libarena.schedule.config import APSearch, ProfilingKind
from libarena.schedule.entities import Job
from libarena.schedule.policies.base import Policy, register_policy


@register_policy
class FCFSPolicy(Policy):
    name = "fcfs"
    description = "rigid first-come-first-served with the requested GPU count and type"
    default_view = "dp"
    profiling = ProfilingKind.NONE
    ap_search = APSearch.FULL

    def attach(self, sim) -> None:
        super().attach(sim)
        self.queue: deque[Job] = deque()

    def runnable(self, job: Job) -> bool:
        return self.requested_count_on(job, job.requested_type_index) is not None

    def on_arrival(self, job: Job) -> None:
        self.queue.append(job)

    def schedule(self) -> None:
        while self.queue:
            job = self.queue[0]
            t = job.requested_type_index
            c = self.requested_count_on(job, t)
            if not self.sim.launch(job, t, c):
                break
            self.queue.popleft()
