"""Transformer families: GPT-3 style decoder (``gpt``), BERT encoder (``bert``), GShard MoE (``moe``).

Pre-LayerNorm blocks; attention weights keep an explicit heads axis so tensor parallelism can split it.
Units: ``embed``, ``block_00`` … ``block_{L-1}``, ``head`` (final LayerNorm, vocabulary projection, loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from libarena.models.base import Batch, Carry, ModelConfig, ModelDef, Params, UnitSpec, sample_rng


@dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    hidden: int
    num_layers: int
    num_heads: int
    vocab_size: int
    mlp_ratio: int = 4
    #: > 0 makes every block's MLP a GShard top-2 mixture of experts.
    num_experts: int = 0
    #: Tokens per routing group (S in the GShard paper), at most one sample's (``_routing_group``); capacity
    #: per expert is 2 * group / experts.
    expert_group_size: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return self.hidden * self.mlp_ratio


def _routing_group(seq_len: int, expert_group_size: int) -> int:
    """Tokens per routing group: within one sample, the whole sample when it is no longer than the configured
    size, else the largest divisor of the sequence length up to that size. A group that spanned samples would
    route a sample's tokens by whichever samples share its micro-batch, so plans that split the batch differently
    (micro-batches, data-parallel replicas) would train differently; the paper's MoE sizes (group 2048, sequence
    1024) route in groups of one sequence. (A gcd would shrink the groups of a sequence of 1,000 to 8 tokens.)"""
    if seq_len <= expert_group_size:
        return seq_len
    return max(d for d in range(1, expert_group_size + 1) if seq_len % d == 0)


def _layer_norm(x: Any, scale: Any, bias: Any) -> Any:
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * (1.0 / jnp.sqrt(var + 1e-5))
    return (y * scale + bias).astype(x.dtype)


def _normal(key: Any, shape: tuple[int, ...], fan_in: int) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.random.normal(key, shape, jnp.float32) * (1.0 / math.sqrt(fan_in))


def top2_gating(gates: Any) -> tuple[Any, Any]:
    """GShard top-2 routing: [G,S,E] gate probabilities -> combine weights and dispatch mask [G,S,E,C]."""
    import jax
    import jax.numpy as jnp

    _, group, experts = gates.shape
    capacity = max(1, 2 * group // experts)
    index_1 = jnp.argmax(gates, axis=-1)
    mask_1 = jax.nn.one_hot(index_1, experts, dtype=jnp.int32)
    gate_1 = jnp.sum(gates * mask_1, axis=-1)
    without_1 = gates * (1 - mask_1)
    index_2 = jnp.argmax(without_1, axis=-1)
    mask_2 = jax.nn.one_hot(index_2, experts, dtype=jnp.int32)
    gate_2 = jnp.sum(without_1 * mask_2, axis=-1)
    # Position of each token in its expert's buffer; tokens beyond capacity are dropped.
    position_1 = jnp.cumsum(mask_1, axis=-2) - mask_1
    mask_1 = mask_1 * (position_1 < capacity)
    position_1 = jnp.sum(position_1 * mask_1, axis=-1)
    count_1 = jnp.sum(mask_1, axis=-2, keepdims=True)
    position_2 = jnp.cumsum(mask_2, axis=-2) - mask_2 + count_1
    mask_2 = mask_2 * (position_2 < capacity)
    position_2 = jnp.sum(position_2 * mask_2, axis=-1)
    kept_1 = jnp.sum(mask_1, axis=-1)
    kept_2 = jnp.sum(mask_2, axis=-1)
    gate_1 = gate_1 * kept_1
    gate_2 = gate_2 * kept_2
    denom = gate_1 + gate_2
    denom = jnp.where(denom > 0, denom, 1.0)
    gate_1, gate_2 = gate_1 / denom, gate_2 / denom
    combine = jnp.einsum(
        "gse,gsc->gsec",
        (gate_1 * kept_1)[..., None] * jax.nn.one_hot(index_1, experts, dtype=gates.dtype),
        jax.nn.one_hot(position_1, capacity, dtype=gates.dtype),
    ) + jnp.einsum(
        "gse,gsc->gsec",
        (gate_2 * kept_2)[..., None] * jax.nn.one_hot(index_2, experts, dtype=gates.dtype),
        jax.nn.one_hot(position_2, capacity, dtype=gates.dtype),
    )
    dispatch = (combine > 0).astype(gates.dtype)
    return combine, dispatch


class TransformerModel(ModelDef):
    """Shared implementation; subclasses choose causal attention, the loss and the MLP kind."""

    config: TransformerConfig
    causal: bool = True

    @property
    def units(self) -> tuple[UnitSpec, ...]:
        c = self.config
        block_kind = "moe_block" if c.num_experts else "transformer_block"
        # the runtime splits the experts over tp (libarena.run.executor.TP_LOGICAL_AXES), not over dp: the combine
        # einsum's all-reduce is the block's second one, and no all-to-all runs (XLA's SPMD output at tp 2, dp 2 and
        # both has none); the experts' weights are replicated over dp and synchronised with the gradients
        blocks = tuple(UnitSpec(f"block_{i:02d}", block_kind, tp_allreduces=2) for i in range(c.num_layers))
        # vocabulary-parallel embedding and output layer (the runtime splits the token table over the vocabulary):
        # the embedding's masked lookup is summed over tp forward, the output layer's input gradient backward (its
        # log-softmax statistics besides: tp_allreduce_bytes, tp_collectives)
        return (UnitSpec("embed", "embedding", tp_allreduces=1, tp_backward_allreduces=0), *blocks,
                UnitSpec("head", "lm_head", tp_allreduces=0, tp_backward_allreduces=1, tp_reduces_input=True))

    #: the output layer's float32 (batch, seq) reductions over the vocabulary split: the log-softmax's max, sum and
    #: target logit forward, its sum backward (XLA's SPMD partition of gpt__tiny's head at tp 2)
    _HEAD_STATISTICS = 4

    def tp_allreduce_bytes(self, index, input_bytes, output_bytes, batch_size, itemsize):
        volume = super().tp_allreduce_bytes(index, input_bytes, output_bytes, batch_size, itemsize)
        if index == len(self.units) - 1:
            tokens = input_bytes / (self.config.hidden * itemsize)
            volume += self._HEAD_STATISTICS * tokens * 4
        return volume

    def tp_collectives(self, index):
        return super().tp_collectives(index) + (self._HEAD_STATISTICS if index == len(self.units) - 1 else 0)

    # -- parameters ------------------------------------------------------------------------------------

    def init_unit(self, index: int, key: Any) -> Params:
        import jax
        import jax.numpy as jnp

        c = self.config
        last = len(self.units) - 1
        keys = jax.random.split(key, 6)
        if index == 0:
            return {
                "token": _normal(keys[0], (c.vocab_size, c.hidden), c.hidden),
                "position": _normal(keys[1], (c.seq_len, c.hidden), c.hidden) * 0.1,
            }
        if index == last:
            return {
                "ln_scale": jnp.ones((c.hidden,), jnp.float32),
                "ln_bias": jnp.zeros((c.hidden,), jnp.float32),
                "w_out": _normal(keys[0], (c.hidden, c.vocab_size), c.hidden),
                "b_out": jnp.zeros((c.vocab_size,), jnp.float32),
            }
        h, nh, hd, f = c.hidden, c.num_heads, c.head_dim, c.mlp_hidden
        block: dict[str, Any] = {
            "ln1_scale": jnp.ones((h,), jnp.float32),
            "ln1_bias": jnp.zeros((h,), jnp.float32),
            "w_qkv": _normal(keys[0], (h, 3, nh, hd), h),
            "b_qkv": jnp.zeros((3, nh, hd), jnp.float32),
            "w_attn_out": _normal(keys[1], (nh, hd, h), h),
            "b_attn_out": jnp.zeros((h,), jnp.float32),
            "ln2_scale": jnp.ones((h,), jnp.float32),
            "ln2_bias": jnp.zeros((h,), jnp.float32),
        }
        if c.num_experts:
            e = c.num_experts
            block["w_gate"] = _normal(keys[2], (h, e), h)
            block["w_expert_in"] = _normal(keys[3], (e, h, f), h)
            block["w_expert_out"] = _normal(keys[4], (e, f, h), f)
        else:
            block["w_mlp_in"] = _normal(keys[2], (h, f), h)
            block["b_mlp_in"] = jnp.zeros((f,), jnp.float32)
            block["w_mlp_out"] = _normal(keys[3], (f, h), f)
            block["b_mlp_out"] = jnp.zeros((h,), jnp.float32)
        return block

    def param_axes(self, index: int) -> Any:
        last = len(self.units) - 1
        if index == 0:
            return {"token": ("vocab", "embed"), "position": ("position", "embed")}
        if index == last:
            return {"ln_scale": ("embed",), "ln_bias": ("embed",), "w_out": ("embed", "vocab"), "b_out": ("vocab",)}
        axes: dict[str, Any] = {
            "ln1_scale": ("embed",),
            "ln1_bias": ("embed",),
            "w_qkv": ("embed", None, "heads", "head_dim"),
            "b_qkv": (None, "heads", "head_dim"),
            "w_attn_out": ("heads", "head_dim", "embed"),
            "b_attn_out": ("embed",),
            "ln2_scale": ("embed",),
            "ln2_bias": ("embed",),
        }
        if self.config.num_experts:
            axes["w_gate"] = ("embed", None)
            axes["w_expert_in"] = ("expert", "embed", "mlp")
            axes["w_expert_out"] = ("expert", "mlp", "embed")
        else:
            axes.update(w_mlp_in=("embed", "mlp"), b_mlp_in=("mlp",), w_mlp_out=("mlp", "embed"), b_mlp_out=("embed",))
        return axes

    # -- computation -----------------------------------------------------------------------------------

    def unit_signature(self, index: int) -> Any:
        return ("block",) if 0 < index < len(self.units) - 1 else ("unit", index)

    def apply_unit(self, index: int, params: Params, carry: Carry, batch: Batch, compute_dtype: Any) -> Carry:
        import jax
        import jax.numpy as jnp

        last = len(self.units) - 1
        p = jax.tree.map(lambda a: a.astype(compute_dtype), params)
        if index == 0:
            tokens = batch["tokens"]
            seq = tokens.shape[1]
            return jnp.take(p["token"], tokens, axis=0) + p["position"][:seq][None]
        if index == last:
            x = _layer_norm(carry, p["ln_scale"], p["ln_bias"])
            logits = (jnp.einsum("bsh,hv->bsv", x, p["w_out"]) + p["b_out"]).astype(jnp.float32)
            return self.loss(logits, batch)
        return self._block(p, carry)

    def _block(self, p: Params, x: Any) -> Any:
        import jax
        import jax.numpy as jnp

        c = self.config
        y = _layer_norm(x, p["ln1_scale"], p["ln1_bias"])
        qkv = jnp.einsum("bsh,hknd->kbsnd", y, p["w_qkv"]) + p["b_qkv"][:, None, None]
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = jnp.einsum("bqnd,bknd->bnqk", q, k).astype(jnp.float32) / math.sqrt(c.head_dim)
        if self.causal:
            seq = x.shape[1]
            mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
            scores = jnp.where(mask[None, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        attn = jnp.einsum("bnqk,bknd->bqnd", weights, v)
        x = x + jnp.einsum("bqnd,ndh->bqh", attn, p["w_attn_out"]) + p["b_attn_out"]
        y = _layer_norm(x, p["ln2_scale"], p["ln2_bias"])
        if c.num_experts:
            return x + self._moe(p, y)
        hidden = jax.nn.gelu(jnp.einsum("bsh,hf->bsf", y, p["w_mlp_in"]) + p["b_mlp_in"])
        return x + jnp.einsum("bsf,fh->bsh", hidden, p["w_mlp_out"]) + p["b_mlp_out"]

    def _moe(self, p: Params, y: Any) -> Any:
        import jax
        import jax.numpy as jnp

        batch, seq, hidden = y.shape
        tokens = batch * seq
        group = _routing_group(seq, self.config.expert_group_size)
        grouped = y.reshape(tokens // group, group, hidden)
        gates = jax.nn.softmax(jnp.einsum("gsh,he->gse", grouped, p["w_gate"]).astype(jnp.float32), axis=-1)
        combine, dispatch = top2_gating(gates)
        combine, dispatch = combine.astype(y.dtype), dispatch.astype(y.dtype)
        expert_inputs = jnp.einsum("gsec,gsh->egch", dispatch, grouped)  # all-to-all under expert parallelism
        hidden_act = jax.nn.relu(jnp.einsum("egch,ehf->egcf", expert_inputs, p["w_expert_in"]))
        expert_outputs = jnp.einsum("egcf,efh->gech", hidden_act, p["w_expert_out"])  # all-to-all back
        out = jnp.einsum("gsec,gech->gsh", combine, expert_outputs)
        return out.reshape(batch, seq, hidden)

    def loss(self, logits: Any, batch: Batch) -> Any:
        import jax
        import jax.numpy as jnp

        log_probs = jax.nn.log_softmax(logits, axis=-1)
        target_log_probs = jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
        return -jnp.mean(target_log_probs)

    def expert_dispatch_shape(self, batch_size: int, seq_len: int | None = None) -> tuple[int, ...] | None:
        """``expert_inputs`` of :meth:`_moe` ([experts, groups, capacity, hidden]), the same grouping."""
        c = self.config
        if not c.num_experts:
            return None
        seq = seq_len or c.seq_len
        tokens = batch_size * seq
        group = _routing_group(seq, c.expert_group_size)
        return (c.num_experts, tokens // group, max(1, 2 * group // c.num_experts), c.hidden)

    # -- data --------------------------------------------------------------------------------------------

    def batch_shapes(self, batch_size: int, seq_len: int | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
        seq = seq_len or self.config.seq_len
        return {"tokens": ((batch_size, seq), "int32"), "targets": ((batch_size, seq), "int32")}

    def _sequences(self, indices: np.ndarray, seed: int, seq: int) -> np.ndarray:
        """Arithmetic token sequences (start + k * stride mod V): next tokens are predictable, so loss falls."""
        vocab = self.config.vocab_size
        out = np.empty((len(indices), seq + 1), dtype=np.int64)
        steps = np.arange(seq + 1)
        for row, index in enumerate(indices):
            rng = sample_rng(seed, int(index))
            start = rng.integers(0, vocab)
            stride = rng.integers(1, 4)
            out[row] = (start + steps * stride) % vocab
        return out

    def synthetic_samples(self, indices: np.ndarray, seed: int, seq_len: int | None = None) -> Batch:
        seq = seq_len or self.config.seq_len
        sequences = self._sequences(np.asarray(indices), seed, seq)
        return {"tokens": sequences[:, :-1].astype(np.int32), "targets": sequences[:, 1:].astype(np.int32)}


class GPTModel(TransformerModel):
    """GPT-3 style causal decoder."""

    family = "gpt"
    causal = True


class MoEModel(TransformerModel):
    """GShard MoE language model: every block's MLP is a top-2 mixture of experts (causal LM objective).

    Alpa's benchmark model alternates dense and MoE layers but its size names (690M … 27B) count every layer
    as MoE; making every layer MoE gives parameter counts that match those names.
    """

    family = "moe"
    causal = True


class BERTModel(TransformerModel):
    """BERT encoder with a masked-language-model loss over 15% masked positions."""

    family = "bert"
    causal = False
    mask_fraction = 0.15

    def batch_shapes(self, batch_size: int, seq_len: int | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
        shapes = super().batch_shapes(batch_size, seq_len)
        shapes["mask_weights"] = (shapes["tokens"][0], "float32")
        return shapes

    def synthetic_samples(self, indices: np.ndarray, seed: int, seq_len: int | None = None) -> Batch:
        seq = seq_len or self.config.seq_len
        originals = self._sequences(np.asarray(indices), seed, seq)[:, :-1]
        weights = np.zeros(originals.shape, dtype=np.float32)
        tokens = originals.copy()
        mask_token = self.config.vocab_size - 1
        for row, index in enumerate(indices):
            rng = sample_rng(seed + 1, int(index))
            masked = rng.random(seq) < self.mask_fraction
            masked[rng.integers(0, seq)] = True  # at least one prediction per sample
            weights[row] = masked
            tokens[row, masked] = mask_token
        return {"tokens": tokens.astype(np.int32), "targets": originals.astype(np.int32), "mask_weights": weights}

    def loss(self, logits: Any, batch: Batch) -> Any:
        import jax
        import jax.numpy as jnp

        log_probs = jax.nn.log_softmax(logits, axis=-1)
        target_log_probs = jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
        weights = batch["mask_weights"]
        # Per-sample mean over masked positions, then mean over samples: invariant to micro-batching.
        per_sample = -jnp.sum(target_log_probs * weights, axis=-1) / jnp.maximum(jnp.sum(weights, axis=-1), 1.0)
        return jnp.mean(per_sample)
