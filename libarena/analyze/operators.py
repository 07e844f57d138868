"""From a model to per-instruction rows: abstract lowering, XLA costs, attribution to units and phases.

Which instructions are rows (no double counting). The unoptimized module holds three kinds of
computations besides the entry: bodies of ``call`` (JAX's nested ``jit``\\ s such as ``jnp.where``,
``jnp.take``, ``log_softmax``), and *applied* computations (the scalar ``to_apply`` of reduce, scatter,
reduce-window, select-and-scatter, sort...). XLA's cost analysis charges a ``call`` exactly the cost of
its body and charges an applied computation to the instruction that applies it (per element). So:

* ``call`` is expanded in place, as XLA's CallInliner does first thing when optimising: every body
  instruction becomes a row (named ``<call>/<instruction>``; a body shared by several call sites gives
  rows at each site), the body's ``parameter``\\ s are aliases of the call's operands and give no row, and
  the ``call`` itself gives no row;
* applied computations give no rows: their cost is inside the applying instruction's row;
* every other entry instruction is one row (parameters, constants, tuples included, at XLA's cost).

The rows then sum to XLA's module-level cost to within about 1e-6 (a test checks 1%): XLA's cost of a body
shared by several call sites varies by a few FLOPs from one site to the next, the probes' does not.

Attribution. Every unit runs under ``jax.named_scope(unit.name)``, so an instruction's op_name reads
``jit(train_step)/jvp(block_03)/...`` (forward) or ``jit(train_step)/transpose(jvp(block_03))/...``
(backward); the Adam update runs under ``optimizer``. The innermost unit scope on the op_name path (the
call sites' op_names first: shared bodies carry no scope of their own) gives the unit; ``transpose(...)``
marks the backward phase and ``optimizer`` the optimizer phase. Instructions with no unit scope (the
per-parameter optimizer arithmetic, a few loss/seed scalars) take the unit of their operands by data
flow when all attributed operands agree (the optimizer's arithmetic on ``mu``/``nu``/the gradient of a
unit's weight belongs to that unit); what is left is unattributed (unit -1; counted in the metadata).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from libarena.analyze import hlo_text, xla_cost
from libarena.analyze.hlo_text import HloModuleText, Instruction
from libarena.artifacts.kinds.operator_table import PHASES as OPERATOR_PHASES
from libarena.errors import ArenaError

PHASES = OPERATOR_PHASES
FORWARD, BACKWARD, OPTIMIZER = PHASES
_PHASE_CODE = {FORWARD: 0, BACKWARD: 1, OPTIMIZER: 2}

#: Instructions that only re-package values (never a saved activation in their own right).

_WRAPPER = re.compile(r"^([A-Za-z_][\w]*)\((.*)\)$")

Log = Callable[[str], None]


# --------------------------------------------------------------------------------------------------
# Lowering


@dataclass(frozen=True)
class LeafRole:
    """What an entry parameter or an output of the step is."""

    role: str  # "param", "opt_state", "batch", "loss"
    unit: int  # -1 when the leaf belongs to no unit (the batch, the loss)
    nbytes: int


@dataclass
class LoweredStep:
    hlo_module: Any
    text: str
    inputs: list[LeafRole]
    outputs: list[LeafRole]
    params: list[Any]  # the abstract parameters (ShapeDtypeStruct trees), one per unit


def _leaf_bytes(leaf: Any) -> int:
    return int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def _roles(tree: Any, last_role: str) -> list[LeafRole]:
    """Role and unit of every leaf of (params, opt_state, batch-or-loss): both parameters and optimizer
    state are lists with one entry per unit."""
    import jax

    roles = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        arg = path[0].idx
        if arg in (0, 1):
            roles.append(LeafRole("param" if arg == 0 else "opt_state", path[1].idx, _leaf_bytes(leaf)))
        else:
            roles.append(LeafRole(last_role, -1, _leaf_bytes(leaf)))
    return roles


def lower_train_step(model: Any, global_batch: int, seq_len: int | None, dtype: str, share_traces: bool = True) -> LoweredStep:
    """Lower the full training step with ShapeDtypeStruct inputs: nothing is allocated or compiled.
    ``share_traces``: identical layers are traced once and called (about 2x faster on 32-layer models;
    each layer then carries its own copies of constants and broadcasts, the FLOPs are the same)."""
    import jax

    from libarena.models.training import abstract_optimizer_state, abstract_params, batch_spec, make_train_step

    params = abstract_params(model)
    opt_state = abstract_optimizer_state(params)
    batch = batch_spec(model, global_batch, seq_len)
    step = make_train_step(model, dtype, share_traces=share_traces)
    try:
        # keep_unused: entry parameter i is flattened input leaf i, whatever the step reads.
        lowered = jax.jit(step, keep_unused=True).lower(params, opt_state, batch)
        out_shapes = lowered.out_info  # the output shapes without tracing the step a second time
        # XLA refuses shapes that JAX accepts (an element count past int64: "overflow in static extent
        # product") only when it converts the module
        module = xla_cost.hlo_module_of(lowered)
    except (TypeError, ValueError, RuntimeError) as exc:
        first = " ".join(str(exc).split())[:200]
        raise ArenaError(
            f"{model.name} cannot be built at global batch {global_batch}"
            f"{'' if seq_len is None else f', seq_len {seq_len}'}: {first}"
        ) from None
    return LoweredStep(
        hlo_module=module,
        text=xla_cost.module_text(module),
        inputs=_roles((params, opt_state, batch), "batch"),
        outputs=_roles(out_shapes, "loss"),
        params=params,
    )


# --------------------------------------------------------------------------------------------------
# Per-instruction XLA costs through probe modules


#: a %name in HLO text (names are letters, digits, '.', '_' and '-')
_HLO_NAME = re.compile(r"%([\w.\-]+)")


class ProbeCoster:
    """XLA's cost of single instructions, each in a probe module (see xla_cost); identical instructions
    (same opcode, shapes, attributes and called computations up to renaming: the repeated layers) share
    one probe."""

    def __init__(self, module: HloModuleText):
        self.module = module
        self._position = {name: i for i, name in enumerate(module.order)}
        self._closure: dict[str, tuple[str, ...]] = {}
        self._canonical: dict[str, int] = {}
        self._interned: dict[Any, int] = {}
        self._by_key: dict[Any, xla_cost.InstructionCost] = {}
        self._by_instruction: dict[int, xla_cost.InstructionCost] = {}
        self.probes = 0

    def _callees(self, name: str) -> tuple[str, ...]:
        """Every computation ``name`` reaches (itself included), in module order."""
        cached = self._closure.get(name)
        if cached is None:
            seen = {name}
            for instr in self.module.computations[name].instructions:
                for callee in instr.called:
                    seen.update(self._callees(callee))
            cached = tuple(sorted(seen, key=self._position.__getitem__))
            self._closure[name] = cached
        return cached

    def _canonical_attributes(self, instr: Instruction) -> str:
        # whole names only: %region_1.4 must not rewrite the start of %region_1.45
        called = set(instr.called)
        return _HLO_NAME.sub(lambda m: f"#{self._canonical_id(m.group(1))}" if m.group(1) in called else m.group(0),
                             instr.attributes)

    def _canonical_id(self, name: str) -> int:
        cached = self._canonical.get(name)
        if cached is None:
            comp = self.module.computations[name]
            local = {instr.name: i for i, instr in enumerate(comp.instructions)}
            signature = tuple(
                (
                    instr.shape,
                    instr.opcode,
                    tuple((shape, local.get(op, op)) for shape, op in instr.operands),
                    instr.literal,
                    self._canonical_attributes(instr),
                    instr.is_root,
                )
                for instr in comp.instructions
            )
            cached = self._interned.setdefault(signature, len(self._interned))
            self._canonical[name] = cached
        return cached

    def _operand_slots(self, instr: Instruction) -> tuple[list[str], list[int]]:
        """Distinct operand names in order, and each operand's slot (repeated operands share a parameter)."""
        names: list[str] = []
        slots = []
        for _, op in instr.operands:
            if op not in names:
                names.append(op)
            slots.append(names.index(op))
        return names, slots

    def _literal(self, instr: Instruction) -> tuple[str, str]:
        """(shape, literal) to print; a parameter becomes parameter(0), an elided constant a scalar
        of its element type (XLA charges constants nothing whatever their size: tested)."""
        if instr.opcode == "parameter":
            return instr.shape, "0"
        if instr.opcode == "constant" and "..." in instr.literal:
            return f"{hlo_text.element_type(instr.shape)}[]", "0"
        return instr.shape, instr.literal

    def cost(self, instr: Instruction) -> xla_cost.InstructionCost:
        cached = self._by_instruction.get(id(instr))
        if cached is not None:
            return cached
        _, slots = self._operand_slots(instr)
        shape, literal = self._literal(instr)
        key = (
            shape,
            instr.opcode,
            tuple((s, slot) for (s, _), slot in zip(instr.operands, slots)),
            literal,
            self._canonical_attributes(instr),
        )
        cost = self._by_key.get(key)
        if cost is None:
            cost = xla_cost.text_cost(self.probe_text(instr))
            self.probes += 1
            self._by_key[key] = cost
        self._by_instruction[id(instr)] = cost
        return cost

    def probe_text(self, instr: Instruction) -> str:
        names, slots = self._operand_slots(instr)
        shape, literal = self._literal(instr)
        lines = ["HloModule arena_probe", ""]
        needed: set[str] = set()
        for callee in instr.called:
            needed.update(self._callees(callee))
        for name in sorted(needed, key=self._position.__getitem__):
            comp = self.module.computations[name]
            lines.append(comp.header)
            lines.extend(instr.probe_line() for instr in comp.instructions)
            lines.append("}")
            lines.append("")
        lines.append("ENTRY %arena_probe.entry {")
        shapes = {op: s for s, op in instr.operands}
        for k, op in enumerate(names):
            lines.append(f"  %p.{k} = {shapes[op]} parameter({k})")
        if instr.operands:
            args = ", ".join(f"{s} %p.{slot}" for (s, _), slot in zip(instr.operands, slots))
        else:
            args = literal
        lines.append(f"  ROOT %arena.probe = {shape} {instr.opcode}({args}){instr.attributes}")
        lines.append("}")
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Rows


