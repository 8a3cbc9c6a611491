"""The incremental engine: a re-run on corrected inputs that runs again only the
tiles the correction can reach, and keeps the parent run's everywhere else.

It is the local engine (same tiles, same tile step, same statistics) with one
question asked before each tile: *can this tile come out differently from the
parent's?*  Changes (:class:`~subzero.engines.changes.Changes`: a box of
differing cells per chunk) start at the corrected inputs (a cell diff against
the parent's stored input) and are pushed forward operator by operator:

* a **tile-parallel** operator (elementwise, stencil) runs again the tiles whose
  read region (core plus halo) meets a change of an input; the others are
  the parent's.  With a :attr:`~subzero.Operator.statistic`, the statistic is
  computed again over the whole new input: unchanged, nothing more runs; changed,
  every tile runs that :meth:`~subzero.Operator.uses_statistic` says the value can
  reach (all of them, unless the operator says where it used it).
* **every other** operator (aggregations, connected components, gathers, global,
  and operators declared not deterministic) runs whole when any input changed, and
  is the parent's when none did.
* every tile that ran is compared with the parent's, chunk by chunk: where it came
  out the same, the change stops there (early cut-off, as Bazel and Shake do for
  files, at tile granularity).

A kept tile's values are read from the parent's verified chunks and its lineage
from the parent's verified backward strategies (:mod:`subzero.engines.parent`); an
operator kept whole stores copies of the parent's strategies where it can
(``Parent.copies``: checked, sealed again for this run, not decoded and encoded).
What cannot be verified in the parent (a chunk that fails its checks, lineage
that cannot be read back) is recomputed, never reused.  The result is, by
construction, the run a full run on the new inputs makes: tile-parallel
operators give the same cells on any tiling, so a tile computed from unchanged
read regions with an unchanged statistic is the parent's tile.

Tiles here are the store's chunks (plus the operator's halo), whatever task
size a full run used: the smallest unit that can be kept or recomputed whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from subzero.capture.buffer import Pairs
from subzero.capture.runner import NOT_GIVEN, run_tile
from subzero.capture.tiles import Tile, concat_pairs, input_slices, one_cell, tile_plan, tiles_for
from subzero.engines.base import StepResult
from subzero.engines.changes import Box, Changes
from subzero.engines.local import LocalEngine, _native
from subzero.engines.parent import Parent, keep_all
from subzero.engines.progress import Progress
from subzero.errors import CorruptArray, OperatorError, ParentUnavailable, StoreError, SubZeroError
from subzero.model.cells import unpack
from subzero.model.modes import Mode
from subzero.model.operator import Operator
from subzero.model.statistic import finished, over_blocks, same_value, updated, value_digest
from subzero.model.strategy import Strategy, modes_needed
from subzero.model.workflow import Step, Workflow
from subzero.storage import rounds
from subzero.storage.arrays import ArrayStore
from subzero.storage.lineage import Prepared


def _slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def _grow(box: Box, by: int, shape: Sequence[int]) -> Box:
    return tuple((max(0, a - by), min(int(n), b + by)) for (a, b), n in zip(box, shape))


class IncrementalEngine(LocalEngine):
    """The local engine, re-running only what a change of inputs can reach (see the
    module's docstring).  ``given``: the inputs that have new values (the others are
    the parent's).  :attr:`report` says, per operator, what ran and what changed."""

    name = "local"

    def __init__(self, arrays: ArrayStore, parent: Parent, given: Sequence[str]):
        super().__init__(arrays, profiling=False, stream=True)
        self.parent = parent
        self.given = set(given)
        self.changes: dict[str, Changes] = {}
        #: per input and operator: how it was made and where it differs from the parent's
        self.report: dict[str, dict[str, Any]] = {}
        #: chunk files shared with the parent by hard links
        self.linked = 0
        #: arrays kept from the parent that an operator still reads whole: read back (and
        #: held) only when one of those operators runs.  A run made from its profiling
        #: run runs none, and reading them all was 1.5 s of its 18 at genomics 10,000x
        self._later: set[str] = set()

    def summary(self) -> dict[str, Any]:
        """What the re-run's record says of it: its parent, the inputs corrected, and per
        input and operator how it was made and where it differs from the parent's."""
        return {"parent": self.parent.run_id, "parent_uid": self.parent.arrays.run_uid,
                "inputs": sorted(self.given), "ops": self.report}

    # -- inputs ---------------------------------------------------------------------------
    def load_inputs(self, wf: Workflow, values: Mapping[str, Any]) -> None:
        super().load_inputs(wf, values)
        tile = self.arrays.tile
        for name in values:
            shape = self.shapes[name]
            if name not in self.given:
                self.changes[name] = Changes.none(shape, tile)
                continue
            ch = self._compare(name)
            self.changes[name] = ch
            self.report[name] = {"kind": "input", "changed": ch.as_dict()}

    def resume(self, wf: Workflow, stored: list[str]) -> None:
        """Go on with a re-run whose driver was lost: what it stored (its inputs, the
        operators done) is compared with the parent's, to know where it changed."""
        super().resume(wf, stored)
        for name in stored:
            shape = self.shapes[name]
            if name in wf.inputs and name not in self.given:
                self.changes[name] = Changes.none(shape, self.arrays.tile)
                continue
            self.changes[name] = self._compare(name)
            self.report[name] = {"kind": "input" if name in wf.inputs else "resumed",
                                 "changed": self.changes[name].as_dict()}

    # -- operators ------------------------------------------------------------------------
    def run_step(self, name: str, step: Step, strategies: tuple[Strategy, ...], capture: bool,
                 progress: Progress) -> StepResult:
        in_shapes = [self.shapes[a] for a in step.inputs]
        changed = [self.changes[a] for a in step.inputs]
        op = step.operator
        # an operator that is not deterministic runs whole: tiles of two of its runs may
        # not fit together (its output is still any of its runs', so it may be kept whole)
        tiles = self._rerun_tiles(step, in_shapes) if op.deterministic else None
        res: StepResult | None = None
        if not any(changed) and self.parent.shapes.get(name) is not None:
            res = self._keep_whole(name, step, strategies, capture, in_shapes, tiles)
        if res is None:
            self._hold_later(step.inputs)
        if res is None and tiles is not None:
            res = self._run_some(name, step, strategies, capture, progress, tiles, in_shapes)
        if res is None:
            t0 = time.perf_counter()
            res = self._run_whole(name, step, strategies, capture)
            ch = self._compare(name)
            self.changes[name] = ch
            self.report[name] = {"kind": "whole", "tiles": 1, "ran": 1,
                                 "changed": ch.as_dict(), "lineage": "recomputed",
                                 "seconds": time.perf_counter() - t0,
                                 "statistic": None if op.statistic is None else {"recomputed": True}}
        self._read(step)
        return res

    def _hold_later(self, names: Sequence[str]) -> None:
        """The arrays among ``names`` kept from the parent and not read back yet, read and
        held now, as the local engine holds what an operator about to run reads whole."""
        for a in names:
            if a in self._later:
                self._later.discard(a)
                if self._wanted(a):
                    self.values[a] = self._value(a)

    def _read(self, step: Step) -> None:
        super()._read(step)
        for a in set(step.inputs):
            if not self._wanted(a):
                self._later.discard(a)

    def _rerun_tiles(self, step: Step, in_shapes: list[tuple[int, ...]]) -> list[Tile] | None:
        """The store's chunks (plus the operator's halo) to run a tile-parallel operator
        over, or None: it runs whole (as the local engine would run it whole)."""
        if self._tiles(step, in_shapes) is None:
            return None
        halo = tile_plan(step.operator, in_shapes)
        assert halo is not None
        tiles = tiles_for(in_shapes[0], self.arrays.tile, halo)
        return tiles if len(tiles) > 1 else None

    # -- an operator no change reaches: the parent's ----------------------------------------
    def _keep_whole(self, name: str, step: Step, strategies: tuple[Strategy, ...], capture: bool,
                    in_shapes: list[tuple[int, ...]], tiles: list[Tile] | None) -> StepResult | None:
        """The parent's output and lineage, verified as they are read; None when either
        cannot be (the operator then runs)."""
        t0 = time.perf_counter()
        full = pay = None
        copies: dict[str, Any] = {}
        if capture:
            # the strategies the parent stored are copied from it; the pairs are read back
            # (or taken from memory) only for the others
            copies = self.parent.copies(name, strategies, self.arrays.run_uid)
            try:
                full, pay = self.parent.pairs(name, tuple(s for s in strategies if str(s) not in copies),
                                              len(in_shapes), keep_all)
            except ParentUnavailable:
                return None
        p = self.parent.arrays
        try:
            shape, dtype, numpy = p.describe(name)
            if not numpy:
                value = p.read_value(name)
                self.arrays.write(name, value)
                self._hold(name, value)
            else:
                dtype = _native(np.dtype(dtype))
                self._create(name, shape, dtype)
                self._take(name, tuple(slice(0, int(n)) for n in shape), self._same_layout(name))
                self.shapes[name], self.dtypes[name] = tuple(shape), dtype
                if self._wanted(name):
                    self._later.add(name)
        except CorruptArray:
            self.arrays.remove(name)
            return None
        self.changes[name] = Changes.none(self.shapes[name], self.arrays.tile)
        self.report[name] = {"kind": "kept", "tiles": len(tiles) if tiles else 1, "ran": 0,
                             "changed": self.changes[name].as_dict(), "lineage": "parent",
                             "seconds": time.perf_counter() - t0, "statistic": None}
        nbytes = int(np.prod(self.shapes[name])) * self.dtypes[name].itemsize
        op = step.operator
        kept = self._kept_rounds(name, op.statistic) if op.statistic is not None else None
        return StepResult(self.shapes[name], str(self.dtypes[name]), nbytes, list(in_shapes),
                          full, pay, 0.0, 0.0, tiles=0, statistic=self.parent.statistics.get(name),
                          rounds=self._keep_rounds(name, op, kept or []),
                          pairs=_captured(strategies, full, pay, copies) if copies else None,
                          copies=copies or None, ahead=self._ahead(name))

    def _ahead(self, name: str) -> Callable[[Strategy], Prepared | None] | None:
        """Operator ``name``'s strategies encoded ahead from the parent's pairs
        (``Parent.ahead``), for the lineage of an operator kept whole."""
        ahead = self.parent.ahead
        return None if ahead is None else (lambda s: ahead(name, s))

    # -- a tile-parallel operator: the tiles a change reaches ------------------------------
    def _run_some(self, name: str, step: Step, strategies: tuple[Strategy, ...], capture: bool,
                  progress: Progress, tiles: list[Tile], in_shapes: list[tuple[int, ...]]
                  ) -> StepResult | None:
        t0 = time.perf_counter()
        op, out_shape = step.operator, tuple(in_shapes[0])
        p = self.parent.arrays
        if tuple(self.parent.shapes.get(name) or ()) != out_shape:
            return None                     # the parent's output is not this one's: run whole
        try:
            _, pdtype, numpy = p.describe(name)
        except (StoreError, OSError):
            return None
        if not numpy:
            return None
        dtype = _native(np.dtype(pdtype))
        changed = [self.changes[a] for a in step.inputs]
        run = [any(ch.meets(self._read_box(t, s)) for ch, s in zip(changed, in_shapes)) for t in tiles]
        stat: Any = None
        stat_info: dict[str, Any] | None = None
        states: list = []
        if op.statistic is not None:
            stat, stat_info, states = self._statistic(name, step, tiles, in_shapes)
            if stat_info["changed"]:
                using = [k for k, t in enumerate(tiles) if not run[k] and self._uses(name, step, t, in_shapes)]
                for k in using:
                    run[k] = True
                stat_info["tiles_using"] = len(using)
        lineage = "parent"
        if capture and not all(run):
            try:
                kept = [t for t, r in zip(tiles, run) if not r]
                parent_pairs = self.parent.pairs(name, strategies, len(in_shapes),
                                                 _in_cores(kept, out_shape, self.arrays.tile))
            except ParentUnavailable:
                run = [True] * len(tiles)
                parent_pairs = (None, None)
                lineage = "recomputed"
        else:
            parent_pairs = (None, None)
        self._create(name, out_shape, dtype)
        layout = self._same_layout(name)
        ch = Changes.none(out_shape, self.arrays.tile)
        fulls: list[Pairs | None] = []
        pays: list[Pairs | None] = []
        run_s = lwrite_s = 0.0
        ran = 0
        for k, tile in enumerate(tiles):
            if not run[k]:
                try:
                    self._take(name, tile.core_slices(), layout)
                    continue
                except CorruptArray:
                    pass
                # a parent chunk that fails its checks: recomputed, never reused, and its
                # lineage with it (the parent's pairs were cut to the tiles kept)
                run[k] = True
                if capture and any(x is not None for x in parent_pairs):
                    return self._restart(name, step, strategies, capture, progress, tiles, in_shapes)
            ins = [self._region(a, tile) for a in step.inputs]
            try:
                done = run_tile(name, op, ins, strategies, capture, tile, out_shape, in_shapes,
                                statistic=stat if op.statistic is not None else NOT_GIVEN)
            except SubZeroError as e:
                raise type(e)(f"{e} (on tile {tile.describe()} of {len(tiles)})") from e
            del ins
            if _native(done.core.dtype) != dtype:
                raise OperatorError(f"operator {name!r} returned {done.core.dtype} on tile "
                                    f"{tile.describe()}, not the {dtype} of run "
                                    f"{self.parent.run_id}; a re-run needs the operator to return "
                                    f"what it returned then")
            self.arrays.write_region(name, tile.core_slices(), done.core)
            try:
                old = p.read_region(name, tile.core_slices())
            except CorruptArray:
                ch.add(tile.core)
            else:
                ch.compare(tile.core, old, done.core)
            fulls.append(done.full)
            pays.append(done.pay)
            run_s += done.run_s
            lwrite_s += done.lwrite_s
            ran += 1
            progress.tiles(ran, sum(run))
        fulls.append(parent_pairs[0])
        pays.append(parent_pairs[1])
        self.shapes[name], self.dtypes[name] = out_shape, dtype
        if self._wanted(name):
            self.values[name] = self._value(name)
        self.changes[name] = ch
        self.report[name] = {"kind": "tiles", "tiles": len(tiles), "ran": ran,
                             "changed": ch.as_dict(), "statistic": stat_info,
                             "lineage": lineage if ran < len(tiles) else "recomputed",
                             "seconds": time.perf_counter() - t0}
        return StepResult(out_shape, str(dtype), int(np.prod(out_shape)) * dtype.itemsize,
                          list(in_shapes), concat_pairs(fulls, len(in_shapes)),
                          concat_pairs(pays, len(in_shapes)), run_s, lwrite_s, tiles=ran,
                          statistic=None if op.statistic is None else value_digest(stat),
                          rounds=self._keep_rounds(name, op, states))

    def _create(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """The output array, made like the parent's (its metadata copied, not written by
        xarray again) when it can be, else as the local engine makes it."""
        try:
            self.arrays.create_like(name, self.parent.arrays)
            got, got_dtype, _ = self.arrays.describe(name)
            if tuple(got) == tuple(shape) and _native(np.dtype(got_dtype)) == dtype and \
                    self.arrays.chunk_shape(name) == tuple(min(int(n), self.arrays.tile) for n in shape):
                return
        except (StoreError, OSError):
            pass
        self.arrays.remove(name)
        self.arrays.create(name, shape, dtype)

    def _same_layout(self, name: str) -> bool:
        """Whether the parent's array ``name`` is chunked as this run's (its chunks can then
        be shared as they are)."""
        try:
            return self.parent.arrays.chunk_shape(name) == self.arrays.chunk_shape(name)
        except (StoreError, OSError):
            return False

    def _take(self, name: str, region: tuple[slice, ...], layout: bool) -> None:
        """The parent's cells of ``region`` (whole chunks) become this run's: its chunk
        files shared (:meth:`ArrayStore.share_region`) when the layouts agree, else read
        and written again.  :class:`CorruptArray` when they fail their checks."""
        if layout:
            self.linked += self.arrays.share_region(name, self.parent.arrays, region)
        else:
            self.arrays.write_region(name, region, self.parent.arrays.read_region(name, region))

    def _restart(self, name: str, step: Step, strategies: tuple[Strategy, ...], capture: bool,
                 progress: Progress, tiles: list[Tile], in_shapes: list[tuple[int, ...]]) -> StepResult:
        """A kept tile turned out unreadable in the parent after its lineage was cut to
        the kept tiles: start the operator over, every tile run."""
        self.arrays.remove(name)
        res = self._run_tiles(name, step, strategies, capture, progress, tiles, in_shapes)
        ch = self._compare(name)
        self.changes[name] = ch
        self.report[name] = {"kind": "tiles", "tiles": len(tiles), "ran": len(tiles),
                             "changed": ch.as_dict(), "statistic": None, "lineage": "recomputed",
                             "seconds": 0.0}
        return res

    def _read_box(self, tile: Tile, shape: tuple[int, ...]) -> Box:
        """What ``tile`` reads of an input of ``shape`` (a one-cell input: all of it)."""
        return tuple((s.start, s.stop) for s in input_slices(tile, shape)) if not one_cell(shape) \
            else tuple((0, int(n)) for n in shape)

    def _statistic(self, name: str, step: Step, tiles: list[Tile], in_shapes: list[tuple[int, ...]]
                   ) -> tuple[Any, dict[str, Any], list]:
        """The statistic over the new first input, whether it differs from the parent's,
        and its merged states.  A subtractive statistic whose parent kept its merged
        states is updated with the tiles whose input changed (:func:`updated`); any other
        is computed over the whole new input, and compared with the value the parent's
        record names (or computed again over the parent's input, for runs made before
        records named it)."""
        op = step.operator
        stat = op.statistic
        assert stat is not None
        first = step.inputs[0]
        cores = [t.core for t in tiles]
        shape = tuple(in_shapes[0])
        states: list = []

        def read_new(box: Box) -> np.ndarray:
            return self._slice(first, _slices(box))

        def read_old(box: Box) -> np.ndarray:
            return self.parent.arrays.read_region(first, _slices(box))

        recorded = self.parent.statistics.get(name)
        try:
            kept = self._kept_rounds(name, stat)
            if not self.changes[first]:
                if kept is not None:     # the parent's value, from its merged states
                    new = finished(stat, kept)
                    if recorded is None or value_digest(new) == recorded:
                        return new, {"changed": False, "recomputed": False}, list(kept)
                new = over_blocks(stat, read_new, cores, shape, states) if stat.subtractive \
                    else over_blocks(stat, read_new, cores, shape)
                return new, {"changed": False, "recomputed": True}, states
            changed = [c for c in cores if self.changes[first].meets(_grow(c, int(stat.halo), shape))]
            # an update reads each changed tile twice (old and new): worth it below half
            if kept is not None and 2 * len(changed) < len(cores):
                try:
                    new, old = updated(stat, kept, read_old, read_new, changed, cores, shape, states)
                except CorruptArray:
                    new = old = None
                if old is not None and (recorded is None or value_digest(old) == recorded):
                    return new, {"changed": not same_value(new, old), "recomputed": "updated",
                                 "tiles_read": len(changed)}, states
                states = []
            new = over_blocks(stat, read_new, cores, shape, states)
        except SubZeroError:
            raise
        except Exception as e:
            raise OperatorError(f"operator {name!r} ({type(op).__name__}) failed computing its "
                                f"statistic: {type(e).__name__}: {e}") from e
        if recorded is not None:         # the parent's value, as its signed record names it
            return new, {"changed": value_digest(new) != recorded, "recomputed": True}, states
        try:
            old = over_blocks(stat, read_old, cores, shape)
        except Exception:
            return new, {"changed": True, "recomputed": True}, states
        return new, {"changed": not same_value(new, old), "recomputed": True}, states

    def _kept_rounds(self, name: str, stat: Any) -> list | None:
        """The merged states the parent kept of ``name``'s statistic, when it is
        subtractive and they are the ones its record names."""
        digest = self.parent.rounds.get(name)
        if not stat.subtractive or digest is None:
            return None
        kept = rounds.load(self.parent.dir, name, digest)
        return kept if kept is not None and len(kept) == int(stat.rounds) else None

    def _uses(self, name: str, step: Step, tile: Tile, in_shapes: list[tuple[int, ...]]) -> bool:
        """Whether a kept tile's output can depend on the changed statistic (the
        operator's :meth:`~subzero.Operator.uses_statistic`, over the parent's values)."""
        op: Operator = step.operator
        if type(op).uses_statistic is Operator.uses_statistic:
            return True
        shape = tuple(in_shapes[0])
        block = _grow(tile.read, int(op.statistic_margin), shape)
        p = self.parent.arrays
        try:
            out = p.read_region(name, _slices(block))
        except CorruptArray:
            return True
        regions = [_slices(block) if not one_cell(s) else tuple(slice(0, int(n)) for n in s)
                   for s in in_shapes]
        try:
            return bool(op.uses_statistic(_Inputs(p, list(step.inputs), regions), out, block,
                                          tile.read, shape))
        except CorruptArray:
            return True
        except Exception as e:
            raise OperatorError(f"operator {name!r} ({type(op).__name__}) failed in "
                                f"uses_statistic: {type(e).__name__}: {e}") from e

    # -- an array compared with the parent's ----------------------------------------------
    def _compare(self, name: str) -> Changes:
        """Where this run's array ``name`` (a corrected input, an operator's output run
        whole) differs from the parent's, cell by cell, chunk by chunk: held in memory or
        read back.  Another shape or dtype counts as changed everywhere, a parent chunk
        that fails its checks as changed there."""
        shape, tile = self.shapes[name], self.arrays.tile
        p = self.parent.arrays
        try:
            pshape, pdtype, _ = p.describe(name)
        except (StoreError, OSError):
            return Changes.all(shape, tile)
        if tuple(pshape) != tuple(shape) or _native(np.dtype(pdtype)) != self.dtypes[name]:
            return Changes.all(shape, tile)
        ch = Changes.none(shape, tile)
        for t in tiles_for(shape, tile):
            region = t.core_slices()
            new = np.asarray(self._slice(name, region))
            try:
                old = p.read_region(name, region)
            except CorruptArray:
                ch.add(t.core)
                continue
            ch.compare(t.core, old, new)
        return ch


class _Inputs(Sequence["_Region"]):
    """The parent's inputs over a block, read only where the operator looks
    (:meth:`~subzero.Operator.uses_statistic` often decides from the output alone, or
    from small boxes of an input): each item reads its block whole with ``np.asarray``,
    and a box of it with ``item[slices]``."""

    def __init__(self, arrays: ArrayStore, names: list[str], regions: list[tuple[slice, ...]]):
        self.items = [_Region(arrays, n, r) for n, r in zip(names, regions)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: Any) -> Any:
        return self.items[i]


class _Region:
    """One stored array over a block, read when (and where) it is indexed."""

    def __init__(self, arrays: ArrayStore, name: str, region: tuple[slice, ...]):
        self.arrays, self.name, self.region = arrays, name, region
        self.shape = tuple(s.stop - s.start for s in region)
        self._whole: np.ndarray | None = None

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self._whole is None:
            self._whole = self.arrays.read_region(self.name, self.region)
        return self._whole if dtype is None else self._whole.astype(dtype)

    def __getitem__(self, key: Any) -> np.ndarray:
        if self._whole is not None or not (isinstance(key, tuple) and len(key) == len(self.shape)
                                           and all(isinstance(k, slice) and k.step in (None, 1)
                                                   for k in key)):
            return np.asarray(self)[key]
        sub = []
        for k, r, n in zip(key, self.region, self.shape):
            a, b, _ = k.indices(n)
            sub.append(slice(r.start + a, r.start + max(a, b)))
        return self.arrays.read_region(self.name, tuple(sub))


def _captured(strategies: tuple[Strategy, ...], full: Pairs | None, pay: Pairs | None,
              copies: Mapping[str, Any]) -> int:
    """The pairs an operator kept whole captured, as a run of it counts them (its Full
    and its payload pairs): of each mode, the pairs read back, else those of a copied
    strategy's record."""
    n = 0
    for mode in modes_needed(strategies):
        got = full if mode is Mode.FULL else pay
        if got is not None:
            n += got.n
            continue
        n += next((int(copies[str(s)].record["pairs"]) for s in strategies
                   if s.mode is mode and str(s) in copies), 0)
    return n


def _in_cores(tiles: list[Tile], shape: tuple[int, ...], tile: int) -> Callable[[np.ndarray], np.ndarray]:
    """Keep: output cells (packed ids) inside the cores of ``tiles`` (chunks)."""
    grid = np.zeros([-(-n // tile) for n in shape], bool)
    for t in tiles:
        grid[tuple(a // tile for a, _ in t.core)] = True

    def keep(keys: np.ndarray) -> np.ndarray:
        if len(keys) == 0:
            return np.zeros(0, bool)
        idx = unpack(np.asarray(keys, np.int64), shape) // tile
        return grid[tuple(idx.T)]
    return keep
