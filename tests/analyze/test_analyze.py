"""arena-analyze on the tiny zoo models (all four families): XLA totals, 6ND, attribution, clusters,
determinism, the artifact round trip and the planner contract."""

from __future__ import annotations

import numpy as np
import pytest

from libarena.analyze import AnalyzeConfig, analyze_model, read_operator_table
from libarena.artifacts import Provenance
from libarena.artifacts.kinds.operator_table import CLUSTER_FIELDS
from libarena.errors import ArenaError
from libarena.models import get_model

# One worker runs this module under `pytest -n 2 --dist loadgroup`, so each tiny model is lowered once.
pytestmark = pytest.mark.xdist_group("analyze_tiny_models")

FAMILIES = ("gpt", "bert", "moe", "wide_resnet")
BATCH = {"gpt": 8, "bert": 8, "moe": 8, "wide_resnet": 4}

_CACHE: dict[str, object] = {}


def analyzed(family: str):
    """One analysis per family per test session (lowering costs a few seconds)."""
    if family not in _CACHE:
        _CACHE[family] = analyze_model(AnalyzeConfig(f"{family}__tiny", BATCH[family]))
    return _CACHE[family]


def col(ops, name):
    return np.asarray(ops.table.column(name).to_pylist())


@pytest.mark.parametrize("family", FAMILIES)
def test_per_op_costs_sum_to_xla_module_totals(family):
    ops = analyzed(family)
    module = ops.metadata["module_cost"]
    flops = col(ops, "flops").sum()
    moved = col(ops, "bytes_read").sum() + col(ops, "bytes_written").sum()
    assert flops > 0 and moved > 0
    assert flops == pytest.approx(module["flops"], rel=0.01)
    assert moved == pytest.approx(module["bytes accessed"], rel=0.01)
    assert col(ops, "bytes_written").sum() == pytest.approx(module["bytes accessedout{}"], rel=0.01)
    assert col(ops, "transcendentals").sum() == pytest.approx(module["transcendentals"], rel=0.01)
    # No double counting: calls are expanded (their rows named <call>/<instruction>, no call rows);
    # computations applied by reduce & co. give no rows of their own.
    names, opcodes = col(ops, "name"), col(ops, "opcode")
    assert "call" not in set(opcodes) and any("/" in n for n in names)
    assert len(set(names)) == len(names)
    applied = {c for c in col(ops, "computation") if c.startswith("region_")}
    assert not applied


def test_scope_paths_give_units_and_phases():
    from libarena.analyze.operators import _Scopes

    scopes = _Scopes(["embed", "block_00", "head"])
    assert scopes.read("jit(train_step)/jvp(block_00)/bsh,hknd->kbsnd/dot_general") == (1, 0)
    assert scopes.read("jit(train_step)/transpose(jvp(block_00))/dot_general") == (1, 1)
    assert scopes.read("jit(train_step)/optimizer/mul") == (-1, 2)
    assert scopes.read("jit(train_step)/jvp(head)/jit(log_softmax)") == (2, 0)
    assert scopes.read("block_00/dot_general") == (1, None)  # not differentiated: phase from data flow
    assert scopes.read("reduce_sum") == (-1, None)


def test_module_totals_are_jaxs_public_cost_analysis():
    import jax

    from libarena.models.training import abstract_optimizer_state, abstract_params, batch_spec, make_train_step

    model = get_model("gpt__tiny")
    params = abstract_params(model)
    lowered = jax.jit(make_train_step(model, "bf16", share_traces=True), keep_unused=True).lower(
        params, abstract_optimizer_state(params), batch_spec(model, BATCH["gpt"])
    )
    public = lowered.cost_analysis()
    module = analyzed("gpt").metadata["module_cost"]
    assert module["flops"] == public["flops"] and module["bytes accessed"] == public["bytes accessed"]


