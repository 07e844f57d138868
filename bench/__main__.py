"""Run every benchmark module (or those named on the command line) and write bench/results/*.json."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str]) -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    names = [m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_")]
    wanted = [f"bench_{a}" if not a.startswith("bench_") else a for a in argv]
    failed = []
    for name in sorted(names):
        if wanted and name not in wanted:
            continue
        start = time.perf_counter()
        print(f"== {name}", file=sys.stderr, flush=True)
        module = importlib.import_module(f"bench.{name}")
        ok = module.run(RESULTS)
        print(f"== {name}: {'ok' if ok else 'TARGET MISSED'} in {time.perf_counter() - start:.1f}s", file=sys.stderr)
        if not ok:
            failed.append(name)
    if failed:
        print(f"targets missed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
