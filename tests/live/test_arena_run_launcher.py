"""The arena-run launcher's process management with stand-in tools (fast): idempotent launch, rescale =
stop the previous version + resume from the checkpoint directory with the new grid, finished / lost reports,
relaunch of a lost version. The real arena-run is exercised by test_arena_run.py."""

from __future__ import annotations

import os
import signal
import sys
import time

from libarena.schedule.live.clock import VirtualClock
from libarena.schedule.live.launchers import LaunchRequest, LauncherContext, LauncherOptions, get_launcher
from tests.live.helpers import wait_until

FAKE_RUN = '''
import os, sys, time
a = sys.argv[1:]
opt = lambda k: a[a.index(k) + 1]
steps, ckpt, grid = int(opt("--steps")), opt("--checkpoint-dir"), opt("--grid")
os.makedirs(ckpt, exist_ok=True)
done = max([int(p) for p in os.listdir(ckpt) if p.isdigit()], default=0)
print(f"grid {grid} resumed from step {done}", flush=True)
for step in range(done + 1, steps + 1):
    time.sleep(0.03)
    os.makedirs(os.path.join(ckpt, str(step)))
print(f"steps {done + 1}..{steps}", flush=True)
'''
FAKE_TOOL = '''
import sys
a = sys.argv[1:]
open(a[a.index("-o") + 1], "w").write("stand-in")
'''


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return str(path)


def _stand_in_launcher(tmp_path):
    """The arena-run launcher with the stand-in tools, on a real-time clock."""
    commands = {"arena-run": _script(tmp_path, "fake-run", FAKE_RUN), "arena-analyze": _script(tmp_path, "fa", FAKE_TOOL),
                "arena-plan": _script(tmp_path, "fp", FAKE_TOOL)}
    clock = VirtualClock(time.time(), 1.0)
    ctx = LauncherContext(tmp_path / "work", tmp_path / "cluster.yaml", clock, None, LauncherOptions(commands=commands))
    return get_launcher("arena-run", ctx), clock


def test_launch_rescale_resume_finish_and_lost(tmp_path):
    launcher, clock = _stand_in_launcher(tmp_path)
    v1 = LaunchRequest("job", 1, "launch", "gpt__tiny", 8, 150, "a100", 1, (0,), 0.0, 0.0)
    launcher.launch(v1)
    pid1 = (launcher.run_dir("job", 1) / "pid").read_text()
    assert len(pid1.split()) == 2  # the pid and the process's start time
    launcher.launch(v1)  # idempotent
    assert (launcher.run_dir("job", 1) / "pid").read_text() == pid1
    wait_until(lambda: (launcher.progress("job") or 0) >= 10)
    assert launcher.poll(clock.now(), {"job": 1})["job"].phase == "running"
    v2 = LaunchRequest("job", 2, "rescale", "gpt__tiny", 8, 150, "a100", 2, (0,), 0.0, clock.now(), previous_version=1)
    launcher.launch(v2)
    assert (launcher.run_dir("job", 1) / "stopped").exists()
    assert launcher.poll(clock.now(), {"job": 1})["job"].phase == "lost"  # stopped: no exit code
    wait_until(lambda: launcher.poll(clock.now(), {"job": 2})["job"].phase == "finished", 60)
    st = launcher.poll(clock.now(), {"job": 2})["job"]
    assert st.iterations_done == 150 and st.started_at is not None and st.finished_at >= st.started_at
    out = (launcher.run_dir("job", 2) / "output.log").read_text()
    resumed = int(out.split("resumed from step ")[1].split()[0])
    assert resumed >= 10 and "grid a100,2" in out  # checkpoint-resume on the new grid
    # a version whose process dies without an exit code is reported lost, and relaunch resumes it
    v3 = LaunchRequest("job2", 1, "launch", "gpt__tiny", 8, 120, "a100", 1, (1,), 0.0, clock.now())
    launcher.launch(v3)
    wait_until(lambda: (launcher.progress("job2") or 0) >= 5)
    os.killpg(int((launcher.run_dir("job2", 1) / "pid").read_text().split()[0]), signal.SIGKILL)
    wait_until(lambda: launcher.poll(clock.now(), {"job2": 1})["job2"].phase == "lost")
    launcher.relaunch(v3)
    wait_until(lambda: launcher.poll(clock.now(), {"job2": 1})["job2"].phase == "finished", 60)
    assert launcher.progress("job2") == 120
    launcher.close()


