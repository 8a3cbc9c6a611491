"""Tracing a run whose code is not trusted: stored lineage as plain data.

A run whose signature does not verify (``storage.trust``) must not have its
operators loaded: they are code from someone else.  Its trace steps can still
be answered by stored lineage that needs no operator code — full pairs, and
payloads expanded at capture time (``pay:*:forward``) — and by nothing else:
payloads keyed by output cells go through ``map_p``, composite lineage through
``map_b``/``map_f``, re-execution runs the operator.  :class:`DataOnlyMethods`
offers only those steps' stored strategies (and re-execution last, which is
refused); :class:`RefusedOperator` stands in for the operator, so whatever would
call its code stops with the one clear :class:`UntrustedRun` error instead of
loading it or skipping the step.
"""

from __future__ import annotations

from collections.abc import Mapping as MappingT
from typing import NoReturn, cast

from subzero.errors import UntrustedRun
from subzero.model.modes import Mode
from subzero.model.operator import Operator
from subzero.model.strategy import Direction, Strategy, parse_one
from subzero.query.methods import Method, Reexec, Stored


def needs_code(s: Strategy) -> bool:
    """Whether answering a step from stored strategy ``s`` calls the operator: payloads
    keyed by output cells (``map_p``) and composite defaults (``map_b``/``map_f``) do;
    full pairs and payloads expanded at capture time (keyed by input cells) do not."""
    return s.mode is Mode.COMP or (s.mode is Mode.PAY and s.direction is not Direction.FORWARD)


class DataOnlyMethods:
    """A step's methods for an untrusted run: stored strategies that need no code (the
    step's direction first), then re-execution — which the refused operator stops with
    a clear error, so a step no data answers is never skipped."""

    def __init__(self, strategies: MappingT[str, tuple[Strategy, ...]]):
        self.strategies = strategies

    def __call__(self, name: str, backward: bool, prefer: str | None = None) -> tuple[Method, ...]:
        stored = [Stored(s) for s in self.strategies.get(name, ()) if s.stored and not needs_code(s)]
        methods: list[Method] = [m for m in stored if m.indexed(backward)]
        methods += [m for m in stored if not m.indexed(backward)]
        pick = _stored(prefer)
        if pick is not None and pick in methods:
            methods.remove(pick)
            methods.insert(0, pick)
        methods.append(Reexec())
        return tuple(methods)


def _stored(prefer: str | None) -> Stored | None:
    """The stored strategy ``prefer`` names, if it names one ("map" and "reexec" are code)."""
    if not prefer or prefer in ("map", "reexec"):
        return None
    try:
        return Stored(parse_one(prefer))
    except Exception:
        return None


class RefusedOperator:
    """Stands in for the operator of an untrusted run: touching it raises UntrustedRun
    naming the operator, why the run is not trusted and how to trust it."""

    def __init__(self, name: str, why: str):
        self._name, self._why = name, why

    def __getattr__(self, attr: str) -> NoReturn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise UntrustedRun(f"tracing through operator {self._name!r} needs its code (mapping "
                           f"functions or re-execution), and {self._why}")

    def __repr__(self) -> str:
        return f"RefusedOperator({self._name!r})"


def refused(name: str, why: str) -> Operator:
    """A :class:`RefusedOperator` where an operator is expected: it stands in for any
    operator, since every use of it raises before its type could matter."""
    return cast(Operator, RefusedOperator(name, why))
