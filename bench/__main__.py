"""Run every benchmark module (or those named on the command line) and write bench/results/*.json.

A module that sets ``REQUIRES_GPU`` (bench_gpu) runs only when named (``python -m bench gpu``). A module may
refuse to run here with a one-line reason (an exception of a class it lists in ``REFUSALS``, raised by its
``preflight()`` or its ``run``): the reason is printed alone and the exit status is 2, without a traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str]) -> int:
    names = [m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_")]
    wanted = [f"bench_{a}" if not a.startswith("bench_") else a for a in argv]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        print(f"unknown benchmark {unknown[0].removeprefix('bench_')!r} (known: {', '.join(n.removeprefix('bench_') for n in sorted(names))})",
              file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in sorted(names):
        if wanted and name not in wanted:
            continue
        module = importlib.import_module(f"bench.{name}")
        if getattr(module, "REQUIRES_GPU", False) and name not in wanted:
            continue
        start = time.perf_counter()
        try:
            getattr(module, "preflight", lambda: None)()
            print(f"== {name}", file=sys.stderr, flush=True)
            ok = module.run(RESULTS)
        except getattr(module, "REFUSALS", ()) as exc:
            print(exc, file=sys.stderr)
            return 2
        print(f"== {name}: {'ok' if ok else 'TARGET MISSED'} in {time.perf_counter() - start:.1f}s", file=sys.stderr)
        if not ok:
            failed.append(name)
    if failed:
        print(f"targets missed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
