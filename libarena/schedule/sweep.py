"""A sweep: every combination of traces x ablation variants x seeds x policies, one simulation each.

The spec is a YAML file (``arena-schedule sweep SPEC.yaml``) or the same fields as options::

    cluster: ../clusters/paper-sim-1280.yaml       # paths are relative to the spec file's folder
    traces:                                        # name -> the trace and its performance table
      philly: {trace: out/philly/trace.csv, perf: out/philly/perf.parquet}
      venus: {trace: out/venus/trace.csv, perf: out/venus/perf.parquet}
    policies: [arena, fcfs, gavel, elasticflow, elasticflow-ls, sia]
    seeds: [0, 1, 2]                               # SimulatorConfig.seed (default [0])
    variants:                                      # ablations: policy options, optionally for some policies only
      default: {}
      no-hetero: {options: {hetero: false}, policies: [arena]}
      depth-1: {options: {search_depth: 1}, policies: [arena]}
    simulator: {tick: 300, horizon: 600000, skip_bad_rows: true, overheads: {checkpoint_resume_s: 120}}
    layout: "{trace}/{variant}/seed-{seed}"        # where each comparison goes (default: the dimensions
                                                   # with more than one value, e.g. "{trace}")

A variant that names ``policies`` applies only to those the sweep runs (the others are not simulated under
it). Each
(trace, variant, seed) is a comparison of its policies, written under ``OUTPUT/<layout>/``: one
sub-directory per policy (what ``arena-schedule simulate`` writes), ``compare.json`` and ``table.txt``.
The scheduler's side only: running the simulations (in-process or on Ray) and caching them is
libarena.pipeline.sweep's.
"""

from __future__ import annotations

import collections
import os
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from libarena.checks import brief
from libarena.errors import ArenaError
from libarena.schedule.config import OverheadConfig, SimulatorConfig

#: the placeholders of a layout, one per dimension of the sweep
LAYOUT_FIELDS = ("trace", "variant", "seed")


@dataclass(frozen=True)
class SweepTrace:
    name: str
    trace: Path
    perf: Path


@dataclass(frozen=True)
class SweepVariant:
    """An ablation: options of the policies' configurations (``make_policy``), for ``policies`` only (None: all)."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    policies: tuple[str, ...] | None = None

    def applies_to(self, policy: str) -> bool:
        return self.policies is None or policy in self.policies


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of a sweep."""

    trace: SweepTrace
    variant: SweepVariant
    seed: int
    policy: str
    #: the comparison it belongs to: a folder under the sweep's output
    group: str

    @property
    def label(self) -> str:
        return f"{self.group}/{self.policy}" if self.group else self.policy

    @property
    def output(self) -> str:
        """Its folder under the sweep's output."""
        return self.label


