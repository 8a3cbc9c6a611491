"""The query executor: traces cells backward or forward through a run.

A query is (start array, cells, path) where the path is a list of
(operator, input index) steps, or every DAG path between two arrays
(``graph.py`` finds and checks them).  The set between steps is a
:class:`~subzero.model.cellset.CellSet`: sorted cell ids while it is small, a
bitmap only once it fills a good part of its array, and "the entire array"
as a symbol, so a step's cost follows the cells it carries, not the array's
size.  Each step uses the first method that works in the order the simple
rule gives (``methods.py``: stored lineage indexed in the step's direction,
then mapping functions, then stored lineage indexed the other way, then
black-box re-execution), or the order a query-time planner gives
(``planner.py``; the optimizer implements one), which may also give reading
stored lineage a budget after which the step re-executes instead: counted in the
read's own CPU time against its measured progress (``sources.TimedSource``).
First-use costs (opening the lineage store and a reader, importing and opening
the array store's backend) are timed apart (``warmup.py``) and left out of a
step's seconds, its CPU time and any budget, so a cold process neither gives up
a read nor teaches the planner's model that a method is slow.
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

import dataclasses
import functools
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from subzero.capture.context import Context
from subzero.errors import CorruptLineage, Deadline, QueryError, warn
from subzero.model.cells import as_cells, first_out_of_bounds, outside, pack
from subzero.model.cellset import CellSet
from subzero.model.operator import Operator
from subzero.model.strategy import Direction, Strategy
from subzero.model.workflow import Workflow
from subzero.query import steps as run_step
from subzero.query.graph import Edge, RunGraph
from subzero.query.methods import Mapping, Method, MethodTable, Reexec, Stored, fallback_order
from subzero.query.planner import (
    Planner,
    ReadBudget,
    StepInfo,
    StepStat,
    as_budget,
    blocks_of,
    blocks_spanned,
    runs_of,
)
from subzero.query.regions import RegionCache
from subzero.query.relation import StepContext
from subzero.query.sources import PairSource, TimedSource
from subzero.query.trace import EXCLUDED, GridLookup, TraceOptions, TraceResult
from subzero.query.untrusted import DataOnlyMethods, refused
from subzero.query.warmup import Warmup, import_arrays
from subzero.storage.arrays import ArrayStore
from subzero.storage.lineage import LineageStore, ShardedReader, StrategyReader
from subzero.tuning import REGION_CACHE_BYTES

if TYPE_CHECKING:
    import xarray as xr

    from subzero.query.tilerun import TileAccess

__all__ = ["Executor", "RunView", "TraceOptions", "TraceResult", "StepStat", "StepInfo",
           "blocks_spanned", "runs_of"]


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
    #: The run's uid (its catalog row's; None for a run made before runs had uids): its
    #: stored lineage must be bound to it (``arrays`` carries it too)
    run_uid: str | None = None
    #: Why the run's code must not be loaded (its signature does not verify), or None:
    #: then only steps its stored lineage answers without the operator work.
    untrusted: str | None = None
    #: per operator with a statistic, the digest of the value the run used, and of the
    #: file of its merged states (:mod:`subzero.storage.rounds`), as its record names them
    statistics: dict[str, str] = dataclasses.field(default_factory=dict)
    rounds: dict[str, str] = dataclasses.field(default_factory=dict)


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
        self._release: weakref.finalize | None = None
        self._readers: dict[tuple[str, Strategy], StrategyReader | ShardedReader] = {}
        self._broken: set[tuple[str, Strategy]] = set()
        self._values: dict[str, np.ndarray | xr.DataArray] = {}
        self._contexts: dict[str, StepContext] = {}
        self._tile_access: dict[str, TileAccess] = {}
        #: per operator: whether an input of it was not kept by the run (``--keep``)
        self._remade_inputs: dict[str, bool] = {}
        #: first-use costs paid so far: left out of the steps that paid them
        self.warmup = Warmup()
        self._regions = RegionCache(view.arrays.read_region, REGION_CACHE_BYTES)

    # -- public -----------------------------------------------------------------------
    def close(self) -> None:
        """Release the run's lineage store (readers become unusable)."""
        self._readers.clear()
        if self._lineage is not None:
            if self._release is not None:
                self._release.detach()
            self._lineage.close()
            self._lineage = None

    def clear_cache(self, close: bool = False) -> None:
        """Drop decoded lineage blocks, loaded arrays and regions, and what re-runs learnt
        of the run (statistics, tiles) (cold-query measurements).  ``close``: also close
        the lineage store and its readers, so that the next read maps its pages afresh
        (the lineage earlier reads touched is otherwise still mapped, and a read of it
        costs less than the same read of lineage nothing touched); reopening is then a
        first use again."""
        for r in self._readers.values():
            r.clear_cache()
        self._values.clear()
        self._tile_access.clear()
        self._regions.clear()
        if close:
            self.close()
            self.warmup.forget([k for k in self.warmup.made() if k == "lineage" or (
                isinstance(k, tuple) and k and k[0] == "reader")])

    def trace(self, start: str, cells: ArrayLike, to: str | None = None,
              path: list[tuple[str, int]] | None = None, prefer: str | None = None,
              shortcut: bool = True, planner: Planner | None = None,
              grids: GridLookup | None = None, exclude_all_to_all: bool = False) -> TraceResult:
        """Trace ``cells`` of array ``start`` to array ``to`` (every DAG path, results
        united) or along ``path``; see :meth:`subzero.Run.trace`.  ``grids`` (the run's
        :meth:`~subzero.api.Run.grid`) gives the result its coordinates."""
        if self.v.untrusted is None:
            opts = TraceOptions(prefer, shortcut, planner, exclude_all_to_all)
            self.v.workflow()      # load the operators (imports) before the clock starts
        else:                      # no code: no all-to-all declarations, no re-execution deadline
            if exclude_all_to_all:
                raise QueryError(f"run {self.v.run_id} is not trusted: which of its operators "
                                 f"read an input all-to-all is in their code, so they cannot "
                                 f"be left out")
            opts = TraceOptions(prefer, False, None)
        t0 = time.perf_counter()
        self.graph.check_array(start)
        shape = self.v.shapes[start]
        c = self._cells(cells, start, shape)
        q = CellSet.of_ids(pack(c, shape), shape)
        if (to is None) == (path is None):
            raise QueryError("give either a target array (`to`) or a path (`path`), not both")
        stats: list[StepStat] = []
        direct: CellSet | None = None
        if path is not None:
            result, target, direction = self._follow(start, q, path, opts, stats)
        else:
            assert to is not None
            self.graph.check_array(to)
            result, direction, direct = self._between(start, to, q, opts, stats)
            target = to

        def values(region: tuple[slice, ...] | None) -> ArrayLike:
            if region is None:
                return self._value(target)
            return self.v.arrays.read_region(target, region)
        return TraceResult(self.v.run_id, start, target, direction, result, stats,
                           time.perf_counter() - t0, read_target=values, grids=grids, query=q,
                           open_target=lambda: self.v.arrays.lazy(target),
                           direct=direct if direct is not None and len(direct) < len(result)
                           else None, excluded_all_to_all=opts.exclude_all_to_all)

    def trace_reach(self, start: str, cells: ArrayLike, backward: bool, shortcut: bool = True,
                    planner: Planner | None = None, direct: dict[str, CellSet] | None = None,
                    ) -> tuple[dict[str, CellSet], list[StepStat], float]:
        """The cells of every array reachable from ``cells`` of ``start`` (upstream when
        ``backward``), every step's statistics and the total time: the walk of
        :meth:`trace` widened from one target to every array, each edge run once, so
        each array's answer is the one ``trace(start, cells, to=array)`` gives, for the
        cost of one trace (the explorer's linked views).  ``direct``, when given, is
        filled with each array's cells reached without a step through an all-to-all
        input (as :attr:`TraceResult.direct`)."""
        if self.v.untrusted is None:
            opts = TraceOptions(None, shortcut, planner)
            self.v.workflow()
        else:
            opts = TraceOptions(None, False, None)
        t0 = time.perf_counter()
        self.graph.check_array(start)
        shape = self.v.shapes[start]
        q = CellSet.of_ids(pack(self._cells(cells, start, shape), shape), shape)
        graph = self.graph
        on = graph.reach(start, down=not backward) | {start}
        order = [a for a in graph.topo() if a in on]
        consumers: dict[str, list[tuple[str, int]]] = {}
        for op, ins in graph.inputs_of.items():
            for i, a in enumerate(ins):
                consumers.setdefault(a, []).append((op, i))
        sets: dict[str, CellSet] = {start: q}
        mine: dict[str, CellSet] | None = None if direct is None else {start: q}
        stats: list[StepStat] = []
        for a in (reversed(order) if backward else order):
            if a not in sets or not sets[a]:
                continue
            if backward:
                edges = [Edge(a, i, True, a, src) for i, src in enumerate(graph.inputs_of.get(a, []))
                         if src in on]
            else:
                edges = [Edge(o, i, False, a, o) for o, i in consumers.get(a, ()) if o in on]
            self._edges(a, edges, sets, mine, opts, stats)
        for a in on - {start}:
            sets.setdefault(a, CellSet.empty(self.v.shapes[a]))
        if direct is not None and mine is not None:
            direct.update({a: mine.get(a, CellSet.empty(self.v.shapes[a])) for a in sets})
        return sets, stats, time.perf_counter() - t0

    def warm(self) -> None:
        """Open what a first trace would wait for: the operators' code (when trusted)."""
        if self.v.untrusted is None:
            self.v.workflow()

    # -- walks ---------------------------------------------------------------------------
    def _cells(self, cells: ArrayLike, name: str, shape: tuple[int, ...]) -> np.ndarray:
        try:
            c = as_cells(cells, len(shape))
        except (ValueError, TypeError) as e:
            raise QueryError(f"bad query cells for {name!r}: {e}") from e
        bad = first_out_of_bounds(c, shape)
        if bad is not None:
            raise QueryError(outside(c[bad], shape, name))
        return c

    def _follow(self, start: str, q: CellSet, path: Sequence[tuple[str, int]],
                opts: TraceOptions, stats: list[StepStat]) -> tuple[CellSet, str, str]:
        edges = self.graph.follow(start, path)
        for e in edges:
            q = self._step(e, q, opts, stats)
        if not edges:
            return q, start, Direction.BACKWARD
        return q, edges[-1].dst, edges[0].direction

    def _between(self, start: str, to: str, q: CellSet, opts: TraceOptions,
                 stats: list[StepStat]) -> tuple[CellSet, str, CellSet]:
        """The answer, its direction, and the part of it reached without a step through
        an all-to-all input (``direct``, walked alongside: the same sets, so no extra
        step, until an all-to-all step makes them differ)."""
        walk = self.graph.walk(start, to)
        sets, direct = {start: q}, {start: q}
        for a, edges in walk.stages:
            if a not in sets or not sets[a]:
                continue
            self._edges(a, edges, sets, direct, opts, stats)
        out = sets.get(to)
        if out is None:
            out = CellSet.empty(self.v.shapes[to])
        return out, walk.direction, direct.get(to, CellSet.empty(self.v.shapes[to]))

    def _edges(self, a: str, edges: Sequence[Edge], sets: dict[str, CellSet],
               direct: dict[str, CellSet] | None, opts: TraceOptions,
               stats: list[StepStat]) -> None:
        """Run the steps out of array ``a``, adding to ``sets``; with ``direct``, also the
        cells reached without a step through an all-to-all input, walked alongside: the
        same steps while the two sets are equal, a step of its own (not among ``stats``)
        once an all-to-all step made them differ."""
        here = sets[a]
        mine = direct.get(a) if direct is not None else None
        same = mine is not None and len(mine) == len(here)       # direct <= all: equal
        aside: list[StepStat] = []
        for e in edges:
            tgt = sets.get(e.dst)
            r = None
            if tgt is None or not tgt.is_entire:          # else early stop: nothing to add
                r = self._step(e, here, opts, stats)
                sets[e.dst] = r if tgt is None else tgt | r
            if direct is None:
                continue
            tgt_d = direct.get(e.dst)
            if tgt_d is not None and tgt_d.is_entire:
                continue
            if not mine or self._all_to_all(e, opts):
                rd = CellSet.empty(self.v.shapes[e.dst])
            elif same and r is not None:
                rd = r
            else:
                rd = self._step(e, mine, opts, aside)
            direct[e.dst] = rd if tgt_d is None else tgt_d | rd

    def _all_to_all(self, e: Edge, opts: TraceOptions) -> bool:
        """Whether the step reads its input all-to-all (known from trusted code only)."""
        return self.v.untrusted is None and self._context(e.op).op.is_all_to_all(e.input)

    # -- one step --------------------------------------------------------------------------
    def _step(self, e: Edge, q: CellSet, opts: TraceOptions, stats: list[StepStat]) -> CellSet:
        """One step: the cells of the step's target array reached from ``q``.  Its
        seconds and CPU time leave out the first-use costs it paid (``warmup``); its CPU
        time, what the planner's model learns from, the planner's own pricing too."""
        t0, c0, w0 = time.perf_counter(), time.thread_time(), self.warmup.mark()
        caches = self.warmup.caches
        tgt_shape = self.v.shapes[e.dst]
        shape_in, note, gave_up, plan_cpu = (0, 0), "", _GaveUp(), 0.0
        if not q:
            res, method = CellSet.empty(tgt_shape), "empty"
        else:
            sc = self._context(e.op)
            if opts.exclude_all_to_all and sc.op.is_all_to_all(e.input):
                res, method = CellSet.empty(tgt_shape), EXCLUDED
            elif opts.shortcut and sc.op.is_all_to_all(e.input):
                res, method = CellSet.everything(tgt_shape), "all-to-all"
            else:
                res, method, note, shape_in, gave_up, plan_cpu = \
                    self._choose_and_run(e, sc, q, opts)
        warm, warm_cpu = self.warmup.since(w0)
        st = StepStat(e.op, e.input, e.direction, method, len(q), len(res),
                      max(time.perf_counter() - t0 - warm, 0.0), shape_in[0], note, shape_in[1],
                      cpu=max(time.thread_time() - c0 - warm_cpu - plan_cpu, 0.0), warmup=warm,
                      abandoned=gave_up.method, abandoned_s=gave_up.spent, done=gave_up.done,
                      cold=self.warmup.caches > caches)
        stats.append(st)
        planner = opts.pricing
        if planner is not None and method not in ("empty", "all-to-all", EXCLUDED):
            planner.observe(st)
        return res

    def _choose_and_run(self, e: Edge, sc: StepContext, q: CellSet, opts: TraceOptions
                        ) -> tuple[CellSet, str, str, tuple[int, int], _GaveUp, float]:
        """The first method that works, in the simple rule's or the planner's order;
        returns (target cells, method, note, (blocks, runs) of the input cells, the
        stored read given up for re-execution if one was, the CPU seconds of planning)."""
        name, i, backward = e.op, e.input, e.backward
        methods: Sequence[Method] = self.methods(name, backward, opts.prefer)
        budget: ReadBudget | None = None
        blocks, runs, note, gave_up, plan_cpu = 0, 0, "", _GaveUp(), 0.0
        planner = opts.pricing
        if planner is not None:
            c0, w0 = time.thread_time(), self.warmup.cpu
            blocks, runs = blocks_of(q), runs_of(q)
            info = StepInfo(name, i, backward, len(q), blocks,
                            all(a in self._values for a in self.v.inputs_of[name]),
                            lambda: self._tile_share(sc, q, i, backward), runs)
            methods, asked = planner.plan(info, methods)
            budget = as_budget(asked)
            if _reexec_early(methods) and self._reads_remade(name):
                # its inputs would be made again first (whole arrays, perhaps several),
                # which the model does not price: re-execution only when nothing else is
                # left (asked only then: knowing opens the inputs' metadata, 0.1-0.4 ms a
                # step, and a read's switch asks it only when it would happen)
                methods = [m for m in methods if not isinstance(m, Reexec)] + \
                    [m for m in methods if isinstance(m, Reexec)]
                budget = None
            plan_cpu = time.thread_time() - c0 - (self.warmup.cpu - w0)   # not first uses

        def inputs() -> list[object]:
            self.warmup.first("arrays", import_arrays)
            return [self._value(a) for a in self.v.inputs_of[name]]

        def reexec() -> tuple[np.ndarray | CellSet, str]:
            # a tile-limited re-run reads regions straight from the chunk files (no
            # zarr); a whole one loads its inputs through inputs(), which warms them
            return run_step.reexec(sc, i, backward, q, inputs, stored, self._tiles(name))

        def stored(region: tuple[slice, ...]) -> np.ndarray:   # a re-run proves itself on it
            return self._regions.read(name, region)
        order = list(methods)
        damaged: list[str] = []
        while order:
            m = order.pop(0)
            if isinstance(m, Stored):
                key = (name, m.strategy)
                if key in self._broken:
                    damaged.append(str(m.strategy))
                    order = fallback_order(order)
                    continue
                timed: TimedSource | None = None
                try:
                    src: PairSource = self._reader(name, m.strategy)
                    if budget is not None:        # its clock starts once the reader is open
                        src = timed = TimedSource(src, budget, len(q),
                                                  lambda: not self._reads_remade(name))
                    res, method = run_step.stored(src, m.strategy, sc, i, backward, q), m.name
                except CorruptLineage as err:
                    self._broken.add(key)
                    damaged.append(str(m.strategy))
                    order = fallback_order(order)
                    self.warn(f"{err}; answering this step another way")
                    continue
                except Deadline:
                    assert budget is not None and timed is not None
                    gave_up = _GaveUp(m.name, timed.spent, timed.done or 0.0)
                    note = _switch_note(m.name, budget, timed)
                    res, method = reexec()
            elif isinstance(m, Mapping):
                res, method = run_step.mapping(sc, q, i, backward), m.name
            else:
                res, method = reexec()
            return (run_step.settle(res, self.v.shapes[e.dst]), method, note, (blocks, runs),
                    gave_up, plan_cpu)
        raise QueryError(f"cannot trace through operator {name!r}: its stored lineage is damaged "
                         f"({', '.join(damaged) or 'none offered'}) and no other method is left "
                         f"(a planner must keep re-execution)")

    def _tile_share(self, sc: StepContext, q: CellSet, i: int, backward: bool) -> float:
        """The share of the operator's tiles a re-execution for ``q`` would run (1.0: it
        re-runs whole).  Only an operator that can re-run per tile needs the tile re-runs
        (their import a first use, not the step's: 4 ms of a 1 ms step in a fresh
        process); the others are known whole from their declaration."""
        from subzero.capture.tiles import tile_halo
        if q.form != "sparse" or tile_halo(sc.op, sc.in_shapes, sc.out_shape) is None:
            return 1.0
        share = self.warmup.first("tilerun", _import_tile_share, cache=False)
        return share(sc, self._tiles(sc.name), q.ids(), i, backward)

    # -- run-lifetime state ------------------------------------------------------------------
    def _reads_remade(self, name: str) -> bool:
        """Whether re-executing ``name`` reads an input its run did not keep."""
        got = self._remade_inputs.get(name)
        if got is None:
            got = self._remade_inputs[name] = not all(
                self.v.arrays.kept(a) for a in self.v.inputs_of[name])
        return got

    def _operator(self, name: str) -> Operator:
        return self.v.workflow().steps[name].operator

    def _context(self, name: str) -> StepContext:
        sc = self._contexts.get(name)
        if sc is None:
            op = self._operator(name) if self.v.untrusted is None else \
                refused(name, self.v.untrusted)
            out_shape = self.v.shapes[name]
            in_shapes = [self.v.shapes[a] for a in self.v.inputs_of[name]]
            sc = self._contexts[name] = StepContext(
                name, op, Context(name, op, frozenset(), in_shapes, out_shape), out_shape, in_shapes)
        return sc

    def _reader(self, name: str, s: Strategy) -> StrategyReader | ShardedReader:
        key = (name, s)
        r = self._readers.get(key)
        if r is None:
            if self._lineage is None:
                try:
                    self._lineage = self.warmup.first("lineage", lambda: LineageStore(
                        self.v.lineage_path, readonly=True, run_uid=self.v.run_uid))
                except CorruptLineage as err:   # the whole file: name what this step wanted
                    raise CorruptLineage(f"stored lineage of operator {name!r} ({s}) is "
                                         f"unreadable: {err}") from err
                # released with the executor, or by close()
                self._release = weakref.finalize(self, self._lineage.close)
            lin = self._lineage
            r = self._readers[key] = self.warmup.first(("reader", key), lambda: lin.reader(name, s))
        return r

    def _tiles(self, name: str) -> TileAccess:
        """How a tile-limited re-run of ``name`` reads its inputs' regions (from memory
        when a whole re-run loaded them, else checksummed from the store) and learns the
        run's tile (the chunk shape of its stored output, read once).  Made for the
        first step that re-executes or is priced: tile re-runs are imported then, not
        by every trace."""
        t = self._tile_access.get(name)
        if t is None:
            self.warmup.first("tilerun", _import_tile_share, cache=False)
            from subzero.query.tilerun import TileAccess
            def region(a: str, r: tuple[slice, ...]) -> np.ndarray:
                v = self._values.get(a)
                # its own copy: an operator may write into its input
                return v[r] if isinstance(v, np.ndarray) else self._regions.read(a, r).copy()
            chunks = functools.cache(lambda: self.warmup.first(
                ("chunks", name), lambda: self._first_array(name)))
            stat = functools.cache(lambda: self._statistic(name, region))
            t = self._tile_access[name] = TileAccess(self.v.inputs_of[name], region, chunks, stat)
        return t

    def _first_array(self, name: str) -> tuple[int, ...]:
        """The chunk shape of array ``name`` (from its verified metadata: no zarr import)."""
        return self.v.arrays.chunk_shape(name)

    def _statistic(self, name: str, region: Callable[[str, tuple[slice, ...]], np.ndarray]
                   ) -> Any:
        """The whole-array value of ``name``'s statistic as the run used it, for a
        tile-limited re-run (:func:`subzero.query.statistic.run_statistic`)."""
        from subzero.query.statistic import run_statistic
        first = self.v.inputs_of[name][0]
        return run_statistic(name, self._operator(name), self.v.arrays.dir.parent,
                             self.v.statistics.get(name), self.v.rounds.get(name),
                             self.v.shapes[first], self.v.arrays.chunk_shape(first),
                             lambda r: region(first, r))

    def _value(self, name: str) -> np.ndarray | xr.DataArray:
        v = self._values.get(name)
        if v is None:
            v = self._values[name] = self.v.arrays.read_value(name)
        return v


