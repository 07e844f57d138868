"""Hand-offs on host devices: a two-stage plan's wait for its producers, measured in the co-run child on the
runtime's own step and charged by the 1F1B model in place of the flat price (libarena.profile.handoff)."""

from __future__ import annotations

import pytest

from libarena.profile.handoff import GATE_SHARE, HandoffTiming, StageBoundary, boundary_of
from libarena.profile.pipeline import StageTimes, one_f_one_b


def test_a_measured_wait_replaces_the_flat_handoff_price_on_a_host():
    stages = [StageTimes(0.019, p2p_s=0.001, alone_s=0.015, together_s=0.020),
              StageTimes(0.077, p2p_s=0.001, alone_s=0.055, together_s=0.080)]
    flat = one_f_one_b(stages, 5, host_cores=2)
    measured = one_f_one_b(stages, 5, host_cores=2, handoff_wait_s=0.0005)
    assert not flat.handoff_measured and flat.handoff_s == pytest.approx(4 * 2 * 0.001)
    assert measured.handoff_measured and measured.handoff_s == pytest.approx(0.0005)
    # the same periods, the step's measured wait in place of 2 p2p_b per micro-batch
    assert measured.steady_state_s == pytest.approx(flat.steady_state_s - 4 * 2 * 0.001 + 0.0005)
    assert measured.iter_time_s == pytest.approx(flat.iter_time_s - 4 * 2 * 0.001 + 0.0005)
    assert one_f_one_b(stages, 5, host_cores=2, handoff_wait_s=0.0).steady_state_s == pytest.approx(flat.steady_state_s - 0.008)
    # separate chips move on copy engines while they compute: nothing charged, measured or not
    chips = one_f_one_b([StageTimes(0.01, p2p_s=0.001), StageTimes(0.02, p2p_s=0.001)], 5, handoff_wait_s=0.004)
    assert chips.handoff_s == 0.0 and not chips.handoff_measured
    with pytest.raises(ValueError, match="handoff_wait_s"):
        one_f_one_b(stages, 5, host_cores=2, handoff_wait_s=-1e-3)


def test_the_wait_is_the_runtimes_step_less_the_step_handing_off_ready_inputs_never_negative():
    timing = HandoffTiming((0.012, 0.011, 0.013, 0.020), (0.010, 0.0105, 0.011, 0.030), 8)
    from libarena.profile.timers import Timing

    assert timing.wait_s("q1") == pytest.approx(Timing(timing.runtime_samples_s).lower_quartile
                                                 - Timing(timing.copy_samples_s).lower_quartile)
    assert timing.wait_s("median") == pytest.approx(0.0125 - 0.01075)
    assert HandoffTiming((0.010,), (0.012,), 2).wait_s("median") == 0.0  # noise: no negative wait
    assert HandoffTiming.from_record(timing.to_dict()) == timing


def _two_stage_plans():
    from libarena.profile.local_plans import enumerate_grid_plans

    plans = enumerate_grid_plans("gpt__tiny", 8, 2, "cpu", 2)
    return [p for p in plans if p.pipeline_degree == 2 and p.num_microbatches > 1]


def test_only_two_one_device_stages_whose_flat_price_counts_have_their_boundary_measured():
    from libarena.models import get_model
    from libarena.profile.local_plans import enumerate_grid_plans
    from libarena.profile.stage import StageSpec

    (plan, *_) = _two_stage_plans()
    B = plan.num_microbatches
    specs = [StageSpec("gpt__tiny", 0, 3, 8 // B), StageSpec("gpt__tiny", 3, 6, 8 // B, remat=True)]
    step = 0.010
    boundary = boundary_of(plan, specs, GATE_SHARE * step, step)
    assert boundary == StageBoundary("gpt__tiny", 3, 8 // B, B, (False, True), "fp32")
    assert boundary_of(plan, specs, 0.99 * GATE_SHARE * step, step) is None  # the flat price is too small to matter
    # the runtime trains at the model's own sequence length
    longer = 2 * get_model("gpt__tiny").config.seq_len
    other_length = [StageSpec("gpt__tiny", 0, 3, 8 // B, seq_len=longer), StageSpec("gpt__tiny", 3, 6, 8 // B, seq_len=longer)]
    assert boundary_of(plan, other_length, step, step) is None
    # one stage, or stages of several devices: nothing to measure
    for other in enumerate_grid_plans("gpt__tiny", 8, 2, "cpu", 2):
        if other.pipeline_degree != 2 or other.num_microbatches == 1:
            assert boundary_of(other, specs[: other.pipeline_degree], step, step) is None
    assert StageBoundary.from_dict({**boundary.__dict__, "remat": [False, True]}) == boundary


@pytest.mark.multidevice
def test_a_boundary_is_timed_on_the_runtimes_step_in_a_two_device_child_and_cached(tmp_path):
    from libarena.profile.cache import ProfileCache
    from libarena.profile.handoff import CHUNK, handoff_cache_key, profile_handoffs
    from libarena.profile.host import XLA_THREADING

    boundary = StageBoundary("gpt__tiny", 3, 2, 4)
    cache, layout, messages = ProfileCache(tmp_path / "cache"), XLA_THREADING.get("eigen-single"), []
    measured, spent = profile_handoffs({boundary: ("first-stage", "second-stage")}, 2, layout, cache, rounds=2, log=messages.append)
    timing = measured[boundary]
    # every micro-batch's activation goes forward and its gradient back; each variant's rounds of CHUNK steps
    assert timing.handoffs_per_step == 2 * 4
    assert len(timing.runtime_samples_s) == len(timing.copy_samples_s) == 2 * CHUNK
    assert min(timing.runtime_samples_s + timing.copy_samples_s) > 0
    assert spent >= timing.device_s > 0 and timing.wait_s("q1") >= 0
    assert [m for m in messages if m.startswith("hand-offs of gpt__tiny split at unit 3")]
    # a second run reads it from the cache: no child, the same timing; other rounds are another record
    again, spent_again = profile_handoffs({boundary: ("first-stage", "second-stage")}, 2, layout, cache, rounds=2)
    assert spent_again == 0.0 and again[boundary] == timing
    keys = {handoff_cache_key(("first-stage", "second-stage"), boundary, 2, layout.name, rounds, False) for rounds in (2, 3)}
    assert len(keys) == 2
    # a boundary the child cannot run is logged and left out (its plans keep the flat price), not the profile's end
    impossible = StageBoundary("gpt__tiny", 99, 2, 4)
    failed, spent = profile_handoffs({impossible: ("x", "y")}, 2, layout, cache, rounds=2, log=messages.append)
    assert failed == {} and spent > 0
    assert messages[-1].startswith("hand-offs of gpt__tiny split at unit 99, mb 2 x 4 not measured (")
    assert messages[-1].endswith("its plans keep the flat price")