@dataclass
class OpRows:
    """Columnar rows of the operator table plus the data-flow facts the clustered view needs."""

    name: list[str] = field(default_factory=list)
    opcode: list[str] = field(default_factory=list)
    computation: list[str] = field(default_factory=list)
    shape: list[str] = field(default_factory=list)
    operand_shapes: list[list[str]] = field(default_factory=list)
    dtype: list[str] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    transcendentals: list[float] = field(default_factory=list)
    bytes_read: list[float] = field(default_factory=list)
    bytes_written: list[float] = field(default_factory=list)
    unit: list[int] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)
    is_parameter_op: list[bool] = field(default_factory=list)
    param_bytes: list[float] = field(default_factory=list)
    probes: int = 0

    def __len__(self) -> int:
        return len(self.name)


def _scope_path(op_name: str) -> list[tuple[frozenset[str], str]]:
    """op_name components as (wrappers, core): ``transpose(jvp(block_02))`` -> ({transpose, jvp}, block_02)."""
    parts = []
    for component in op_name.split("/"):
        wrappers = set()
        found = _WRAPPER.match(component)
        while found:
            wrappers.add(found.group(1))
            component = found.group(2)
            found = _WRAPPER.match(component)
        parts.append((frozenset(wrappers), component))
    return parts


class _Scopes:
    """Unit and phase from the op_name path (memoised: op_names repeat a lot)."""

    def __init__(self, unit_names: list[str]):
        self._units = {name: i for i, name in enumerate(unit_names)}
        self._cache: dict[str, tuple[int, int | None]] = {}

    def read(self, op_name: str) -> tuple[int, int | None]:
        """(unit or -1, phase code or None when the path says nothing about the phase)."""
        cached = self._cache.get(op_name)
        if cached is None:
            unit, phase = -1, None
            for wrappers, core in _scope_path(op_name):
                signal = None
                if core == "optimizer":
                    signal = _PHASE_CODE[OPTIMIZER]
                elif "transpose" in wrappers:
                    signal = _PHASE_CODE[BACKWARD]
                elif core in self._units and wrappers:  # jvp(block_03): the differentiated forward
                    signal = _PHASE_CODE[FORWARD]
                if core in self._units:
                    unit = self._units[core]
                if signal is not None:
                    # Later phases win: optimizer > backward > forward.
                    phase = signal if phase is None else max(phase, signal)
            cached = (unit, phase)
            self._cache[op_name] = cached
        return cached


