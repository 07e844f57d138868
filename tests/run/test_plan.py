"""Plans as the runtime sees them: validation, cluster -> unit mapping, the 1F1B order, sharding rules."""

from __future__ import annotations

import pytest

from libarena.errors import ArenaError
from libarena.models import get_model
from libarena.run.executor import one_f_one_b, param_partition, zero_partition
from libarena.plan import Grid, StageLayout, make_plan
from libarena.run.plan import RunPlan, simple_plan


@pytest.mark.parametrize("stages,micro", [(1, 1), (1, 4), (2, 4), (3, 2), (4, 8), (4, 4)])
def test_one_f_one_b_order_is_a_valid_1f1b_schedule(stages: int, micro: int) -> None:
    order = one_f_one_b(stages, micro)
    assert sorted(order) == sorted((j, k, i) for j in range(stages) for k in "FB" for i in range(micro))
    position = {task: n for n, task in enumerate(order)}
    for j in range(stages):
        for i in range(micro):
            if j > 0:
                assert position[(j - 1, "F", i)] < position[(j, "F", i)]
            if j < stages - 1:
                assert position[(j + 1, "B", i)] < position[(j, "B", i)]
            assert position[(j, "F", i)] < position[(j, "B", i)]
        # Per stage: min(S-1-j, B) warm-up forwards, then strictly alternating, so at most S - j
        # micro-batches are in flight (the 1F1B memory bound).
        mine = [(k, i) for jj, k, i in order if jj == j]
        warm = min(stages - 1 - j, micro)
        assert [k for k, _ in mine[:warm]] == ["F"] * warm
        in_flight = peak = 0
        for k, _ in mine:
            in_flight += 1 if k == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(stages - j, micro)


def test_tensor_parallel_axis_choice() -> None:
    assert param_partition(("embed", None, "heads", "head_dim"), (64, 3, 4, 16), 2) == (None, None, "tp", None)
    assert param_partition(("embed", "mlp"), (64, 256), 4) == (None, "tp")
    assert param_partition(("vocab", "embed"), (256, 64), 2) == ("tp", None)
    # Indivisible -> replicated; tp = 1 -> replicated.
    assert param_partition(("embed", "heads"), (64, 3), 2) == (None, None)
    assert param_partition(("embed", "mlp"), (64, 256), 1) == (None, None)
    assert zero_partition((None, "tp"), (64, 256), 2) == ("dp", "tp")
    assert zero_partition(("tp",), (256,), 2) == ("tp",)  # nothing left to shard
    assert zero_partition((), (), 4) == ()


def test_validation_errors_are_one_line() -> None:
    model = get_model("gpt__tiny")  # 6 units
    ok = simple_plan(model, 8, [0, 3], [2, 1], [1, 2], 2)
    ok.validate(model, 4)
    with pytest.raises(ArenaError, match="needs 4 devices but only 2 exist"):
        ok.validate(model, 2)
    with pytest.raises(ArenaError, match="not 'moe__tiny'"):
        ok.validate(get_model("moe__tiny"), 4)
    with pytest.raises(ArenaError, match="cannot be split"):
        simple_plan(model, 8, [0], [8], [1], 2).validate(model, 8)
    with pytest.raises(ArenaError, match="not divisible"):
        simple_plan(model, 8, [0], [1], [1], 3).validate(model, 1)
    short = make_plan(Grid(model.name, 8, "cpu", 1, 1, 1, 1), [0], [1], [1], [1], None, 1, 1, "short")
    with pytest.raises(ArenaError, match="cover 3 of"):
        RunPlan(short, ((0, 3),)).validate(model)


def test_a_plan_binds_its_clusters_to_model_units() -> None:
    model = get_model("gpt__tiny")
    clusters = [{"units": ["embed"]}, {"units": ["block_00", "block_01"]}, {"units": ["block_02", "block_03"]}, {"units": ["head"]}]
    layout = StageLayout.from_cluster_records(clusters)
    assert [layout.unit_range(c, c + 1) for c in range(4)] == [(0, 1), (1, 3), (3, 5), (5, 6)]
    grid = Grid("gpt__tiny", 8, "a100", 3, 1, 4, 2)
    plan = make_plan(grid, [0, 2], [2, 1], [2, 1], [1, 1], [1, 0], 4, 4, "p", offsets=[0, 2])
    run_plan = RunPlan.from_plan(plan, layout, model)
    assert run_plan.unit_ranges == ((0, 3), (3, 6))
    assert run_plan.stages[0].zero and run_plan.num_gpus == 3 and run_plan.offsets() == [0, 2]
    run_plan.validate(model, 3)
    with pytest.raises(ArenaError, match="not 'moe__tiny'"):
        RunPlan.from_plan(plan, layout, get_model("moe__tiny"))
    with pytest.raises(ArenaError, match="not the contiguous units"):
        StageLayout.from_cluster_records([{"units": ["embed"]}, {"units": ["block_01"]}]).check_units(
            [u.name for u in model.units], model.name)
    with pytest.raises(ArenaError, match="does not have"):
        StageLayout.from_cluster_records([{"units": ["stem"]}]).check_units([u.name for u in model.units], model.name)


