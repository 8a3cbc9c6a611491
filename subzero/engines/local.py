"""The local engine: runs a workflow's operators in-process, capturing lineage as
each operator runs, with memory that follows the tile size, not the image.

* Tile-parallel operators (declared elementwise or stencil, every input of the
  output's shape) *stream*: per tile, the engine reads the tile's read region
  (core plus halo) of each input -- from memory when the array is held, else from
  the array store -- runs the operator on it, writes the core of the output
  straight into the store and keeps only the tile's lineage.  The tile step is
  the Spark engine's (:func:`subzero.capture.runner.run_tile`), so both engines
  see the same tiles and give the same arrays and lineage.
* Other operators (global, aggregate, inputs that are xarray DataArrays or 0-d,
  arrays of one tile) run on whole arrays, read back from the store when they
  are not held.
* An array is held in memory only while an operator that runs on whole arrays
  still has to read it (a run's inputs: while any operator does), and is
  dropped after its last reader.

The loop over operators is :func:`subzero.engines.driver.run_workflow`.  It
works on plain data and the array store it is handed, so an instance-parallel
run can drive it inside a Spark task.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from subzero.capture.buffer import Pairs
from subzero.capture.runner import NOT_GIVEN, run_operator, run_tile, shape_of
from subzero.capture.tiles import Tile, concat_pairs, input_slices, task_tile, tile_plan, tiles_for
from subzero.engines.base import Engine, StepResult
from subzero.engines.progress import Progress
from subzero.errors import OperatorError, SubZeroError
from subzero.model.labelled import is_dataarray
from subzero.model.operator import Operator
from subzero.model.statistic import over_blocks, value_digest
from subzero.model.strategy import Strategy
from subzero.model.workflow import Step, Workflow
from subzero.storage import rounds
from subzero.storage.arrays import ArrayStore
from subzero.storage.inputs import RegionReadable, is_region_source

if TYPE_CHECKING:
    import xarray as xr


def _tile_parallel(op: Operator) -> bool:
    return op.tiling.kind.tile_local


def _native(dtype: np.dtype) -> np.dtype:
    """The dtype as the store keeps it (native byte order)."""
    return dtype if dtype.byteorder in ("=", "|") else dtype.newbyteorder("=")


class LocalEngine(Engine):
    """Operators run one after another in this process (see the module's docstring).

    ``profiling``: every operator runs on whole arrays and its :class:`StepResult`
    carries its input and output values, for the optimizer's profiling hook.
    ``stream``: run tile-parallel operators tile by tile (off: every operator runs
    whole, as before streaming existed; arrays are still dropped after their last
    reader)."""

    name = "local"

    def __init__(self, arrays: ArrayStore, profiling: bool = False, stream: bool = True):
        self.arrays = arrays
        self.profiling = profiling
        self.stream = stream and not profiling
        #: the arrays held in memory now (every other array is read from the store)
        self.values: dict[str, np.ndarray | xr.DataArray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self._xarray: set[str] = set()           # arrays the operators see as DataArrays
        self._inputs: set[str] = set()
        self._readers: Counter[str] = Counter()  # operators still to read each array
        self._whole: Counter[str] = Counter()    # ... of them, those that run on whole arrays

    # -- what is held ---------------------------------------------------------------
    def _count_readers(self, wf: Workflow) -> None:
        """How many operators read each array, and how many of them read it whole."""
        for step in wf.steps.values():
            whole = not (self.stream and _tile_parallel(step.operator))
            for a in set(step.inputs):
                self._readers[a] += 1
                self._whole[a] += whole

    def load_inputs(self, wf: Workflow, values: Mapping[str, Any]) -> None:
        self._count_readers(wf)
        for name, v in values.items():
            shared = self.arrays.is_shared(name)     # the store's copy: nothing to write
            if is_region_source(v):
                if getattr(v, "labelled", False):   # a NetCDF/Zarr variable: seen as a DataArray
                    self._xarray.add(name)
                if shared:
                    self.shapes[name] = tuple(int(n) for n in v.shape)
                    self.dtypes[name] = _native(np.dtype(v.dtype))
                else:
                    self._copy_source(name, v)
                continue
            v = v if is_dataarray(v) else np.asarray(v)
            if not shared:
                if v.ndim:
                    self._store(name, v)
                else:               # one cell, stored as xarray's writer stores it: shape (1,)
                    self.arrays.write(name, v)
            self._inputs.add(name)
            self._hold(name, v)

    def resume(self, wf: Workflow, stored: list[str]) -> None:
        """Continue a run whose inputs and first operators (``stored``, in the order they
        ran) are already in the array store: hold what later operators read whole."""
        self._count_readers(wf)
        for name in stored:
            self.shapes[name], self.dtypes[name], numpy = self.arrays.describe(name)
            if not numpy:
                self._xarray.add(name)
            if name in wf.inputs:
                self._inputs.add(name)
        for name in stored:
            if name in wf.steps:
                self._read(wf.steps[name])
        for name in stored:
            if self._wanted(name):
                self.values[name] = self.arrays.read_value(name)

    def _copy_source(self, name: str, source: RegionReadable) -> None:
        """An input read region by region (a file, a lazily built array) goes into the
        store a tile at a time and is not held: operators read it back like any
        stored array, so memory follows the tile, not the input."""
        shape = tuple(int(n) for n in source.shape)
        dtype = _native(np.dtype(source.dtype))
        self.arrays.create(name, shape, dtype, getattr(source, "dims", None),
                           getattr(source, "attrs", None), getattr(source, "coords", None),
                           getattr(source, "coord_attrs", None), getattr(source, "labelled", False))
        for t in tiles_for(shape, self.arrays.tile):
            self.arrays.write_region(name, t.core_slices(), source.read_region(t.core_slices()))
        self.shapes[name] = shape
        self.dtypes[name] = dtype

    def _wanted(self, name: str) -> bool:
        """Whether an array is worth holding: an operator still reads it and may read it
        whole (it is a DataArray, fits in one tile, or has a reader that runs whole) --
        or it is a run input, which its caller holds anyway."""
        if self._readers[name] <= 0:
            return False
        small = all(n <= self.arrays.tile for n in self.shapes[name])
        return self._whole[name] > 0 or small or name in self._inputs or name in self._xarray

    def _hold(self, name: str, value: np.ndarray | xr.DataArray) -> None:
        self.shapes[name] = shape_of(value)
        self.dtypes[name] = _native(np.dtype(value.dtype))
        if is_dataarray(value):
            self._xarray.add(name)
        if self._wanted(name):
            self.values[name] = value

    def _read(self, step: Step) -> None:
        """``step`` has run: its inputs have one reader less; drop those no longer wanted."""
        whole = not (self.stream and _tile_parallel(step.operator))
        for a in set(step.inputs):
            self._readers[a] -= 1
            self._whole[a] -= whole
            if not self._wanted(a):
                self.values.pop(a, None)

    def _value(self, name: str) -> np.ndarray | xr.DataArray:
        """The whole array, as the operator first saw it: held, else read back as one
        region, each chunk checked (a DataArray, with its dims and attrs, through
        xarray).  Always the operator's own copy: it may write into its input."""
        if name in self.values:
            return self.values[name]
        if name in self._xarray:
            return self.arrays.read_value(name)
        out = self.arrays.read_region(name, tuple(slice(0, n) for n in self.shapes[name]))
        return out if out.flags.writeable and out.flags.owndata else np.array(out)

    def _store(self, name: str, value: np.ndarray | xr.DataArray) -> None:
        """Write a whole input or output.  A numeric or string numpy array goes into an array made
        with :meth:`ArrayStore.create`, as streamed outputs do (xarray's writer holds
        several copies of the array at once), in slabs of whole chunks
        (:meth:`ArrayStore.fill`): the files xarray would write, and a run whose arrays are
        all numeric numpy never imports xarray, pandas or dask (1 s of CPU a process)."""
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufU":
            dtype = _native(value.dtype)
            self.arrays.create(name, value.shape, dtype)
            self.arrays.fill(name, value)
        else:
            self.arrays.write(name, value)

    def _region(self, name: str, tile: Tile) -> np.ndarray:
        """A tile's read region of an array: its own copy (an operator may write into
        its input; a read from the store is one already)."""
        data = self._slice(name, input_slices(tile, self.shapes[name]))
        return np.array(data) if name in self.values else data

    def _slice(self, name: str, region: tuple[slice, ...]) -> np.ndarray:
        """A region of an array, from memory when held, else from the store's chunks."""
        if name in self.values:
            return np.asarray(self.values[name]).reshape(self.shapes[name])[region]
        return self.arrays.read_region(name, region)

    def _tiles(self, step: Step, in_shapes: list[tuple[int, ...]]) -> list[Tile] | None:
        """The tiles to stream the step over, or None: it runs on whole arrays."""
        if not self.stream:
            return None
        halo = tile_plan(step.operator, in_shapes)
        if halo is None:
            return None
        for a in step.inputs:
            if a in self._xarray or (a in self.values and np.ndim(self.values[a]) == 0):
                return None        # tiles are numpy: keep what run() sees (dims, attrs, 0-d)
        tiles = tiles_for(in_shapes[0], task_tile(self.arrays.tile, halo), halo)
        return tiles if len(tiles) > 1 else None

    # -- running ----------------------------------------------------------------------
    def run_step(self, name: str, step: Step, strategies: tuple[Strategy, ...], capture: bool,
                 progress: Progress) -> StepResult:
        in_shapes = [self.shapes[a] for a in step.inputs]
        tiles = self._tiles(step, in_shapes)
        if tiles is None:
            res = self._run_whole(name, step, strategies, capture)
        else:
            res = self._run_tiles(name, step, strategies, capture, progress, tiles, in_shapes)
        self._read(step)
        return res

    def _run_whole(self, name: str, step: Step, strategies: tuple[Strategy, ...],
                   capture: bool) -> StepResult:
        ins = [self._value(a) for a in step.inputs]
        op = step.operator
        t0 = time.perf_counter()
        stat, states = self._whole_statistic(name, op, ins)
        out, full, pay, ctx = run_operator(name, op, ins, strategies, capture, statistic=stat)
        run_s = time.perf_counter() - t0
        arr = out.data if is_dataarray(out) else out
        self._store(name, out)
        self._hold(name, out)
        keep = self.profiling
        return StepResult(shape_of(out), str(arr.dtype), int(arr.nbytes),
                          [shape_of(x) for x in ins], full, pay, run_s, ctx.lwrite_seconds,
                          inputs=ins if keep else None, output=out if keep else None,
                          statistic=None if stat is NOT_GIVEN else value_digest(stat),
                          rounds=self._keep_rounds(name, op, states) if states else None)

    def _whole_statistic(self, name: str, op: Operator, ins: list) -> tuple[Any, list]:
        """The statistic of an operator run whole, over its whole first input as one
        block (what ``ctx.statistic`` would compute), and its rounds' merged states:
        recorded as a tiled run records them, so that a trace re-running a few of its
        tiles or regions uses the value this run used (:mod:`subzero.query.statistic`).
        ``NOT_GIVEN`` without a statistic or inputs."""
        if op.statistic is None or not ins:
            return NOT_GIVEN, []
        values = np.asarray(ins[0].data if is_dataarray(ins[0]) else ins[0])
        states: list = []
        try:
            stat = over_blocks(op.statistic, lambda box: values,
                               [tuple((0, int(n)) for n in values.shape)], values.shape, states)
        except SubZeroError:
            raise
        except Exception as e:
            raise OperatorError(f"operator {name!r} ({type(op).__name__}) failed computing its "
                                f"statistic: {type(e).__name__}: {e}") from e
        return stat, states

    def _run_tiles(self, name: str, step: Step, strategies: tuple[Strategy, ...], capture: bool,
                   progress: Progress, tiles: list[Tile], in_shapes: list[tuple[int, ...]]
                   ) -> StepResult:
        """Tile by tile: only one tile's inputs and output are in memory at a time."""
        op, out_shape = step.operator, in_shapes[0]
        fulls: list[Pairs | None] = []
        pays: list[Pairs | None] = []
        run_s = lwrite_s = 0.0
        dtype: np.dtype | None = None
        stat = None
        states: list = []
        if op.statistic is not None:      # the whole array's, computed over the tiles first
            first = step.inputs[0]
            try:
                stat = over_blocks(op.statistic,
                                   lambda box: self._slice(first, tuple(slice(a, b) for a, b in box)),
                                   [t.core for t in tiles], tuple(in_shapes[0]), states)
            except SubZeroError:
                raise
            except Exception as e:
                raise OperatorError(f"operator {name!r} ({type(op).__name__}) failed computing its "
                                    f"statistic: {type(e).__name__}: {e}") from e
        for k, tile in enumerate(tiles):
            ins = [self._region(a, tile) for a in step.inputs]
            try:
                done = run_tile(name, op, ins, strategies, capture, tile, out_shape, in_shapes,
                                statistic=stat)
            except SubZeroError as e:
                raise type(e)(f"{e} (on tile {tile.describe()} of {len(tiles)})") from e
            del ins
            got = _native(done.core.dtype)
            if dtype is None:
                dtype = got
                self.arrays.create(name, out_shape, dtype)
                writer = self.arrays.tile_writer(name)
            elif got != dtype:
                raise OperatorError(
                    f"operator {name!r} is declared {op.tiling.kind} but returned {got} on tile "
                    f"{tile.describe()} and {dtype} on the first tile; return one dtype, or "
                    f"declare it global")
            writer.add(tile.core_slices(), done.core)
            fulls.append(done.full)
            pays.append(done.pay)
            run_s += done.run_s
            lwrite_s += done.lwrite_s
            progress.tiles(k + 1, len(tiles))
        assert dtype is not None
        writer.close()
        self.shapes[name] = tuple(out_shape)
        self.dtypes[name] = dtype
        return StepResult(tuple(out_shape), str(dtype), int(np.prod(out_shape)) * dtype.itemsize,
                          list(in_shapes), concat_pairs(fulls, len(in_shapes)),
                          concat_pairs(pays, len(in_shapes)), run_s, lwrite_s, tiles=len(tiles),
                          statistic=None if op.statistic is None else value_digest(stat),
                          rounds=self._keep_rounds(name, op, states))

    def _keep_rounds(self, name: str, op: Operator, states: list) -> str | None:
        """A subtractive statistic's merged states, kept in the run for a re-run
        (:mod:`subzero.storage.rounds`); their file's digest."""
        if op.statistic is None or not op.statistic.subtractive:
            return None
        return rounds.save(self.arrays.dir.parent, name, states)

    def bind(self, names: list[str]) -> None:
        for name in names:
            self.arrays.bind(name)

    def array_store(self) -> ArrayStore:
        return self.arrays

    def close(self) -> None:
        self.values.clear()