@dataclass
class _Emitted:
    instr: Instruction
    computation: str
    name: str
    operands: list[int]  # operand rows as written
    sources: list[int]  # operand rows with tuple/get-tuple-element pairs seen through
    unit: int
    phase: int | None
    role: LeafRole | None  # entry parameters only


def _flatten(step: LoweredStep, module: HloModuleText, scopes: _Scopes) -> tuple[list[_Emitted], int, dict[int, list[int]]]:
    """Entry instructions in order with ``call`` instructions expanded in place; returns (rows, root row, tuple parts)."""
    emitted: list[_Emitted] = []
    tuple_parts: dict[int, list[int]] = {}
    origin: list[int] = []  # row -> the row whose value it is (itself unless a get-tuple-element of a tuple)
    num_inputs = len(step.inputs)

    def emit(comp_name: str, arguments: list[int] | None, context: tuple[str, ...], prefix: str) -> int:
        comp = module.computations[comp_name]
        local: dict[str, int] = {}
        for instr in comp.instructions:
            if instr.opcode == "parameter" and arguments is not None:
                local[instr.name] = arguments[int(instr.literal)]
                continue
            try:
                operands = [local[op] for _, op in instr.operands]
            except KeyError as exc:
                raise ArenaError(f"HLO computation {comp_name}: operand %{exc.args[0]} used before its definition") from None
            if instr.opcode == "call" and len(instr.called) == 1:
                local[instr.name] = emit(instr.called[0], operands, (*context, instr.op_name), f"{prefix}{instr.name}/")
                continue
            if instr.opcode in ("while", "conditional"):
                # XLA prices a loop's body once and a conditional's every branch; the table would count the
                # loop's work once per step however many times it runs
                what = "a while loop (lax.scan, lax.fori_loop, lax.while_loop)" if instr.opcode == "while" else \
                    "a conditional (lax.cond, lax.switch)"
                raise ArenaError(f"the training step contains {what} at {instr.op_name or comp_name}; "
                                 "arena-analyze counts straight-line code only: unroll it in the model")
            row = len(emitted)
            local[instr.name] = row
            # Data flow sees through tuple / get-tuple-element pairs (call results, multi-output
            # computations): a get-tuple-element stands for the tuple element it extracts.
            sources = [origin[o] for o in operands]
            origin.append(row)
            if instr.opcode == "tuple":
                tuple_parts[row] = operands
            elif instr.opcode == "get-tuple-element" and operands and operands[0] in tuple_parts:
                index = re.search(r"index=(\d+)", instr.attributes)
                if index is not None:
                    sources = [origin[tuple_parts[operands[0]][int(index.group(1))]]]
                    origin[row] = sources[0]
            unit, phase = -1, None
            for op_name in (*context, instr.op_name):
                u, p = scopes.read(op_name)
                if u >= 0:
                    unit = u
                if p is not None and (phase is None or p > phase):
                    phase = p
            role = None
            if arguments is None and instr.opcode == "parameter":
                number = int(instr.literal)
                if number >= num_inputs:
                    raise ArenaError(f"HLO entry parameter {number} has no matching input (the step has {num_inputs})")
                role = step.inputs[number]
                unit = role.unit
                phase = _PHASE_CODE[OPTIMIZER] if role.role == "opt_state" else _PHASE_CODE[FORWARD]
            emitted.append(_Emitted(instr, comp_name, prefix + instr.name, operands, sources, unit, phase, role))
        return local[comp.root.name]

    root = emit(module.entry, None, (), "")
    return emitted, root, tuple_parts


