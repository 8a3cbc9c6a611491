"""The query executor: traces cells backward or forward through a run.

A query is (start array, cells, path) where the path is a list of
(operator, input index) steps, or every DAG path between two arrays.  The
set between steps is a boolean bitmap of the array's shape.  Each step uses
the cheapest available method.  With a query-time planner (a cost model
passed in, see ``optimizer.planner``) the methods are priced per step, and
reading stored lineage gives up for re-execution once it has taken longer
than re-executing is predicted to.  Without one, a simple rule orders them:
stored lineage indexed in the step's direction, then mapping functions, then
stored lineage indexed the other way, then black-box re-execution.  Operators declared all-to-all
on an input short-cut to the entire array.  Damaged stored lineage falls
back to re-execution with a warning: a trace never answers wrongly in silence.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from subzero.capture.context import Context
from subzero.errors import QueryError, warn
from subzero.model.cells import (
    as_cells,
    bitmap_from_packed,
    cells_from_bitmap,
    first_out_of_bounds,
    fmt_cell,
    lengths_to_offsets,
    pack,
    run_starts,
)
from subzero.model.modes import Mode
from subzero.model.strategy import Strategy, parse_one
from subzero.query import relation
from subzero.query.reexec import capture_mode, rerun
from subzero.storage.encodings import KEY_BITS
from subzero.storage.lineage import CorruptLineage, LineageStore
from subzero.tuning import FIRST_CHUNK, LOOKUP_CHUNK, SMALL_QUERY, TIMED_QUERY_CELLS, TIMED_RECORD_PAIRS

KEY_BLOCK = 1 << KEY_BITS


@dataclass
class StepStat:
    op: str
    input: int
    direction: str
    method: str
    cells_in: int
    cells_out: int
    seconds: float
    blocks_in: int = 0          # key blocks the input cells span (taken when a planner runs)
    note: str = ""              # e.g. why the planner switched to re-execution


@dataclass
class StepInfo:
    """What a query-time planner knows about a step before it runs."""

    op: str
    input: int
    backward: bool
    cells_in: int
    blocks_in: int              # distinct 2**KEY_BITS-cell blocks of the input cells
    loaded: bool                # the operator's inputs are already in memory (re-execution)


class _Deadline(Exception):
    """Reading stored lineage took longer than re-executing is predicted to."""


@dataclass
class TraceResult:
    """Cells of ``target`` reached from ``cells`` of ``start``."""

    run_id: int
    start: str
    target: str
    direction: str
    bitmap: np.ndarray
    steps: list[StepStat]
    seconds: float
    _values: Callable | None = field(default=None, repr=False)

    @property
    def cells(self) -> np.ndarray:
        return cells_from_bitmap(self.bitmap)

    @property
    def values(self) -> np.ndarray:
        """Values of the target array at the result cells (same order as ``cells``)."""
        arr = np.asarray(self._values())
        return arr[self.bitmap]

    def __len__(self) -> int:
        return int(np.count_nonzero(self.bitmap))


@dataclass
class RunView:
    """What the executor needs to know about a run (plain data + operators)."""

    run_id: int
    workflow: object                     # Workflow with operator instances (lazy)
    strategies: dict[str, tuple[Strategy, ...]]
    shapes: dict[str, tuple[int, ...]]
    inputs_of: dict[str, list[str]]
    arrays: object                       # ArrayStore
    lineage_path: object


class Executor:
    def __init__(self, view: RunView, warn: Callable[[str], None] = warn):
        self.v = view
        self.warn = warn
        self._lineage: LineageStore | None = None
        self._readers: dict[tuple[str, str], object] = {}
        self._broken: set[tuple[str, str]] = set()
        self._values: dict[str, object] = {}
        self._reach_cache: dict[tuple[str, bool], frozenset] = {}
        self._topo_cache: list[str] | None = None
        self._methods_cache: dict[tuple, tuple] = {}
        self._sc_cache: dict[str, relation.StepContext] = {}
        self._planner = None

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

    def trace(self, start: str, cells, to: str | None = None,
              path: list[tuple[str, int]] | None = None, prefer: str | None = None,
              shortcut: bool = True, planner=None) -> TraceResult:
        self.v.workflow()          # load the operators (imports) before the clock starts
        self._planner = planner
        t0 = time.perf_counter()
        self._check_array(start)
        shape = self.v.shapes[start]
        cells = self._cells(cells, start, shape)
        packed = pack(cells, shape)
        # a small query also keeps its sorted cells (deduplicated); a large one only
        # its bitmap, so it pays no sort
        q0 = np.unique(packed) if packed.size <= SMALL_QUERY else None
        bm = bitmap_from_packed(packed if q0 is None else q0, shape)
        if (to is None) == (path is None):
            raise QueryError("give either a target array (--to) or a path (--path), not both")
        steps: list[StepStat] = []
        if path is not None:
            target, direction = self._follow(start, bm, q0, path, prefer, shortcut, steps)
            result = self._last
        else:
            self._check_array(to)
            result, direction = self._between(start, to, bm, q0, prefer, shortcut, steps)
            target = to
        view = self.v

        def values():
            return self._value(target)
        return TraceResult(view.run_id, start, target, direction, result, steps,
                           time.perf_counter() - t0, values)

    # -- structure ----------------------------------------------------------------------
    def _check_array(self, name: str) -> None:
        if name not in self.v.shapes:
            raise QueryError(f"unknown array {name!r} in run {self.v.run_id}; its arrays are: "
                             f"{', '.join(self.v.shapes)}")

    def _cells(self, cells, name, shape) -> np.ndarray:
        try:
            c = as_cells(cells, len(shape))
        except (ValueError, TypeError) as e:
            raise QueryError(f"bad query cells for {name!r}: {e}") from None
        bad = first_out_of_bounds(c, shape)
        if bad is not None:
            raise QueryError(f"cell {fmt_cell(c[bad])} is outside {name} (shape {tuple(shape)})")
        return c

    def _follow(self, start, bm, q, path, prefer, shortcut, steps):
        cur, direction = start, None
        for op, i in path:
            if op not in self.v.inputs_of:
                raise QueryError(f"path step {op}:{i}: {op!r} is not an operator of run "
                                 f"{self.v.run_id}")
            ins = self.v.inputs_of[op]
            if not 0 <= i < len(ins):
                raise QueryError(f"path step {op}:{i}: operator {op!r} has {len(ins)} inputs "
                                 f"(indexes 0..{len(ins) - 1})")
            if op == cur:
                d, nxt = "backward", ins[i]
            elif ins[i] == cur:
                d, nxt = "forward", op
            else:
                raise QueryError(f"path step {op}:{i} does not touch array {cur!r}: {op!r} reads "
                                 f"{ins[i]!r} as input {i}")
            if direction and d != direction:
                raise QueryError(f"path mixes directions at step {op}:{i}; a trace goes either "
                                 f"backward or forward")
            direction = d
            bm, _, q = self._step(op, i, d == "backward", bm, prefer, shortcut, steps, q_in=q)
            cur = nxt
        self._last = bm
        return cur, direction or "backward"

    def _reach(self, frm: str, down: bool) -> set[str]:
        """Arrays reachable from ``frm`` downstream (consumers) or upstream (inputs); cached,
        the DAG of a run never changes."""
        key = (frm, down)
        hit = self._reach_cache.get(key)
        if hit is None:
            hit = self._reach_cache[key] = frozenset(self._reach_uncached(frm, down))
        return set(hit)

    def _reach_uncached(self, frm: str, down: bool) -> set[str]:
        seen, todo = set(), [frm]
        while todo:
            a = todo.pop()
            nxt = ([o for o, ins in self.v.inputs_of.items() if a in ins] if down
                   else self.v.inputs_of.get(a, []))
            for b in nxt:
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    def _between(self, start, to, bm, q0, prefer, shortcut, steps):
        if start == to:
            return bm, "backward"
        if to in self._reach(start, down=False):
            backward, on = True, self._reach(start, down=False) & (self._reach(to, down=True) | {to})
        elif to in self._reach(start, down=True):
            backward, on = False, self._reach(start, down=True) & (self._reach(to, down=False) | {to})
        else:
            raise QueryError(f"arrays {start!r} and {to!r} are not connected in run "
                             f"{self.v.run_id}: no path of operators leads from one to the other")
        on.add(start)
        order = [a for a in self._topo() if a in on]
        bms = {start: bm}
        # sorted packed cells of small sets, kept beside their bitmaps: a small query
        # never scans a whole bitmap to count or list its cells
        packed = {start: q0} if q0 is not None else {}
        counts = {start: int(q0.size) if q0 is not None
                  else int(np.count_nonzero(bm))}       # one count per bitmap, reused
        for a in (reversed(order) if backward else order):
            if a not in bms or not counts[a]:
                continue
            if backward:
                edges = [(a, i, src) for i, src in enumerate(self.v.inputs_of.get(a, [])) if src in on]
            else:
                edges = [(o, i, o) for o, ins in self.v.inputs_of.items() if o in on
                         for i, x in enumerate(ins) if x == a]
            for op, i, dst in edges:
                tgt = bms.get(dst)
                if tgt is not None and counts[dst] == tgt.size:
                    continue          # early stop: nothing left to add
                r, n, rq = self._step(op, i, backward, bms[a], prefer, shortcut, steps, counts[a],
                                      q_in=packed.get(a))
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
        return out, "backward" if backward else "forward"

    def _topo(self) -> list[str]:
        if self._topo_cache is None:
            self._topo_cache = self._topo_uncached()
        return self._topo_cache

    def _topo_uncached(self) -> list[str]:
        order, seen = [], set()

        def visit(a):
            if a in seen:
                return
            seen.add(a)
            for b in self.v.inputs_of.get(a, []):
                visit(b)
            order.append(a)
        for a in self.v.shapes:
            visit(a)
        return order

    # -- one step --------------------------------------------------------------------------
    def _operator(self, name: str):
        return self.v.workflow().steps[name].operator

    def _methods(self, name: str, i: int, backward: bool, prefer: str | None):
        """The operator and its methods for a step in the simple rule's order (cached:
        the run's strategies never change)."""
        key = (name, i, backward, prefer)
        hit = self._methods_cache.get(key)
        if hit is None:
            hit = self._methods_cache[key] = self._methods_uncached(name, i, backward, prefer)
        return hit[0], list(hit[1])

    def _step_context(self, name, op, out_shape, in_shapes) -> relation.StepContext:
        sc = self._sc_cache.get(name)
        if sc is None:
            sc = self._sc_cache[name] = relation.StepContext(
                name, op, Context(name, op, frozenset(), in_shapes, out_shape), out_shape, in_shapes)
        return sc

    def _methods_uncached(self, name: str, i: int, backward: bool, prefer: str | None):
        op = self._operator(name)
        strategies = self.v.strategies.get(name, ())
        want = "backward" if backward else "forward"
        rank = {Mode.FULL: 0, Mode.COMP: 1, Mode.PAY: 2}
        stored = sorted((s for s in strategies if s.stored), key=lambda s: rank[s.mode])
        methods = [("stored", s) for s in stored if s.direction == want]
        if any(s.mode is Mode.MAP for s in strategies) and op.has_mapping():
            methods.append(("map", None))
        methods += [("stored", s) for s in stored if s.direction != want]
        methods.append(("reexec", None))
        if prefer:
            pick = _preferred(prefer, methods, op)
            if pick is not None:
                methods.remove(pick) if pick in methods else None
                methods.insert(0, pick)
        return op, methods

    def _step(self, name, i, backward, bm, prefer, shortcut, steps,
              n_in: int | None = None, q_in: np.ndarray | None = None):
        """One step; returns the target bitmap, its number of set cells and, for a small
        result, its sorted packed cells (else None).  ``q_in``: the sorted packed cells
        of ``bm`` when known."""
        t0 = time.perf_counter()
        ins = self.v.inputs_of[name]
        out_shape = self.v.shapes[name]
        in_shapes = [self.v.shapes[a] for a in ins]
        tgt_shape = in_shapes[i] if backward else out_shape
        d = "backward" if backward else "forward"
        n_in = int(np.count_nonzero(bm)) if n_in is None else n_in
        budget, blocks, note = None, 0, ""
        res_q = None
        if n_in == 0:
            res, method = np.zeros(tgt_shape, bool), "empty"
        else:
            op, methods = self._methods(name, i, backward, prefer)
            if shortcut and op.is_all_to_all(i):
                res, method = np.ones(tgt_shape, bool), "all-to-all"
            else:
                q = q_in
                if self._planner is not None and not prefer:
                    if n_in <= SMALL_QUERY:      # the packed cells are needed anyway
                        q = relation.packed_query(bm)[0] if q is None else q
                        blocks = blocks_of_packed(q)
                    else:
                        blocks = blocks_spanned(bm)
                    info = StepInfo(name, i, backward, n_in, blocks,
                                    all(a in self._values for a in ins))
                    methods, budget = self._planner.plan(info, methods)
                sc = self._step_context(name, op, out_shape, in_shapes)
                q_flat = bm.ravel()
                res = None
                for kind, s in methods:
                    if kind != "map" and q is None:
                        q = relation.packed_query(bm)[0]
                    if kind == "stored":
                        if (name, str(s)) in self._broken:
                            continue
                        try:
                            until = None if budget is None else t0 + budget
                            packed = self._stored(name, s, sc, i, backward, q, q_flat, tgt_shape,
                                                  until)
                        except CorruptLineage as e:
                            self._broken.add((name, str(s)))
                            self.warn(f"{e}; answering this step another way")
                            continue
                        except _Deadline:
                            note = (f"stored:{s} took longer than its budget ({budget * 1000:.1f}"
                                    f" ms, from the predicted re-execution); switched to "
                                    f"re-execution")
                            packed, method = self._reexec(name, op, sc, i, backward, q, q_flat)
                            res = bitmap_from_packed(packed, tgt_shape) \
                                if not (isinstance(packed, np.ndarray) and packed.dtype == bool) \
                                else packed
                            break
                        method = f"stored:{s}"
                    elif kind == "map":
                        packed = self._map(op, sc, bm, i, backward, q)
                        method = "map"
                    else:
                        packed, method = self._reexec(name, op, sc, i, backward, q, q_flat)
                    if isinstance(packed, np.ndarray) and packed.dtype == bool:
                        res = packed
                    elif packed.size <= SMALL_QUERY:
                        res_q = np.unique(packed)
                        res = bitmap_from_packed(res_q, tgt_shape)
                    else:
                        res = bitmap_from_packed(packed, tgt_shape)
                    break
        if res_q is not None:
            n_out = int(res_q.size)
        else:
            n_out = res.size if method == "all-to-all" else int(np.count_nonzero(res))
        st = StepStat(name, i, d, method, n_in, n_out, time.perf_counter() - t0, blocks, note)
        steps.append(st)
        if self._planner is not None and not prefer and method not in ("empty", "all-to-all"):
            self._planner.observe(st)
        return res, n_out, res_q

    @staticmethod
    def _map(op, sc, bm, i, backward, q):
        """Mapping functions, through the operator's whole-bitmap fast path when it has one
        (``q``, the packed cells, is computed only when there is none)."""
        fast = (op.map_b_bitmap if backward else op.map_f_bitmap)(bm, i, sc.mapctx)
        if fast is not NotImplemented:
            tgt = sc.in_shapes[i] if backward else sc.out_shape
            fast = np.asarray(fast, dtype=bool)
            if fast.shape != tuple(tgt):
                raise QueryError(f"operator {sc.name!r}: its bitmap mapping returned shape "
                                 f"{fast.shape}, expected {tuple(tgt)}")
            return fast
        if q is None:
            q = relation.packed_query(bm)[0]
        return sc.map_b(q, i) if backward else sc.map_f(q, i)

    def _stored(self, name, s: Strategy, sc, i, backward, q, q_flat, tgt_shape, until=None):
        reader = self._reader(name, s)
        if until is not None:
            reader = _TimedReader(reader, until)
        if s.mode is Mode.COMP:
            return relation.composite(reader, s.direction, sc, i, backward, q, q_flat)
        fn = relation.backward if backward else relation.forward
        matched = (s.direction == "backward") == backward
        if not matched or q.size <= FIRST_CHUNK:
            return fn(reader, s.payload, s.direction, sc, i, q, q_flat)
        # Chunked so that a step whose target fills up stops early: a high fan-out step
        # (a model cell feeds thousands of predictions) often fills it from its first
        # few cells.  Chunks grow 8x while the cells so far could still fill the target
        # at their fan-out; otherwise the rest goes in LOOKUP_CHUNK pieces.  Only the
        # speed depends on this: the answer is the union over chunks either way.
        size = int(np.prod(tgt_shape, dtype=np.int64))
        out = np.zeros(size, bool)
        a, step = 0, FIRST_CHUNK
        while a < q.size:
            b = min(q.size, a + step)
            out[fn(reader, s.payload, s.direction, sc, i, q[a:b], q_flat)] = True
            n = int(np.count_nonzero(out))
            if n == size:
                break
            step = min(step * 8, LOOKUP_CHUNK) if n * q.size >= size * b else LOOKUP_CHUNK
            a = b
        return out.reshape(tgt_shape)

    def _reader(self, name, s):
        key = (name, str(s))
        r = self._readers.get(key)
        if r is None:
            if self._lineage is None:
                self._lineage = LineageStore(self.v.lineage_path, readonly=True)
                weakref.finalize(self, self._lineage.close)   # released with the executor
            r = self._readers[key] = self._lineage.reader(name, s)
        return r

    def _value(self, name):
        v = self._values.get(name)
        if v is None:
            v = self._values[name] = self.v.arrays.read_value(name)
        return v

    def _reexec(self, name, op, sc, i, backward, q, q_flat):
        mode = capture_mode(op)
        if mode is None:
            if Mode.MAP in op.supported_modes() and op.has_mapping():
                return (sc.map_b(q, i) if backward else sc.map_f(q, i)), "map"
            shape = sc.in_shapes[i] if backward else sc.out_shape
            return np.ones(shape, bool), "all-to-all"
        inputs = [self._value(a) for a in self.v.inputs_of[name]]
        full, pay, covered = rerun(name, op, inputs, sc.out_shape, mode, backward, i, q_flat)
        fn = relation.backward if backward else relation.forward
        if mode is Mode.FULL:
            res = fn(relation.MemoryPairs(full), False, "backward", sc, i, q, q_flat) \
                if full is not None else np.zeros(0, np.int64)
        elif mode is Mode.PAY:
            res = fn(relation.MemoryPairs(pay), True, "backward", sc, i, q, q_flat) \
                if pay is not None else np.zeros(0, np.int64)
        else:
            from subzero.capture.buffer import empty_pairs
            src = relation.MemoryPairs(pay if pay is not None else empty_pairs(len(sc.in_shapes), True),
                                       covered=covered)
            res = relation.composite(src, "backward", sc, i, backward, q, q_flat)
        return res, f"reexec:{mode.value}"


