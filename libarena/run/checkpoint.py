"""Plan-independent training checkpoints (orbax): per-unit parameters and Adam state, the step and the
data position, so a job resumes onto any other plan and device count with the same global batch.

Orbax writes each step into a temporary directory and renames it when complete, so a crash mid-save never
leaves a half-written checkpoint behind; restoring never writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from libarena.checks import brief
from libarena.errors import ArenaError
from libarena.hardware import normalize_dtype
from libarena.models import ModelDef
from libarena.models.training import OptimizerConfig

#: Steps between checkpoints when a job does not say (arena-run, a Ray job, train); the run also saves at its end.
DEFAULT_CHECKPOINT_EVERY = 10


@dataclass(frozen=True)
class CheckpointMeta:
    model: str
    global_batch: int
    #: Steps completed; the next step to run is ``step`` (0-based).
    step: int
    #: Global index of the next training sample: samples are consumed in order, ``global_batch`` per step.
    data_position: int
    data_seed: int
    dtype: str
    optimizer: dict[str, Any]
    #: Shapes of every unit's parameters (detects a checkpoint of another model configuration).
    param_signature: str
    #: The plan and device count that wrote it (informational: any plan can resume it).
    plan_id: str = ""
    num_devices: int = 0
    #: fp16's dynamic loss scale when it was written (scale, good steps): a resume goes on with it ({}: none)
    loss_scale: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> CheckpointMeta:
        if not isinstance(data, dict):
            raise ArenaError(f"checkpoint {where} has incomplete metadata: not a record")
        try:
            meta = cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except TypeError as exc:
            raise ArenaError(f"checkpoint {where} has incomplete metadata: {exc}") from None
        # every field of its declared type: a damaged file (a null, a string for a number) is skipped like any
        # other, not a TypeError where it is first used
        for name, typ in _META_TYPES.items():
            value = getattr(meta, name)
            if isinstance(value, bool) or not isinstance(value, typ):
                raise ArenaError(f"checkpoint {where} has incomplete metadata: {name} is {brief(value)}, "
                                 f"expected {_META_TYPE_NAMES[typ]}")
        return meta


_META_TYPES = {"model": str, "global_batch": int, "step": int, "data_position": int, "data_seed": int, "dtype": str,
               "optimizer": dict, "param_signature": str, "plan_id": str, "num_devices": int, "loss_scale": dict}
_META_TYPE_NAMES = {str: "a string", int: "an integer", dict: "a record"}


def param_signature(model: ModelDef) -> str:
    import jax

    from libarena.artifacts import content_digest
    from libarena.models.training import abstract_params

    shapes = [[list(leaf.shape) + [str(leaf.dtype)] for leaf in jax.tree.leaves(unit)] for unit in abstract_params(model)]
    return content_digest(model.name, shapes)[:16]


def _state_template(model: ModelDef, optimizer: OptimizerConfig) -> dict[str, Any]:
    import jax

    from libarena.models.training import abstract_optimizer_state, abstract_params

    params = abstract_params(model)
    opt = [jax.tree.leaves(state) for state in abstract_optimizer_state(params, optimizer)]
    zeros = lambda s: np.zeros(s.shape, s.dtype)  # noqa: E731
    return {"params": jax.tree.map(zeros, params), "opt": jax.tree.map(zeros, opt)}


def _reason(exc: BaseException, limit: int = 200) -> str:
    """An exception as a short phrase (orbax and tensorstore errors carry whole JSON specs)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SILENCED = False


def _silence_abandoned_reads() -> None:
    """After a failed restore, tensorstore keeps completing the reads orbax abandoned: their callbacks find
    orbax's event loop closed ("Event loop is closed", through sys.unraisablehook) and asyncio reports their
    exceptions as never retrieved, dozens of tracebacks on stderr after the one-line report of the damage.
    Drop exactly those, for the rest of the process."""
    global _SILENCED
    if _SILENCED:
        return
    _SILENCED = True
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        previous(unraisable)

    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(lambda record: not record.getMessage().startswith(
        ("Task exception was never retrieved", "Future exception was never retrieved")))


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax logs a warning per damaged file it meets; the reader reports the damage itself, in one line."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _this_process_only() -> Any:
    """Orbax options making each process an independent single-process user: in a multi-host job the
    state is gathered (``PipelineExecutor.host_state``) and process 0 alone writes; every process reads."""
    import jax
    import orbax.checkpoint as ocp

    if jax.process_count() == 1:
        return ocp.options.MultiprocessingOptions()
    me = jax.process_index()
    return ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"arena-run-p{me}")


