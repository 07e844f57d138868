"""Communication cost model: alpha-beta from the catalogue, measured tables with interpolation and fallback."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from libarena.artifacts import Provenance, read_table, write_table
from libarena.errors import ArenaError
from libarena.hardware import get_gpu
from libarena.hardware.comm import AlphaBetaCommModel, MeasuredCommModel, comm_model_from_table, load_comm_model


def test_alpha_beta_ring_all_reduce_known_value():
    model = AlphaBetaCommModel(intra_node_latency_s=5e-6, inter_node_latency_s=1e-5)
    a100 = get_gpu("a100")
    t = model.time("all-reduce", 1e9, 4, "a100", crosses_nodes=False)
    assert t == pytest.approx(2 * 3 * 5e-6 + 2 * 3 / 4 * 1e9 / a100.intra_node_bandwidth)
    t_inter = model.time("all-reduce", 1e9, 4, "a100", crosses_nodes=True)
    assert t_inter == pytest.approx(2 * 3 * 1e-5 + 2 * 3 / 4 * 1e9 / a100.inter_node_bandwidth)
    assert t_inter > t
    # all-gather and reduce-scatter move half an all-reduce; one device needs no communication.
    assert model.time("all-gather", 1e9, 4, "a100", False) == pytest.approx(t / 2)
    assert model.time("reduce-scatter", 1e9, 4, "a100", False) == pytest.approx(t / 2)
    assert model.time("all-reduce", 1e9, 1, "a100", False) == 0.0
    assert model.time("p2p", 1e6, 2, "a100", False) == pytest.approx(5e-6 + 1e6 / a100.intra_node_bandwidth)


def test_alpha_beta_is_vectorised_and_monotone():
    model = AlphaBetaCommModel()
    volumes = np.array([0.0, 1e3, 1e6, 1e9])
    times = model.time("all-to-all", volumes, 8, "a10", True)
    assert times.shape == (4,) and times[0] == 0.0
    assert np.all(np.diff(times) > 0)


def test_unknown_primitive_is_a_one_line_error():
    with pytest.raises(ArenaError, match="unknown communication primitive"):
        AlphaBetaCommModel().time("broadcast-ish", 1.0, 2, "a100", False)


def _rows():
    rows = []
    for volume, latency in ((1e3, 2e-5), (1e6, 1e-4), (1e9, 1e-1)):
        rows.append(("all-reduce", "a100", 4, False, volume, latency))
    return rows


def test_measured_interpolates_log_log_and_extrapolates():
    model = MeasuredCommModel.from_rows(_rows())
    assert model.time("all-reduce", 1e6, 4, "a100", False) == pytest.approx(1e-4)
    # Half-way in log volume between (1e6, 1e-4) and (1e9, 1e-1): geometric mean.
    assert model.time("all-reduce", math.sqrt(1e15), 4, "a100", False) == pytest.approx(math.sqrt(1e-5))
    # Below the range: the latency floor; above: linear in volume (bandwidth bound).
    assert model.time("all-reduce", 10.0, 4, "a100", False) == pytest.approx(2e-5)
    assert model.time("all-reduce", 2e9, 4, "a100", False) == pytest.approx(2e-1)
    assert model.source("all-reduce", 4, "a100", False) == "measured"



def test_a_table_measured_up_to_a_few_mib_extrapolates_a_gradient_sized_collective_by_its_last_slope():
    """A collective costs a + b V: above the largest measured volume the table goes on with the slope of its
    last two points. Scaling the last latency in proportion to the volume folded its latency term into the
    bandwidth: a table of the alpha-beta model's own values up to 4 MiB priced 1 GB at 2.4x the model."""
    truth = AlphaBetaCommModel()
    volumes = [2.0 ** k for k in range(10, 23)]  # 1 KiB .. 4 MiB, as `arena-profile comm` measures by default
    model = MeasuredCommModel.from_rows([("all-reduce", "a100", 4, False, v, truth.time("all-reduce", v, 4, "a100", False))
                                         for v in volumes])
    for volume in (16 * 2 ** 20, 1e9):
        assert model.time("all-reduce", volume, 4, "a100", False) == pytest.approx(
            truth.time("all-reduce", volume, 4, "a100", False), rel=1e-3)
    # a last slope that is not positive (noise) falls back to the last point's latency per byte
    noisy = MeasuredCommModel.from_rows([("p2p", "a100", 2, False, 1e6, 2e-4), ("p2p", "a100", 2, False, 2e6, 1.9e-4)])
    assert noisy.time("p2p", 4e6, 2, "a100", False) == pytest.approx(1.9e-4 * 2)

