"""The model zoo registry: families register a ModelDef class, sizes register a config under the family.

Identifiers are ``family__size`` exactly as the traces write them (``moe__2.4B``, ``wide_resnet__6.8B``).
"""

from __future__ import annotations

from dataclasses import dataclass

from libarena.errors import ArenaError
from libarena.models.base import ModelConfig, ModelDef
from libarena.registry import Registry
from libarena.workloads import TEST_SIZES


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str
    size: str
    config: ModelConfig
    #: Sizes the paper's Table 2 and the traces use; tiny/small ones exist for tests and CPU profiling.
    paper_size: bool


def _ensure_loaded() -> None:
    import libarena.models.zoo  # noqa: F401  (registers the built-in families and sizes)


FAMILIES: Registry[type[ModelDef]] = Registry("model family", _ensure_loaded)
#: family -> its sizes (size name -> config)
_SIZES: dict[str, Registry[ModelConfig]] = {}


def register_family(cls: type[ModelDef]) -> type[ModelDef]:
    FAMILIES.register(cls.family, cls)
    _SIZES.setdefault(cls.family, Registry(f"size of model family {cls.family!r}"))
    return cls


def register_size(family: str, size: str, config: ModelConfig) -> None:
    if family not in _SIZES:
        raise ValueError(f"family {family!r} is not registered")
    if size in _SIZES[family]:
        raise ValueError(f"{family}__{size} registered twice")
    _SIZES[family].register(size, config)


def get_model(identifier: str) -> ModelDef:
    family, sep, size = str(identifier).partition("__")
    if not sep or family not in FAMILIES:
        raise ArenaError(
            f"unknown model {identifier!r}: expected family__size with family one of {', '.join(FAMILIES.names())}"
        )
    sizes = _SIZES[family]
    if size not in sizes:
        known = ", ".join(name for name, _ in sizes.items())
        raise ArenaError(f"unknown size {size!r} for model family {family!r} (known: {known})")
    return FAMILIES.get(family)(size, sizes.get(size))


def list_models(include_test_sizes: bool = True) -> list[ZooEntry]:
    entries = []
    for family in FAMILIES.names():
        for size, config in _SIZES[family].items():
            paper = size not in TEST_SIZES
            if paper or include_test_sizes:
                entries.append(ZooEntry(f"{family}__{size}", family, size, config, paper))
    return entries


def families() -> list[str]:
    return FAMILIES.names()

