"""``arena-schedule perf build``: the performance table a trace needs.

Contract (issue 7): for every (model, global batch) the trace uses and every GPU type of the cluster, run
arena-analyze -> arena-plan -> arena-profile (with their content-addressed caches) and concatenate the
resulting ``perf_table`` rows (views arena, dp, ap) into one table.

Not wired yet: it needs the analyze/plan/profile stages' library entry points, which are being written in
parallel. Until then this command fails with a clear message instead of producing numbers.
"""

from __future__ import annotations

import os

from libarena.errors import ArenaError


def build_perf_table(trace: str | os.PathLike[str], cluster: str | os.PathLike[str],
                     output: str | os.PathLike[str]) -> None:
    raise ArenaError("perf build is not available yet: it needs the arena-analyze/plan/profile library entry "
                     "points; build the table with those tools and pass it with --perf")