def test_measured_falls_back_to_alpha_beta_and_says_so():
    model = MeasuredCommModel.from_rows(_rows())
    fallback = AlphaBetaCommModel()
    assert model.time("all-reduce", 1e6, 8, "a100", False) == pytest.approx(fallback.time("all-reduce", 1e6, 8, "a100", False))
    assert model.time("all-reduce", 1e6, 4, "v100", False) == pytest.approx(fallback.time("all-reduce", 1e6, 4, "v100", False))
    used = model.sources()
    assert used[("all-reduce", "a100", 8, False)] == "alpha-beta"
    assert used[("all-reduce", "v100", 4, False)] == "alpha-beta"
    assert model.covers("a100") and not model.covers("v100")


def _comm_table() -> pa.Table:
    rows = _rows()
    return pa.table(
        {
            "primitive": [r[0] for r in rows],
            "gpu_type": [r[1] for r in rows],
            "num_devices": [r[2] for r in rows],
            "crosses_nodes": [r[3] for r in rows],
            "bytes": [r[4] for r in rows],
            "latency_s": [r[5] for r in rows],
        }
    )


def test_comm_table_artifact_round_trip(tmp_path):
    path = tmp_path / "comm.parquet"
    write_table(path, "comm_table", _comm_table(), Provenance(tool="tests"), {"hardware": {"cluster": "test"}})
    model = load_comm_model(str(path))
    assert model.time("all-reduce", 1e6, 4, "a100", False) == pytest.approx(1e-4)


def test_comm_table_imports_nccl_tests_csv(tmp_path):
    path = tmp_path / "nccl.csv"
    path.write_text(
        "primitive,gpu_type,num_devices,crosses_nodes,bytes,latency_s\n"
        "allreduce,A100,4,false,1000,2e-5\nallreduce,A100,4,false,1000000,1e-4\n"
    )
    artifact = read_table(path, "comm_table")
    assert not artifact.native
    model = comm_model_from_table(artifact)
    assert model.covers("a100")
    assert model.time("all-reduce", 1e6, 4, "a100", False) == pytest.approx(1e-4)


@pytest.mark.parametrize("volume, latency, message", [
    (-5.0, 1e-3, r"row 4, column 'bytes': -5 is out of range \(expected a finite number in \[1, "),
    (0.5, 1e-3, r"row 4, column 'bytes': 0\.5 is out of range"),
    (1e300, 1e-3, r"row 4, column 'bytes': 1e\+300 is out of range"),
    (1e6, 0.0, r"row 4, column 'latency_s': 0 is out of range"),
    (1e6, 1e308, r"row 4, column 'latency_s': 1e\+308 is out of range"),
    (1e6, float("nan"), r"row 4, column 'latency_s': nan is not"),
])
def test_comm_table_bad_row_names_the_row(volume, latency, message):
    """Measured volumes and latencies must be physical: an absurd one (1e308 s) would overflow the bandwidth-bound
    extrapolation above the largest measured volume."""
    rows = _rows() + [("all-reduce", "a100", 4, False, volume, latency)]
    with pytest.raises(ArenaError, match=message):
        MeasuredCommModel.from_rows(rows)


@pytest.mark.parametrize("devices, message", [
    (10**12, r"row 4, column 'num_devices': 1000000000000 is out of range \(expected an integer in \[1, 1048576\]\)"),
    (0, r"row 4, column 'num_devices': 0 is out of range"),
    (2.5, r"row 4, column 'num_devices': 2\.5 is not an integer"),
])
def test_comm_table_bad_group_size_names_the_row(devices, message):
    rows = _rows() + [("all-reduce", "a100", devices, False, 1e6, 1e-4)]
    with pytest.raises(ArenaError, match=message):
        MeasuredCommModel.from_rows(rows)


