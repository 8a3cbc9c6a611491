"""``ctx``: what an operator sees while it runs and when its mapping
functions are called (shapes, requested lineage modes, ``lwrite``).

While an operator runs, its output shape is known only if the operator
declares ``output_shape``; otherwise the engine passes a *guess* (the first
input's shape) that is never trusted: lineage is interpreted without it and
validated against the real output in :meth:`Context.finish`, after ``run``
returns.  A ``lwrite`` whose output cells cannot be read without knowing the
output's dimensions (a flat ``(a, b, ...)``: one cell of that many dimensions,
or that many cells of a 1-D output) is kept as a copy and replayed then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from subzero.capture.buffer import LineageBuffer, Pairs, Payload, _ragged
from subzero.errors import LineageError
from subzero.model.cells import as_cells, sorted_positions, stable_order, take_rows
from subzero.model.modes import Mode
from subzero.model.operator import Operator


class Context:
    """Per-operator context.

    ``modes`` is the set of lineage modes the run needs from this operator;
    an operator should skip lineage code for modes not in it.  ``lwrite``
    calls for modes that were not requested are dropped cheaply.

    ``output_guessed``: ``output_shape`` is the engine's guess, not the
    operator's declaration (see the module docstring); :meth:`finish` then
    settles the real shape.

    ``array_shape``: the whole output array's shape when the operator runs per
    tile (:attr:`array_shape`).  ``statistic``: how :attr:`statistic` gets the
    value of the operator's declared statistic, called once, on first use (the
    engine's value computed over the tiles, or a computation over the whole
    input: :func:`subzero.capture.runner.statistic_source`); None when it declares none.
    """

    def __init__(self, name: str, operator: Operator, modes: Iterable[Mode] = frozenset(),
                 input_shapes: Sequence[Sequence[int]] = (), output_shape: Sequence[int] | None = None,
                 buffer: LineageBuffer | None = None, tile_origin: Sequence[int] | None = None,
                 output_guessed: bool = False, array_shape: Sequence[int] | None = None,
                 statistic: Callable[[], Any] | None = None):
        self.name = name
        self.operator = operator
        self.modes = frozenset(modes)
        self._input_shapes = [tuple(int(x) for x in s) for s in input_shapes]
        self._output_shape = tuple(int(x) for x in output_shape) if output_shape is not None else None
        self._guessed = bool(output_guessed)
        self._shape_read = False          # run() asked for ctx.output_shape
        #: (method, args): lwrite calls replayed by finish()
        self._deferred: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.buffer = buffer
        self.lwrite_seconds = 0.0
        self._origin = tuple(int(x) for x in tile_origin) if tile_origin is not None else None
        self._array_shape = tuple(int(x) for x in array_shape) if array_shape is not None else None
        self._statistic = statistic
        self._statistic_value: Any = None
        self._supported: set[Mode] | None = None

    # -- shapes ----------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self._input_shapes)

    @property
    def origin(self) -> tuple[int, ...]:
        """Where this data begins in the whole array: the array coordinates of the
        first cell of the first input.  An operator run per tile sees a tile's
        read region; one whose result depends on the position (a mask of the
        sensor's science area, say) adds ``origin`` to its local coordinates.
        Zeros when the operator runs on the whole array."""
        if self._origin is None:
            return (0,) * len(self._input_shapes[0]) if self._input_shapes else ()
        return self._origin

    @property
    def array_shape(self) -> tuple[int, ...] | None:
        """The shape of the whole output array when running per tile (the tile's own
        shape is the inputs' shape), else None: it is then the output's shape."""
        return self._array_shape

    @property
    def statistic(self) -> Any:
        """The value of the operator's declared ``statistic`` over the whole first
        input (None when it declares none).  Per tile, the engine computed it over
        all the tiles beforehand; on a whole array it is computed here, on first use."""
        if self._statistic is not None:
            self._statistic_value, self._statistic = self._statistic(), None
        return self._statistic_value

    def input_shape(self, i: int) -> tuple[int, ...]:
        if not 0 <= i < len(self._input_shapes):
            raise LineageError(f"operator {self.name!r} has no input {i} "
                               f"(it has {len(self._input_shapes)})")
        return self._input_shapes[i]

    @property
    def output_shape(self) -> tuple[int, ...]:
        """The output's shape.  Inside ``run`` it is the operator's declared
        ``output_shape`` (or the first input's shape when it declares none:
        :meth:`finish` then fails the run if the output came out different)."""
        if self._output_shape is None:
            raise LineageError(
                f"operator {self.name!r}: the output shape is not known before run() returns; "
                f"define output_shape(*input_shapes) on {type(self.operator).__name__}")
        self._shape_read = True
        return self._output_shape

    def finish(self, out_shape: Sequence[int]) -> tuple[Pairs | None, Pairs | None]:
        """After ``run`` returned an output of ``out_shape``: check the shape
        ``run`` was told, replay the deferred ``lwrite`` calls, then validate
        and pack every buffered pair against the real shapes.  Returns (full
        pairs, payload pairs), both None when nothing was captured."""
        real = tuple(int(x) for x in out_shape)
        told = self._output_shape
        if self._shape_read and told is not None and (told or (1,)) != real:
            cls = type(self.operator).__name__
            why = (f"the first input's shape, assumed because {cls} does not define "
                   f"output_shape(*input_shapes)" if self._guessed else
                   f"from {cls}.output_shape")
            raise LineageError(
                f"operator {self.name!r} read ctx.output_shape {told} in run() ({why}), but "
                f"returned an output of shape {real}; define output_shape(*input_shapes) "
                f"to return {real}")
        self._output_shape, self._guessed = real, False
        deferred, self._deferred = self._deferred, []
        if deferred:
            t0 = time.perf_counter()
            try:
                for method, args in deferred:
                    method(*args)
            finally:
                self.lwrite_seconds += time.perf_counter() - t0
        if self.buffer is None:
            return None, None
        return self.buffer.finish(real, self._input_shapes)

    # -- lineage -----------------------------------------------------------------
    def _supports(self, mode: Mode) -> bool:
        if self._supported is None:
            self._supported = set(self.operator.supported_modes())
        return mode in self._supported

    # ``*incells: Any``: cells, or with ``each`` cells per row as an (N, K, ndim) array or a
    # ragged sequence (what _ragged reads); each is checked as it is read, and named in the error
    def lwrite(self, outcells: ArrayLike, *incells: Any, payload: Payload | Sequence[Payload] | None = None,
               each: bool = False) -> None:
        """Record lineage.

        ``lwrite(out, in_0, ..., in_k)``: all ``out`` cells depend on all cells
        of each ``in_i`` (one region pair).  ``lwrite(out, payload=b"...")``:
        one payload pair, resolved later by ``map_p``.  With ``each=True``
        every row of ``out`` is its own pair: each ``in_i`` is then per row
        (an (N, ndim) array, an (N, K, ndim) array or a sequence of N cell
        arrays) and ``payload`` is one bytes value for all rows or N values.
        """
        t0 = time.perf_counter()
        try:
            self._lwrite(outcells, incells, payload, each)
        finally:
            self.lwrite_seconds += time.perf_counter() - t0

    def _lwrite(self, outcells: ArrayLike, incells: tuple[Any, ...],
                payload: Payload | Sequence[Payload] | None, each: bool) -> None:
        is_pay = payload is not None
        if is_pay and incells:
            raise LineageError(f"operator {self.name!r}: lwrite takes input cells or a payload, not both")
        self._check_mode(is_pay)
        if self.buffer is None or not self._wanted(is_pay):
            return
        out = self._out_cells(outcells)
        if out is None:
            self._defer(self._lwrite, outcells, incells, payload, each)
            return
        n = len(out)
        if payload is not None:
            buf = self.buffer
            if each:
                if isinstance(payload, (bytes, bytearray, memoryview)):
                    pay_ids = np.full(n, self._pid(payload), np.int64)
                else:
                    seq = self._payloads(payload)
                    if len(seq) != n:
                        raise LineageError(f"operator {self.name!r}: lwrite got {len(seq)} payloads "
                                           f"for {n} output cells")
                    pay_ids = self._pids(seq)
                buf.add_pay(out, np.ones(n, np.int64), pay_ids)
            else:
                buf.add_pay(out, np.array([n], np.int64), np.array([self._pid(payload)], np.int64))
            return
        if len(incells) != self.n_inputs:
            raise LineageError(f"operator {self.name!r}: lwrite got {len(incells)} input cell sets, "
                               f"but the operator has {self.n_inputs} inputs (pass an empty array "
                               f"for an input the pair does not depend on)")
        ins, lens = [], []
        for i, c in enumerate(incells):
            if each:
                try:
                    cells, ln = _ragged(c, n, len(self.input_shape(i)), f"input {i} cells",
                                        as_cells)
                except (ValueError, TypeError) as e:
                    raise LineageError(f"operator {self.name!r}: lwrite(each=True): {e}") from e
            else:
                cells = self._cells(c, self.input_shape(i), f"input {i}")
                ln = np.array([len(cells)], np.int64)
            ins.append(cells)
            lens.append(ln)
        out_lens = np.ones(n, np.int64) if each else np.array([n], np.int64)
        self.buffer.add_full(out, out_lens, ins, lens)

    def lwrite_groups(self, outcells: ArrayLike, out_groups: ArrayLike, *ins: tuple[ArrayLike, ArrayLike],
                      payload: Payload | Sequence[Payload] | dict[int, Payload] | None = None) -> None:
        """Many multi-cell pairs in one call: cells labelled by pair id.

        ``out_groups[j]`` is the pair of output cell j; each of ``ins`` is a
        ``(cells, groups)`` tuple for one input.  One pair is made per distinct
        output group (in sorted order); input cells of groups without output
        cells are ignored.  ``payload`` is one bytes value for every pair, a
        sequence aligned with the sorted distinct groups, or a dict
        group -> bytes.
        """
        t0 = time.perf_counter()
        try:
            self._lwrite_groups(outcells, out_groups, ins, payload)
        finally:
            self.lwrite_seconds += time.perf_counter() - t0

    def _lwrite_groups(self, outcells: ArrayLike, out_groups: ArrayLike,
                       ins: tuple[tuple[ArrayLike, ArrayLike], ...],
                       payload: Payload | Sequence[Payload] | dict[int, Payload] | None) -> None:
        is_pay = payload is not None
        if is_pay and ins:
            raise LineageError(f"operator {self.name!r}: lwrite_groups takes input cells or a payload, not both")
        self._check_mode(is_pay)
        if self.buffer is None or not self._wanted(is_pay):
            return
        out = self._out_cells(outcells)
        if out is None:
            self._defer(self._lwrite_groups, outcells, out_groups, ins, payload)
            return
        g = np.asarray(out_groups).astype(np.int64, copy=False).ravel()
        if len(g) != len(out):
            raise LineageError(f"operator {self.name!r}: lwrite_groups got {len(g)} group labels "
                               f"for {len(out)} output cells")
        order = stable_order(g)
        groups, counts = np.unique(g[order], return_counts=True)
        out = take_rows(out, order)
        if payload is not None:
            buf = self.buffer
            if isinstance(payload, (bytes, bytearray, memoryview)):
                pay_ids = np.full(len(groups), self._pid(payload), np.int64)
            elif isinstance(payload, Mapping):
                missing = [int(k) for k in groups if int(k) not in payload]
                if missing:
                    raise LineageError(f"operator {self.name!r}: lwrite_groups has no payload for "
                                       f"group {missing[0]}")
                pay_ids = self._pids([payload[k] for k in groups.tolist()])
            else:
                seq = self._payloads(payload)
                if len(seq) != len(groups):
                    raise LineageError(f"operator {self.name!r}: lwrite_groups got {len(seq)} payloads "
                                       f"for {len(groups)} groups")
                pay_ids = self._pids(seq)
            buf.add_pay(out, counts, pay_ids)
            return
        if len(ins) != self.n_inputs:
            raise LineageError(f"operator {self.name!r}: lwrite_groups got {len(ins)} inputs, "
                               f"but the operator has {self.n_inputs}")
        in_cells, in_lens = [], []
        for i, item in enumerate(ins):
            try:
                cells, ig = item
            except (TypeError, ValueError) as err:
                raise LineageError(f"operator {self.name!r}: lwrite_groups input {i} must be a "
                                   f"(cells, groups) tuple") from err
            cells = self._cells(cells, self.input_shape(i), f"input {i}")
            ig = np.asarray(ig).astype(np.int64, copy=False).ravel()
            if len(ig) != len(cells):
                raise LineageError(f"operator {self.name!r}: lwrite_groups input {i} has {len(ig)} "
                                   f"group labels for {len(cells)} cells")
            pos, keep = sorted_positions(groups, ig)
            if keep is not None:          # cells of groups without output cells: dropped
                rows = np.flatnonzero(keep)
                pos, cells = pos[rows], take_rows(cells, rows)
            in_cells.append(take_rows(cells, stable_order(pos, len(groups))))
            in_lens.append(np.bincount(pos, minlength=len(groups)).astype(np.int64))
        self.buffer.add_full(out, counts.astype(np.int64), in_cells, in_lens)

    # -- helpers -------------------------------------------------------------------
    def _payloads(self, payload: object) -> list[object]:
        """A sequence of payloads as a list, or a LineageError naming the operator."""
        try:
            return list(payload)        # type: ignore[call-overload]  # checked here
        except TypeError as e:
            raise LineageError(f"operator {self.name!r}: a payload must be bytes, or a sequence "
                               f"of bytes with each=True, not {type(payload).__name__}") from e

    def _pid(self, payload: object) -> int:
        return int(self._pids((payload,))[0])

    def _pids(self, seq: Sequence[object]) -> np.ndarray:
        """The id of each payload of ``seq`` (``LineageBuffer.payload_ids``), or a
        LineageError naming the operator."""
        assert self.buffer is not None, "payload ids are asked for only while capturing"
        try:
            return self.buffer.payload_ids(seq)
        except TypeError as e:
            raise LineageError(f"operator {self.name!r}: {e}") from e

    def _check_mode(self, is_pay: bool) -> None:
        if is_pay and not (self._supports(Mode.PAY) or self._supports(Mode.COMP)):
            raise LineageError(
                f"operator {self.name!r} wrote a payload pair but supports neither Mode.PAY nor "
                f"Mode.COMP; add one to supported_modes() or write region pairs")
        if not is_pay and not self._supports(Mode.FULL):
            raise LineageError(
                f"operator {self.name!r} wrote region pairs but does not list Mode.FULL in "
                f"supported_modes()")

    def _wanted(self, is_pay: bool) -> bool:
        if is_pay:
            return Mode.PAY in self.modes or Mode.COMP in self.modes
        return Mode.FULL in self.modes

    def _out_cells(self, cells: ArrayLike) -> np.ndarray | None:
        """Output cells of one lwrite call as (N, ndim); None when the output's
        dimensions are still unknown and a flat ``(a, b, ...)`` could mean
        either one cell or several cells of a 1-D output (the call is then
        deferred).  Bounds are checked in :meth:`LineageBuffer.finish`."""
        if not self._guessed:
            return self._cells(cells, self._output_shape, "output")
        try:
            arr = cells if isinstance(cells, np.ndarray) else np.asarray(cells)
        except (ValueError, TypeError) as e:
            raise LineageError(f"operator {self.name!r}: bad output cells in lwrite: {e}") from e
        if arr.ndim == 1 and arr.shape[0] > 1 and arr.dtype != object:
            return None
        return self._cells(arr, None, "output")

    def _defer(self, method: Callable[..., None], *args: Any) -> None:
        """Keep a copy of one call's arguments (the caller may reuse its arrays)
        for :meth:`finish` to replay once the output shape is known."""
        self._deferred.append((method, tuple(_snapshot(a) for a in args)))

    def _cells(self, cells: ArrayLike, shape: Sequence[int] | None, side: str) -> np.ndarray:
        try:
            return as_cells(cells, len(shape) if shape is not None else None)
        except (ValueError, TypeError) as e:
            raise LineageError(f"operator {self.name!r}: bad {side} cells in lwrite: {e}") from e


def _snapshot(x: Any) -> Any:
    """A copy of an lwrite argument that later changes to the caller's objects
    cannot reach (arrays copied, bytes-likes to bytes, containers rebuilt)."""
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, dict):
        return {k: _snapshot(v) for k, v in x.items()}
    if isinstance(x, (str, int, float, np.generic)) or x is None:
        return x
    try:
        return [_snapshot(v) for v in x]
    except TypeError:          # not iterable: lwrite reports it when replayed
        return x
