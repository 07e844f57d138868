"""Wide-ResNet (``wide_resnet``) as in Alpa's benchmark: ResNet-50 layout, bottleneck blocks whose 3x3
convolution is ``width_factor`` times wider, base channels C.

GroupNorm replaces BatchNorm so that every sample is processed independently: then every parallel plan
(data-parallel shards, pipeline micro-batches) computes exactly the single-device step, which the runtime's
correctness tests rely on. Units: ``stem``, ``block_00`` … ``block_15``, ``head``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from libarena.models.base import Batch, Carry, ModelConfig, ModelDef, Params, UnitSpec, sample_rng


@dataclass(frozen=True)
class WideResNetConfig(ModelConfig):
    base_channels: int
    width_factor: int
    stage_sizes: tuple[int, ...] = (3, 4, 6, 3)
    num_classes: int = 1024


@dataclass(frozen=True)
class _Block:
    in_channels: int
    filters: int
    stride: int

    def out_channels(self) -> int:
        return self.filters * 4


def _group_norm(x: Any, scale: Any, bias: Any) -> Any:
    import jax.numpy as jnp

    n, h, w, ch = x.shape
    groups = math.gcd(32, ch)
    x32 = x.astype(jnp.float32).reshape(n, h, w, groups, ch // groups)
    mean = jnp.mean(x32, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=(1, 2, 4), keepdims=True)
    y = ((x32 - mean) / jnp.sqrt(var + 1e-5)).reshape(n, h, w, ch)
    return (y * scale + bias).astype(x.dtype)


def _conv(x: Any, kernel: Any, stride: int) -> Any:
    import jax

    pad = kernel.shape[0] // 2
    return jax.lax.conv_general_dilated(
        x, kernel, (stride, stride), [(pad, pad), (pad, pad)], dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _kernel(key: Any, size: int, cin: int, cout: int) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.random.normal(key, (size, size, cin, cout), jnp.float32) * math.sqrt(2.0 / (size * size * cin))


def _projects(b: _Block) -> bool:
    """The block's shortcut is a convolution (it changes the size or the channels)."""
    return b.stride != 1 or b.in_channels != b.out_channels()


