"""Subprocess worker for the elastic-resume test (run with XLA_FLAGS=--xla_force_host_platform_device_count=N).

    python -m tests.run.resume_worker PLAN_JSON STEPS CHECKPOINT_DIR|- CHECKPOINT_EVERY

PLAN_JSON: {"bounds": [...], "dp": [...], "tp": [...], "micro": B, "zero": [...]} for the micro GPT.
Prints the train report as one JSON line.
"""

from __future__ import annotations

import json
import sys

from libarena.run.plan import simple_plan
from libarena.run.train import TrainConfig, train
from tests.run.micro import TEST_OPTIMIZER, micro_gpt

GLOBAL_BATCH = 8


def main(plan_json: str, steps: int, checkpoint_dir: str, every: int) -> None:
    spec = json.loads(plan_json)
    model = micro_gpt()
    plan = simple_plan(model, GLOBAL_BATCH, spec["bounds"], spec["dp"], spec["tp"], spec["micro"], spec.get("zero"))
    config = TrainConfig(GLOBAL_BATCH, steps, optimizer=TEST_OPTIMIZER, checkpoint_dir=None if checkpoint_dir == "-" else checkpoint_dir,
                         checkpoint_every=every, profile_step=0)
    print(json.dumps(train(model, plan, config).to_dict()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