@pytest.mark.parametrize("family", ("gpt", "wide_resnet"))
def test_repeated_layers_are_traced_once_with_the_same_costs(family):
    """The analysis traces identical layers once (one called computation per distinct layer); per layer and
    phase, XLA's FLOPs are those of the module traced layer by layer."""
    import jax

    from libarena.analyze import operators
    from libarena.models.training import abstract_params

    model = get_model(f"{family}__tiny")
    ops = analyzed(family)
    # Units with the same signature and parameter shapes run the same called computations.
    unit, computation = col(ops, "unit_index"), col(ops, "computation")
    entry = computation[0]
    shapes = [str(jax.tree.map(lambda leaf: leaf.shape, p)) for p in abstract_params(model)]
    groups: dict[tuple, list[int]] = {}
    for u in range(len(model.units)):
        groups.setdefault((model.unit_signature(u), shapes[u]), []).append(u)
    repeated = [g for g in groups.values() if len(g) > 1]
    assert repeated
    for members in repeated:
        called = [set(computation[unit == u]) - {entry} for u in members]
        assert called[0] and all(c == called[0] for c in called), members

    plain, _ = operators.build_rows(operators.lower_train_step(model, BATCH[family], None, "bf16", share_traces=False),
                                    [u.name for u in model.units])
    assert len(plain.flops) < ops.table.num_rows  # no call plumbing, one copy of each shared constant
    unit, phase, flops = col(ops, "unit_index"), col(ops, "phase"), col(ops, "flops")
    plain_unit, plain_phase, plain_flops = np.asarray(plain.unit), np.asarray(plain.phase), np.asarray(plain.flops)
    for u in range(len(model.units)):
        for p in ("forward", "backward"):
            assert flops[(unit == u) & (phase == p)].sum() == plain_flops[(plain_unit == u) & (plain_phase == p)].sum(), (u, p)
    for u in range(1, len(model.units) - 1):
        assert flops[(unit == u) & (phase == "forward")].sum() > 0


def test_gpt_total_flops_match_six_n_tokens():
    from libarena.models.training import param_count

    ops = analyzed("gpt")
    model = get_model("gpt__tiny")
    tokens = BATCH["gpt"] * model.config.seq_len
    analytic = 6 * param_count(model) * tokens
    assert col(ops, "flops").sum() == pytest.approx(analytic, rel=0.10)
    # Backward costs about twice the forward.
    phase, flops = col(ops, "phase"), col(ops, "flops")
    assert 1.7 < flops[phase == "backward"].sum() / flops[phase == "forward"].sum() < 2.3