def build_rows(step: LoweredStep, unit_names: list[str], log: Log | None = None) -> tuple[OpRows, dict[str, int]]:
    """Rows of the operator table; also returns counts for the metadata.

    Instructions nothing reads (dead code JAX left in) are kept: XLA's cost analysis visits them too
    (``HloComputation::Accept`` visits unreachable roots), so the rows still sum to its module totals.
    """
    module = hlo_text.parse_module(step.text)
    kept, root, tuple_parts = _flatten(step, module, _Scopes(unit_names))
    root_parts = tuple_parts.get(root)
    n = len(kept)

    coster = ProbeCoster(module)
    rows = OpRows()
    for e in kept:
        cost = coster.cost(e.instr)
        rows.name.append(e.name)
        rows.opcode.append(e.instr.opcode)
        rows.computation.append(e.computation)
        rows.shape.append(hlo_text.without_layout(e.instr.shape))
        rows.operand_shapes.append([hlo_text.without_layout(s) for s, _ in e.instr.operands])
        rows.dtype.append(hlo_text.element_type(e.instr.shape))
        rows.flops.append(cost.flops)
        rows.transcendentals.append(cost.transcendentals)
        rows.bytes_read.append(cost.bytes_read)
        rows.bytes_written.append(cost.bytes_written)
    rows.probes = coster.probes
    if log:
        log(f"{n} instructions, {coster.probes} distinct XLA cost probes")
        # XLA's cost analysis cannot see inside a library call (a fused attention kernel, say): its work would
        # be missing from the table without a word
        opaque = [e.name for e, flops in zip(kept, rows.flops) if e.instr.opcode == "custom-call" and not flops]
        if opaque:
            log(f"warning: {len(opaque)} custom-call instruction(s) counted at 0 FLOPs (XLA cannot cost library "
                f"calls), e.g. {opaque[0]}: the table leaves their work out")

    # Data flow in row order (operands first): units and phases of unscoped instructions.
    unit = np.full(n, -1, dtype=np.int64)
    phase = np.zeros(n, dtype=np.int8)
    for row, e in enumerate(kept):
        u = e.unit
        if u < 0 and e.role is None:
            found = {int(unit[o]) for o in e.sources if unit[o] >= 0}
            if len(found) == 1:
                u = found.pop()
        unit[row] = u
        p = e.phase
        if p is None:
            p = max((int(phase[o]) for o in e.sources), default=_PHASE_CODE[FORWARD])
        phase[row] = p
    # What is still unattributed (hoisted constants and their broadcasts, the batch inputs) belongs to
    # the unit of its readers when they all agree; readers come later, so walk backwards. Values made
    # of constants only (XLA deduplicates them across layers) also take their readers' phase: a
    # broadcast learning rate is optimizer work even though nothing in its op_name says so.
    readers: list[list[int]] = [[] for _ in range(n)]
    constant_only = np.zeros(n, dtype=bool)
    for row, e in enumerate(kept):
        for o in set(e.sources):
            readers[o].append(row)
        constant_only[row] = e.role is None and e.phase is None and all(constant_only[o] for o in e.sources)
    for row in range(n - 1, -1, -1):
        mine = readers[row]
        if unit[row] < 0:
            found = {int(unit[r]) for r in mine if unit[r] >= 0}
            if len(found) == 1 and all(unit[r] >= 0 for r in mine):
                unit[row] = found.pop()
        if constant_only[row] and mine:
            found = {int(phase[r]) for r in mine}
            if len(found) == 1:
                phase[row] = found.pop()

    # Bytes a fused kernel still moves at each instruction (plan.model.fused_bytes): parameter / optimizer-state
    # buffers read directly and written (the step's outputs for them, charged to the instruction that computes
    # the value: a root element that is a get-tuple-element of a call's result costs nothing in XLA's analysis),
    # and the gradients the optimizer reads (written by the backward pass, read once by the update's kernel).
    param_bytes = np.zeros(n)
    optimizer = _PHASE_CODE[OPTIMIZER]
    gradients_read: set[int] = set()
    for row, e in enumerate(kept):
        for o in set(e.sources):
            role = kept[o].role
            if role is not None and role.role in ("param", "opt_state"):
                param_bytes[row] += role.nbytes
            elif (phase[row] == optimizer and role is None and phase[o] == _PHASE_CODE[BACKWARD]
                  and o not in gradients_read):
                gradients_read.add(o)
                # the gradient array's size: its producer's written bytes are 0 where XLA treats it as a bitcast
                # (fp32 weight gradients come out of layout-permuting transposes)
                size = hlo_text.array_bytes(kept[o].instr.shape)
                param_bytes[row] += rows.bytes_written[o] if size is None else size
    if root_parts is not None and len(root_parts) == len(step.outputs):
        for part, role in zip(root_parts, step.outputs):
            if role.role in ("param", "opt_state"):
                computed = kept[part].sources[0] if kept[part].instr.opcode == "get-tuple-element" and kept[part].sources else part
                param_bytes[computed] += role.nbytes
    elif log:
        log("warning: the step's outputs do not match the module's root tuple; written parameter bytes not counted")

    names = {v: k for k, v in _PHASE_CODE.items()}
    rows.unit = unit.tolist()
    rows.phase = [names[int(p)] for p in phase]
    rows.param_bytes = param_bytes.tolist()
    rows.is_parameter_op = [bool(pb > 0 or ph == _PHASE_CODE[OPTIMIZER]) for pb, ph in zip(param_bytes, phase)]
    return rows, {"instructions": n, "cost_probes": coster.probes}

