"""Launchers: how the live scheduler starts, rescales (checkpoint-resume) and watches jobs.

- ``arena-run`` (:mod:`.arena_run`): each (job, version) is an ``arena-run`` process (on Ray, placed by the
  ``gpu_type:<t>`` resource) in its own session, so jobs outlive a scheduler crash.
- ``perf-table`` (:mod:`.perf_table`): emulated hosts whose jobs progress at the performance table's execution
  truth in scheduler time (tests, load benchmarks, what-if runs on a laptop).
"""

from libarena.schedule.live.launchers.base import (JobLauncher, LaunchRequest, LauncherContext, LauncherOptions, RunStatus,
                                                   get_launcher, launcher_names, register_launcher)

__all__ = ["JobLauncher", "LaunchRequest", "LauncherContext", "LauncherOptions", "RunStatus", "get_launcher",
           "launcher_names", "register_launcher"]
