"""On-disk content-addressed cache of profiled stages (and of the local device's roofline spec).

One JSON file per key under ``<root>/<key[:2]>/<key>.json``, written atomically (temp file + rename), so
an interrupted run never leaves a half-written entry; an unreadable or inconsistent entry is a miss and
is overwritten by the next profile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libarena.artifacts import write_json
from libarena.errors import ArenaError

CACHE_FORMAT = 1


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "arena" / "profile"


@dataclass
class ProfileCache:
    root: Path
    hits: int = 0
    misses: int = 0
    writes: int = 0
    _memory: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArenaError(f"cannot use profile cache {self.root}: {exc.strerror or exc}") from None

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        path = self.path(key)
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            self.misses += 1
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or entry.get("format") != CACHE_FORMAT or "value" not in entry:
            self.misses += 1
            return None
        self.hits += 1
        self._memory[key] = entry["value"]
        return entry["value"]

    def put(self, key: str, value: dict[str, Any]) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"format": CACHE_FORMAT, "key": key, "value": value})
        self._memory[key] = value
        self.writes += 1

    def entries(self) -> list[Path]:
        return sorted(self.root.glob("*/*.json"))