@pytest.mark.parametrize("nodes, crosses, message", [
    ("-1", "false", r"nccl\.csv: row 2, column 'num_nodes': -1 is out of range \(expected an integer in \[0, 4\]\)"),
    ("5", "true", r"row 2, column 'num_nodes': 5 is out of range \(expected an integer in \[0, 4\]\)"),
    ("2", "false", r"row 2, column 'num_nodes': 2 node\(s\) but crosses_nodes is false"),
    ("1", "true", r"row 2, column 'num_nodes': 1 node\(s\) but crosses_nodes is true"),
    ("0", "true", None),
    ("2", "true", None),
])
def test_comm_table_num_nodes_must_agree_with_its_row(tmp_path, nodes, crosses, message):
    """num_nodes is not priced, but an imported table that says a group of 4 spans -1 or 5 nodes, or spans 2 nodes
    without crossing them, is wrong somewhere: refused with its row, not read."""
    path = tmp_path / "nccl.csv"
    agreeing = 2 if crosses == "true" else 1  # the first row is right either way
    path.write_text(
        "primitive,gpu_type,num_devices,crosses_nodes,bytes,latency_s,num_nodes\n"
        f"allreduce,A100,4,{crosses},1000,2e-5,{agreeing}\nallreduce,A100,4,{crosses},1000000,1e-4,{nodes}\n"
    )
    artifact = read_table(path, "comm_table")
    if message is None:
        assert comm_model_from_table(artifact).time("all-reduce", 1e6, 4, "a100", crosses == "true") == pytest.approx(1e-4)
    else:
        with pytest.raises(ArenaError, match=message):
            comm_model_from_table(artifact)


def test_group_placement_of_a_stages_axes():
    from libarena.hardware import GroupPlacement

    # 16 devices on nodes of 4, tp 4 innermost: a tp group is one node, each dp group has one device per node
    tp_group, dp_group = GroupPlacement.tensor_parallel(4, 4), GroupPlacement.data_parallel(4, 4, 4)
    assert not tp_group.crosses_nodes
    assert dp_group.crosses_nodes and dp_group.members_per_node == 1 and dp_group.groups_per_node == 4
    # tp 2: each node holds two members of each of the two dp groups
    dp_group = GroupPlacement.data_parallel(8, 2, 4)
    assert (dp_group.members_per_node, dp_group.groups_per_node) == (2, 2)
    # a tp group larger than a node: one group per node, a dp group's members on g different nodes' devices
    assert GroupPlacement.tensor_parallel(8, 4).groups_per_node == 1
    wide = GroupPlacement.data_parallel(2, 8, 4)
    assert wide.crosses_nodes and (wide.members_per_node, wide.groups_per_node) == (1, 4)
    # inside a node nothing shares an adapter
    assert not GroupPlacement.data_parallel(2, 2, 4).crosses_nodes


def test_concurrent_groups_share_the_node_adapter():
    from libarena.hardware import GroupPlacement

    model = AlphaBetaCommModel(intra_node_latency_s=5e-6, inter_node_latency_s=1e-5)
    nic = get_gpu("a100").inter_node_bandwidth
    volume = 1e8
    # the four dp rings of tp 4 (nodes of 4) each cross every node's one adapter once per direction
    ring = model.collective_time("all-reduce", volume, GroupPlacement.data_parallel(4, 4, 4), "a100")
    assert ring == pytest.approx(2 * 3 * 1e-5 + 4 * (2 * 3 / 4) * volume / nic)
    assert 3.9 < ring / model.time("all-reduce", volume, 4, "a100", True) < 4  # latency steps overlap
    # one ring (tp 1) has the adapter to itself: the one-group price
    alone = GroupPlacement.data_parallel(16, 1, 4)
    assert model.collective_time("all-reduce", volume, alone, "a100") == pytest.approx(model.time("all-reduce", volume, 16, "a100", True))
    # an all-to-all over 16 devices on nodes of 4: each node's adapter carries 4 devices x 12/16 of their bytes
    a2a = model.collective_time("all-to-all", volume, alone, "a100")
    assert a2a == pytest.approx(15 * 1e-5 + 4 * volume * 12 / 16 / nic)
    assert 3.1 < a2a / model.time("all-to-all", volume, 16, "a100", True) < 4 * 12 / 15  # latency steps overlap
    # inside a node: the one-group price, scalar in, scalar out; arrays element-wise
    inside = GroupPlacement.data_parallel(2, 2, 4)
    priced = model.collective_time("all-reduce", volume, inside, "a100")
    assert isinstance(priced, float) and priced == model.time("all-reduce", volume, 2, "a100", False)
    volumes = np.array([0.0, volume])
    assert model.collective_time("all-reduce", volumes, GroupPlacement.data_parallel(4, 4, 4), "a100")[1] == pytest.approx(ring)