@pytest.mark.parametrize("family", FAMILIES)
def test_every_op_is_attributed_or_explicitly_not(family):
    ops = analyzed(family)
    model = get_model(f"{family}__tiny")
    names = [u.name for u in model.units]
    unit, layer, cluster, phase = col(ops, "unit_index"), col(ops, "layer"), col(ops, "cluster"), col(ops, "phase")
    assert set(phase) == {"forward", "backward", "optimizer"}
    assert ((unit >= -1) & (unit < len(names))).all()
    assert all(layer[i] == (names[u] if u >= 0 else "") for i, u in enumerate(unit))
    assert ((cluster == -1) == (unit == -1)).all()
    unattributed = unit == -1
    info = ops.metadata["attribution"]
    assert info["unattributed_ops"] == int(unattributed.sum()) and info["instructions"] == len(unit)
    # Few, and practically free: a shared constant or two, the root tuple.
    assert unattributed.sum() <= 0.01 * len(unit)
    # Each unit has its own Adam state, so all optimizer work (the step count's too) is some unit's;
    # only the step's root tuple (every unit's outputs) and scalar constants that XLA shares between
    # units (the learning rate, the betas) are no one's.
    opcode = col(ops, "opcode")
    assert (unit[(phase == "optimizer") & ~np.isin(opcode, ["tuple", "constant"])] >= 0).all()
    flops = col(ops, "flops")
    assert flops[unattributed].sum() <= 1e-6 * flops.sum()
    moved = col(ops, "bytes_read") + col(ops, "bytes_written")
    assert moved[unattributed].sum() <= 0.05 * moved.sum()
    # Every unit computes forward and backward, and every unit's weights get an optimizer update.
    for u in range(len(names)):
        mine = unit == u
        assert flops[mine & (phase == "forward")].sum() > 0, names[u]
        assert (mine & (phase == "backward")).any(), names[u]
        assert flops[mine & (phase == "optimizer")].sum() > 0, names[u]
    # Units follow the named scopes: block_01's dots are block_01's.
    dots = (col(ops, "opcode") == "dot") | (col(ops, "opcode") == "convolution")
    assert (unit[dots] >= 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_clusters_are_contiguous_cover_all_units_and_sum_the_rows(family):
    ops = analyzed(family)
    model = get_model(f"{family}__tiny")
    meta = ops.metadata
    clusters = meta["clusters"]
    assert meta["num_clusters"] == len(clusters) == min(16, len(model.units))
    assert [u for c in clusters for u in c["units"]] == [u.name for u in model.units]
    assert [c["index"] for c in clusters] == list(range(len(clusters)))
    for c in clusters:
        assert {f.name for f in CLUSTER_FIELDS} <= set(c)
    unit, cluster, phase = col(ops, "unit_index"), col(ops, "cluster"), col(ops, "phase")
    flops = col(ops, "flops")
    compute = (phase != "optimizer") & (cluster >= 0)
    for c in clusters:
        mine = cluster == c["index"]
        assert c["num_ops"] == int(mine.sum())
        assert c["flops"] == pytest.approx(flops[mine & compute].sum())
        assert c["optimizer_flops"] == pytest.approx(flops[mine & (phase == "optimizer")].sum())
    from libarena.models.training import param_count

    assert sum(c["param_count"] for c in clusters) == param_count(model) == meta["model"]["param_count"]
    assert sum(c["param_bytes"] for c in clusters) == 4 * param_count(model)  # float32 master weights
    assert [u["cluster"] for u in meta["units"]] == [int(cluster[unit == i][0]) for i in range(len(model.units))]


def test_transformer_boundary_and_communication_bytes():
    for family in ("gpt", "moe"):
        ops = analyzed(family)
        c = get_model(f"{family}__tiny").config
        tokens = BATCH[family] * c.seq_len
        act = tokens * c.hidden * 2  # bf16
        blocks = [r for r in ops.metadata["clusters"] if r["units"][0].startswith("block_")]
        assert blocks
        for r in blocks:
            assert r["activation_bytes"] == act
            assert r["tp_allreduce_bytes"] == 2 * 2 * act  # two all-reduces, forward and backward
            assert r["saved_activation_bytes"] >= act
            assert r["param_count"] > 0
        if family == "moe":
            shape = ops.metadata["expert_dispatch_shape"]
            # The hook's shape is the dispatch einsum's output in the module itself.
            shapes = col(ops, "shape")[(col(ops, "opcode") == "dot") & (col(ops, "layer") == "block_00")]
            assert f"bf16[{','.join(map(str, shape))}]" in set(shapes)
        # the runtime splits experts over tp (the combine's all-reduce is the block's second): no all-to-all runs
        assert all(r["alltoall_bytes"] == 0 for r in blocks)
        # vocabulary-parallel ends: the embedding's output is summed over tp forward (its table's gradient is
        # local), the output layer's input gradient backward (its output is the loss): one all-reduce each
        units = {u["name"]: u for u in ops.metadata["units"]}
        assert units["embed"]["tp_allreduce_bytes"] == act == units["embed"]["activation_bytes"]
        # ... and its log-softmax's float32 (batch, seq) statistics, 4 reductions (gpt__tiny's HLO at tp 2)
        assert units["head"]["input_activation_bytes"] == act
        assert units["head"]["tp_allreduce_bytes"] == act + 4 * tokens * 4
    # The loss unit keeps the float32 softmax for its backward (it leaves log_softmax's call as a tuple
    # element: data flow must see through tuples).
    gpt = get_model("gpt__tiny").config
    head = analyzed("gpt").units[-1]
    assert head["saved_activation_bytes"] >= BATCH["gpt"] * gpt.seq_len * gpt.vocab_size * 4
    wrn = analyzed("wide_resnet")
    assert all(r["alltoall_bytes"] == 0 for r in wrn.metadata["clusters"])
    assert all(r["activation_bytes"] > 0 for r in wrn.metadata["clusters"])
    assert all(r["tp_allreduce_bytes"] > 0 for r in wrn.metadata["clusters"] if any(u.startswith("block_") for u in r["units"]))
    # Wide-ResNet's convolutions split their output channels: each gathers its input forward and backward (half an
    # all-reduce each) and all-reduces its input's gradient; the stem reads the whole image, the head's logits are
    # summed once. The values of XLA's SPMD partition of a wide_resnet__tiny stage at tp 2 (its HLO's collectives at
    # batch 8: 73,728, 114,688, 147,456 and 256 bytes), at this test's batch of 4.
    units = {u["name"]: u for u in wrn.metadata["units"]}
    assert BATCH["wide_resnet"] == 4
    assert [units[n]["tp_allreduce_bytes"] for n in ("stem", "block_00", "block_01", "block_03", "head")] == \
        [0.0, 36864.0, 57344.0, 73728.0, 128.0]
    # a block that keeps its size: (5 + width) / 2 x its output (the rule was 4x, a quarter of it at width 16)
    width = get_model("wide_resnet__tiny").config.width_factor
    assert units["block_01"]["tp_allreduce_bytes"] == (5 + width) / 2 * units["block_01"]["activation_bytes"]


def test_parameter_ops_touch_parameter_bytes():
    ops = analyzed("gpt")
    is_param, pbytes, opcode, phase = col(ops, "is_parameter_op"), col(ops, "param_bytes"), col(ops, "opcode"), col(ops, "phase")
    assert ((pbytes > 0) <= is_param).all()
    assert (is_param[phase == "optimizer"]).all()
    total_params = ops.metadata["model"]["param_bytes"]
    # The forward casts of the weights read every parameter once.
    casts = (opcode == "convert") & (phase == "forward") & (pbytes > 0)
    assert pbytes[casts].sum() == pytest.approx(total_params)


def test_analysis_is_deterministic_and_round_trips(tmp_path):
    first = analyzed("gpt")
    second = analyze_model(AnalyzeConfig("gpt__tiny", BATCH["gpt"]))
    assert first.table.equals(second.table) and first.metadata == second.metadata
    path = tmp_path / "ops.parquet"
    first.write(path, Provenance(tool="tests", parameters=AnalyzeConfig("gpt__tiny", 8).parameters()))
    back = read_operator_table(path)
    assert back.table.equals(first.table) and back.metadata == first.metadata
    assert back.provenance.parameters["model"] == "gpt__tiny"
    # The planner's contract: it loads our table as is.
    from libarena.artifacts import read_table
    from libarena.plan.model import load_model_profile

    profile = load_model_profile(read_table(path, "operator_table"))
    assert profile.num_clusters == first.metadata["num_clusters"]
    assert profile.arrays["flops"].sum() == pytest.approx(sum(c["flops"] for c in first.metadata["clusters"]))


def test_dtype_and_cluster_count_are_honoured():
    ops = analyze_model(AnalyzeConfig("gpt__tiny", 4, seq_len=16, dtype="fp32", num_clusters=3))
    meta = ops.metadata
    assert meta["dtype"] == "fp32" and meta["seq_len"] == 16 and meta["global_batch"] == 4
    assert meta["num_clusters"] == 3 and len(meta["clusters"]) == 3
    dots = col(ops, "shape")[col(ops, "opcode") == "dot"]
    assert len(dots) and all(s.startswith("f32[") for s in dots)
    sums = [c["flops"] for c in meta["clusters"]]
    assert max(sums) < 0.5 * sum(sums)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (("nope__1B", 8), {}, "unknown model"),
        (("gpt__3B", 8), {}, "unknown size"),
        (("gpt__tiny", 0), {}, "--global-batch: 0 is out of range"),
        (("gpt__tiny", -3), {}, "--global-batch: -3 is out of range"),
        (("gpt__tiny", 8), {"dtype": "int3"}, "unknown dtype"),
        (("gpt__tiny", 8), {"seq_len": 0}, "--seq-len"),
        (("gpt__tiny", 8), {"num_clusters": 0}, "--num-clusters"),
    ],
)
def test_bad_configs_are_one_line_errors(args, kwargs, message):
    with pytest.raises(ArenaError, match=message):
        AnalyzeConfig(*args, **kwargs)


