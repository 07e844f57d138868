"""libarena.hardware: the GPU catalogue and cluster spec files."""

from __future__ import annotations

import pytest

from libarena.errors import ArenaError
from libarena.hardware import cluster_from_dict, get_gpu, gpu_names, load_cluster

REQUIRED = ("h100", "a100", "a100-80gb", "a40", "a10", "v100", "l20", "l4", "t4")


def test_catalogue_has_every_required_gpu_with_a_source():
    for name in REQUIRED:
        gpu = get_gpu(name)
        assert gpu.source and gpu.memory_bytes > 0 and gpu.hbm_bandwidth > 0
        assert gpu.peak("bf16") >= gpu.peak("fp32") > 0
        assert gpu.inter_node_bandwidth > 0 and gpu.intra_node_bandwidth > 0
    assert set(REQUIRED) <= set(gpu_names())


def test_aliases_and_roofline():
    assert get_gpu("A100-40GB").name == "a100"
    h100 = get_gpu("h100")
    ridge = h100.ridge_point("bf16")
    assert h100.roofline(ridge * 10, "bf16") == h100.peak("bf16")
    assert h100.roofline(1.0, "bf16") == pytest.approx(h100.hbm_bandwidth)
    # Volta has no bf16 tensor cores: bf16 runs at the fp32 rate.
    assert get_gpu("v100").peak("bf16") == get_gpu("v100").peak("fp32")


def test_unknown_gpu_is_a_one_line_error():
    with pytest.raises(ArenaError, match="unknown GPU type 'b200'"):
        get_gpu("b200")


def test_shipped_clusters(repo_root):
    sim = load_cluster(repo_root / "examples/clusters/paper-sim-1280.yaml")
    assert sim.total_gpus == 1280
    assert {t: sim.num_gpus(t) for t in sim.gpu_types} == {"a100": 320, "v100": 320, "a40": 320, "a10": 320}
    assert sim.gpus_per_node("v100") == 16
    a = load_cluster(repo_root / "examples/clusters/cluster-a.yaml")
    assert a.total_gpus == 64
    b = load_cluster(repo_root / "examples/clusters/cluster-b.yaml")
    assert b.num_gpus("h100") == 128 and b.num_gpus("l20") == 256