def test_measured_groups_include_their_own_members_sharing():
    from libarena.hardware import GroupPlacement

    nic = get_gpu("a100").inter_node_bandwidth

    def packed_all_to_all(p, m, v):  # one group of p alone, m members on each node: its adapter load / bandwidth
        return m * (p - m) / p * v / nic

    volumes = np.logspace(3, 9, 13)
    # a measured all-to-all over 8 devices on two nodes of 4 (as nccl-tests runs it): its own members share the adapter
    rows = [("all-to-all", "a100", 8, True, float(v), packed_all_to_all(8, 4, v)) for v in volumes]
    measured = MeasuredCommModel.from_rows(rows)
    one_group = GroupPlacement.data_parallel(8, 1, 4)
    assert measured.adapter_share("all-to-all", one_group, "a100") == 1.0
    assert measured.collective_time("all-to-all", 1e8, one_group, "a100") == pytest.approx(packed_all_to_all(8, 4, 1e8), rel=1e-6)
    # dp 8 x tp 2 on nodes of 4: two groups a node, two members each: each node's adapter carries 4 devices x 6/8 of
    # their bytes, against the measured group's 4 x 4/8
    two_groups = GroupPlacement.data_parallel(8, 2, 4)
    assert measured.adapter_share("all-to-all", two_groups, "a100") == pytest.approx(1.5)
    assert measured.collective_time("all-to-all", 1e8, two_groups, "a100") == pytest.approx(
        4 * 6 / 8 * 1e8 / nic, rel=1e-6)
    # the alpha-beta model prices the same physical load
    truth = AlphaBetaCommModel(inter_node_latency_s=0.0)
    assert truth.collective_time("all-to-all", 1e8, two_groups, "a100") == pytest.approx(4 * 6 / 8 * 1e8 / nic)
    assert truth.adapter_share("all-to-all", one_group, "a100") == pytest.approx(4 * 4 / 7)
    # rings: a measured ring includes nothing of the other groups, which each cross the adapter once more
    ring_rows = [("all-reduce", "a100", 4, True, float(v), 2 * 3 / 4 * v / nic) for v in volumes]
    rings = MeasuredCommModel.from_rows(ring_rows)
    four_rings = GroupPlacement.data_parallel(4, 4, 4)
    assert rings.source("all-reduce", 4, "a100", True) == "measured"
    assert rings.adapter_share("all-reduce", four_rings, "a100") == 4.0
    assert rings.collective_time("all-reduce", 1e8, four_rings, "a100") == pytest.approx(4 * 2 * 3 / 4 * 1e8 / nic, rel=1e-6)
    # cases the table does not cover are the fallback's, priced with the fallback's share
    assert rings.source("all-to-all", 8, "a100", True) == "alpha-beta"
    assert rings.adapter_share("all-to-all", two_groups, "a100") == AlphaBetaCommModel().adapter_share("all-to-all", two_groups, "a100")


def test_pipeline_hand_off_is_shared_out_over_pairs_or_adapters():
    model = AlphaBetaCommModel()
    activation = 4e6  # one micro-batch's activation leaving a stage

    def pair(volume, crosses):
        return model.time("p2p", volume, 2, "a100", crosses)

    # a whole 4-GPU node of 4 replicas hands off to another node: all of it through one adapter
    assert model.boundary_time(activation, 4, 4, 4, 4, True, 4, "a100") == pytest.approx(pair(activation, True))
    # two nodes to two nodes: two adapters each way; two nodes to one: that node's one adapter
    assert model.boundary_time(activation, 8, 8, 8, 8, True, 4, "a100") == pytest.approx(pair(activation / 2, True))
    assert model.boundary_time(activation, 8, 4, 8, 4, True, 4, "a100") == pytest.approx(pair(activation, True))
    # a tp 8 stage of one replica on two nodes sends half from each node's adapter
    assert model.boundary_time(activation, 1, 8, 8, 8, True, 4, "a100") == pytest.approx(pair(activation / 2, True))
    # inside a node the replicas' pairs each have a link: the side with fewer replicas sets the pace, both ways
    assert model.boundary_time(activation, 2, 2, 2, 2, False, 4, "a100") == pytest.approx(pair(activation / 2, False))
    assert model.boundary_time(activation, 2, 1, 2, 2, False, 4, "a100") == model.boundary_time(activation, 1, 2, 2, 2, False, 4, "a100") \
        == pytest.approx(pair(activation, False))
