"""The query executor: traces cells backward or forward through a run.

A query is (start array, cells, path) where the path is a list of
(operator, input index) steps, or every DAG path between two arrays
(``graph.py`` finds and checks them).  The set between steps is a boolean
bitmap of the array's shape, with its sorted cells beside it while it is
small.  Each step uses the first method that works in the order the simple
rule gives (``methods.py``: stored lineage indexed in the step's direction,
then mapping functions, then stored lineage indexed the other way, then
black-box re-execution), or the order a query-time planner gives
(``planner.py``; the optimizer implements one), which may also give reading
stored lineage a deadline after which the step re-executes instead.
``steps.py`` runs one method.  Operators declared all-to-all on an input
short-cut to the entire array.  Damaged stored lineage (a checksum that does
not match, a missing block or file) falls back with a warning naming what was
damaged — to the operator's other stored strategies first, then mapping
functions, then re-execution — and a step with nothing trustworthy left stops
the trace with one QueryError naming the operator: a trace never answers
wrongly in silence.

An executor serves every query of one run and keeps only what lives as long
as the run: open lineage readers, loaded arrays, strategies found damaged,
step contexts.  A query's options travel down as a :class:`TraceOptions`.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from subzero.capture.context import Context
from subzero.errors import QueryError, warn
from subzero.model.cells import as_cells, bitmap_from_packed, first_out_of_bounds, fmt_cell, pack
from subzero.model.operator import Operator
from subzero.model.strategy import Direction, Strategy
from subzero.model.workflow import Workflow
from subzero.query import steps as run_step
from subzero.query.graph import Edge, RunGraph
from subzero.query.methods import Mapping, Method, MethodTable, Stored, fallback_order
from subzero.query.planner import Planner, StepInfo, StepStat, blocks_of_packed, blocks_spanned
from subzero.query.relation import StepContext, packed_query
from subzero.query.sources import Deadline, PairSource, TimedSource
from subzero.query.tilerun import TileAccess, share
from subzero.query.trace import TraceOptions, TraceResult
from subzero.query.untrusted import DataOnlyMethods, RefusedOperator
from subzero.storage.arrays import ArrayStore
from subzero.storage.lineage import CorruptLineage, LineageStore, StrategyReader
from subzero.tuning import SMALL_QUERY

__all__ = ["Executor", "RunView", "TraceOptions", "TraceResult", "StepStat", "StepInfo",
           "blocks_spanned"]


@dataclass
class RunView:
    """What the executor needs to know about a run (plain data + operators)."""

    run_id: int
    workflow: Callable[[], Workflow]     # the workflow with operator instances (lazy)
    strategies: dict[str, tuple[Strategy, ...]]
    shapes: dict[str, tuple[int, ...]]
    inputs_of: dict[str, list[str]]
    arrays: ArrayStore
    lineage_path: Path
    #: Why the run's code must not be loaded (its signature does not verify), or None:
    #: then only steps its stored lineage answers without the operator work.
    untrusted: str | None = None


class Executor:
    """Runs the traces of one run."""

    def __init__(self, view: RunView, warn: Callable[[str], None] = warn):
        self.v = view
        self.warn = warn
        self.graph = RunGraph(view.run_id, view.inputs_of, view.shapes)
        self.methods: Callable[..., Sequence[Method]] = (
            MethodTable(view.strategies, self._operator) if view.untrusted is None
            else DataOnlyMethods(view.strategies))
        self._lineage: LineageStore | None = None
        self._readers: dict[tuple[str, Strategy], StrategyReader] = {}
        self._broken: set[tuple[str, Strategy]] = set()
        self._values: dict[str, object] = {}
        self._contexts: dict[str, StepContext] = {}
        self._tile_access: dict[str, TileAccess] = {}

    # -- public -----------------------------------------------------------------------
    def close(self) -> None:
        """Release the run's lineage store (readers become unusable)."""
        self._readers.clear()
        if self._lineage is not None:
            self._lineage.close()
            self._lineage = None

    def clear_cache(self) -> None:
        """Drop decoded lineage blocks and loaded arrays (cold-query measurements)."""
        for r in self._readers.values():
            r.clear_cache()
        self._values.clear()

    def trace(self, start: str, cells: ArrayLike, to: str | None = None,
              path: list[tuple[str, int]] | None = None, prefer: str | None = None,
              shortcut: bool = True, planner: Planner | None = None) -> TraceResult:
        """Trace ``cells`` of array ``start`` to array ``to`` (every DAG path, results
        united) or along ``path``; see :meth:`subzero.Run.trace`."""
        if self.v.untrusted is None:
            opts = TraceOptions(prefer, shortcut, planner)
            self.v.workflow()      # load the operators (imports) before the clock starts
        else:                      # no code: no all-to-all declarations, no re-execution deadline
            opts = TraceOptions(prefer, False, None)
        t0 = time.perf_counter()
        self.graph.check_array(start)
        shape = self.v.shapes[start]
        c = self._cells(cells, start, shape)
        packed = pack(c, shape)
        # a small query also keeps its sorted cells (deduplicated); a large one only
        # its bitmap, so it pays no sort
        q0 = np.unique(packed) if packed.size <= SMALL_QUERY else None
        bm = bitmap_from_packed(packed if q0 is None else q0, shape)
        if (to is None) == (path is None):
            raise QueryError("give either a target array (--to) or a path (--path), not both")
        stats: list[StepStat] = []
        if path is not None:
            result, target, direction = self._follow(start, bm, q0, path, opts, stats)
        else:
            assert to is not None
            self.graph.check_array(to)
            result, direction = self._between(start, to, bm, q0, opts, stats)
            target = to

        def values() -> object:
            return self._value(target)
        return TraceResult(self.v.run_id, start, target, direction, result, stats,
                           time.perf_counter() - t0, values)

    # -- walks ---------------------------------------------------------------------------
    def _cells(self, cells: ArrayLike, name: str, shape: tuple[int, ...]) -> np.ndarray:
        try:
            c = as_cells(cells, len(shape))
        except (ValueError, TypeError) as e:
            raise QueryError(f"bad query cells for {name!r}: {e}") from None
        bad = first_out_of_bounds(c, shape)
        if bad is not None:
            raise QueryError(f"cell {fmt_cell(c[bad])} is outside {name} (shape {tuple(shape)})")
        return c

    def _follow(self, start: str, bm: np.ndarray, q: np.ndarray | None,
                path: Sequence[tuple[str, int]], opts: TraceOptions,
                stats: list[StepStat]) -> tuple[np.ndarray, str, str]:
        edges = self.graph.follow(start, path)
        for e in edges:
            bm, _, q = self._step(e, bm, q, None, opts, stats)
        if not edges:
            return bm, start, Direction.BACKWARD
        return bm, edges[-1].dst, edges[0].direction

    def _between(self, start: str, to: str, bm: np.ndarray, q0: np.ndarray | None,
                 opts: TraceOptions, stats: list[StepStat]) -> tuple[np.ndarray, str]:
        walk = self.graph.walk(start, to)
        bms = {start: bm}
        # sorted packed cells of small sets, kept beside their bitmaps: a small query
        # never scans a whole bitmap to count or list its cells
        packed = {start: q0} if q0 is not None else {}
        counts = {start: int(q0.size) if q0 is not None
                  else int(np.count_nonzero(bm))}       # one count per bitmap, reused
        for a, edges in walk.stages:
            if a not in bms or not counts[a]:
                continue
            for e in edges:
                dst = e.dst
                tgt = bms.get(dst)
                if tgt is not None and counts[dst] == tgt.size:
                    continue          # early stop: nothing left to add
                r, n, rq = self._step(e, bms[a], packed.get(a), counts[a], opts, stats)
                if tgt is None:
                    bms[dst], counts[dst] = r, n
                    if rq is not None:
                        packed[dst] = rq
                elif n:
                    bms[dst] = tgt | r
                    counts[dst] = int(np.count_nonzero(bms[dst]))
                    packed.pop(dst, None)
        out = bms.get(to)
        if out is None:
            out = np.zeros(self.v.shapes[to], bool)
        return out, walk.direction

    # -- one step --------------------------------------------------------------------------
    def _step(self, e: Edge, bm: np.ndarray, q_in: np.ndarray | None, n_in: int | None,
              opts: TraceOptions, stats: list[StepStat]) -> tuple[np.ndarray, int, np.ndarray | None]:
        """One step; returns the target bitmap, its number of set cells and, for a small
        result, its sorted packed cells (else None).  ``q_in``: the sorted packed cells
        of ``bm`` when known."""
        t0 = time.perf_counter()
        n_in = int(np.count_nonzero(bm)) if n_in is None else n_in
        tgt_shape = self.v.shapes[e.dst]
        blocks, note, res_q = 0, "", None
        if n_in == 0:
            res, method = np.zeros(tgt_shape, bool), "empty"
        else:
            sc = self._context(e.op)
            if opts.shortcut and sc.op.is_all_to_all(e.input):
                res, method = np.ones(tgt_shape, bool), "all-to-all"
            else:
                res, res_q, method, note, blocks = self._choose_and_run(e, sc, bm, q_in, n_in,
                                                                         opts, t0)
        if res_q is not None:
            n_out = int(res_q.size)
        else:
            n_out = res.size if method == "all-to-all" else int(np.count_nonzero(res))
        st = StepStat(e.op, e.input, e.direction, method, n_in, n_out, time.perf_counter() - t0,
                      blocks, note)
        stats.append(st)
        planner = opts.pricing
        if planner is not None and method not in ("empty", "all-to-all"):
            planner.observe(st)
        return res, n_out, res_q

    def _choose_and_run(self, e: Edge, sc: StepContext, bm: np.ndarray, q: np.ndarray | None,
                        n_in: int, opts: TraceOptions,
                        t0: float) -> tuple[np.ndarray, np.ndarray | None, str, str, int]:
        """The first method that works, in the simple rule's or the planner's order;
        returns (bitmap, sorted packed cells or None, method, note, blocks)."""
        name, i, backward = e.op, e.input, e.backward
        methods: Sequence[Method] = self.methods(name, backward, opts.prefer)
        budget, blocks, note = None, 0, ""
        planner = opts.pricing
        if planner is not None:
            if n_in <= SMALL_QUERY:      # the packed cells are needed anyway
                q = packed_query(bm)[0] if q is None else q
                blocks = blocks_of_packed(q)
            else:
                blocks = blocks_spanned(bm)
            info = StepInfo(name, i, backward, n_in, blocks,
                            all(a in self._values for a in self.v.inputs_of[name]),
                            1.0 if q is None else share(sc, self._tiles(name), q, i, backward))
            methods, budget = planner.plan(info, methods)
        q_flat = bm.ravel()

        def inputs() -> list[object]:
            return [self._value(a) for a in self.v.inputs_of[name]]

        def stored(region: tuple[slice, ...]) -> np.ndarray:   # a re-run proves itself on it
            return self.v.arrays.read_region(name, region)
        tiles = self._tiles(name)
        order = list(methods)
        damaged: list[str] = []
        while order:
            m = order.pop(0)
            if q is None and not isinstance(m, Mapping):
                q = packed_query(bm)[0]
            if isinstance(m, Stored):
                assert q is not None
                key = (name, m.strategy)
                if key in self._broken:
                    damaged.append(str(m.strategy))
                    order = fallback_order(order)
                    continue
                try:
                    src: PairSource = self._reader(name, m.strategy)
                    if budget is not None:
                        src = TimedSource(src, t0 + budget)
                    res, method = run_step.stored(src, m.strategy, sc, i, backward, q, q_flat), m.name
                except CorruptLineage as err:
                    self._broken.add(key)
                    damaged.append(str(m.strategy))
                    order = fallback_order(order)
                    self.warn(f"{err}; answering this step another way")
                    continue
                except Deadline:
                    assert budget is not None
                    note = (f"{m.name} took longer than its budget ({budget * 1000:.1f} ms, "
                            f"from the predicted re-execution); switched to re-execution")
                    res, method = run_step.reexec(sc, i, backward, q, q_flat, inputs, stored, tiles)
            elif isinstance(m, Mapping):
                res, method = run_step.mapping(sc, bm, i, backward, q), m.name
            else:
                assert q is not None
                res, method = run_step.reexec(sc, i, backward, q, q_flat, inputs, stored, tiles)
            out, res_q = run_step.settle(res, self.v.shapes[e.dst])
            return out, res_q, method, note, blocks
        raise QueryError(f"cannot trace through operator {name!r}: its stored lineage is damaged "
                         f"({', '.join(damaged) or 'none offered'}) and no other method is left "
                         f"(a planner must keep re-execution)")

    # -- run-lifetime state ------------------------------------------------------------------
    def _operator(self, name: str) -> Operator:
        return self.v.workflow().steps[name].operator

    def _context(self, name: str) -> StepContext:
        sc = self._contexts.get(name)
        if sc is None:
            op = self._operator(name) if self.v.untrusted is None else \
                RefusedOperator(name, self.v.untrusted)
            out_shape = self.v.shapes[name]
            in_shapes = [self.v.shapes[a] for a in self.v.inputs_of[name]]
            sc = self._contexts[name] = StepContext(
                name, op, Context(name, op, frozenset(), in_shapes, out_shape), out_shape, in_shapes)
        return sc

    def _reader(self, name: str, s: Strategy) -> StrategyReader:
        key = (name, s)
        r = self._readers.get(key)
        if r is None:
            if self._lineage is None:
                try:
                    self._lineage = LineageStore(self.v.lineage_path, readonly=True)
                except CorruptLineage as err:   # the whole file: name what this step wanted
                    raise CorruptLineage(f"stored lineage of operator {name!r} ({s}) is "
                                         f"unreadable: {err}") from None
                weakref.finalize(self, self._lineage.close)   # released with the executor
            r = self._readers[key] = self._lineage.reader(name, s)
        return r

    def _tiles(self, name: str) -> TileAccess:
        """How a tile-limited re-run of ``name`` reads its inputs' regions (from memory
        when a whole re-run loaded them, else checksummed from the store) and learns the
        run's tile (the chunk shape of its stored output, read once)."""
        t = self._tile_access.get(name)
        if t is None:
            def region(a: str, r: tuple[slice, ...]) -> np.ndarray:
                v = self._values.get(a)
                return v[r] if isinstance(v, np.ndarray) else self.v.arrays.read_region(a, r)
            chunks = functools.cache(lambda: self.v.arrays.chunk_shape(name))
            t = self._tile_access[name] = TileAccess(self.v.inputs_of[name], region, chunks)
        return t

    def _value(self, name: str) -> object:
        v = self._values.get(name)
        if v is None:
            v = self._values[name] = self.v.arrays.read_value(name)
        return v
