"""A package's public names loaded on first use (PEP 562), so importing the package
costs nothing until a name is asked for (``subzero``, ``subzero.optimizer``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def attach(package: str, homes: Mapping[str, str], public: Sequence[str]
           ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``homes`` is
    imported from the module it names (relative to ``package`` when it starts with a
    dot) the first time it is asked for, and kept in the package's namespace."""
    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        vars(importlib.import_module(package))[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(public))
    return __getattr__, __dir__