def test_job_hosts_spread_the_gpus_evenly() -> None:
    from libarena.hardware import get_gpu
    from libarena.run.api import RunRequest, job_hosts

    def request(hosts: int, address: str | None = None) -> RunRequest:
        return RunRequest("p.parquet", "gpt__tiny", 8, 1, "ckpt", num_hosts=hosts, address=address)

    assert job_hosts(request(0), "a100", 16) == 1  # the embedded cluster is one host
    per_node = get_gpu("a100").default_gpus_per_node
    assert job_hosts(request(0, "head:6379"), "a100", 4 * per_node) == 4  # whole nodes of the type's default size
    assert job_hosts(request(0, "head:6379"), "a100", per_node) == 1
    assert job_hosts(request(2), "a100", 4) == 2
    # a joined cluster's own node size, where known (the paper's A100 nodes hold 4): 16 GPUs are 4 hosts
    assert job_hosts(request(0, "head:6379"), "a100", 16, per_node=4) == 4
    assert job_hosts(request(0, "head:6379"), "a100", 4, per_node=4) == 1
    assert job_hosts(request(0), "a100", 16, per_node=4) == 1  # the embedded cluster stays one host
    with pytest.raises(ArenaError, match="do not split evenly over 3 hosts"):
        job_hosts(request(3), "a100", 4)


@pytest.mark.parametrize("kwargs, message", [
    ({"selection": "best"}, r"--search: unknown selection 'best' \(one of proxy, pruned, full\)"),
    ({"use_ray": False, "address": "head:6379"}, "--no-ray runs in this process: drop --address"),
    ({"use_ray": False, "num_hosts": 2}, "--no-ray runs in this process, on one host: drop --hosts"),
    ({"plan_id": "s1-b0-g1-1x1", "selection": "pruned"}, r"--plan-id and --search exclude each other"),
    ({"num_hosts": -1}, "--hosts: "),
    ({"checkpoint_every": -1}, "--checkpoint-every: "),
    ({"dtype": "int8"}, r"--dtype: unknown dtype 'int8' \(known: "),
])
def test_a_run_request_checks_its_values(kwargs, message) -> None:
    """The library's callers get the checks the arena-run tool relies on (the tool repeats none of them)."""
    from libarena.run.api import RunRequest
    from libarena.run.cluster import LocalClusterConfig

    with pytest.raises(ArenaError, match=message):
        RunRequest("p.parquet", "gpt__tiny", 8, 1, "ckpt", **kwargs)
    with pytest.raises(ArenaError, match="--devices: a run needs at least 1 device, got 0"):
        RunRequest("p.parquet", "gpt__tiny", 8, 1, "ckpt", local=LocalClusterConfig(num_devices=0))


def test_a_run_request_spells_its_dtype_one_way() -> None:
    """A checkpoint records the dtype it was trained in and a resume must match it: "bfloat16" is "bf16"."""
    from libarena.run.api import RunRequest

    assert RunRequest("p.parquet", "gpt__tiny", 8, 1, "ckpt", dtype="bfloat16").dtype == "bf16"


def test_cpu_devices_stand_in_on_the_embedded_cluster_and_a_joined_clusters_nodes_use_their_gpus() -> None:
    """Host CPU devices stand in for the GPUs on the embedded cluster (a laptop has none); a job that joins a
    cluster (--address) trains on its nodes' GPUs, unless asked otherwise (--cpu-devices)."""
    from libarena.run.api import RunRequest

    assert RunRequest("p.parquet", "gpt__tiny", 8, 1, "ckpt").on_cpu_devices
    assert not RunRequest("p.parquet", "gpt__tiny", 8, 1, "ckpt", address="head:6379").on_cpu_devices
    assert RunRequest("p.parquet", "gpt__tiny", 8, 1, "ckpt", address="head:6379", cpu_devices=True).on_cpu_devices


