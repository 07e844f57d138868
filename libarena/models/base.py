"""What every model of the zoo provides: an ordered list of units (layers) that the planner clusters into
stages, and pure functions to initialise and apply each unit.

A unit consumes the activation (``carry``) of the previous one; the first unit reads the batch, the last
returns the scalar training loss. This one interface serves abstract lowering (arena-analyze), per-stage
executables (arena-profile) and pipelined, sharded training (arena-run).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

Params = Any  # a pytree of arrays
Carry = Any  # the activation flowing between units (an array; None before the first unit)
Batch = dict[str, Any]

#: Logical axis names used in ``param_axes``; the runtime maps them onto mesh axes.
#: "heads", "mlp", "vocab" are split by Megatron-style tensor parallelism, "expert" by expert parallelism,
#: "conv_out" is the output-channel axis of a convolution kernel.
LOGICAL_AXES = ("embed", "heads", "head_dim", "mlp", "vocab", "expert", "conv_in", "conv_out", "classes", "position")


@dataclass(frozen=True)
class UnitSpec:
    """One layer of a model, in execution order."""

    name: str
    kind: str
    #: All-reduces of the unit's output activation per forward pass under Megatron-style tensor parallelism
    #: (2 per transformer block: after attention and after the MLP).
    tp_allreduces: int = 0
    #: Expert all-to-alls per forward pass (dispatch and combine of a GShard MoE layer); as many in the backward.
    alltoalls: int = 0
    #: All-reduces of the same tensor in the backward pass; None: as many as forward (a block's column-parallel
    #: inputs' gradients). A vocabulary-parallel embedding reduces its output forward only (its table's gradient
    #: is local); a vocabulary-parallel output layer its input's gradient backward only.
    tp_backward_allreduces: int | None = None
    #: The all-reduced tensor is the unit's input, not its output (an output layer, whose output is the loss).
    tp_reduces_input: bool = False

    @property
    def tp_allreduce_count(self) -> int:
        """Tensor-parallel all-reduces of one forward and backward pass."""
        backward = self.tp_allreduces if self.tp_backward_allreduces is None else self.tp_backward_allreduces
        return self.tp_allreduces + backward

    def tp_allreduce_bytes(self, input_bytes: float, output_bytes: float) -> float:
        """Bytes the unit's tensor-parallel all-reduces move in one forward and backward pass (full tensors)."""
        return float(self.tp_allreduce_count * (input_bytes if self.tp_reduces_input else output_bytes))

    def alltoall_bytes(self, dispatch_bytes: float) -> float:
        """Bytes the unit's expert all-to-alls move in one forward and backward pass (dispatch and combine each way)."""
        return float(2 * self.alltoalls * dispatch_bytes)


@dataclass(frozen=True)
class ModelConfig:
    """Fields common to every family; families subclass it with their own hyperparameters."""

    nominal_params: float
    #: Sequence length for text models, image side for vision models.
    seq_len: int


class ModelDef(ABC):
    """A registered model: family ``family``, size ``size``, identifier ``family__size``."""

    family: ClassVar[str]

    def __init__(self, size: str, config: ModelConfig):
        self.size = size
        self.config = config

    @property
    def name(self) -> str:
        return f"{self.family}__{self.size}"

    @property
    @abstractmethod
    def units(self) -> tuple[UnitSpec, ...]: ...

    @abstractmethod
    def init_unit(self, index: int, key: Any) -> Params:
        """Parameters of unit ``index`` (float32 master copies)."""

    @abstractmethod
    def apply_unit(self, index: int, params: Params, carry: Carry, batch: Batch, compute_dtype: Any) -> Carry:
        """Run unit ``index`` on ``carry`` (None for the first unit); the last unit returns the mean loss."""

    @abstractmethod
    def param_axes(self, index: int) -> Any:
        """A pytree like the unit's parameters whose leaves are tuples of logical axis names (or None)."""

    @abstractmethod
    def batch_shapes(self, batch_size: int, seq_len: int | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
        """Shape and numpy dtype name of each batch entry (inputs and targets)."""

    @abstractmethod
    def synthetic_samples(self, indices: np.ndarray, seed: int, seq_len: int | None = None) -> Batch:
        """Deterministic, learnable training samples by global sample index (so data loading can resume
        exactly where it stopped after a checkpoint, whatever the new parallel layout)."""

    def unit_signature(self, index: int) -> Hashable:
        """Units with equal signatures run the same computation (``apply_unit`` depends on the index only
        through the signature; shapes may still differ): their traces can be shared. Default: every unit
        is its own."""
        return ("unit", index)

    def tp_allreduce_bytes(self, index: int, input_bytes: float, output_bytes: float, batch_size: int, itemsize: int) -> float:
        """Bytes unit ``index``'s tensor-parallel collectives move in one forward and backward pass, as all-reduces
        of full tensors (an all-gather of N bytes counts N / 2: a ring moves half an all-reduce's bytes). Default:
        its UnitSpec's rule from the unit's input and output bytes; a model whose collectives depend on tensors
        inside its units (their shapes: ``batch_size``, ``itemsize``) overrides it."""
        return self.units[index].tp_allreduce_bytes(input_bytes, output_bytes)

    def tp_collectives(self, index: int) -> int:
        """Tensor-parallel collectives of unit ``index`` in one forward and backward pass (each pays a latency)."""
        return self.units[index].tp_allreduce_count

    def expert_dispatch_shape(self, batch_size: int, seq_len: int | None = None) -> tuple[int, ...] | None:
        """Shape of the tensor one expert all-to-all moves per MoE unit at ``batch_size`` (in the compute
        dtype), e.g. ``(experts, groups, capacity, hidden)``; None for models without experts."""
        return None

    def expert_dispatch_bytes(self, batch_size: int, itemsize: int, seq_len: int | None = None) -> float:
        """Bytes of :meth:`expert_dispatch_shape`'s tensor in a dtype of ``itemsize`` bytes (0 without experts)."""
        shape = self.expert_dispatch_shape(batch_size, seq_len)
        return float(np.prod(shape, dtype=np.int64)) * itemsize if shape else 0.0

    def describe(self) -> dict[str, Any]:
        """A JSON-able record of the model for artifact metadata."""
        from dataclasses import asdict

        return {
            "name": self.name,
            "family": self.family,
            "size": self.size,
            "nominal_params": self.config.nominal_params,
            "num_units": len(self.units),
            "config": asdict(self.config),
        }


def sample_rng(seed: int, index: int) -> np.random.Generator:
    """The random stream of one training sample: a function of (seed, global sample index) only."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(index)])
