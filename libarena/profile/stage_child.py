"""One stage built and timed in a fresh interpreter of its own (``ProfileConfig.isolation = "child"``).

Why: a step runs at a speed that depends on what its process traced and compiled before (docs/profiler-accuracy.md,
"What the process compiled before"). ``arena-run`` builds one plan in a fresh process, while the profiling process has
lowered and compiled every stage of the model before it times the later ones. A child per stage builds only its
stage, as the runtime builds only its plan. The child speaks the :class:`StageSession` protocol, so the profiler
and the accuracy benchmark's interleaved (ABAB) timing use it the same way."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Any

from libarena.artifacts.io import json_default
from libarena.errors import ArenaError
from libarena.profile.device import split_device_name
from libarena.profile.stage import StageSpec
from libarena.profile.subprocess_devices import DeviceChild, serve_requests


class StageChild(DeviceChild):
    """``spec`` in a child on this process's ``device`` (``cpu:0``, ``gpu:1``: :attr:`LocalDevice.label`): ``build``
    compiles it (and its optimizer), ``time`` adds timed runs, ``record`` gives its profile record (from every
    sample, or one ``time`` call's), as :class:`libarena.profile.profiler.StageSession` does in this process.
    ``device_s`` counts the child's start. A GPU child sees that GPU alone (as its gpu:0); a host child has one host
    device, which is any of this process's host devices."""

    def __init__(self, spec: StageSpec, timer_name: str, *, device: str = "cpu:0", threading: Any = None, seed: int = 0,
                 burst: int = 4) -> None:
        t0 = time.perf_counter()
        platform, index = split_device_name(device)
        super().__init__("libarena.profile.stage_child", [timer_name, str(seed), str(burst)], 1,
                         what=f"profiling stage {spec.model}[{spec.start}:{spec.stop}] in a child", platform=platform,
                         threading=threading, device_index=None if platform == "cpu" else index)
        self.spec, self.timer_name, self.device, self.burst = spec, timer_name, device, burst
        self._started = t0
        self._built = False
        self._keys: dict[str, str] | None = None

    def _ask(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.ask({"op": op, "spec": asdict(self.spec), **fields})

    def build(self, repeats: int = 7) -> None:
        if not self._built:
            self._ask("build", repeats=repeats)
            self._built = True

    def time(self, warmup: int, repeats: int) -> None:
        self.build()
        self._ask("time", warmup=warmup, repeats=repeats)

    def record(self, chunk: int | None = None) -> dict[str, Any]:
        from libarena.profile.device import resolve_device
        from libarena.profile.profiler import optimizer_cache_key, stage_cache_key

        record = self._ask("record", chunk=chunk)["record"]
        if self._keys is None:
            # keyed as this process keys the stage: the child's own keys hold its cores and its layout's XLA flags
            # (libarena.profile.host.process_identity), by which nothing here looks the stage up (plans, co-run
            # timings); computed once, a benchmark asks for a record every turn
            local = resolve_device(self.device)
            self._keys = {"key": stage_cache_key(self.spec, local, self.timer_name, burst=self.burst),
                          "optimizer_key": optimizer_cache_key(self.spec, local, self.timer_name)}
        # the device was held from the child's start: interpreter, JAX and the build count too
        return {**record, **self._keys, "device_s": time.perf_counter() - self._started}


class StageChildren:
    """:class:`StageSession`'s interface over one :class:`StageChild` per stage (each built on first use, ended
    by ``release`` or ``close``)."""

    def __init__(self, timer_name: str, *, device: str = "cpu:0", threading: Any = None, seed: int = 0, burst: int = 4) -> None:
        self.timer_name, self.device, self.threading, self.seed, self.burst = timer_name, device, threading, seed, burst
        self._children: dict[StageSpec, StageChild] = {}

    def _child(self, spec: StageSpec) -> StageChild:
        if spec not in self._children:
            self._children[spec] = StageChild(spec, self.timer_name, device=self.device, threading=self.threading,
                                              seed=self.seed, burst=self.burst)
        return self._children[spec]

    def build(self, spec: StageSpec, repeats: int = 7) -> None:
        self._child(spec).build(repeats)

    def time(self, spec: StageSpec, warmup: int, repeats: int) -> None:
        self._child(spec).time(warmup, repeats)

    def record(self, spec: StageSpec, chunk: int | None = None) -> dict[str, Any]:
        if spec not in self._children:
            raise ArenaError(f"stage {spec.model}[{spec.start}:{spec.stop}] has not been timed yet")
        return self._children[spec].record(chunk)

    def release(self, spec: StageSpec) -> None:
        child = self._children.pop(spec, None)
        if child is not None:
            child.close()

    def close(self) -> None:
        for spec in list(self._children):
            self.release(spec)

    def __enter__(self) -> StageChildren:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _serve(timer_name: str, seed: int, burst: int) -> None:
    """The child side: a StageSession on this process's device, for the one stage the parent names."""
    from libarena.profile.device import resolve_device
    from libarena.profile.profiler import StageSession
    from libarena.profile.timers import select_timer

    local = resolve_device("local")
    session = StageSession(local, select_timer(timer_name, local.device), seed=seed, burst=burst)

    def spec_of(request: dict[str, Any]) -> StageSpec:
        return StageSpec(**request["spec"])  # every field a JSON scalar

    def build(request: dict[str, Any]) -> dict[str, Any]:
        session.build(spec_of(request), int(request["repeats"]))
        return {"ok": True}

    def time_stage(request: dict[str, Any]) -> dict[str, Any]:
        session.time(spec_of(request), int(request["warmup"]), int(request["repeats"]))
        return {"ok": True}

    def record(request: dict[str, Any]) -> dict[str, Any]:
        chunk = request.get("chunk")
        found = session.record(spec_of(request), None if chunk is None else int(chunk))
        return {"record": json.loads(json.dumps(found, default=json_default))}  # numpy scalars as the cache writes them

    serve_requests({"build": build, "time": time_stage, "record": record})


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