def test_analyze_model_takes_a_model_name_too():
    with pytest.raises(ArenaError, match="global batch size is missing"):
        analyze_model("gpt__tiny")
    with pytest.raises(ArenaError, match="unknown model"):
        analyze_model("nope__1B", 8)
    with pytest.raises(TypeError):
        analyze_model(AnalyzeConfig("gpt__tiny", 8), 8)
    assert AnalyzeConfig("gpt__tiny", 8, dtype="float32").dtype == "fp32"  # normalised on construction


def test_a_sequence_longer_than_the_model_supports_is_a_clear_error():
    with pytest.raises(ArenaError, match="cannot be built"):
        analyze_model(AnalyzeConfig("gpt__tiny", 2, seq_len=64))


def test_sizes_xla_cannot_represent_are_a_clear_error():
    """Batch and image side within AnalyzeConfig's ranges whose activation has more than 2^63 elements: JAX
    lowers it, XLA refuses it on conversion (a RuntimeError, "overflow in static extent product")."""
    with pytest.raises(ArenaError, match=r"wide_resnet__tiny cannot be built at global batch 1048576, seq_len 1048576: .*overflow"):
        analyze_model(AnalyzeConfig("wide_resnet__tiny", 1 << 20, seq_len=1 << 20))


@pytest.mark.parametrize("construct", ["fori_loop", "cond"])
def test_a_loop_or_conditional_in_the_step_is_refused(construct):
    """XLA prices a while loop's body once (a 10-step scan of a matmul costs one matmul) and a conditional's
    every branch: an operator table of either would be wrong by the trip count, so arena-analyze refuses it."""
    import jax

    from libarena.analyze import operators
    from libarena.models.zoo.transformer import GPTModel, TransformerConfig

    class LoopingGPT(GPTModel):
        def apply_unit(self, index, params, carry, batch, compute_dtype):
            if construct == "fori_loop":
                return jax.lax.fori_loop(0, 3, lambda _, c: c, super().apply_unit(index, params, carry, batch, compute_dtype))
            out = super().apply_unit(index, params, carry, batch, compute_dtype)
            return jax.lax.cond(jax.numpy.sum(out) > 0, lambda x: x, lambda x: x * 2, out)

    model = LoopingGPT("micro", TransformerConfig(0.0, 8, 16, 2, 2, vocab_size=32))
    step = operators.lower_train_step(model, 4, None, "fp32", share_traces=False)
    what = "a while loop" if construct == "fori_loop" else "a conditional"
    with pytest.raises(ArenaError, match=f"the training step contains {what} .*unroll it in the model"):
        operators.build_rows(step, [u.name for u in model.units])


