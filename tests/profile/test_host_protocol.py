"""The timing protocol for a shared host (libarena.profile.host), process CPU time in timings, the CPU-time
model of host devices that share cores, and the one-command GPU check's behaviour without a GPU."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time

import pytest

from libarena.errors import ArenaError
from libarena.profile import host
from libarena.profile.pipeline import StageTimes, one_f_one_b


def _steady() -> dict[str, float]:
    return {"level": 0.02, "spread": 0.01, "within": 0.02, "sample_s": 0.005}


def test_quiet_host_starts_at_once():
    record = host.wait_until_quiet(host.QuietPolicy(max_load=0.5), probe=lambda: (0.1, []), sleep=pytest.fail, noise_probe=_steady)
    assert record["quiet"] and record["waited_s"] == 0 and record["timing_noise"]["spread"] == 0.01
    assert record["first_look"] == {"quiet": True, "load_average": 0.1, "busy_processes": [], "timing_noise": _steady()}


def test_busy_host_is_waited_for_then_used():
    looks = iter([(3.0, [{"pid": 9, "name": "pytest", "cpu_percent": 180.0}]), (1.2, []), (0.2, [])])
    slept = []
    probed = []
    record = host.wait_until_quiet(host.QuietPolicy(max_load=0.5, poll_s=10, max_wait_s=60), probe=lambda: next(looks), sleep=slept.append,
                                   noise_probe=lambda: probed.append(1) or _steady())
    assert record["quiet"] and record["waited_s"] == 20 and slept == [10, 10]
    assert probed == [1]  # the noise is timed only once the host looks idle
    # the host as first found is kept beside (a benchmark judges the work just before the wait by it)
    first = record["first_look"]
    assert not first["quiet"] and first["load_average"] == 3.0 and first["busy_processes"][0]["pid"] == 9 and first["timing_noise"] is None


def test_host_that_stays_busy_is_refused_in_one_line_naming_the_load_and_the_process():
    busy = (2.5, [{"pid": 42, "name": "stress", "cpu_percent": 99.0}])
    with pytest.raises(ArenaError) as err:
        host.wait_until_quiet(host.QuietPolicy(max_wait_s=30, poll_s=10), probe=lambda: busy, sleep=lambda s: None, noise_probe=pytest.fail)
    message = str(err.value)
    assert "\n" not in message and "2.50" in message and "stress[42]" in message
    record = host.wait_until_quiet(host.QuietPolicy(max_wait_s=0, refuse=False), probe=lambda: busy, noise_probe=pytest.fail)
    assert not record["quiet"] and record["busy_processes"][0]["pid"] == 42 and record["timing_noise"] is None


def test_a_policy_without_a_load_limit_looks_only_at_other_processes_and_the_noise():
    # between a benchmark's models its own last minutes of work keep the load average up
    record = host.wait_until_quiet(host.QuietPolicy(max_load=None), probe=lambda: (1.9, []), sleep=pytest.fail, noise_probe=_steady)
    assert record["quiet"] and record["policy"]["max_load"] is None
    busy = (1.9, [{"pid": 7, "name": "make", "cpu_percent": 95.0}])
    with pytest.raises(ArenaError, match="not limited; busy: make\\[7\\]"):
        host.wait_until_quiet(host.QuietPolicy(max_load=None, max_wait_s=0), probe=lambda: busy, noise_probe=pytest.fail)
    with pytest.raises(ArenaError, match="max_load"):
        host.QuietPolicy(max_load=-1.0)


def test_noisy_host_is_waited_for_then_refused_in_one_line_naming_the_noise():
    # A neighbour on a shared virtual machine: load average and process list look idle, the timings do not.
    noisy = {"level": 0.124, "spread": 0.124, "within": 0.05, "sample_s": 0.012}
    slept = []
    with pytest.raises(ArenaError) as err:
        host.wait_until_quiet(host.QuietPolicy(max_noise=0.05, max_wait_s=30, poll_s=10), probe=lambda: (0.1, []),
                              sleep=slept.append, noise_probe=lambda: noisy)
    message = str(err.value)
    assert "\n" not in message and "noisy" in message and "12.4%" in message and "5%" in message and slept == [10, 10, 10]
    calms = iter([noisy, _steady()])
    record = host.wait_until_quiet(host.QuietPolicy(max_noise=0.05, max_wait_s=30, poll_s=10), probe=lambda: (0.1, []),
                                   sleep=lambda s: None, noise_probe=lambda: next(calms))
    assert record["quiet"] and record["waited_s"] == 10 and record["policy"]["max_noise"] == 0.05
    assert not record["first_look"]["quiet"] and record["first_look"]["timing_noise"] == noisy
    # without a limit the probe is only recorded (bench_host measures that noise itself)
    record = host.wait_until_quiet(host.QuietPolicy(max_noise=None), probe=lambda: (0.1, []), sleep=pytest.fail, noise_probe=lambda: noisy)
    assert record["quiet"] and record["timing_noise"]["level"] == 0.124
    with pytest.raises(ArenaError, match="max_noise"):
        host.QuietPolicy(max_noise=0)


def test_timing_noise_is_the_spread_of_the_bursts_lower_quartiles():
    # A fake clock, read at each run's start and end: the end reading adds the run's duration. Four bursts of four.
    durations = iter([0.010, 0.010, 0.010, 0.010,   # burst 1: lower quartile 10 ms
                      0.012, 0.012, 0.012, 0.012,   # burst 2: 12 ms
                      0.010, 0.010, 0.020, 0.020,   # burst 3: 10 ms (IQR / median 0.010 / 0.015 within it)
                      0.010, 0.010, 0.010, 0.010])  # burst 4: 10 ms
    now, reads = [0.0], [0]

    def clock():
        reads[0] += 1
        if reads[0] % 2 == 0:
            now[0] += next(durations)
        return now[0]

    slept = []
    noise = host.timing_noise(bursts=4, samples=4, interval_s=1.0, work=lambda: None, clock=clock, sleep=slept.append)
    # quartiles of the bursts' lower quartiles (10, 12, 10, 10 ms): 10 and 11.5 ms around a 10 ms median
    assert noise["spread"] == pytest.approx(0.15) and noise["level"] == pytest.approx(0.15)
    assert noise["within"] == pytest.approx(0.0) and noise["sample_s"] == pytest.approx(0.010)
    assert (noise["bursts"], noise["samples"]) == (4, 4) and slept == [1.0, 1.0, 1.0]  # between the bursts


def test_alternation_gaps_show_a_drift_that_long_turns_split_unevenly_and_short_turns_share():
    # The host's speed steps between two levels every 40 samples (about a second of a tiny model's steps)
    drifting = [1.0 if (i // 40) % 2 == 0 else 1.25 for i in range(800)]
    # turns of 40 samples in step with the drift: in a window that starts with a phase, one side gets every fast
    # phase and the other every slow one (20% or 25% apart, as A is the fast side or the slow one); the windows
    # overlap by three quarters (start every 100 samples), and one that starts mid-phase splits every phase
    long_turns = host.alternation_gaps(drifting, per_turn=40, turns=5)
    assert long_turns == pytest.approx([0.2, 0.0, 0.25, 0.0, 0.2])
    # turns of 10 samples: each side meets both phases alike
    assert max(host.alternation_gaps(drifting, per_turn=10, turns=20)) == pytest.approx(0.0)
    # a steady host: no gap whatever the turns; windows overlap by three quarters
    assert host.alternation_gaps([0.02] * 800, per_turn=40, turns=5) == [0.0] * 5
    assert host.alternation_gaps([0.02] * 10, per_turn=40, turns=5) == []  # too few samples for one window
    with pytest.raises(ArenaError, match="at least one turn"):
        host.alternation_gaps(drifting, per_turn=0, turns=5)


def test_alternation_floor_times_the_fixed_computation_back_to_back_and_scores_each_scheme():
    # A fake clock: each run of the work takes 10 ms on a fast phase of 50 runs, 12 ms on the slow one after it
    now, runs = [0.0], [0]

    def work():
        runs[0] += 1
        now[0] += 0.010 if (runs[0] // 50) % 2 == 0 else 0.012

    floor = host.alternation_floor([(0.5, 2), (0.05, 20)], duration_s=4.0, work=work, clock=lambda: now[0])
    assert floor["samples"] == runs[0] - 1 >= 300 and floor["sample_s"] in (pytest.approx(0.010), pytest.approx(0.012))
    coarse, fine = floor["schemes"]
    # half-second turns hold a phase each (about 50 runs): the sides' lower quartiles land about 20% apart;
    # turns of 5 runs share the phases out evenly
    assert coarse["samples_per_turn"] in (42, 50) and coarse["mean_gap"] > 0.1
    assert fine["samples_per_turn"] in (4, 5) and fine["mean_gap"] < 0.02 and fine["windows"] >= 1
    # the real fixed computation on this host, pinned to a core (the affinity restored after)
    before = os.sched_getaffinity(0)
    real = host.alternation_floor([(0.05, 5)], duration_s=1.0, core=host.usable_cores()[0])
    scheme = real["schemes"][0]
    # no bound on the gap: on a loaded runner two sides timing the same work drift apart, which is what it reports;
    # a window needs turns' worth of samples, so a slow host's second may hold none (then no gap at all)
    assert real["samples"] >= 1 and scheme["samples_per_turn"] == max(1, round(0.05 / real["sample_s"]))
    assert (scheme["mean_gap"] is None) == (scheme["windows"] == 0) and os.sched_getaffinity(0) == before
    if scheme["windows"]:
        assert math.isfinite(scheme["mean_gap"]) and scheme["mean_gap"] >= 0
    with pytest.raises(ArenaError, match="positive duration"):
        host.alternation_floor([(0.0, 5)], duration_s=1.0)


def test_turn_control_times_the_fixed_computation_after_each_sides_turn_and_shows_a_drift_between_them():
    # A fake clock and work: 10 ms a run, 12 ms while the host is slow (``slow`` set by the "side" just timed)
    now, slow, cores_seen = [0.0], [False], []

    def work():
        cores_seen.append(sorted(os.sched_getaffinity(0)))
        now[0] += 0.012 if slow[0] else 0.010

    cores = host.usable_cores()[:2]
    control = host.TurnControl(("estimate", "measurement"), cores=cores, chunk_s=0.095, work=work, clock=lambda: now[0])
    assert control.summary()["gap"] is None  # nothing timed yet
    before = os.sched_getaffinity(0)
    for turn in range(4):
        for side in ("estimate", "measurement") if turn % 2 == 0 else ("measurement", "estimate"):
            slow[0] = False
            control.after(side, turn)
    steady = control.summary()
    # one untimed run, then 0.095 s of 10 ms runs (ten) per chunk; both sides alike: no gap
    assert steady["gap"] == pytest.approx(0.0, abs=1e-12) and steady["samples"] == {"estimate": 40, "measurement": 40}
    assert steady["lower_quartile_s"] == {"estimate": pytest.approx(0.010), "measurement": pytest.approx(0.010)}
    # each turn's chunks ran on one of the cores, turn by turn, and this thread's affinity came back after
    assert cores_seen[0] == [cores[0]] and cores_seen[-1] == [cores[3 % len(cores)]] and os.sched_getaffinity(0) == before
    # a host 20% slower beside the measurement's turns than beside the estimate's: a 1/1.2 - 1 gap
    drifting = host.TurnControl(("estimate", "measurement"), chunk_s=0.095, work=work, clock=lambda: now[0])
    for turn in range(4):
        for side in ("estimate", "measurement"):
            slow[0] = side == "measurement"
            drifting.after(side, turn)
    assert drifting.summary()["gap"] == pytest.approx(1 - 1 / 1.2)
    with pytest.raises(ArenaError, match="unknown side 'other'"):
        drifting.after("other", 0)
    with pytest.raises(ArenaError, match="two distinct sides"):
        host.TurnControl(("a", "a"))
    # the real fixed computation on this host: each side's quartile is a positive time and the gap is theirs.
    # No bound on the gap itself: on a loaded host (a CI runner beside other pytest workers) two sides timing the
    # same thing can drift by more than 100% (CI saw 1.28), which is what the control exists to report.
    real = host.TurnControl(("a", "b"), cores=cores[:1], chunk_s=0.05)
    for turn in range(3):
        real.after("a", turn)
        real.after("b", turn)
    measured = real.summary()
    quartiles = measured["lower_quartile_s"]
    assert min(measured["samples"].values()) >= 3 and all(q > 0 for q in quartiles.values())
    assert measured["gap"] == pytest.approx(abs(quartiles["a"] / quartiles["b"] - 1.0))


def test_continuous_noise_is_the_spread_of_the_fixed_computation_back_to_back_on_the_noisiest_core():
    now, runs = [0.0], [0]

    def work():  # every other run 30% slower on the second core's turn, steady on the first
        runs[0] += 1
        slow = len(seen) > 1 and runs[0] % 2 == 0
        now[0] += 0.013 if slow else 0.010

    seen = []

    def clock():
        core = sorted(os.sched_getaffinity(0))
        if not seen or seen[-1] != core:
            seen.append(core)
        return now[0]

    cores = host.usable_cores()[:2]
    before = os.sched_getaffinity(0)
    noise = host.continuous_noise(0.5, cores=cores, work=work, clock=clock)
    assert os.sched_getaffinity(0) == before and seen[:len(cores)] == [[c] for c in cores]
    if len(cores) == 2:
        assert noise["per_core"][str(cores[0])] == pytest.approx(0.0, abs=1e-12) and noise["level"] == noise["per_core"][str(cores[1])] > 0
    real = host.continuous_noise(0.2)
    # a spread of real timings: finite, with no bound a loaded runner could break
    assert math.isfinite(real["level"]) and real["level"] >= 0 and list(real["per_core"]) == ["None"]
    with pytest.raises(ArenaError, match="positive duration"):
        host.continuous_noise(0.0)


def test_timing_noise_of_this_host_is_a_finite_spread_of_a_real_fixed_computation():
    noise = host.timing_noise(bursts=4, samples=4, interval_s=0.0)
    assert 0 < noise["sample_s"] < 1.0 and math.isfinite(noise["level"]) and noise["level"] == max(noise["spread"], noise["within"])
    # the fixed computation runs on the calling thread, as each device of the pinned layout does (a BLAS thread
    # pool would show about 2 CPU seconds per wall second on two cores): timed in a fresh interpreter, whose
    # process CPU time is that thread's alone (a pytest worker's other threads count in this process's)
    fresh = host.timing_noise_on(None, bursts=4, samples=4, interval_s=0.0)
    assert fresh["cpu_per_wall"] < 1.3
    with pytest.raises(ArenaError, match="at least 4"):
        host.timing_noise(bursts=3)


def test_timing_noise_times_each_measuring_core_in_turn_and_restores_the_affinity():
    cores = host.usable_cores()[:2]
    before = os.sched_getaffinity(0)
    seen = []
    noise = host.timing_noise(bursts=4, samples=4, interval_s=0.0, work=lambda: seen.append(frozenset(os.sched_getaffinity(0))),
                              cores=cores)
    # per burst and core: one untimed run and 4 timed ones, pinned to that core alone
    assert seen == [frozenset({core}) for _ in range(4) for core in cores for _ in range(5)]
    assert os.sched_getaffinity(0) == before
    assert sorted(noise["per_core"]) == sorted(str(c) for c in cores) and noise["cores"] == cores
    assert noise["level"] == max(figures["level"] for figures in noise["per_core"].values())
    with pytest.raises(ArenaError, match="usable cores"):
        host.timing_noise(bursts=4, samples=4, interval_s=0.0, work=lambda: None, cores=[max(host.usable_cores()) + 1000])
    assert os.sched_getaffinity(0) == before


def test_busy_processes_sees_another_process_burning_a_core():
    # Started through a parent that exits at once: not this process's child (children are not "other" work).
    burn = "import time\nt = time.time()\nwhile time.time() - t < 20: pass"
    spawn = (f"import subprocess, sys\nprint(subprocess.Popen([sys.executable, '-c', {burn!r}], stdout=subprocess.DEVNULL, "
             "stderr=subprocess.DEVNULL).pid)")
    pid = int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, check=True).stdout)
    try:
        time.sleep(0.5)
        busy = host.busy_processes(min_percent=5.0, interval_s=2.0)  # a loaded host shares its cores
        assert pid in {b["pid"] for b in busy}
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_cpu_ticks_and_host_window_report_steal_and_busy_shares(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3\n")
    ticks = host.cpu_ticks(stat)
    assert ticks == {"user": 100, "nice": 0, "system": 50, "idle": 800, "iowait": 10, "irq": 0, "softirq": 0, "steal": 40}
    assert host.cpu_ticks(tmp_path / "missing") is None
    before = host.HostSnapshot(0.0, (1.0, 1.0, 1.0), ticks, 0.0, 0.0)
    later = dict(ticks, user=ticks["user"] + 60, idle=ticks["idle"] + 30, steal=ticks["steal"] + 10)
    after = host.HostSnapshot(2.0, (1.5, 1.1, 1.0), later, 1.5, 0.25)
    window = host.host_window(before, after)
    assert window["cpu_steal_fraction"] == pytest.approx(0.1)
    assert window["cpu_busy_fraction"] == pytest.approx(0.7)
    assert window["process_cpu_s"] == 1.5 and window["wall_s"] == 2.0 and window["load_average_before"] == [1.0, 1.0, 1.0]


def test_xla_flags_are_merged_and_layouts_pin_one_core_per_device():
    assert host.merge_xla_flags("--a=1 --b=2", ("--b=3", "--c")) == "--a=1 --b=3 --c"
    pinned = host.XLA_THREADING.get("pinned")
    assert pinned.cores(2, [0, 1, 2, 3]) == [0, 1]
    assert host.XLA_THREADING.get("default").cores(2, [0, 1]) is None
    with pytest.raises(ArenaError, match="3 devices need 3 cores"):
        pinned.cores(3, [0, 1])
    with pytest.raises(ArenaError, match="unknown XLA threading layout"):
        host.XLA_THREADING.get("turbo")
    env = host.threading_env(host.XLA_THREADING.get("eigen-single"), {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false"


def test_a_pinned_child_runs_on_one_core_per_device_with_the_layout_flags():
    from libarena.profile.subprocess_devices import device_env

    layout = device_env("cpu", 1, host.XLA_THREADING.get("pinned"))
    code = "import os, json; print(json.dumps([sorted(os.sched_getaffinity(0)), os.environ['XLA_FLAGS'], os.environ['GLIBC_TUNABLES']]))"
    out = subprocess.run(layout.command([sys.executable, "-c", code]), env=layout.env, capture_output=True, text=True, check=True)
    cores, flags, tunables = json.loads(out.stdout)
    assert cores == host.STARTING_CORES[:1]
    assert "--xla_cpu_multi_thread_eigen=false" in flags and "--xla_force_host_platform_device_count=1" in flags
    # its C heap on huge pages (libarena.run.heap), with or without a threading layout
    assert "glibc.malloc.hugetlb=1" in tunables.split(":")
    assert "glibc.malloc.hugetlb=1" in device_env("cpu", 2).env["GLIBC_TUNABLES"].split(":")


def test_threading_cannot_be_applied_once_jax_has_started():
    code = ("import jax; jax.devices()\nfrom libarena.profile.host import XLA_THREADING, apply_threading\n"
            "from libarena.errors import ArenaError\ntry:\n    apply_threading(XLA_THREADING.get('pinned'))\n"
            "except ArenaError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert "must be applied before JAX starts" in out.stdout


def test_timings_carry_process_cpu_time_and_a_lower_quartile():
    from libarena.profile.timers import HostTimer, Timing, lower_quartile

    def spin():
        t = time.process_time()
        while time.process_time() - t < 0.01:
            pass

    timing = HostTimer().time(spin, 1, 8)
    assert len(timing.cpu_samples) == len(timing.samples) == 8
    # each run burns 10 ms of this process's CPU: its CPU time at least that (other threads of a pytest worker
    # may add theirs, so no upper bound against the wall time)
    assert all(c >= 0.01 and w > 0 for c, w in zip(timing.cpu_samples, timing.samples))
    assert timing.cpu_per_wall > 0
    d = timing.to_dict()
    assert d["q1_s"] <= d["median_s"] and len(d["cpu_samples_s"]) == 8
    assert lower_quartile([5.0, 1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.5)
    assert Timing((1.0, 2.0), (0.5, 1.0)).scaled(0.5).cpu_samples == (0.25, 0.5)


def test_cpu_time_model_runs_single_core_stages_side_by_side_and_saturated_ones_in_turn():
    single = [StageTimes(0.010, cores=1.0), StageTimes(0.010, cores=1.0)]
    assert one_f_one_b(single, 8, host_cores=2).iter_time_s == pytest.approx(one_f_one_b(single, 8).iter_time_s)
    saturated = [StageTimes(0.010, cores=2.0), StageTimes(0.010, cores=2.0)]
    est = one_f_one_b(saturated, 8, host_cores=2)
    # both stages busy all the time: each micro-batch period needs 2 x 10 ms of both cores
    assert est.steady_state_s == pytest.approx(7 * 0.020)
    dp = [StageTimes(0.010, workers=2, cores=1.0)]
    assert one_f_one_b(dp, 1, host_cores=2).iter_time_s == pytest.approx(0.010)
    assert one_f_one_b([StageTimes(0.010, workers=2, cores=1.6)], 1, host_cores=2).iter_time_s == pytest.approx(0.016)
    with pytest.raises(ValueError, match="one host-sharing model"):
        one_f_one_b(dp, 1, slowdown=lambda k: 2.0, host_cores=2)


def test_host_capacity_shares_all_cores_or_one_per_device_at_most_what_the_host_gave_the_micro_benchmark():
    from libarena.profile.concurrency import HostCapacity, HostConcurrency

    assert HostCapacity(2).cores_for(1) == 2
    assert HostCapacity(1, one_core_per_device=True).cores_for(2) == 2
    # one MLP alone keeps 1.6 cores busy; two at once take 1.9x as long: the host gave them 2 x 1.6 / 1.9 cores
    measured = HostConcurrency(((2, 1.9),), "test", 0.0, ((2, 1.6),))
    assert measured.effective_cores(2) == pytest.approx(3.2 / 1.9) and measured.effective_cores(3) is None
    assert HostCapacity(2, measured=measured).cores_for(2) == pytest.approx(3.2 / 1.9)
    assert HostCapacity(2, measured=measured).cores_for(1) == 2
    assert HostCapacity(1, True, HostConcurrency(((2, 1.2),), "test", 0.0, ((2, 1.0),))).cores_for(2) == pytest.approx(2 / 1.2)
    assert HostCapacity(2, measured=HostConcurrency(((2, 1.0),), "test", 0.0, ((2, 1.9),))).cores_for(2) == 2  # never above the cores


def test_gpu_check_without_a_gpu_is_one_line_and_exit_2(repo_root, tmp_path):
    for args in (["-m", "bench", "gpu"], ["-m", "bench.bench_gpu"]):
        # a PATH with no nvidia-smi, even on a host that has one (it would go on to install the GPU extra)
        out = subprocess.run([sys.executable, *args], cwd=repo_root, capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PATH=str(tmp_path)))
        assert out.returncode == 2
        assert out.stderr.strip() == "no NVIDIA GPU visible" and out.stdout == ""


def test_gpu_check_picks_the_cuda_extra_from_the_driver():
    import types

    from bench import bench_gpu

    smi = "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8     |"
    fake = lambda *a, **k: types.SimpleNamespace(stdout=smi, returncode=0)  # noqa: E731
    assert bench_gpu.driver_cuda_major(fake) == 12
    assert bench_gpu.cuda_extra(12) == "cuda12" and bench_gpu.cuda_extra(13) == "cuda13"
    with pytest.raises(bench_gpu.GpuCheckError, match="CUDA 11"):
        bench_gpu.cuda_extra(11)
    lines = lambda *a, **k: types.SimpleNamespace(stdout="GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n", returncode=0)  # noqa: E731
    if bench_gpu.shutil.which("nvidia-smi"):
        assert bench_gpu.nvidia_gpus(lines) == ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"]


def test_gpu_check_keeps_the_models_a_stopped_child_finished(tmp_path):
    """The check's child rewrites gpu.json after every model; one stopped for overrunning leaves those rows, and
    the models not reached are listed. A child that stops before any model, or fails, is a one-line error."""
    import json

    from bench import bench_gpu

    out = tmp_path / "gpu.json"
    row = {"error_cupti": -0.5, "error_host": 0.1, "error_composed_cupti": -0.6, "error_composed_host": 0.05}
    payload = bench_gpu.check_payload([row], [], ["gpt__small", "bert__small"], {}, {}, 3.0)
    writes_then_hangs = f"import json, time; open({str(out)!r}, 'w').write({json.dumps(json.dumps(payload))}); time.sleep(60)"
    kept = bench_gpu.run_check_child([sys.executable, "-c", writes_then_hangs], dict(os.environ), out, 10.0)
    assert kept["summary"]["plans"] == 1 and kept["summary"]["mae_host"] == pytest.approx(0.1)
    assert kept["summary"]["models_not_reached"] == ["gpt__small", "bert__small"] and kept["summary"]["stopped_after_s"] == 10.0
    out.unlink()
    with pytest.raises(bench_gpu.GpuCheckError, match="overran 1 s before finishing a model"):
        bench_gpu.run_check_child([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), out, 1.0)
    with pytest.raises(bench_gpu.GpuCheckError, match="failed \\(exit 3"):
        bench_gpu.run_check_child([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), out, 30.0)


def test_gpu_check_compiles_without_kernel_autotuning_unless_asked(tmp_path):
    """The check's children compile with XLA's GPU autotuning off (the caller's other flags kept, an autotune level
    it set replaced); None leaves XLA_FLAGS as the caller had it."""
    from bench import bench_gpu

    env = bench_gpu.check_env({"XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_gpu_autotune_level=4"}, tmp_path)
    assert env["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/x", f"--xla_gpu_autotune_level={bench_gpu.AUTOTUNE_LEVEL}"]
    assert bench_gpu.AUTOTUNE_LEVEL == 0 and env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jax-cache")
    assert bench_gpu.check_env({"XLA_FLAGS": "--a=1"}, tmp_path, 2)["XLA_FLAGS"] == "--a=1 --xla_gpu_autotune_level=2"
    assert "XLA_FLAGS" not in bench_gpu.check_env({}, tmp_path, None)
    assert bench_gpu.check_env({"XLA_FLAGS": "--a=1"}, tmp_path, None)["XLA_FLAGS"] == "--a=1"


def test_a_process_pinned_to_one_core_probes_the_noise_of_every_core_from_a_fresh_interpreter():
    # bench_profile's measuring interpreter runs pinned to its layout's cores; between models it probes the
    # cores its 2-device measurements use
    usable = host.usable_cores()
    host.pin_cores(usable[:1])
    try:
        with pytest.raises(ArenaError, match="not among this process's usable cores") if len(usable) > 1 else contextlib.nullcontext():
            host.timing_noise(bursts=4, samples=4, interval_s=0.0, cores=usable)
        noise = host.timing_noise_on(usable, bursts=4, samples=4, interval_s=0.0)
    finally:
        host.pin_cores(usable)
    assert noise["cores"] == usable and sorted(noise["per_core"]) == sorted(map(str, usable)) and noise["level"] >= 0
    # the first usable core, not core 0: a container's affinity may leave core 0 out
    with pytest.raises(ArenaError, match=f"^timing noise on cores {re.escape(str(usable[:1]))}: the probe failed \\(exit 1\\): .*at least 4 bursts"):
        host.timing_noise_on(usable[:1], bursts=2)
