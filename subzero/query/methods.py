"""The ways a trace step can map cells through an operator, and the simple rule
that orders them when no query-time planner prices them.

A method is a small frozen value: :class:`Stored` (one stored strategy),
:class:`Mapping` (the operator's mapping functions) or :class:`Reexec`
(black-box re-execution).  Its ``name`` is the spelling step statistics,
the catalog's trace log and the optimizer's cost model use
(``"stored:full:fullone:backward"``, ``"map"``, ``"reexec"``; a re-execution
step reports the mode it captured, ``"reexec:full"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Mapping as MappingT
from dataclasses import dataclass
from typing import ClassVar

from subzero.model.modes import Mode
from subzero.model.operator import Operator
from subzero.model.strategy import Strategy, parse_one


@dataclass(frozen=True)
class Stored:
    """Read the pairs one stored strategy keeps."""

    strategy: Strategy
    family: ClassVar[str] = "stored"

    @property
    def name(self) -> str:
        return f"stored:{self.strategy}"

    def indexed(self, backward: bool) -> bool:
        """Whether the strategy is keyed on the step's query side (a lookup, not a scan)."""
        return self.strategy.backward == backward


@dataclass(frozen=True)
class Mapping:
    """Call the operator's mapping functions (``map_b`` / ``map_f``)."""

    family: ClassVar[str] = "map"
    name: ClassVar[str] = "map"


@dataclass(frozen=True)
class Reexec:
    """Re-run the operator on its stored inputs, keeping only the pairs the query touches."""

    family: ClassVar[str] = "reexec"
    name: ClassVar[str] = "reexec"


Method = Stored | Mapping | Reexec

_RANK = {Mode.FULL: 0, Mode.COMP: 1, Mode.PAY: 2}


def simple_order(op: Operator, strategies: tuple[Strategy, ...], backward: bool) -> list[Method]:
    """The simple rule: stored lineage indexed in the step's direction (Full before
    Comp before Pay, and of a mode a One encoding before a Many one), mapping functions
    where the operator stores Map, stored lineage indexed the other way, then
    re-execution (always possible).  A Many encoding reads an R-tree, whose library a
    fresh process imports first (about 50 ms, against a lookup's fraction of a
    millisecond at genomics 1x): with FullMany first, a query-time planner priced that
    step over its floor and then weighed every method, a query 1.4x the defaults'."""
    stored = [Stored(s) for s in sorted((s for s in strategies if s.stored),
                                        key=lambda s: (_RANK[s.mode], s.many))]
    methods: list[Method] = [m for m in stored if m.indexed(backward)]
    if any(s.mode is Mode.MAP for s in strategies) and op.has_mapping():
        methods.append(Mapping())
    methods += [m for m in stored if not m.indexed(backward)]
    methods.append(Reexec())
    return methods


def fallback_order(rest: Sequence[Method]) -> list[Method]:
    """What to try after a stored strategy was found damaged: the operator's other
    stored strategies first (exact, and usually cheaper than the rest), then mapping
    functions, then re-execution, each group in the order it had."""
    return [m for m in rest if isinstance(m, Stored)] + [m for m in rest if not isinstance(m, Stored)]


def preferred(prefer: str, methods: list[Method], op: Operator) -> Method | None:
    """The method ``prefer`` names ("map", "reexec" or a strategy spec) when this step
    can use it; None otherwise (the step then keeps its order)."""
    if prefer == "map":   # mapping alone is lineage only for operators that declare MAP
        return Mapping() if Mode.MAP in op.supported_modes() and op.has_mapping() else None
    if prefer == "reexec":
        return Reexec()
    try:
        s = parse_one(prefer)
    except Exception:
        return None
    return Stored(s) if Stored(s) in methods else None


def rank(op: Operator, strategies: tuple[Strategy, ...], backward: bool,
         prefer: str | None = None) -> tuple[Method, ...]:
    """The simple rule's order, with the ``prefer``-red method first when usable."""
    methods = simple_order(op, strategies, backward)
    if prefer:
        pick = preferred(prefer, methods, op)
        if pick is not None:
            if pick in methods:
                methods.remove(pick)
            methods.insert(0, pick)
    return tuple(methods)


class MethodTable:
    """Every step's methods in the simple rule's order, for one run (cached: a run's
    strategies and operators never change)."""

    def __init__(self, strategies: MappingT[str, tuple[Strategy, ...]],
                 operator_of: Callable[[str], Operator]):
        self.strategies = strategies
        self.operator_of = operator_of
        self._cache: dict[tuple[str, bool, str | None], tuple[Method, ...]] = {}

    def __call__(self, name: str, backward: bool, prefer: str | None = None) -> tuple[Method, ...]:
        key = (name, backward, prefer)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = rank(self.operator_of(name), self.strategies.get(name, ()),
                                          backward, prefer)
        return hit