def blocks_of_packed(q: np.ndarray) -> int:
    """``blocks_spanned`` from sorted packed cells (cheaper for small queries)."""
    return int(np.count_nonzero(run_starts(q >> KEY_BITS)))


def blocks_spanned(bm: np.ndarray) -> int:
    """Distinct key blocks (2**KEY_BITS consecutive cells) a query bitmap touches: how
    clustered its cells are, which decides how many stored blocks a lookup decodes."""
    flat = bm.ravel()
    if flat.size <= KEY_BLOCK:
        return 1
    return int(np.count_nonzero(np.logical_or.reduceat(flat, np.arange(0, flat.size, KEY_BLOCK))))


class _TimedReader:
    """A StrategyReader that gives up (raises _Deadline) once ``until`` has passed,
    checked between chunks of record blocks: the query-time planner's switch to
    re-execution when reading stored lineage costs more than re-running would."""

    CHUNK = TIMED_RECORD_PAIRS   # pairs per records() call
    QUERY_CHUNK = TIMED_QUERY_CELLS   # query cells per lookup() call (R-tree probes are slow)

    def __init__(self, reader, until: float):
        self.r, self.until = reader, until

    def _check(self) -> None:
        if time.perf_counter() > self.until:
            raise _Deadline()

    def has_space(self, space):
        return self.r.has_space(space)

    def covered(self):
        self._check()
        return self.r.covered()

    def lookup(self, space, q, q_flat):
        self._check()
        if len(q) <= self.QUERY_CHUNK:
            return self.r.lookup(space, q, q_flat)
        ids = []                  # pairs hit by any chunk of the query are hit by the query
        for a in range(0, len(q), self.QUERY_CHUNK):
            self._check()
            ids.append(self.r.lookup(space, q[a:a + self.QUERY_CHUNK], q_flat))
        return np.unique(np.concatenate(ids))

    def all_pairs(self, space):
        self._check()
        return self.r.all_pairs(space)

    def scan_keys(self, space, pids):
        self._check()
        return self.r.scan_keys(space, pids)

    def records(self, space, pids, fields):
        if len(pids) <= self.CHUNK:
            self._check()
            return self.r.records(space, pids, fields)
        parts = []
        for a in range(0, len(pids), self.CHUNK):
            self._check()
            parts.append(self.r.records(space, pids[a:a + self.CHUNK], fields))
        out = {}
        for f in fields:
            if f == "pay":        # one payload table for all chunks
                table: dict[bytes, int] = {}
                ids = []
                for p in parts:
                    local, tab = p["pay"]
                    remap = np.array([table.setdefault(b, len(table)) for b in tab], np.int64)
                    ids.append(remap[local] if len(tab) else np.zeros(0, np.int64))
                out["pay"] = (np.concatenate(ids), list(table))
            else:
                cells = np.concatenate([p[f][0] for p in parts])
                lens = np.concatenate([np.diff(p[f][1]) for p in parts])
                out[f] = (cells, lengths_to_offsets(lens))
        return out


def _preferred(prefer: str, methods, op):
    if prefer == "map":   # mapping alone is lineage only for operators that declare MAP
        return ("map", None) if Mode.MAP in op.supported_modes() and op.has_mapping() else None
    if prefer == "reexec":
        return ("reexec", None)
    try:
        s = parse_one(prefer)
    except Exception:
        return None
    return ("stored", s) if ("stored", s) in methods else None