class WideResNetModel(ModelDef):
    family = "wide_resnet"
    config: WideResNetConfig

    def _blocks(self) -> list[_Block]:
        c = self.config
        blocks = []
        channels = c.base_channels
        for stage, size in enumerate(c.stage_sizes):
            filters = c.base_channels * 2**stage
            for j in range(size):
                stride = 2 if stage > 0 and j == 0 else 1
                blocks.append(_Block(channels, filters, stride))
                channels = filters * 4
        return blocks

    @property
    def units(self) -> tuple[UnitSpec, ...]:
        # tensor-parallel collectives: tp_allreduce_bytes and tp_collectives below (they depend on tensors inside a block)
        blocks = tuple(UnitSpec(f"block_{i:02d}", "bottleneck_block") for i in range(len(self._blocks())))
        return (UnitSpec("stem", "conv_stem"), *blocks, UnitSpec("head", "classifier_head"))

    # The runtime splits every convolution's output channels over tp (conv_out), so XLA's SPMD partition gathers
    # each convolution's input (sharded by the convolution before) in the forward pass and again in the backward
    # pass, and all-reduces the input's gradient once per convolution reading it; the stem reads the image (not
    # split) and the head's weights are whole (its pooled features' contraction is summed over tp: one
    # all-reduce of the logits). Checked against the HLO of a wide_resnet__tiny stage at tp 2.

    def tp_allreduce_bytes(self, index, input_bytes, output_bytes, batch_size, itemsize):
        blocks = self._blocks()
        if index == 0:
            return 0.0
        if index == len(blocks) + 1:
            return float(batch_size * self.config.num_classes * itemsize)
        b = blocks[index - 1]
        y1 = input_bytes * b.filters / b.in_channels  # conv1 (1x1, stride 1) keeps the input's size
        y2 = output_bytes * self.config.width_factor / 4  # conv2's output, at the block's output size
        shortcut = input_bytes if _projects(b) else 0.0  # the projection reads the block's input too
        # gathered forward and backward (half an all-reduce each), all-reduced backward per reading convolution
        return float(2 * (input_bytes + y1 + y2) + shortcut)

    def tp_collectives(self, index):
        blocks = self._blocks()
        if index == 0:
            return 0
        if index == len(blocks) + 1:
            return 1
        return 9 + (1 if _projects(blocks[index - 1]) else 0)

    def init_unit(self, index: int, key: Any) -> Params:
        import jax
        import jax.numpy as jnp

        c = self.config
        blocks = self._blocks()
        keys = jax.random.split(key, 4)
        if index == 0:
            return {
                "kernel": _kernel(keys[0], 7, 3, c.base_channels),
                "norm_scale": jnp.ones((c.base_channels,), jnp.float32),
                "norm_bias": jnp.zeros((c.base_channels,), jnp.float32),
            }
        if index == len(blocks) + 1:
            features = blocks[-1].out_channels()
            return {
                "w": jax.random.normal(keys[0], (features, c.num_classes), jnp.float32) / math.sqrt(features),
                "b": jnp.zeros((c.num_classes,), jnp.float32),
            }
        b = blocks[index - 1]
        wide = b.filters * c.width_factor
        params: dict[str, Any] = {
            "conv1": _kernel(keys[0], 1, b.in_channels, b.filters),
            "norm1_scale": jnp.ones((b.filters,), jnp.float32),
            "norm1_bias": jnp.zeros((b.filters,), jnp.float32),
            "conv2": _kernel(keys[1], 3, b.filters, wide),
            "norm2_scale": jnp.ones((wide,), jnp.float32),
            "norm2_bias": jnp.zeros((wide,), jnp.float32),
            "conv3": _kernel(keys[2], 1, wide, b.out_channels()),
            # Zero-initialised last norm (as in Alpa/Flax): each block starts as the identity.
            "norm3_scale": jnp.zeros((b.out_channels(),), jnp.float32),
            "norm3_bias": jnp.zeros((b.out_channels(),), jnp.float32),
        }
        if _projects(b):
            params["proj"] = _kernel(keys[3], 1, b.in_channels, b.out_channels())
            params["proj_scale"] = jnp.ones((b.out_channels(),), jnp.float32)
            params["proj_bias"] = jnp.zeros((b.out_channels(),), jnp.float32)
        return params

    def param_axes(self, index: int) -> Any:
        conv = (None, None, "conv_in", "conv_out")
        vec = ("conv_out",)
        blocks = self._blocks()
        if index == 0:
            return {"kernel": conv, "norm_scale": vec, "norm_bias": vec}
        if index == len(blocks) + 1:
            return {"w": ("embed", "classes"), "b": ("classes",)}
        b = blocks[index - 1]
        axes = {
            "conv1": conv, "norm1_scale": vec, "norm1_bias": vec,
            "conv2": conv, "norm2_scale": vec, "norm2_bias": vec,
            "conv3": conv, "norm3_scale": vec, "norm3_bias": vec,
        }
        if _projects(b):
            axes.update(proj=conv, proj_scale=vec, proj_bias=vec)
        return axes

    def unit_signature(self, index: int) -> Any:
        # A block's computation depends on its index only through the stride (the projection shortcut
        # shows in its parameters, the widths in its shapes: both part of a trace's key anyway).
        blocks = self._blocks()
        return ("block", blocks[index - 1].stride) if 0 < index <= len(blocks) else ("unit", index)

    def apply_unit(self, index: int, params: Params, carry: Carry, batch: Batch, compute_dtype: Any) -> Carry:
        import jax
        import jax.numpy as jnp

        blocks = self._blocks()
        p = jax.tree.map(lambda a: a.astype(compute_dtype), params)
        if index == 0:
            x = batch["images"].astype(compute_dtype)
            x = jax.nn.relu(_group_norm(_conv(x, p["kernel"], 2), p["norm_scale"], p["norm_bias"]))
            return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
        if index == len(blocks) + 1:
            pooled = jnp.mean(carry.astype(jnp.float32), axis=(1, 2)).astype(compute_dtype)
            logits = (pooled @ p["w"] + p["b"]).astype(jnp.float32)
            log_probs = jax.nn.log_softmax(logits, axis=-1)
            return -jnp.mean(jnp.take_along_axis(log_probs, batch["labels"][:, None], axis=-1))
        b = blocks[index - 1]
        x = carry
        y = jax.nn.relu(_group_norm(_conv(x, p["conv1"], 1), p["norm1_scale"], p["norm1_bias"]))
        y = jax.nn.relu(_group_norm(_conv(y, p["conv2"], b.stride), p["norm2_scale"], p["norm2_bias"]))
        y = _group_norm(_conv(y, p["conv3"], 1), p["norm3_scale"], p["norm3_bias"])
        residual = x
        if "proj" in p:
            residual = _group_norm(_conv(x, p["proj"], b.stride), p["proj_scale"], p["proj_bias"])
        return jax.nn.relu(residual + y)

    def batch_shapes(self, batch_size: int, seq_len: int | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
        side = seq_len or self.config.seq_len
        return {"images": ((batch_size, side, side, 3), "float32"), "labels": ((batch_size,), "int32")}

    def synthetic_samples(self, indices: np.ndarray, seed: int, seq_len: int | None = None) -> Batch:
        """Images whose low-frequency pattern is a function of the label, plus noise: learnable."""
        side = seq_len or self.config.seq_len
        classes = self.config.num_classes
        grid = np.arange(side, dtype=np.float32) / side
        images = np.empty((len(indices), side, side, 3), dtype=np.float32)
        labels = np.empty((len(indices),), dtype=np.int32)
        for row, index in enumerate(np.asarray(indices)):
            rng = sample_rng(seed, int(index))
            label = int(rng.integers(0, classes))
            fy, fx = 1 + label % 7, 1 + (label // 7) % 7
            phase = (label % 3) * np.array([0.0, 2.1, 4.2], dtype=np.float32)
            pattern = np.sin(2 * np.pi * (fy * grid[:, None, None] + fx * grid[None, :, None]) + phase)
            images[row] = pattern + 0.1 * rng.standard_normal((side, side, 3)).astype(np.float32)
            labels[row] = label
        return {"images": images, "labels": labels}
