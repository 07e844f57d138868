"""LiveCluster unit behaviour: intents carry the version to stop, snapshots restore exactly."""

from __future__ import annotations

from libarena.hardware import load_cluster
from libarena.schedule.api import make_policy
from libarena.schedule.entities import JobSpec, JobState
from libarena.schedule.live.cluster import LiveCluster
from libarena.schedule.perf import load_perf
from tests.live.helpers import OVERHEADS, write_inputs


def _cluster(tmp_path, policy: str = "fcfs"):
    from libarena.schedule.config import SimulatorConfig

    cluster, perf = write_inputs(tmp_path)
    spec = load_cluster(cluster)
    return LiveCluster(load_perf(perf, spec), spec, make_policy(policy), SimulatorConfig(overheads=OVERHEADS))


def test_twice_in_one_round_stops_the_launched_version(tmp_path):
    live = _cluster(tmp_path)
    job = live.submit(JobSpec("a", 1, 0.0, "gpt__760M", 128, 5000, 1, "a100", None, 1), 0.0)
    live.advance(0.0)
    assert live.launch(job, 0, 0)
    (first,) = live.drain()[0]
    assert first.version == 1 and first.previous_version is None
    job.state = JobState.RUNNING  # as if the launcher had reported the start
    job.rate = 1.0
    assert live.rescale(job, 0, 1) and live.rescale(job, 0, 2)
    intents = live.drain()[0]
    assert [(r.version, r.previous_version) for r in intents] == [(2, 1), (3, 1)]


def test_snapshot_restore_roundtrip(tmp_path):
    live = _cluster(tmp_path)
    a = live.submit(JobSpec("a", 1, 0.0, "gpt__760M", 128, 5000, 1, "a100", None, 1), 0.0)
    b = live.submit(JobSpec("b", 2, 0.0, "bert__1.3B", 128, 5000, 8, "a100", None, 2), 0.0)
    live.advance(0.0)
    live.tick()
    snaps = {j.spec.job_id: (j.spec, live.snapshot(j), live.status_of(j)) for j in (a, b)}
    assert snaps["a"][2] == "starting" and snaps["b"][2] == "queued"
    (tmp_path / "x").mkdir()
    other = _cluster(tmp_path / "x")
    restored = {k: other.restore(spec, snap) for k, (spec, snap, _) in snaps.items()}
    other.requeue([j for j in restored.values() if j.state == JobState.QUEUED])
    for k, j in restored.items():
        orig = a if k == "a" else b
        assert (j.index, j.state, j.version, j.alloc, j.priority, j.enqueue_seq) == \
               (orig.index, orig.state, orig.version, orig.alloc, orig.priority, orig.enqueue_seq)
    assert other.cluster.free_gpus == live.cluster.free_gpus
    assert other.requests["a"] == live.requests["a"]
    assert other.policy.queues[restored["b"].requested_type_index][0] is restored["b"]  # back in the policy's queue
    assert other.queued_count == 1


def test_reuse_state_survives_a_restart(tmp_path):
    """What the server saves each pass (LiveCluster.reuse_state) gives a restarted server the profiles of
    finished jobs' (model, batch) and the searched plans: a later job of that pair is not profiled again."""
    import json

    live = _cluster(tmp_path, "arena")
    a = live.submit(JobSpec("a", 1, 0.0, "gpt__760M", 128, 5000, 1, "a100", None, 1), 0.0)
    live.advance(0.0)
    fresh_cost = live.launch_overhead(a, 0, 0)
    assert live.launch(a, 0, 0)
    saved = json.loads(json.dumps(live.reuse_state()))  # through the store's JSON, as the server saves it
    assert saved["profiles"] and saved["plans"][0][2] == live.perf.gpu_types[0]
    (tmp_path / "x").mkdir()
    other = _cluster(tmp_path / "x", "arena")
    other.restore_reuse_state(saved)
    other.advance(10000.0)  # long after the profile was ready
    b = other.submit(JobSpec("b", 2, 10000.0, "gpt__760M", 128, 5000, 1, "a100", None, 2), 10000.0)
    forgetful = _cluster(tmp_path / "x", "arena")
    forgetful.advance(10000.0)
    c = forgetful.submit(JobSpec("c", 2, 10000.0, "gpt__760M", 128, 5000, 1, "a100", None, 2), 10000.0)
    assert forgetful.launch_overhead(c, 0, 0) == fresh_cost
    assert other.launch_overhead(b, 0, 0) < fresh_cost
    assert other.plans_ready == live.plans_ready and other.profiles_ready == live.profiles_ready


def test_a_trade_stops_both_jobs_before_either_starts(tmp_path):
    """A trade gives two running jobs each other's GPUs: the server stops every job leaving its GPUs in a round
    before it starts any version of that round (in request order, either start would find the other job still
    on its GPUs). Superseded intents are neither stopped nor started."""
    from types import SimpleNamespace

    from libarena.schedule.live.server import Server

    live = _cluster(tmp_path, "arena")
    a = live.submit(JobSpec("short", 1, 0.0, "gpt__760M", 128, 5000, 4, "a100", None, 1), 0.0)
    b = live.submit(JobSpec("long", 2, 0.0, "gpt__760M", 128, 50000, 4, "v100", None, 1), 0.0)
    live.advance(0.0)
    assert live.launch(a, 1, 2) and live.launch(b, 0, 2)  # short on 4 V100s, long on 4 A100s
    live.drain()
    for job in (a, b):
        job.state = JobState.RUNNING
        job.rate = 1.0
    live.trade(a, b)
    intents = live.drain()[0]
    assert [(r.job_id, r.gpu_type, r.previous_version) for r in intents] == [("short", "a100", 1), ("long", "v100", 1)]
    calls: list[tuple] = []
    launcher = SimpleNamespace(vacate=lambda r: calls.append(("stop", r.job_id, r.previous_version)),
                               launch=lambda r: calls.append(("start", r.job_id, r.version)))
    store = SimpleNamespace(mark_launch=lambda job_id, version, what: calls.append((what, job_id, version)))
    superseded = intents[0].__class__(**{**intents[0].to_dict(), "version": 1, "nodes": (0,)})
    Server._execute(SimpleNamespace(launcher=launcher, store=store), [superseded, *intents])
    assert calls == [("superseded", "short", 1), ("stop", "short", 1), ("stop", "long", 1),
                     ("start", "short", 2), ("launched", "short", 2), ("start", "long", 2), ("launched", "long", 2)]


def test_a_version_reported_started_and_finished_at_once_stays_finished(tmp_path):
    """The launcher may report a version's start and finish at one time (a resume with nothing left to train): the
    completion, ordered first at equal times, ends the job, and its start must not bring it back as running."""
    from libarena.schedule.live.launchers.base import RunStatus

    live = _cluster(tmp_path)
    job = live.submit(JobSpec("a", 1, 0.0, "gpt__760M", 128, 5000, 1, "a100", None, 1), 0.0)
    live.advance(0.0)
    live.tick()
    assert live.status_of(job) == "starting"
    live.apply({"a": RunStatus("a", job.version, "finished", 12.0, 12.0, 5000.0)}, True)
    live.advance(20.0)
    assert job.state == JobState.FINISHED and not job.active and live.status_of(job) == "finished"
    assert job.index not in live.active and live.cluster.free_gpus == live.cluster.total_gpus
    assert [e[2] for e in live.drain()[1] if e[1] == "a"] == ["launch", "finish"]
