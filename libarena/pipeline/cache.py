"""Where the pipeline's stage outputs are cached (``--cache-dir``) and whether a run recomputes (``--no-cache``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from libarena.artifacts.stage_cache import DEFAULT_CACHE_DIR, StageCache
from libarena.progress import Report


@dataclass(frozen=True)
class CacheSettings:
    #: the cache root (None: .arena-cache in the working directory)
    cache_dir: Path | None = None
    #: recompute and refresh the entry instead of serving it
    refresh: bool = False

    @property
    def root(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir is not None else DEFAULT_CACHE_DIR

    def stage(self, name: str, report: Report) -> StageCache:
        return StageCache(self.cache_dir, name, refresh=self.refresh, log=report.log, warn=report.warn)

    def reuse(self) -> CacheSettings:
        """The same cache without --no-cache: the steps a stage builds on (an operator table under a plan)
        are served from the cache even when the stage itself recomputes."""
        return CacheSettings(self.cache_dir, False)