def test_the_embedded_ray_cluster_is_started_even_where_one_is_recorded(monkeypatch) -> None:
    """Without an address Ray joins the cluster `ray start` recorded on the machine (RAY_ADDRESS or
    /tmp/ray/ray_current_cluster) and then refuses num_cpus / num_gpus: the embedded cluster asks for a new local
    one."""
    import ray

    from libarena.run.cluster import LocalClusterConfig, connect

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    assert connect(None, LocalClusterConfig(num_cpus=2, num_devices=2, gpu_type="a100"))
    assert calls[0]["address"] == "local" and calls[0]["num_gpus"] == 2


def test_a_search_that_no_single_node_can_hold_is_refused_in_one_line(monkeypatch) -> None:
    """The runtime search measures its candidates in one process holding the whole allocation: on a cluster whose
    nodes are smaller than the grid, Ray would keep that task pending for ever."""
    import ray

    from libarena.run.api import RunRequest, _search_on_ray

    nodes = [{"Alive": True, "Resources": {"GPU": 2.0, "gpu_type:a100": 2.0}}] * 2
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    request = RunRequest("p.parquet", "gpt__tiny", 8, 1, "ckpt", selection="pruned", address="head:6379")
    with pytest.raises(ArenaError, match=r"--search measures the candidates in one process, which needs 4 a100 GPUs on "
                                         r"one node; the largest node has 2"):
        _search_on_ray(request, "a100", 4)


def test_a_joined_cluster_spreads_the_job_over_its_own_node_size(gpt_tiny_plans, tmp_path, monkeypatch) -> None:
    """arena-run by hand on a joined cluster, no --hosts: the job's hosts follow the cluster's nodes of the GPU
    type (here 2 A100s a node: a 4-GPU plan is 2 hosts), not the catalogue's default node size (4 for an A100)."""
    from libarena.hardware import get_gpu
    from libarena.run import cluster
    from libarena.run.api import GridSpec, RunRequest, run

    assert get_gpu("a100").default_gpus_per_node == 4
    specs = []

    class Report:
        def to_dict(self):
            return {"chunks": []}

    monkeypatch.setattr(cluster, "connect", lambda address, local: False)
    monkeypatch.setattr(cluster, "available_gpus", lambda gpu_type: 8)
    monkeypatch.setattr(cluster, "largest_node_gpus", lambda gpu_type: 2)
    monkeypatch.setattr(cluster, "run_job", lambda spec: specs.append(spec) or Report())
    request = RunRequest(str(gpt_tiny_plans), "gpt__tiny", 8, 1, str(tmp_path / "ckpt"), grid=GridSpec("a100", 4, 1),
                         address="head:6379")
    run(request)
    (spec,) = specs
    assert spec.plan.num_gpus == 4 and spec.num_hosts == 2


def test_the_runtime_runs_no_expert_all_to_all() -> None:
    """The planner and profiler price no MoE all-to-all (UnitSpec.alltoalls is 0 for the zoo's MoE blocks) because
    the runtime splits the experts over tp and replicates them over dp: XLA's SPMD partition of a moe__tiny stage
    emits all-reduces (the combine's, and the gradients' over dp) and no all-to-all, at dp 2, at tp 2 and at both."""
    from tests.run.conftest import run_worker

    for dp, tp in ((2, 1), (1, 2), (2, 2)):
        (found,) = run_worker("tests.run.collectives_worker", ["moe__tiny", str(dp), str(tp)], dp * tp)
        counts = found["collectives"]
        assert all(phase["all-to-all"] == 0 for phase in counts.values()), (dp, tp, counts)
        if tp > 1:
            assert counts["forward"]["all-reduce"] > 0, counts
        if dp > 1:
            assert counts["update"]["all-reduce"] + counts["backward"]["all-reduce"] > 0, counts


def test_the_runtime_gathers_wide_resnet_convolution_inputs() -> None:
    """What Wide-ResNet's tensor-parallel pricing (WideResNetModel.tp_allreduce_bytes) rests on: at tp 2 XLA's SPMD
    partition gathers convolution inputs forward and backward and all-reduces their gradients backward, at least
    three collectives a block each way, not two all-reduces a block."""
    from libarena.models import get_model
    from tests.run.conftest import run_worker

    blocks = len(get_model("wide_resnet__tiny").units) - 2
    (found,) = run_worker("tests.run.collectives_worker", ["wide_resnet__tiny", "1", "2"], 2)
    counts = found["collectives"]
    assert counts["forward"]["all-gather"] >= 2 * blocks, counts
    assert counts["backward"]["all-gather"] >= 2 * blocks and counts["backward"]["all-reduce"] >= 3 * blocks, counts

