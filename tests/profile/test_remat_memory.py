"""The planner's memory model against XLA's memory analysis of the stage executables, with and without activation
recomputation, for the tiny and small models of every family (CPU); see libarena.pipeline.memory_check."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["gpt__tiny", "gpt__small", "bert__tiny", "bert__small", "moe__tiny", "moe__small",
                                  "wide_resnet__tiny", "wide_resnet__small"])
def test_memory_model_matches_xla_with_and_without_recomputation(name: str) -> None:
    from libarena.pipeline.memory_check import stage_memory

    for row in stage_memory(name):
        plain, remat = row["plain"], row["remat"]
        for key, figures in (("plain", plain), ("remat", remat)):
            assert figures["planned_kept_bytes"] == pytest.approx(figures["xla_kept_bytes"], rel=0.2), (row["units"], key, figures)
        # recomputation keeps only the units' inputs: a small fraction of their activations
        assert remat["xla_kept_bytes"] < 0.2 * plain["xla_kept_bytes"], row
        if "xla_fused_temp_bytes" in plain:
            assert remat["xla_fused_temp_bytes"] < plain["xla_fused_temp_bytes"], row
