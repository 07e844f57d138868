"""What a profiling run's per-stage cost breakdown (``summary["stage_costs"]``) must hold, in every isolation."""

from __future__ import annotations


def check_stage_costs(summary):
    costs = summary["stage_costs"]
    assert len(costs) == summary["stages_profiled"]
    for c in costs:
        assert 0 <= c["start"] < c["stop"] and c["micro_batch"] >= 1 and c["tp"] >= 1
        assert c["compile_s"] > 0 and c["timed_microbatch_s"] > 0 and c["timed_optimizer_s"] >= 0
        assert c["device_s"] >= c["compile_s"] + c["timed_microbatch_s"] + c["timed_optimizer_s"]
    # the optimizer's profile is shared by stages of the same parameter shards: at least one paid for it
    assert any(c["timed_optimizer_s"] > 0 for c in costs)