def test_called_computations_are_renamed_by_whole_name():
    """Identical instructions share one probe when their called computations are the same up to renaming; an
    instruction calling %region_1.4 and %region_1.45 (select-and-scatter's select and scatter) must not have
    the second read as the first followed by "5"."""
    import types

    from libarena.analyze.operators import ProbeCoster

    coster = object.__new__(ProbeCoster)
    coster._canonical = {"region_1.4": 7, "region_1.45": 9}  # their canonical ids, as computed before
    instr = types.SimpleNamespace(attributes="select=%region_1.4, scatter=%region_1.45, metadata={op_name=\"%x\"}",
                                  called=["region_1.4", "region_1.45"])
    assert coster._canonical_attributes(instr) == "select=#7, scatter=#9, metadata={op_name=\"%x\"}"


def test_the_profilers_plan_clusters_carry_the_analysed_volumes():
    """The small grids' plans (profile.local_plans, built from the model without an operator table) price the same
    tensor-parallel and all-to-all volumes per unit as arena-analyze records: the output layer's input, not the
    loss; the expert dispatch tensor, not the block's output."""
    from libarena.profile.local_plans import model_clusters

    for family in ("moe", "gpt"):
        ops = analyzed(family)
        units = ops.metadata["units"]
        clusters = model_clusters(f"{family}__tiny", BATCH[family], dtype=ops.metadata["dtype"], num_clusters=len(units))
        assert [c["units"] for c in clusters] == [[u["name"]] for u in units]
        for cluster, unit in zip(clusters, units):
            assert cluster["tp_allreduce_bytes"] == pytest.approx(unit["tp_allreduce_bytes"]), unit["name"]
            assert cluster["alltoall_bytes"] == pytest.approx(unit["alltoall_bytes"]), unit["name"]
        assert all(u["alltoall_bytes"] == 0 for u in units)  # experts split over tp: no all-to-all (see transformer.py)


