"""Named registries: what a recipe's names (`agent: search_r1`, `reward: {f1: 1}`, `policy: lm`)
resolve to. The core declares each registry empty, or with its generic entries; the method records in
`ragrl.methods` fill in what each method adds, when that package is imported.

A lookup of a name the registry lacks imports `ragrl.methods` once before it gives up: the one
place where a lower layer reaches up, by name and on purpose, as a plugin system's discovery does
(a recipe may name any method without its caller importing the method first).

>>> colours = Registry("colour", {"red": 1})
>>> colours["red"], "blue" in colours
(1, False)
>>> colours.register("blue", 2); sorted(colours)
['blue', 'red']
>>> colours["bleu"]
Traceback (most recent call last):
...
ragrl.errors.ConfigError: unknown colour 'bleu'; did you mean 'blue'? (known: blue, red)
"""
from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from ragrl.errors import ConfigError

V = TypeVar("V")
PLUGINS = "ragrl.methods"   # the package whose import fills the registries


def load_plugins() -> None:
    """Import the method records (idempotent); they register what each method adds."""
    importlib.import_module(PLUGINS)


class Registry(Mapping[str, V], Generic[V]):
    """A name -> value mapping that refuses a second entry under one name and names the known
    ones (and the nearest) when a lookup fails."""

    def __init__(self, what: str, entries: Mapping[str, V] | None = None):
        self.what = what
        self._entries: dict[str, V] = dict(entries or {})

    def register(self, name: str, value: V, *, replace: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a {self.what} needs a non-empty name, got {name!r}")
        if name in self._entries and not replace and self._entries[name] is not value:
            raise ConfigError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = value

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def __getitem__(self, name: str) -> V:
        if name not in self._entries:
            load_plugins()
        if name not in self._entries:
            near = difflib.get_close_matches(str(name), list(self._entries), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"unknown {self.what} {name!r}{hint} (known: {', '.join(sorted(self._entries))})")
        return self._entries[name]

    # Membership, iteration and size see the registry filled: a caller never has to know whether
    # `ragrl.methods` was imported before it asked.
    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        load_plugins()
        return iter(dict(self._entries))

    def __len__(self) -> int:
        load_plugins()
        return len(self._entries)

    def get(self, name: str, default=None):
        return self._entries.get(name, default) if name in self else default

    def registered(self) -> dict[str, V]:
        """The entries registered so far, without loading the plugins (for a plugin registering itself)."""
        return dict(self._entries)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self)
