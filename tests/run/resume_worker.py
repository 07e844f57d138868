"""Subprocess worker for the elastic-resume test (run with XLA_FLAGS=--xla_force_host_platform_device_count=N).

    python -m tests.run.resume_worker JOBS_JSON

JOBS_JSON: a list of {"plan": {"bounds", "dp", "tp", "micro", "zero"}, "steps": S, "checkpoint_dir": D or null,
"every": K} for the micro GPT, run in order in this process (jobs sharing stages share compilations).
Prints one train report per job as a JSON line.
"""

from __future__ import annotations

import json
import sys

from libarena.run.plan import simple_plan
from libarena.run.train import TrainConfig, train
from tests.run.micro import TEST_OPTIMIZER, micro_gpt

GLOBAL_BATCH = 8


def main(jobs_json: str) -> None:
    model = micro_gpt()
    for job in json.loads(jobs_json):
        spec = job["plan"]
        plan = simple_plan(model, GLOBAL_BATCH, spec["bounds"], spec["dp"], spec["tp"], spec["micro"], spec.get("zero"))
        config = TrainConfig(GLOBAL_BATCH, job["steps"], optimizer=TEST_OPTIMIZER, checkpoint_dir=job["checkpoint_dir"],
                             checkpoint_every=job["every"], profile_step=0)
        print(json.dumps(train(model, plan, config).to_dict()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