def test_options_shape_the_arena_run_command(tmp_path):
    """Typed launcher options: the checkpoint interval, the Ray address and extra arguments reach arena-run's
    command line; left unset, arena-run's own defaults apply; bad values are refused when the options are made."""
    import pytest

    from libarena.errors import ArenaError

    clock = VirtualClock(time.time(), 1.0)
    req = LaunchRequest("job", 1, "launch", "gpt__tiny", 8, 150, "a100", 4, (0,), 0.0, 0.0)
    (tmp_path / "c.yaml").write_text("name: c\nnode_groups:\n  - {gpu_type: a100, nodes: 1, gpus_per_node: 4}\n")

    def command(options):
        launcher = get_launcher("arena-run", LauncherContext(tmp_path / "work", tmp_path / "c.yaml", clock, None, options))
        return launcher.script(req, tmp_path / "run").splitlines()[1]

    default = command(LauncherOptions())
    assert "--checkpoint-every" not in default and "--devices 4" in default and "--search-max 2" in default
    chosen = command(LauncherOptions(address="ray://head:10001", checkpoint_every=25, search_max=3,
                                     arena_run_args=["--lr", "0.01"]))
    assert "--checkpoint-every 25" in chosen and "--address ray://head:10001" in chosen and "--devices" not in chosen
    assert "--search-max 3" in chosen and chosen.endswith("--lr 0.01")
    for bad in ({"checkpoint_every": 0}, {"checkpoint_every": 2.5}, {"search_max": -1}):
        with pytest.raises(ArenaError, match="--checkpoint-every|search_max"):
            LauncherOptions(**bad)


def test_a_job_longer_than_arena_run_trains_is_rejected_on_arrival(tmp_path):
    """A job file may ask for up to 10**12 iterations, arena-run trains at most MAX_STEPS in one run: with the
    arena-run launcher such a job is rejected when it arrives, saying why, instead of failing at its launch."""
    from libarena.checks import MAX_STEPS
    from libarena.schedule.live import store as st
    from libarena.schedule.live.jobfile import JobSubmission
    from libarena.schedule.live.server import ServeConfig, Server
    from tests.live.helpers import write_inputs

    cluster, perf = write_inputs(tmp_path)
    server = Server(ServeConfig(cluster, perf, tmp_path / "state.db", launcher="arena-run", workdir=tmp_path / "work"))
    try:
        server.store.submit(JobSubmission("gpt__760M", 128, MAX_STEPS + 1, "long"))
        server.store.submit(JobSubmission("gpt__760M", 128, MAX_STEPS, "ok"))
        server.ingest()
        long, ok = server.store.job("long"), server.store.job("ok")
        assert long["status"] == st.REJECTED
        assert long["error"] == f"{MAX_STEPS + 1} iterations: arena-run trains at most {MAX_STEPS} steps in one run"
        assert ok["status"] == st.ARRIVING
    finally:
        server.close()


def test_a_recorded_pid_that_now_belongs_to_another_process_is_not_the_job(tmp_path):
    """After a host restart a version's recorded pid may be another process's: the pid file records the start
    time too, so such a process is neither taken for the job (it is reported lost, and can be relaunched) nor
    killed with its process group when the job is rescaled."""
    import subprocess

    from libarena.schedule.live.processes import running_pid, start_time

    clock = VirtualClock(time.time(), 1.0)
    launcher = get_launcher("arena-run", LauncherContext(tmp_path / "work", tmp_path / "c.yaml", clock, None,
                                                         LauncherOptions()))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        run_dir = launcher.run_dir("job", 1)
        run_dir.mkdir(parents=True)
        (run_dir / "started_wall").write_text(repr(time.time()))
        (run_dir / "pid").write_text(f"{other.pid} {start_time(other.pid)}")
        assert running_pid(run_dir / "pid") == other.pid  # the recorded process itself: running
        assert launcher.poll(clock.now(), {"job": 1})["job"].phase == "running"
        (run_dir / "pid").write_text(f"{other.pid} 1")  # the same pid, another start: not the job's process
        assert launcher.poll(clock.now(), {"job": 1})["job"].phase == "lost"
        v2 = LaunchRequest("job", 2, "rescale", "gpt__tiny", 8, 150, "a100", 2, (0,), 0.0, clock.now(), previous_version=1)
        launcher.vacate(v2)
        assert other.poll() is None  # not killed
    finally:
        other.kill()
        other.wait()
        launcher.close()


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return None


