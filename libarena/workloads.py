"""The model zoo's catalogue, as data: every family's sizes from the paper's Table 2 and the arena-ae traces, the
global batches the traces train each family at, and the tiny/small sizes every family also has (tests, CPU
profiling).

Data only, so that the scheduler (which reads traces and job files naming these models) never imports the model
code; the zoo (``libarena.models.zoo``) registers a configuration for exactly these names and refuses to load
when the two disagree.
"""

from __future__ import annotations

#: family -> the paper's sizes of it (``family__size`` names a model: ``moe__2.4B``, ``wide_resnet__6.8B``)
PAPER_SIZES: dict[str, tuple[str, ...]] = {
    "bert": ("760M", "1.3B", "2.6B", "6.7B"),
    "gpt": ("760M", "1.3B", "2.6B", "6.7B"),
    "moe": ("690M", "1.3B", "2.4B", "10B", "27B"),
    "wide_resnet": ("500M", "1B", "2B", "4B", "6.8B"),
}
#: family -> the global batch sizes its jobs use (a raw trace's job gets one of them: libarena.schedule.traces)
GLOBAL_BATCHES: dict[str, tuple[int, ...]] = {
    "bert": (128, 256, 512),
    "gpt": (128, 256, 512),
    "moe": (256, 512, 1024),
    "wide_resnet": (256, 512, 1024),
}
#: Sizes every family has for tests and CPU profiling, not in the paper.
TEST_SIZES = ("tiny", "small")


def zoo_model_names(include_test_sizes: bool = True) -> set[str]:
    """Every model of the zoo (``family__size``), the tiny/small sizes too unless ``include_test_sizes`` is False."""
    sizes = {family: paper + (TEST_SIZES if include_test_sizes else ()) for family, paper in PAPER_SIZES.items()}
    return {f"{family}__{size}" for family, names in sizes.items() for size in names}


def is_zoo_model(name: str) -> bool:
    """Whether ``name`` is a model of the zoo (a paper size or a test size of a known family)."""
    family, sep, size = str(name).partition("__")
    return bool(sep) and family in PAPER_SIZES and (size in PAPER_SIZES[family] or size in TEST_SIZES)
