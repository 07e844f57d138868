"""The model zoo (GPT, BERT, GShard MoE, Wide-ResNet) as ordered units with pure init/apply functions.

Importing this package does not import JAX; ``libarena.models.training`` does.
"""

from libarena.models.base import LOGICAL_AXES, ModelConfig, ModelDef, UnitSpec
from libarena.models.registry import TEST_SIZES, ZooEntry, families, get_model, list_models, register_family, register_size

__all__ = [
    "LOGICAL_AXES",
    "TEST_SIZES",
    "ModelConfig",
    "ModelDef",
    "UnitSpec",
    "ZooEntry",
    "families",
    "get_model",
    "list_models",
    "register_family",
    "register_size",
]