def test_a_rescale_stops_what_is_left_of_a_version_whose_script_died(tmp_path):
    """A version's script killed on its own leaves its children running in its process group: stopping the
    version (a rescale, a relaunch) still stops them (they carry the version's directory in their environment),
    but never a group that merely has the same number (a daemon's, after the pid was reused)."""
    import subprocess

    from libarena.schedule.live.processes import process_env, recorded_group, write_pid_file

    clock = VirtualClock(time.time(), 1.0)
    launcher = get_launcher("arena-run", LauncherContext(tmp_path / "work", tmp_path / "c.yaml", clock, None,
                                                         LauncherOptions()))
    sleeper = f"{sys.executable} -c 'import time; time.sleep(120)' & echo $!; wait"
    children = []
    try:
        for version, env in ((1, process_env(launcher.run_dir("job", 1))), (2, None)):  # ours, and a stranger
            run_dir = launcher.run_dir("job", version)
            run_dir.mkdir(parents=True)
            script = subprocess.Popen(["/bin/sh", "-c", sleeper], stdout=subprocess.PIPE, text=True,
                                      start_new_session=True, env=env)
            children.append(int(script.stdout.readline()))
            write_pid_file(run_dir / "pid", script.pid)
            (run_dir / "started_wall").write_text(repr(time.time()))
            script.kill()  # the script alone: its child stays, in the script's group
            script.wait()
            assert _state(children[-1]) not in (None, "Z")
        ours, stranger = (launcher.run_dir("job", v) / "pid" for v in (1, 2))
        assert recorded_group(ours) is not None and recorded_group(stranger) is None
        assert launcher.poll(clock.now(), {"job": 1})["job"].phase == "lost"
        for previous in (1, 2):
            launcher.vacate(LaunchRequest("job", previous + 1, "rescale", "gpt__tiny", 8, 150, "a100", 2, (0,), 0.0,
                                          clock.now(), previous_version=previous))
        wait_until(lambda: _state(children[0]) in (None, "Z"), 30)
        assert recorded_group(ours) is None
        assert _state(children[1]) not in (None, "Z")  # the stranger's group is left alone
    finally:
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.close()


def test_a_version_that_ends_while_it_is_polled_is_finished_not_lost(tmp_path, monkeypatch):
    """The script writes its exit code, then exits: a poll that found no exit code and then no process looks for
    the exit code again before it calls the version lost (which would have it relaunched: a finished job run
    twice, a failure's code erased). The end is made to fall between the two looks."""
    import libarena.schedule.live.launchers.arena_run as arena_run

    launcher, clock = _stand_in_launcher(tmp_path)
    request = LaunchRequest("job", 1, "launch", "gpt__tiny", 8, 40, "a100", 1, (0,), 0.0, 0.0)
    launcher.launch(request)
    run_dir = launcher.run_dir("job", 1)
    wait_until(lambda: (run_dir / "exit_code").exists(), 60)
    code = (run_dir / "exit_code").read_text()
    (run_dir / "exit_code").unlink()  # as it was a moment before the script wrote it ...
    looked = []

    def ends_while_looked_for(path):  # ... and the script writes it and exits while the poll looks for its process
        looked.append(path)
        (run_dir / "exit_code").write_text(code)
        return None

    monkeypatch.setattr(arena_run, "running_pid", ends_while_looked_for)
    status = launcher.poll(clock.now(), {"job": 1})["job"]
    assert looked and status.phase == "finished" and status.iterations_done == 40
    launcher.close()


