"""Micro instances of the zoo's model classes (a few units, tiny shapes): XLA compilation dominates the
runtime's tests on CPU, so the equivalence grid uses the smallest models that still exercise every
parallel axis (heads/mlp/vocab for GPT and BERT, expert for MoE, conv_out for Wide-ResNet); BERT for its
masked-position loss, which must not change with the micro-batching."""

from __future__ import annotations

from libarena.models.training import OptimizerConfig
from libarena.models.zoo.transformer import BERTModel, GPTModel, MoEModel, TransformerConfig
from libarena.models.zoo.wide_resnet import WideResNetConfig, WideResNetModel

#: Adam with a large epsilon: the first update is then smooth in the gradient (not ~lr * sign(g)), so
#: comparing updated parameters really compares gradients.
TEST_OPTIMIZER = OptimizerConfig(learning_rate=1e-2, eps=1e-3)


def micro_gpt() -> GPTModel:
    return GPTModel("micro", TransformerConfig(0.0, 8, 16, 2, 2, vocab_size=32))


def micro_bert() -> BERTModel:
    return BERTModel("micro", TransformerConfig(0.0, 8, 16, 2, 2, vocab_size=32))


def micro_moe() -> MoEModel:
    return MoEModel("micro", TransformerConfig(0.0, 8, 16, 2, 2, vocab_size=32, num_experts=4, expert_group_size=8))


def micro_wide_resnet() -> WideResNetModel:
    return WideResNetModel("micro", WideResNetConfig(0.0, 16, 8, 2, stage_sizes=(1, 1), num_classes=8))


MICRO_MODELS = {"gpt": micro_gpt, "bert": micro_bert, "moe": micro_moe, "wide_resnet": micro_wide_resnet}