def _dtype_name(dtype: str) -> str:
    """One spelling of a dtype (a checkpoint written before names were normalised may say "bfloat16")."""
    try:
        return normalize_dtype(dtype)
    except ArenaError:
        return dtype


class CheckpointStore:
    """Checkpoints of one job in ``directory`` (one orbax step directory per save, the newest few kept)."""

    def __init__(self, directory: str | os.PathLike[str], max_to_keep: int = 2):
        self.directory = Path(directory).absolute()
        self.max_to_keep = max_to_keep
        self._manager: Any = None
        if self.directory.exists() and not self.directory.is_dir():
            raise ArenaError(f"checkpoint directory {directory} is not a directory")

    def _open(self, create: bool) -> Any:
        with _quiet_orbax():
            return self._open_manager(create)

    def _open_manager(self, create: bool) -> Any:
        import orbax.checkpoint as ocp

        if self._manager is None:
            if not create and not self.directory.exists():
                return None
            only_me = _this_process_only()
            if create:  # only the checkpoint directory itself: a missing parent is an error, not a new tree
                try:
                    self.directory.mkdir(exist_ok=True)
                except FileNotFoundError:
                    raise ArenaError(f"cannot create the checkpoint directory {self.directory}: "
                                     f"{self.directory.parent} does not exist") from None
            options = ocp.CheckpointManagerOptions(max_to_keep=self.max_to_keep, enable_async_checkpointing=False,
                                                   create=False, multiprocessing_options=only_me)
            self._manager = ocp.CheckpointManager(self.directory, options=options)
        else:
            # Another process (a restarted actor) may have saved since: re-read the step list.
            self._manager.reload()
        return self._manager

    def latest_step(self) -> int | None:
        with _quiet_orbax():
            manager = self._open(create=False)
            return None if manager is None else manager.latest_step()

    def steps(self) -> list[int]:
        with _quiet_orbax():
            manager = self._open(create=False)
            return [] if manager is None else list(manager.all_steps())

    def read_meta(self, step: int | None = None) -> CheckpointMeta | None:
        import orbax.checkpoint as ocp

        manager = self._open(create=False)
        step = self.latest_step() if step is None else step
        if manager is None or step is None:
            return None
        where = f"{self.directory / str(step)}"
        try:
            with _quiet_orbax():
                meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        except Exception as exc:  # noqa: BLE001 - any failure to read is a corrupt checkpoint
            _silence_abandoned_reads()
            raise ArenaError(f"checkpoint {where} is corrupt or unreadable: {_reason(exc)}") from None
        if not isinstance(meta, dict):
            raise ArenaError(f"checkpoint {where} is corrupt: metadata is not a JSON object")
        return CheckpointMeta.from_dict(meta, where)

    def newest_usable(self, model: ModelDef, global_batch: int, data_seed: int, optimizer: OptimizerConfig,
                      below: int | None = None, dtype: str | None = None) -> tuple[CheckpointMeta | None, list[dict[str, Any]]]:
        """The newest checkpoint (older than ``below``) whose metadata reads and is consistent, and the newer ones
        skipped on the way, each with why (``{"step", "path", "why"}``): a corrupt or empty latest checkpoint
        (a save killed half-way, a full disk) does not block resuming from an earlier one. When none is usable
        the first problem is an error (starting over would overwrite them). A readable checkpoint of another job
        (model, batch, data seed, optimizer, parameter shapes, compute dtype when ``dtype`` is given) is an error
        too: it is not damage, and training over it would mix two jobs."""
        skipped: list[dict[str, Any]] = []
        for step in sorted(self.steps(), reverse=True):
            if below is not None and step >= below:
                continue
            try:
                meta = self.read_meta(step)
                if meta is None or meta.step != step:
                    raise ArenaError(f"checkpoint {self.directory / str(step)} is corrupt: its metadata names step "
                                     f"{None if meta is None else meta.step}")
                if meta.data_position != meta.step * meta.global_batch:
                    raise ArenaError(f"checkpoint {self.directory / str(step)} is inconsistent: data position "
                                     f"{meta.data_position} after {meta.step} steps of {meta.global_batch}")
            except ArenaError as exc:
                skipped.append({"step": step, "path": str(self.directory / str(step)), "why": str(exc)})
                continue
            self.check_compatible(meta, model, global_batch, data_seed, optimizer, dtype)
            return meta, skipped
        if skipped:
            raise ArenaError(f"{skipped[0]['why']}; no earlier checkpoint in {self.directory} is usable (move the "
                             f"directory aside to start over)")
        return None, skipped

    def check_compatible(self, meta: CheckpointMeta, model: ModelDef, global_batch: int, data_seed: int, optimizer: OptimizerConfig,
                         dtype: str | None = None) -> None:
        where = f"checkpoint {self.directory / str(meta.step)}"
        if dtype is not None and _dtype_name(meta.dtype) != _dtype_name(dtype):
            raise ArenaError(f"{where} was trained in {meta.dtype}, not {dtype} (resuming keeps the compute dtype)")
        if meta.model != model.name:
            raise ArenaError(f"{where} is for model {meta.model!r}, not {model.name!r}")
        if meta.global_batch != global_batch:
            raise ArenaError(f"{where} was trained with global batch {meta.global_batch}, not {global_batch} (resuming keeps the global batch)")
        if meta.data_seed != data_seed:
            raise ArenaError(f"{where} was trained on data seed {meta.data_seed}, not {data_seed}")
        if meta.param_signature != param_signature(model):
            raise ArenaError(f"{where} holds parameters of a different {model.name} configuration")
        if meta.optimizer != asdict(optimizer):
            raise ArenaError(f"{where} was trained with optimizer {meta.optimizer}, not {asdict(optimizer)}")
        if meta.data_position != meta.step * meta.global_batch:
            raise ArenaError(f"{where} is inconsistent: data position {meta.data_position} after {meta.step} steps of {meta.global_batch}")

    def restore(self, model: ModelDef, optimizer: OptimizerConfig, step: int | None = None) -> tuple[list[Any], list[Any], CheckpointMeta]:
        """(per-unit params, per-unit optimizer state, meta) as host numpy arrays."""
        import jax
        import orbax.checkpoint as ocp

        meta = self.read_meta(step)
        if meta is None:
            raise ArenaError(f"no checkpoint in {self.directory}")
        step = meta.step if step is None else step
        where = f"{self.directory / str(step)}"
        template = _state_template(model, optimizer)
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), template)
        try:
            with _quiet_orbax():
                state = self._manager.restore(
                    step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(item=template, restore_args=restore_args))
                ).state
        except Exception as exc:  # noqa: BLE001
            _silence_abandoned_reads()
            raise ArenaError(f"checkpoint {where} is corrupt or does not match {model.name}: {_reason(exc)}") from None
        for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(template)):
            if np.shape(got) != want.shape:
                raise ArenaError(f"checkpoint {where} does not match {model.name}: array of shape {np.shape(got)}, expected {want.shape}")
        from libarena.models.training import abstract_optimizer_state

        opt = [
            jax.tree.unflatten(jax.tree.structure(shapes), [np.asarray(x) for x in leaves])
            for shapes, leaves in zip(abstract_optimizer_state(state["params"], optimizer), state["opt"])
        ]
        return list(state["params"]), opt, meta

    def set_aside(self, step: int) -> Path | None:
        """Rename the unusable checkpoint of ``step`` to ``unusable-<step>[-k]`` in the same directory (None: it is
        gone). A run that resumed from an earlier one saves that step again, which a damaged directory of the same
        step would refuse; orbax's keep-the-newest cleanup would count it too, and delete the good ones first.
        Kept, not deleted: a checkpoint that failed to read for a passing reason (a network file system) is
        still there to be looked at."""
        source = self.directory / str(step)
        for k in range(1000):
            target = self.directory / (f"unusable-{step}" if k == 0 else f"unusable-{step}-{k}")
            if target.exists():
                continue
            try:
                os.rename(source, target)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise ArenaError(f"cannot set the unusable checkpoint {source} aside: {exc.strerror or exc}") from None
            if self._manager is not None:
                with _quiet_orbax():
                    self._manager.reload()
            return target
        raise ArenaError(f"cannot set the unusable checkpoint {source} aside: {self.directory} holds 1000 such copies")

    def save(self, unit_params: list[Any], unit_opt: list[Any], meta: CheckpointMeta) -> Path:
        import jax
        import orbax.checkpoint as ocp

        manager = self._open(create=True)
        state = {"params": list(unit_params), "opt": [jax.tree.leaves(s) for s in unit_opt]}
        manager.save(meta.step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state), meta=ocp.args.JsonSave(asdict(meta))), force=True)
        manager.wait_until_finished()
        return self.directory / str(meta.step)

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None