def test_every_ended_version_is_reaped_not_only_the_polled_ones(tmp_path):
    """A version whose exit code was read while its shell was still exiting is not polled again (its job is
    done); its process must not stay a zombie for the server's life: every poll reaps every child that ended."""
    from pathlib import Path

    from libarena.schedule.live.processes import recorded_pid

    launcher, clock = _stand_in_launcher(tmp_path)
    launcher.launch(LaunchRequest("done", 1, "launch", "gpt__tiny", 8, 5, "a100", 1, (0,), 0.0, 0.0))
    proc = Path("/proc") / str(recorded_pid(launcher.run_dir("done", 1) / "pid"))

    def state() -> str | None:
        try:
            return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None  # reaped

    wait_until(lambda: state() == "Z", 60)  # ended, not yet reaped
    launcher.poll(clock.now(), {})  # polls no version at all
    assert state() is None
    launcher.close()


def test_an_allocation_larger_than_a_node_runs_the_proxy_of_the_tables_pipeline_degree_on_whole_nodes(tmp_path):
    """arena-run's search measures its candidates in one process, which needs the whole grid on one node: on a
    joined cluster an allocation larger than a node runs the proxy plan of the pipeline degree behind the
    performance table's arena row instead, one host per node; within a node the search runs as before."""
    import pyarrow as pa
    import yaml

    from libarena.hardware import load_cluster
    from libarena.schedule.perf import PerfLookup

    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump({"name": "c", "node_groups": [{"gpu_type": "a40", "nodes": 8, "gpus_per_node": 2}]}))
    perf = PerfLookup(pa.table({"model": ["gpt__1.3B"] * 2, "global_batch": [128] * 2, "gpu_type": ["a40"] * 2,
                                "num_gpus": [8, 2], "view": ["arena"] * 2, "iter_time_s": [1.0, 3.0],
                                "pipeline_degree": [4, 1]}), load_cluster(cluster))
    assert perf.pipeline_degree("gpt__1.3B", 128, "a40", 8) == 4 and perf.pipeline_degree("gpt__1.3B", 128, "a40", 4) is None
    clock = VirtualClock(time.time(), 1.0)
    launcher = get_launcher("arena-run", LauncherContext(tmp_path / "work", cluster, clock, perf,
                                                         LauncherOptions(address="ray://head:10001")))
    wide = LaunchRequest("job", 1, "launch", "gpt__1.3B", 128, 150, "a40", 8, (0, 1, 2, 3), 0.0, 0.0)
    command = launcher.script(wide, tmp_path / "run").splitlines()[1]
    assert "--grid a40,8,4 --hosts 4" in command and "--search" not in command
    within = LaunchRequest("job", 1, "launch", "gpt__1.3B", 128, 150, "a40", 2, (0,), 0.0, 0.0)
    assert "--grid a40,2 --search pruned" in launcher.script(within, tmp_path / "run").splitlines()[1]


def test_processes_started_under_a_state_directory_are_found_without_their_pid_file(tmp_path):
    """A version launched just before its scheduler died has no pid file: its processes (and their children)
    are still found by the state directory in their environment, and only those of that directory."""
    import subprocess

    from libarena.schedule.live.processes import process_env, processes_started_under

    sleeper = f"{sys.executable} -c 'import time; time.sleep(120)' & echo $!; wait"
    procs, children = [], []
    try:
        for directory in (tmp_path / "ours" / "state.db.d" / "jobs" / "j" / "v1", tmp_path / "other"):
            proc = subprocess.Popen(["/bin/sh", "-c", sleeper], stdout=subprocess.PIPE, text=True,
                                    start_new_session=True, env=process_env(directory))
            procs.append(proc)
            children.append(int(proc.stdout.readline()))
        found = processes_started_under(tmp_path / "ours")
        assert sorted(found) == sorted([procs[0].pid, children[0]])
        assert procs[1].pid not in found and children[1] not in found
        assert set(processes_started_under(tmp_path)) >= {procs[0].pid, procs[1].pid, *children}
    finally:
        for pid in children + [p.pid for p in procs]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            proc.wait()