@dataclass(frozen=True)
class SweepSpec:
    cluster: Path
    traces: tuple[SweepTrace, ...]
    policies: tuple[str, ...]
    seeds: tuple[int, ...] = (0,)
    variants: tuple[SweepVariant, ...] = (SweepVariant("default"),)
    tick_s: float = 300.0
    horizon_s: float | None = None
    skip_bad_rows: bool = False
    overheads: OverheadConfig = field(default_factory=OverheadConfig)
    #: where each comparison goes under the output, from LAYOUT_FIELDS (None: the dimensions with several values)
    layout: str | None = None
    #: the spec file it was read from (None: options only): an input the sweep must not write over
    spec_file: Path | None = None

    def __post_init__(self) -> None:
        from libarena.schedule.policies import get_policy

        if not self.traces:
            raise ArenaError("sweep: no traces")
        if not self.policies:
            raise ArenaError("sweep: no policies")
        if not self.seeds:
            raise ArenaError("sweep: no seeds")
        if not self.variants:
            raise ArenaError("sweep: no variants")
        for what, names in (("trace", [t.name for t in self.traces]), ("policy", list(self.policies)),
                            ("seed", [str(s) for s in self.seeds]), ("variant", [v.name for v in self.variants])):
            repeated = sorted(n for n, count in collections.Counter(names).items() if count > 1)
            if repeated:
                raise ArenaError(f"sweep: {what} {repeated[0]!r} is given twice")
            bad = [n for n in names if not _folder_name(n)]
            if bad:
                raise ArenaError(f"sweep: {what} name {brief(bad[0])} cannot name a folder")
        for policy in self.policies:
            get_policy(policy)  # an unknown policy is an error naming the known ones
        for variant in self.variants:
            for policy in variant.policies or ():
                get_policy(policy)  # a misspelt name is an error, one the sweep does not run is not
        SimulatorConfig(tick_s=self.tick_s, horizon_s=self.horizon_s)  # validates tick and horizon
        layout = self.group_layout
        try:
            fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(layout)
                      if name is not None]
        except ValueError as exc:
            raise ArenaError(f"sweep: layout {brief(layout)}: {exc}") from None
        formatted = [f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"[:60]
                     for name, spec, conversion in fields if spec or conversion]
        if formatted:  # a format spec is a way to fail ({trace:d}) or to write gigabytes of padding ({trace:>400000000})
            raise ArenaError(f"sweep: layout {brief(layout)} formats a field ({formatted[0]}); use the plain "
                             f"{', '.join(f'{{{f}}}' for f in LAYOUT_FIELDS)}")
        placeholders = {name for name, _, _ in fields}
        unknown = sorted(placeholders - set(LAYOUT_FIELDS))
        if unknown:
            raise ArenaError(f"sweep: layout {brief(layout)} has {{{unknown[0]}}}; it may use {', '.join(f'{{{f}}}' for f in LAYOUT_FIELDS)}")
        for dim, size in (("trace", len(self.traces)), ("variant", len(self.variants)), ("seed", len(self.seeds))):
            if size > 1 and dim not in placeholders:
                raise ArenaError(f"sweep: layout {brief(layout)} lacks {{{dim}}}, but the sweep has {size} of them")
        example = Path(layout.format(trace="t", variant="v", seed=0))
        if Path(layout).is_absolute() or ".." in example.parts:
            raise ArenaError(f"sweep: layout {brief(layout)} must stay inside the output folder")
        if any(not _folder_name(part) for part in example.parts):
            raise ArenaError(f"sweep: layout {brief(layout)} cannot name folders (a character that is not printable, "
                             f"or a part of more than 255 bytes)")
        groups: dict[str, tuple[str, str, int]] = {}
        for trace in self.traces:  # two comparisons in one folder: the later would overwrite the earlier's runs
            for variant in self.variants:
                for seed in self.seeds:
                    group = self.group(trace.name, variant.name, seed)
                    if any(not _folder_name(part) for part in Path(group).parts):  # names joined past 255 bytes
                        raise ArenaError(f"sweep: layout {brief(layout)} makes folder {brief(group)} for trace "
                                         f"{brief(trace.name)}, variant {brief(variant.name)}, seed {seed}: a part of "
                                         f"more than 255 bytes")
                    other = groups.setdefault(group, (trace.name, variant.name, seed))
                    if other != (trace.name, variant.name, seed):
                        raise ArenaError(f"sweep: layout {brief(layout)} puts trace {brief(other[0])}, variant "
                                         f"{brief(other[1])}, seed {other[2]} and trace {brief(trace.name)}, variant "
                                         f"{brief(variant.name)}, seed {seed} in one folder ({brief(group or '.')})")

    @property
    def group_layout(self) -> str:
        if self.layout is not None:
            return self.layout
        parts = [("trace", "{trace}", len(self.traces)), ("variant", "{variant}", len(self.variants)),
                 ("seed", "seed-{seed}", len(self.seeds))]
        return "/".join(text for _, text, size in parts if size > 1)

    def simulator_config(self, seed: int) -> SimulatorConfig:
        return SimulatorConfig(tick_s=self.tick_s, horizon_s=self.horizon_s, seed=seed, overheads=self.overheads)

    def group(self, trace: str, variant: str, seed: int) -> str:
        """The folder (relative to the output) of one comparison; "" for the output itself."""
        group = Path(self.group_layout.format(trace=trace, variant=variant, seed=seed)).as_posix()
        return "" if group == "." else group

    def points(self) -> list[SweepPoint]:
        """Every simulation, by trace, variant, seed, then policy (the order of the spec)."""
        out = []
        for trace in self.traces:
            for variant in self.variants:
                for seed in self.seeds:
                    group = self.group(trace.name, variant.name, seed)
                    out.extend(SweepPoint(trace, variant, seed, policy, group)
                               for policy in self.policies if variant.applies_to(policy))
        return out


