"""A run's DAG as plain data, and the walks a trace takes through it.

A trace is a sequence of edges (operator, input index, direction) from the
start array: given as a path, which is checked here, or every DAG path between
two arrays, which is found here.  Nothing in this module touches lineage or
cells; the executor runs the edges.  A run's DAG never changes, so what is
derived from it (reachability, topological order, walks) is cached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from subzero.errors import QueryError
from subzero.model.strategy import Direction


@dataclass(frozen=True)
class Edge:
    """One trace step: map cells of ``src`` through input ``input`` of operator ``op``
    to ``dst`` (backward: ``src`` is ``op``'s output; forward: ``dst`` is)."""

    op: str
    input: int
    backward: bool
    src: str
    dst: str

    @property
    def direction(self) -> Direction:
        return Direction.of(self.backward)


@dataclass(frozen=True)
class Walk:
    """Every edge on a DAG path between two arrays, grouped by the array they leave,
    arrays in the order the trace visits them (sources before what they feed)."""

    backward: bool
    stages: tuple[tuple[str, tuple[Edge, ...]], ...]

    @property
    def direction(self) -> Direction:
        return Direction.of(self.backward)


class RunGraph:
    """The arrays of a run (``shapes``) and which arrays each operator reads
    (``inputs_of``; an operator's output array has the operator's name)."""

    def __init__(self, run_id: int, inputs_of: Mapping[str, Sequence[str]],
                 shapes: Mapping[str, tuple[int, ...]]):
        self.run_id = run_id
        self.inputs_of = {op: list(ins) for op, ins in inputs_of.items()}
        self.shapes = dict(shapes)
        self._consumers: dict[str, list[tuple[str, int]]] = {a: [] for a in self.shapes}
        for op, ins in self.inputs_of.items():
            for i, a in enumerate(ins):
                self._consumers.setdefault(a, []).append((op, i))
        self._reach: dict[tuple[str, bool], frozenset[str]] = {}
        self._topo: list[str] | None = None
        self._walks: dict[tuple[str, str], Walk] = {}

    # -- checks --------------------------------------------------------------------------
    def check_array(self, name: str) -> None:
        if name not in self.shapes:
            raise QueryError(f"unknown array {name!r} in run {self.run_id}; its arrays are: "
                             f"{', '.join(self.shapes)}")

    def follow(self, start: str, path: Sequence[tuple[str, int]]) -> list[Edge]:
        """The edges of an explicit path of (operator, input index) steps from ``start``;
        every step must touch the array the previous one reached, in one direction."""
        cur, direction, edges = start, None, []
        for op, i in path:
            if op not in self.inputs_of:
                raise QueryError(f"path step {op}:{i}: {op!r} is not an operator of run "
                                 f"{self.run_id}")
            ins = self.inputs_of[op]
            if not 0 <= i < len(ins):
                raise QueryError(f"path step {op}:{i}: operator {op!r} has {len(ins)} inputs "
                                 f"(indexes 0..{len(ins) - 1})")
            if op == cur:
                d, nxt = Direction.BACKWARD, ins[i]
            elif ins[i] == cur:
                d, nxt = Direction.FORWARD, op
            else:
                raise QueryError(f"path step {op}:{i} does not touch array {cur!r}: {op!r} reads "
                                 f"{ins[i]!r} as input {i}")
            if direction and d != direction:
                raise QueryError(f"path mixes directions at step {op}:{i}; a trace goes either "
                                 f"backward or forward")
            direction = d
            edges.append(Edge(op, i, d is Direction.BACKWARD, cur, nxt))
            cur = nxt
        return edges

    # -- structure ------------------------------------------------------------------------
    def reach(self, frm: str, down: bool) -> frozenset[str]:
        """Arrays reachable from ``frm`` downstream (consumers) or upstream (inputs)."""
        key = (frm, down)
        hit = self._reach.get(key)
        if hit is None:
            seen: set[str] = set()
            todo = [frm]
            while todo:
                a = todo.pop()
                nxt = ([o for o, _ in self._consumers.get(a, ())] if down
                       else self.inputs_of.get(a, []))
                for b in nxt:
                    if b not in seen:
                        seen.add(b)
                        todo.append(b)
            hit = self._reach[key] = frozenset(seen)
        return hit

    def topo(self) -> list[str]:
        """Every array, each after the arrays it is computed from."""
        if self._topo is None:
            order: list[str] = []
            seen: set[str] = set()

            def visit(a: str) -> None:
                if a in seen:
                    return
                seen.add(a)
                for b in self.inputs_of.get(a, []):
                    visit(b)
                order.append(a)
            for a in self.shapes:
                visit(a)
            self._topo = order
        return self._topo

    def walk(self, start: str, to: str) -> Walk:
        """The edges of every DAG path between ``start`` and ``to`` (backward when ``to``
        is upstream of ``start``), in an order where each array is left only after
        every edge into it ran."""
        key = (start, to)
        hit = self._walks.get(key)
        if hit is None:
            hit = self._walks[key] = self._walk(start, to)
        return hit

    def _walk(self, start: str, to: str) -> Walk:
        if start == to:
            return Walk(True, ())
        if to in self.reach(start, down=False):
            backward, on = True, self.reach(start, down=False) & (self.reach(to, down=True) | {to})
        elif to in self.reach(start, down=True):
            backward, on = False, self.reach(start, down=True) & (self.reach(to, down=False) | {to})
        else:
            raise QueryError(f"arrays {start!r} and {to!r} are not connected in run "
                             f"{self.run_id}: no path of operators leads from one to the other")
        on = on | {start}
        order = [a for a in self.topo() if a in on]
        stages = []
        for a in (reversed(order) if backward else order):
            if backward:
                edges = tuple(Edge(a, i, True, a, src)
                              for i, src in enumerate(self.inputs_of.get(a, [])) if src in on)
            else:
                edges = tuple(Edge(o, i, False, a, o)
                              for o, i in self._consumers.get(a, ()) if o in on)
            if edges:
                stages.append((a, edges))
        return Walk(backward, tuple(stages))
