"""The built-in zoo: every size in the paper's Table 2 and in the arena-ae traces, plus tiny/small test sizes.

Hyperparameters follow Alpa's benchmark suites (the paper's artifact runs on Alpa): GPT specs
(seq, hidden, layers, heads, vocab), MoE specs (+ experts, expert group size), Wide-ResNet specs
(image size, 50 layers, base channels, width factor). BERT sizes reuse the GPT shapes with BERT's vocabulary.
"""

from libarena.models.registry import list_models, register_family, register_size
from libarena.models.zoo.transformer import BERTModel, GPTModel, MoEModel, TransformerConfig
from libarena.models.zoo.wide_resnet import WideResNetConfig, WideResNetModel
from libarena.workloads import zoo_model_names

for _family in (GPTModel, BERTModel, MoEModel, WideResNetModel):
    register_family(_family)

# (nominal params, seq, hidden, layers, heads, vocab)
_GPT_SHAPES = {
    "760M": (0.76e9, 1024, 1536, 24, 16),
    "1.3B": (1.3e9, 1024, 2048, 24, 32),
    "2.6B": (2.6e9, 1024, 2560, 32, 32),
    "6.7B": (6.7e9, 1024, 4096, 32, 32),
}
#: BERT's 30,522 word pieces padded to a multiple of 128 x 16, as Megatron pads its vocabularies: the runtime
#: splits an axis over tensor-parallel devices only where it divides evenly (else it keeps it whole on every
#: device), and the planner counts the embedding and output projection split, for any degree up to 16
_BERT_VOCAB = 30720
for _size, (_nominal, _seq, _hidden, _layers, _heads) in _GPT_SHAPES.items():
    register_size("gpt", _size, TransformerConfig(_nominal, _seq, _hidden, _layers, _heads, vocab_size=51200))
    register_size("bert", _size, TransformerConfig(_nominal, _seq, _hidden, _layers, _heads, vocab_size=_BERT_VOCAB))

for _family in ("gpt", "bert"):
    register_size(_family, "tiny", TransformerConfig(0.235e6, 32, 64, 4, 4, vocab_size=256))
    register_size(_family, "small", TransformerConfig(8.45e6, 128, 256, 8, 8, vocab_size=4096))

# (nominal params, hidden, layers, experts); seq 1024, 16 heads, vocab 32000, expert group 2048.
_MOE_SHAPES = {
    "690M": (0.69e9, 768, 8, 16),
    "1.3B": (1.3e9, 768, 16, 16),
    "2.4B": (2.4e9, 1024, 16, 16),
    "10B": (10e9, 1536, 16, 32),
    "27B": (27e9, 2048, 16, 48),
}
for _size, (_nominal, _hidden, _layers, _experts) in _MOE_SHAPES.items():
    register_size(
        "moe", _size, TransformerConfig(_nominal, 1024, _hidden, _layers, 16, 32000, num_experts=_experts, expert_group_size=2048)
    )
register_size("moe", "tiny", TransformerConfig(0.63e6, 32, 64, 4, 4, 256, num_experts=4, expert_group_size=32))
register_size("moe", "small", TransformerConfig(5.0e6, 128, 128, 4, 4, 2048, num_experts=8, expert_group_size=128))

# (nominal params, image side, base channels, width factor); ResNet-50 layout.
_WRN_SHAPES = {
    "500M": (0.5e9, 224, 224, 2),
    "1B": (1e9, 224, 320, 2),
    "2B": (2e9, 224, 448, 2),
    "4B": (4e9, 224, 640, 2),
    "6.8B": (6.8e9, 224, 320, 16),
}
for _size, (_nominal, _side, _channels, _width) in _WRN_SHAPES.items():
    register_size("wide_resnet", _size, WideResNetConfig(_nominal, _side, _channels, _width))
register_size("wide_resnet", "tiny", WideResNetConfig(0.63e6, 32, 8, 2, num_classes=16))
register_size("wide_resnet", "small", WideResNetConfig(2.5e6, 64, 16, 2, num_classes=64))

# The catalogue (libarena.workloads) is what the scheduler knows of the zoo: it must name exactly these models.
_registered = {entry.name for entry in list_models()}
if _registered != zoo_model_names():
    raise RuntimeError(f"libarena.workloads and the model zoo disagree: registered only {sorted(_registered - zoo_model_names())}, "
                       f"catalogued only {sorted(zoo_model_names() - _registered)}")
