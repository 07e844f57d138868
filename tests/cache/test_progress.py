"""libarena.cli.Reporter: logs, warnings and progress bars on stderr; --quiet; terminals vs pipes."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

from rich.console import Console

from libarena.cli import Reporter
from libarena.progress import ProgressUpdate


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=100, highlight=False), buf


def _run(reporter: Reporter) -> None:
    with reporter:
        reporter.log("step one [1/2]")  # not rich markup
        for i in range(3):
            reporter.progress(ProgressUpdate("simulating arena", i, 3, f"simulated {i} h"))
        reporter.progress(ProgressUpdate("lowering", 0, None, "phase"))  # indeterminate
        reporter.warn("careful")


def test_terminal_shows_bars_and_logs():
    console, buf = _console(terminal=True)
    reporter = Reporter(prefix="tool: ", console=console)
    assert reporter.bars_enabled
    _run(reporter)
    text = buf.getvalue()
    assert "tool: step one [1/2]" in text and "tool: warning: careful" in text
    assert "simulating arena" in text  # the bar was drawn (then cleared: transient)


def test_pipe_gets_only_the_log_lines():
    console, buf = _console(terminal=False)
    reporter = Reporter(prefix="tool: ", console=console)
    assert not reporter.bars_enabled
    _run(reporter)
    assert buf.getvalue().splitlines() == ["tool: step one [1/2]", "tool: warning: careful"]


def test_quiet_keeps_only_warnings():
    console, buf = _console(terminal=True)
    reporter = Reporter(quiet=True, console=console)
    assert not reporter.bars_enabled
    _run(reporter)
    assert buf.getvalue().splitlines() == ["warning: careful"]


def test_simulator_reports_progress_to_the_end(paper_cluster):
    from libarena.schedule.api import make_policy, prepare_workload, run_policy
    from libarena.schedule.perf import PerfLookup
    from libarena.schedule.traces import read_trace
    from tests.schedule.perf_fixtures import synthetic_perf_table

    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "t.csv"
        trace.write_text("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
                         + "".join(f"j{i},{60 * i},500,gpt__1.3B,,256,2,a100\n" for i in range(6)))
        lookup = PerfLookup(synthetic_perf_table([("gpt__1.3B", 256)], paper_cluster.gpu_types), paper_cluster)
        workload = prepare_workload(read_trace(trace, gpu_types=lookup.gpu_types), lookup, paper_cluster)
        updates: list[ProgressUpdate] = []
        run_policy(workload, make_policy("fcfs"), progress=updates.append)
    assert updates and updates[-1].done and updates[-1].total == 6 and updates[-1].task == "simulating fcfs"
    assert [u.completed for u in updates] == sorted(u.completed for u in updates)