def test_the_fused_optimizer_step_moves_what_adam_reads_and_writes():
    """After fusion an Adam step reads each parameter, its gradient and both moments and writes the parameter
    and both moments: 28 bytes per fp32 parameter with fp32 gradients. The writes were charged to get-tuple-element
    rows (which XLA costs nothing) and the gradient read to nothing: 12 bytes per parameter were counted."""
    from libarena.plan.model import fused_bytes

    for family in ("gpt", "moe"):
        ops = analyzed(family)
        opcode, phase = col(ops, "opcode"), col(ops, "phase")
        moved = col(ops, "bytes_read") + col(ops, "bytes_written")
        fused = fused_bytes(opcode, moved, col(ops, "param_bytes"))
        per_param = fused[phase == "optimizer"].sum() / ops.metadata["model"]["param_count"]
        assert 26.0 <= per_param <= 28.01, (family, per_param)


def test_the_optimizer_reads_every_gradient_in_every_dtype():
    """The bytes an optimizer kernel reads include each gradient, once. In fp32 XLA writes most weight gradients
    through layout-permuting transposes it treats as bitcasts (0 bytes written), and those reads were missing:
    gpt__tiny's optimizer rows counted 5.73 MB in fp32 against 6.58 MB in bf16, where parameters, moments and
    gradients (all fp32 in the update) are the same."""
    import numpy as np

    from libarena.analyze import hlo_text, operators
    from libarena.models import get_model

    assert hlo_text.array_bytes("f32[256,1024]{0,1}") == hlo_text.array_bytes("f32[256,1024]{1,0}") == 1 << 20
    assert hlo_text.array_bytes("bf16[3]") == 6 and hlo_text.array_bytes("(f32[2], s32[])") is None
    model = get_model("gpt__tiny")
    optimizer_bytes = {}
    for dtype in ("fp32", "bf16"):
        rows, _ = operators.build_rows(operators.lower_train_step(model, 8, None, dtype), [u.name for u in model.units])
        optimizer_bytes[dtype] = float(np.array(rows.param_bytes)[np.array(rows.phase) == "optimizer"].sum())
    assert optimizer_bytes["fp32"] == optimizer_bytes["bf16"] > 6.5e6


def test_a_library_call_counted_at_zero_flops_is_named_in_a_warning(monkeypatch):
    """XLA's cost analysis cannot see inside a custom call (a fused attention kernel, say): the table would leave
    its work out without a word. Here a real step's first dot is made to look like one."""
    from libarena.analyze import operators, xla_cost
    from libarena.models import get_model

    flatten, cost = operators._flatten, operators.ProbeCoster.cost

    def with_a_custom_call(*args, **kwargs):
        kept, root, parts = flatten(*args, **kwargs)
        first = next(e for e in kept if e.instr.opcode == "dot")
        first.instr.opcode = "custom-call"
        return kept, root, parts

    def zero_for_custom_calls(self, instr):
        if instr.opcode == "custom-call":
            return xla_cost.InstructionCost(0.0, 0.0, 0.0, 0.0)
        return cost(self, instr)

    model = get_model("gpt__tiny")
    step = operators.lower_train_step(model, 8, None, "fp32")
    plain = []
    operators.build_rows(step, [u.name for u in model.units], plain.append)
    assert not [line for line in plain if line.startswith("warning:")]
    monkeypatch.setattr(operators, "_flatten", with_a_custom_call)
    monkeypatch.setattr(operators.ProbeCoster, "cost", zero_for_custom_calls)
    logs = []
    operators.build_rows(step, [u.name for u in model.units], logs.append)
    warnings = [line for line in logs if line.startswith("warning:")]
    # the dot's body is shared by the layers' call sites: a row (and a custom call) at each
    assert len(warnings) == 1 and "custom-call instruction(s) counted at 0 FLOPs" in warnings[0]