def test_paper_cluster_matches_shared_hardware_table(shared_dir, repo_root):
    import json

    nodes = json.loads((shared_dir / "hardware" / "arena-sim-cluster.json").read_text())[0]
    sim = load_cluster(repo_root / "examples/clusters/paper-sim-1280.yaml")
    assert {t: sim.num_nodes(t) for t in sim.gpu_types} == {t: v["node_num"] for t, v in nodes.items()}


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"name": "x"}, "no nodes"),
        ({"node_groups": []}, "no nodes"),
        ({"node_groups": [{"gpu_type": "zz", "nodes": 1}]}, "unknown GPU type"),
        ({"node_groups": [{"gpu_type": "a10", "nodes": 0}]}, r"nodes: 0 is out of range \(expected an integer in \[1, "),
        ({"node_groups": [{"gpu_type": "a10", "nodes": 2.5}]}, "nodes: 2.5 is not an integer"),
        ({"node_groups": [{"gpu_type": "a10", "nodes": 1, "gpus_per_node": 4096}]}, "gpus_per_node: 4096 is out of range"),
        ({"node_groups": [{"gpu_type": "a10", "nodes": 2**20, "gpus_per_node": 8}]}, "more than 1048576 GPUs"),
        ({"node_groups": [{"gpu_type": "a10", "nodes": 2, "gpus_per_nodes": 4}]},
         "unknown key 'gpus_per_nodes' \\(did you mean 'gpus_per_node'\\?\\)"),
        ({"node_group": [{"gpu_type": "a10", "nodes": 2}]}, "unknown key 'node_group' \\(did you mean 'node_groups'"),
        ({"node_groups": [{"gpu_type": ["a10"] * 10**6, "nodes": 2}]}, "gpu_type: expected a GPU type name"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_cluster_specs(spec, message):
    with pytest.raises(ArenaError, match=message):
        cluster_from_dict(spec)


@pytest.mark.parametrize("text, message", [
    # an alias bomb: nine aliases per level, 9**8 leaves once anything walks or prints it
    ("a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)) + "node_groups: *a8\n",
     "YAML aliases .* are not accepted"),
    ("node_groups: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper than 32 levels"),
    ("node_groups:\n" + "".join("  " * (i + 1) + "- \n" for i in range(40)), "nested deeper than 32 levels"),
    ("name: '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['\nnode_groups: [{gpu_type: a10, nodes: 1}]\n", None),
    ("# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\nnode_groups: [{gpu_type: a10, nodes: 1}]\n", None),
    ("name: x\n" + "# padding\n" * 200_000, "larger than 1024 KiB"),
])
def test_hostile_cluster_files_are_refused_quickly(tmp_path, text, message):
    """Aliases, deep nesting and huge files are refused before the parser or anything else walks them;
    brackets inside strings and comments do not count as nesting."""
    import time

    p = tmp_path / "c.yaml"
    p.write_text(text)
    t0 = time.process_time()  # CPU seconds: a loaded runner stretches the wall time, not the work
    if message is None:
        assert load_cluster(p).total_gpus == 2
    else:
        with pytest.raises(ArenaError, match=message):
            load_cluster(p)
    assert time.process_time() - t0 < 5


def test_hostile_toml_cluster_file(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ArenaError, match="nested deeper than 32 levels"):
        load_cluster(p)
    p.write_text('name = "t"\n[[node_groups]]\ngpu_type = "a10"\nnodes = 2\ngpus_per_nodes = 4\n')
    with pytest.raises(ArenaError, match="did you mean 'gpus_per_node'"):
        load_cluster(p)


@pytest.mark.parametrize("suffix, digits, message", [
    # beyond a float: the range check's message formatted it as one (OverflowError)
    (".yaml", 401, r"c\.yaml: node_groups\[0\]: nodes: an integer of 401 digits is out of range"),
    (".toml", 401, r"c\.toml: node_groups\[0\]: nodes: an integer of 401 digits is out of range"),
    # beyond what Python reads from text at all (4,300 digits): the parsers raise ValueError
    (".yaml", 5000, r"c\.yaml: malformed cluster spec \(Exceeds the limit"),
    (".toml", 5000, r"c\.toml: malformed cluster spec \(Exceeds the limit"),
])
def test_an_integer_of_hundreds_of_digits_is_a_one_line_error(tmp_path, suffix, digits, message):
    p = tmp_path / f"c{suffix}"
    number = "1" + "0" * (digits - 1)
    if suffix == ".yaml":
        p.write_text(f"name: c\nnode_groups:\n  - {{gpu_type: a10, nodes: {number}, gpus_per_node: 4}}\n")
    else:
        p.write_text(f'name = "c"\n[[node_groups]]\ngpu_type = "a10"\nnodes = {number}\ngpus_per_node = 4\n')
    with pytest.raises(ArenaError, match=message) as err:
        load_cluster(p)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_malformed_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("node_groups: [\n")
    with pytest.raises(ArenaError, match="malformed cluster spec"):
        load_cluster(p)
    with pytest.raises(ArenaError, match="no such cluster spec"):
        load_cluster(tmp_path / "none.yaml")


def test_a_key_given_twice_is_refused(tmp_path):
    """YAML requires unique keys; PyYAML would keep the last one silently (a cluster of 2 nodes read as 8)."""
    p = tmp_path / "c.yaml"
    p.write_text("name: t\nnode_groups:\n  - gpu_type: a10\n    nodes: 2\n    gpus_per_node: 1\n    nodes: 8\n")
    with pytest.raises(ArenaError, match=r"c\.yaml: malformed cluster spec: .*line 6, column 5 \(key 'nodes' is given twice\)"):
        load_cluster(p)
    p.write_text("name: t\nnode_groups: [{gpu_type: a10, nodes: 2}]\nname: u\n")
    with pytest.raises(ArenaError, match="key 'name' is given twice"):
        load_cluster(p)
    p.write_text("name: t\nnode_groups: [{gpu_type: a10, nodes: 2, gpus_per_node: 1}, {gpu_type: a10, nodes: 1, gpus_per_node: 1}]\n")
    assert load_cluster(p).total_gpus == 3  # equal keys in different mappings are fine
    p.write_text("name: t\nnode_groups:\n  - <<: {gpu_type: a10, nodes: 2}\n    nodes: 3\n    gpus_per_node: 1\n")
    assert load_cluster(p).total_gpus == 3  # a merge key's keys may be overridden by the mapping's own


def test_a_gpu_type_whose_node_groups_differ_in_node_size_is_refused_by_planner_and_scheduler():
    """One node of 8 A100s and four of 2: grids of whole nodes would take "2 nodes of 8" that do not exist (the
    planner used the largest size), and the buddy placement takes one node size per type: both refuse."""
    from tests.plan.optables import gpt_like
    from libarena.plan import PlannerConfig, plan_job
    from libarena.schedule.entities.cluster import ClusterState

    mixed = cluster_from_dict({"name": "mixed", "node_groups": [{"gpu_type": "a100", "nodes": 1, "gpus_per_node": 8},
                                                                {"gpu_type": "a100", "nodes": 4, "gpus_per_node": 2},
                                                                {"gpu_type": "v100", "nodes": 2, "gpus_per_node": 4}]})
    message = r"cluster 'mixed': node groups of a100 differ in GPUs per node \(2, 8\); give each its own GPU type"
    assert mixed.gpus_per_node("v100") == 4
    with pytest.raises(ArenaError, match=message):
        plan_job(gpt_like(num_clusters=3, hidden=256, seq_len=64, batch=8), mixed, PlannerConfig())
    with pytest.raises(ArenaError, match=message):
        ClusterState(mixed, ["a100", "v100"])
    # planned for the other type alone, it is planned
    assert plan_job(gpt_like(num_clusters=3, hidden=256, seq_len=64, batch=8), mixed, PlannerConfig(gpu_types=("v100",))).grids
