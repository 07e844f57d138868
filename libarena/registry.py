"""One small registry for every pluggable kind (models, policies, launchers, GPU types, artifact kinds, timers).

A registry maps names to items; registering a name twice is a programming error, looking up an unknown one
is the user's (a one-line :class:`ArenaError` listing what is known). A registry whose items live in modules
that register themselves on import names a ``loader`` that imports them on first use, so importing the
registry stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from libarena.errors import ArenaError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str, loader: Callable[[], None] | None = None, case_sensitive: bool = True) -> None:
        #: what an item is, for messages ("policy", "GPU type")
        self.what = what
        self._loader = loader
        self._loaded = loader is None
        self._case_sensitive = case_sensitive
        self._items: dict[str, T] = {}
        #: alias (normalised) -> canonical name
        self._aliases: dict[str, str] = {}

    def _key(self, name: str) -> str:
        return str(name) if self._case_sensitive else str(name).lower()

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # set first: the loader's imports register into this very registry
            assert self._loader is not None
            self._loader()

    def register(self, name: str, item: T, aliases: tuple[str, ...] = ()) -> T:
        """Add ``item`` under ``name`` (and ``aliases``); the same item again is a no-op, another one an error."""
        if name in self._items and self._items[name] != item:
            raise ValueError(f"{self.what} {name!r} registered twice")
        self._items[name] = item
        for alias in (name, *aliases):
            self._aliases[self._key(alias)] = name
        return item

    def canonical(self, name: str) -> str:
        """The registered name ``name`` (or an alias of it) stands for; ArenaError when unknown."""
        self._load()
        found = self._aliases.get(self._key(name))
        if found is None:
            raise ArenaError(f"unknown {self.what} {name!r} (known: {', '.join(self.names())})")
        return found

    def get(self, name: str) -> T:
        return self._items[self.canonical(name)]

    def __contains__(self, name: object) -> bool:
        self._load()
        return isinstance(name, str) and self._key(name) in self._aliases

    def names(self) -> list[str]:
        """The registered names, sorted."""
        self._load()
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, item) pairs in registration order."""
        self._load()
        return iter(list(self._items.items()))
