"""The pipeline: each stage's cache-keyed run, between the tools and the stage packages.

The five tools (``tools/arena-*``) parse arguments and call these; ``arena-schedule perf build`` chains them
for every (model, batch) of a trace; the live scheduler calls the same chain (as ``perf build --pair``) when
a job of a new (model, batch) arrives, and its arena-run launcher plans a model with ``arena-plan --model``.
One cache serves them all: an operator table analyzed by ``arena-analyze`` is the one ``perf build`` and
``arena-plan --model`` read, and the other way round (``<cache-dir>/stages/<stage>/<key>/``, see
libarena.artifacts.stage_cache).

Modules, in pipeline order: ``analyze``, ``plan``, ``profile``, ``perf_build``, ``schedule`` (simulate and
compare). Each step takes its typed configuration, a :class:`CacheSettings` and a
:class:`~libarena.progress.Report`, and returns what happened (a StageOutcome and a summary the tools print).
Importing this package imports no JAX; the steps that need it import it when they run.
"""

from libarena.pipeline.cache import CacheSettings

__all__ = ["CacheSettings"]
