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
        ({"node_groups": [{"gpu_type": "a10", "nodes": 0}]}, "positive integer"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_cluster_specs(spec, message):
    with pytest.raises(ArenaError, match=message):
        cluster_from_dict(spec)


def test_malformed_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("node_groups: [\n")
    with pytest.raises(ArenaError, match="malformed cluster spec"):
        load_cluster(p)
    with pytest.raises(ArenaError, match="no such cluster spec"):
        load_cluster(tmp_path / "none.yaml")