def _folder_name(name: str) -> bool:
    """Whether a trace, variant or seed name (or a layout's part) can name a folder on every common file system,
    and be shown: not empty, ``.`` or ``..``, no ``/``, only printable characters (no NUL, no other control or
    invisible format character), at most 255 bytes."""
    return (bool(name) and name not in (".", "..") and "/" not in name and name.isprintable()
            and len(name.encode("utf-8", "surrogatepass")) <= 255)


# -- reading a spec -------------------------------------------------------------------------------------------


def _mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ArenaError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _names(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ArenaError(f"{where}: expected a list of names")
    return tuple(value)


def _path(value: Any, where: str, base: Path) -> Path:
    if not isinstance(value, str) or not value:
        raise ArenaError(f"{where}: expected a path")
    return Path(os.path.abspath(base / Path(value).expanduser()))


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArenaError(f"{where}: expected a number, got {value!r}")
    return float(value)


def sweep_spec_from_dict(data: Any, source: str = "sweep spec", base_dir: Path | None = None) -> SweepSpec:
    """A spec from its YAML mapping; relative paths are relative to ``base_dir`` (default: the working folder)."""
    base = Path(os.path.abspath(base_dir or Path.cwd()))
    data = _mapping(data, source)
    known = {"cluster", "traces", "policies", "seeds", "variants", "simulator", "layout"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ArenaError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    for key in ("cluster", "traces", "policies"):
        if key not in data:
            raise ArenaError(f"{source}: {key!r} is missing")
    traces = []
    for name, entry in _mapping(data["traces"], f"{source}: traces").items():
        where = f"{source}: traces.{name}"
        entry = _mapping(entry, where)
        extra = sorted(set(entry) - {"trace", "perf"})
        if extra or "trace" not in entry or "perf" not in entry:
            raise ArenaError(f"{where}: expected {{trace: PATH, perf: PATH}}")
        traces.append(SweepTrace(str(name), _path(entry["trace"], f"{where}.trace", base),
                                 _path(entry["perf"], f"{where}.perf", base)))
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ArenaError(f"{source}: seeds: expected a list of integers")
    variants = []
    for name, entry in _mapping(data.get("variants", {"default": {}}), f"{source}: variants").items():
        where = f"{source}: variants.{name}"
        entry = _mapping(entry or {}, where)
        if set(entry) - {"options", "policies"}:
            # the short form: the mapping is the options
            entry = {"options": entry}
        options = _mapping(entry.get("options") or {}, f"{where}.options")
        named = [k for k in options if not isinstance(k, str)]
        if named:
            raise ArenaError(f"{where}.options: {brief(named[0])} is not an option name")
        policies = _names(entry["policies"], f"{where}.policies") if "policies" in entry else None
        variants.append(SweepVariant(str(name), dict(options), policies))
    sim = _mapping(data.get("simulator") or {}, f"{source}: simulator")
    extra = sorted(set(sim) - {"tick", "horizon", "skip_bad_rows", "overheads"})
    if extra:
        raise ArenaError(f"{source}: simulator.{extra[0]}: unknown (known: tick, horizon, skip_bad_rows, overheads)")
    overheads = _mapping(sim.get("overheads") or {}, f"{source}: simulator.overheads")
    layout = data.get("layout")
    if layout is not None and not isinstance(layout, str):
        raise ArenaError(f"{source}: layout: expected a string like \"{{trace}}/seed-{{seed}}\"")
    skip = sim.get("skip_bad_rows", False)
    if not isinstance(skip, bool):
        raise ArenaError(f"{source}: simulator.skip_bad_rows: expected true or false")
    return SweepSpec(
        cluster=_path(data["cluster"], f"{source}: cluster", base),
        traces=tuple(traces),
        policies=_names(data["policies"], f"{source}: policies"),
        seeds=tuple(seeds),
        variants=tuple(variants),
        tick_s=_number(sim.get("tick", 300.0), f"{source}: simulator.tick"),
        horizon_s=None if sim.get("horizon") is None else _number(sim["horizon"], f"{source}: simulator.horizon"),
        skip_bad_rows=skip,
        overheads=OverheadConfig.from_assignments([f"{k}={v}" for k, v in overheads.items()]),
        layout=layout,
    )




#: what a sweep compares when neither a spec nor --policies says (arena-schedule compare's default)
DEFAULT_POLICIES = ("arena", "fcfs", "elasticflow-ls", "gavel", "sia")


def _named_path(text: str) -> tuple[str | None, str]:
    """``NAME=PATH`` or ``PATH`` (a name has no '/')."""
    name, sep, path = text.partition("=")
    if sep and name and "/" not in name and path:
        return name, path
    return None, text


def build_sweep_spec(spec_file: str | Path | None = None, *, traces: list[str] = (), perfs: list[str] = (),
                     cluster: str | Path | None = None, policies: str | None = None, seeds: str | None = None,
                     tick_s: float | None = None, horizon_s: float | None = None, overheads: list[str] = (),
                     skip_bad_rows: bool = False, layout: str | None = None) -> SweepSpec:
    """The spec of ``arena-schedule sweep``: the spec file's (if any), with the fields the options give
    replaced (``traces``: ``[NAME=]PATH``, the name defaulting to the file's stem; ``perfs``: ``[NAME=]PATH``,
    without a name for every trace; ``policies`` and ``seeds`` comma-separated; ``overheads`` NAME=SECONDS).
    Paths given as options are relative to the working folder, those in the file to the file's folder."""
    from libarena.artifacts.untrusted import load_spec_file

    data: dict[str, Any] = {}
    source, base = "sweep options", Path.cwd()
    if spec_file is not None:
        p = Path(spec_file)
        # the limits of every hand-written spec: size, depth, no YAML aliases (a few lines can expand to gigabytes)
        data = dict(_mapping(load_spec_file(p, "sweep spec") or {}, str(p)))
        source, base = str(p), p.parent

    def given(path: str | Path) -> str:
        return os.path.abspath(Path(path).expanduser())

    if traces:
        data["traces"] = {}
        for text in traces:
            name, path = _named_path(text)
            name = name or Path(path).stem
            if name in data["traces"]:
                raise ArenaError(f"--trace {text!r}: trace {name!r} is given twice")
            data["traces"][name] = {"trace": given(path)}
    if "traces" in data:
        data["traces"] = dict(_mapping(data["traces"] or {}, f"{source}: traces"))
    if perfs:
        entries = _mapping(data.setdefault("traces", {}), f"{source}: traces")
        for text in perfs:
            name, path = _named_path(text)
            if name is not None and name not in entries:
                raise ArenaError(f"--perf {text!r}: no trace named {name!r} (traces: {', '.join(entries) or 'none'})")
            for trace in entries if name is None else [name]:
                _mapping(entries[trace], f"{source}: traces.{trace}")["perf"] = given(path)
    for name, entry in (data.get("traces") or {}).items():
        if isinstance(entry, dict) and "perf" not in entry:
            raise ArenaError(f"trace {name!r} has no performance table (give --perf {name}=PATH, or --perf PATH for all)")
    if cluster is not None:
        data["cluster"] = given(cluster)
    if policies is not None:
        data["policies"] = [p.strip() for p in policies.split(",") if p.strip()]
    elif "policies" not in data:
        data["policies"] = list(DEFAULT_POLICIES)
    if seeds is not None:
        try:
            data["seeds"] = [int(s) for s in seeds.split(",") if s.strip()]
        except ValueError:
            raise ArenaError(f"--seeds {seeds!r}: expected integers separated by commas") from None
    sim = dict(_mapping(data.get("simulator") or {}, f"{source}: simulator"))
    if tick_s is not None:
        sim["tick"] = tick_s
    if horizon_s is not None:
        sim["horizon"] = horizon_s
    if skip_bad_rows:
        sim["skip_bad_rows"] = True
    if overheads:
        sim["overheads"] = {**_mapping(sim.get("overheads") or {}, f"{source}: simulator.overheads"),
                            **{k: v for k, _, v in (o.partition("=") for o in overheads)}}
        OverheadConfig.from_assignments(list(overheads))  # a malformed one is named as given
    data["simulator"] = sim
    if layout is not None:
        data["layout"] = layout
    spec = sweep_spec_from_dict(data, source, base)
    return spec if spec_file is None else replace(spec, spec_file=Path(os.path.abspath(spec_file)))
