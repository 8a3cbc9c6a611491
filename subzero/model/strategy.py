"""Storage strategies: (mode, encoding, direction) and their CLI spelling.

Spelling: ``full``, ``map``, ``blackbox``, ``pay``, ``comp`` (short forms), or
``MODE:ENCODING:DIRECTION`` such as ``comp:payone:backward``; several joined
with ``+`` (``full:fullmany:backward+full:fullone:forward``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

from subzero.errors import StrategyError
from subzero.model.modes import Mode
from subzero.model.operator import Operator


class Direction(enum.StrEnum):
    """Which side of a pair stored lineage is keyed (indexed) by.

    BACKWARD is keyed by output cells (fast output -> input traces), FORWARD by
    the cells of each input.  A trace step also has a direction; a step whose
    direction differs from the stored one must scan instead of look up."""

    BACKWARD = "backward"
    FORWARD = "forward"

    @staticmethod
    def of(backward: bool) -> "Direction":
        return Direction.BACKWARD if backward else Direction.FORWARD


class Encoding(enum.StrEnum):
    """The four encodings of stored lineage.

    *One* encodings index every key cell (a per-cell key index); *Many*
    encodings index each pair's bounding box in an R-tree.  *Full* encodings
    store the input cells of each pair, *Pay* encodings a payload for ``map_p``."""

    FULLONE = "fullone"
    FULLMANY = "fullmany"
    PAYONE = "payone"
    PAYMANY = "paymany"

    @property
    def one(self) -> bool:
        return self in (Encoding.FULLONE, Encoding.PAYONE)

    @property
    def many(self) -> bool:
        return not self.one

    @property
    def payload(self) -> bool:
        return self in (Encoding.PAYONE, Encoding.PAYMANY)


ENCODINGS = {Mode.FULL: (Encoding.FULLONE, Encoding.FULLMANY),
             Mode.PAY: (Encoding.PAYONE, Encoding.PAYMANY),
             Mode.COMP: (Encoding.PAYONE, Encoding.PAYMANY)}
DIRECTIONS = (Direction.BACKWARD, Direction.FORWARD)
_E = TypeVar("_E", Encoding, Direction)
_DEFAULT_ENCODING = {Mode.FULL: Encoding.FULLONE, Mode.PAY: Encoding.PAYONE,
                     Mode.COMP: Encoding.PAYONE}


@dataclass(frozen=True, order=True)
class Strategy:
    """One way to keep an operator's lineage: (mode, encoding, direction).

    MAP and BLACKBOX store nothing and have no encoding or direction."""

    mode: Mode
    encoding: Encoding | None = None
    direction: Direction | None = None

    def __post_init__(self) -> None:
        # accept the plain spellings too ("fullone", "backward"), kept as enums
        if self.encoding is not None and not isinstance(self.encoding, Encoding):
            object.__setattr__(self, "encoding", Encoding(self.encoding))
        if self.direction is not None and not isinstance(self.direction, Direction):
            object.__setattr__(self, "direction", Direction(self.direction))

    @property
    def stored(self) -> bool:
        return self.encoding is not None

    @property
    def many(self) -> bool:
        return self.encoding is not None and self.encoding.many

    @property
    def backward(self) -> bool:
        """Stored lineage keyed by output cells."""
        return self.direction is Direction.BACKWARD

    @property
    def payload(self) -> bool:
        return self.mode in (Mode.PAY, Mode.COMP)

    def __str__(self) -> str:
        return _spelling(self)


@lru_cache(maxsize=256)
def _spelling(s: Strategy) -> str:
    """A strategy's name; cached because the query planner keys its statistics by it
    on every step."""
    if not s.stored:
        return s.mode.value
    return f"{s.mode.value}:{s.encoding}:{s.direction}"


MAP = Strategy(Mode.MAP)
BLACKBOX = Strategy(Mode.BLACKBOX)


def parse_one(text: str) -> Strategy:
    """One strategy from its spelling (cached: the planner parses method names per step)."""
    return _parse_one(text)


@lru_cache(maxsize=1024)
def _parse_one(text: str) -> Strategy:
    parts = [p.strip().lower() for p in text.split(":")]
    try:
        mode = Mode(parts[0])
    except ValueError as err:
        raise StrategyError(f"unknown lineage mode {parts[0]!r} in strategy {text!r}; "
                            f"use one of {', '.join(m.value for m in Mode)}") from err
    if mode in (Mode.MAP, Mode.BLACKBOX):
        if len(parts) > 1:
            raise StrategyError(f"strategy {text!r}: {mode.value} stores nothing, so it takes "
                                f"no encoding or direction")
        return Strategy(mode)
    if len(parts) > 3:
        raise StrategyError(f"malformed strategy {text!r}; write MODE[:ENCODING[:DIRECTION]], "
                            f"e.g. full:fullone:backward")
    enc_text = parts[1] if len(parts) > 1 and parts[1] else _DEFAULT_ENCODING[mode].value
    dir_text = parts[2] if len(parts) > 2 and parts[2] else Direction.BACKWARD.value
    enc = _member(Encoding, enc_text)
    if enc is None or enc not in ENCODINGS[mode]:
        raise StrategyError(f"strategy {text!r}: mode {mode.value} uses encoding "
                            f"{' or '.join(ENCODINGS[mode])}, not {enc_text!r}")
    direction = _member(Direction, dir_text)
    if direction is None:
        raise StrategyError(f"strategy {text!r}: direction must be backward or forward, "
                            f"not {dir_text!r}")
    return Strategy(mode, enc, direction)


def _member(kind: type[_E], text: str) -> _E | None:
    """The enum member spelt ``text``, or None."""
    try:
        return kind(text)
    except ValueError:
        return None


def parse(text: str) -> tuple[Strategy, ...]:
    """Parse ``A+B+...`` into a tuple of strategies (deduplicated, ordered)."""
    if not text or not text.strip():
        raise StrategyError("empty strategy; use e.g. full, map, blackbox or comp:payone:backward")
    out = []
    for t in text.split("+"):
        s = parse_one(t)
        if s not in out:
            out.append(s)
    modes = {s.mode for s in out}
    if Mode.BLACKBOX in modes and len(out) > 1:
        raise StrategyError(f"strategy {text!r}: blackbox cannot be combined with other strategies")
    if Mode.PAY in modes and Mode.COMP in modes:
        raise StrategyError(f"strategy {text!r}: pay and comp both use payload pairs; choose one")
    return tuple(out)


def supported_strategies(operator: Operator) -> list[str]:
    """Every single strategy spelling the operator supports (for messages)."""
    modes = operator.supported_modes()
    out = []
    for m in (Mode.FULL, Mode.PAY, Mode.COMP):
        if m in modes:
            out += [f"{m.value}:{e}:{d}" for e in ENCODINGS[m] for d in DIRECTIONS]
    if Mode.MAP in modes:
        out.append("map")
    out.append("blackbox")
    return out


def check_supported(op_name: str, operator: Operator, strategies: tuple[Strategy, ...]) -> None:
    modes = operator.supported_modes() | {Mode.BLACKBOX}
    for s in strategies:
        ok = s.mode in modes
        if s.mode in (Mode.MAP, Mode.COMP) and not operator.has_mapping():
            ok = False
        if not ok:
            raise StrategyError(
                f"operator {op_name!r} ({type(operator).__name__}) does not support strategy "
                f"{s}; it supports: {', '.join(supported_strategies(operator))}")


def default_for(operator: Operator) -> tuple[Strategy, ...]:
    """The operator's own ``default_strategy`` when it declares one; else ``map``
    where there are mapping functions, ``full`` if supported, else blackbox."""
    own = operator.default_strategy
    if own:
        return parse(own)
    modes = operator.supported_modes()
    if Mode.MAP in modes and operator.has_mapping():
        return (MAP,)
    if Mode.FULL in modes:
        return (Strategy(Mode.FULL, Encoding.FULLONE, Direction.BACKWARD),)
    return (BLACKBOX,)


def reexecuted(strategies: Sequence[Strategy]) -> bool:
    """Whether a trace through an operator with these strategies re-executes it: it
    stores no lineage and has no mapping functions (it then reads its inputs)."""
    return not any(s.stored or s.mode is Mode.MAP for s in strategies)


def modes_needed(strategies: tuple[Strategy, ...]) -> frozenset[Mode]:
    """Lineage modes the operator must emit at run time for these strategies."""
    return frozenset(s.mode for s in strategies if s.stored)