@dataclass(frozen=True)
class _GaveUp:
    """A stored read given up for re-execution: its method, the CPU seconds it ran and
    the share of its work it had done (0: not measured); empty when none was."""

    method: str = ""
    spent: float = 0.0
    done: float = 0.0


def _reexec_early(methods: Sequence[Method]) -> bool:
    """Whether re-execution comes before another method in ``methods``."""
    seen = False
    for m in methods:
        if isinstance(m, Reexec):
            seen = True
        elif seen:
            return True
    return False


def _switch_note(method: str, budget: ReadBudget, timed: TimedSource) -> str:
    """Why a step gave up its stored read, in the user's terms."""
    done = "" if timed.done is None else f", {timed.done:.0%} done"
    why = (f"re-execution (at most {budget.reexec * 1000:.1f} ms predicted) costs less than "
           f"the rest of the read" if budget.reexec > 0 else "the planner's limit")
    return (f"{method} had run {timed.spent * 1000:.1f} ms of CPU{done}, past its budget of "
            f"{budget.after * 1000:.1f} ms; {why}: switched to re-execution")


def _import_tile_share() -> Callable[..., float]:
    """``tilerun.share``, importing the tile re-runs (with the capture code they run) on
    first use: a trace that neither prices nor runs a re-execution never loads them."""
    from subzero.query.tilerun import share
    return share
