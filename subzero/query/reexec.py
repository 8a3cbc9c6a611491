"""Black-box re-execution: re-run one operator on its stored inputs and
collect, in memory, only the lineage pairs that touch the query.

A re-run proves itself before its lineage is used: its output must equal the
stored output on the region the query uses (:func:`verify_output`).  An
operator that computes something else on a second run (unseeded random
numbers, a clock, a race) would otherwise give a different lineage each time,
and the trace a different answer each time, with nothing to tell.

An equal output does not prove the lineage: an operator may compute its output
exactly and draw its lineage at random.  Nothing stored can show that (black-box
lineage was never captured), so unless the operator declares its lineage
deterministic (``Operator.deterministic_lineage = True``) the step re-runs it a
second time and the two relations must agree on the query's cells
(:func:`same_lineage`); one declared ``False`` is not re-run at all.  Two re-runs
in one process do not catch lineage that varies only between processes (drawn
from Python's per-process string hashes, say): such an operator must declare
``False``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
from numpy.typing import ArrayLike

from subzero.capture.buffer import LineageBuffer, Pairs
from subzero.capture.context import Context
from subzero.capture.runner import NOT_GIVEN, statistic_source
from subzero.errors import LineageError, OperatorError, QueryError, SubZeroError
from subzero.model.cells import (
    csr_rows,
    first_out_of_bounds,
    fmt_cell,
    lengths_to_offsets,
    pack,
    sorted_unique,
    unique,
    unpack,
)
from subzero.model.cellset import CellSet
from subzero.model.modes import Mode
from subzero.model.operator import Operator, own_code
from subzero.model.operator import rerun_mode as capture_mode
from subzero.storage.arrays import as_values
from subzero.storage.encodings import MapPPairs

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["QueryBuffer", "Rerun", "capture_mode", "check_deterministic", "check_region", "compare",
           "differs", "rerun", "run_with_buffer", "same_lineage", "verify_output"]


class QueryBuffer(LineageBuffer):
    """Keeps only the pairs whose key side intersects the query.

    Backward: key side = output cells.  Forward: key side = input ``i``
    (for payload pairs, ``map_p`` of the output cells).  Composite re-runs
    also keep the output cells of every payload pair (the covered set).
    """

    def __init__(self, name: str, n_inputs: int, out_shape: Sequence[int],
                 in_shapes: Sequence[Sequence[int]], backward: bool, i: int,
                 hit: Callable[[np.ndarray], np.ndarray], map_p_pairs: MapPPairs, keep_covered: bool):
        super().__init__(name, n_inputs, len(out_shape), [len(s) for s in in_shapes])
        self.out_shape, self.in_shapes = tuple(out_shape), [tuple(s) for s in in_shapes]
        self.backward, self.i, self.hit = backward, i, hit
        self.map_p_pairs = map_p_pairs
        self.keep_covered = keep_covered
        self.covered: list[np.ndarray] = []
        #: (output cells, their offsets, per input (cells, offsets), kept rows), packed
        self._kept_full: list[tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]],
                                    np.ndarray]] = []
        #: (output cells, their offsets, payload ids, kept rows), packed
        self._kept_pay: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def add_full(self, out: np.ndarray, out_lens: np.ndarray, ins: Sequence[np.ndarray],
                 in_lens: Sequence[np.ndarray]) -> None:
        self._check(out, self.out_shape, "output")
        o = pack(out, self.out_shape)
        oo = lengths_to_offsets(out_lens)
        packed_ins = []
        for k in range(self.n_inputs):
            self._check(ins[k], self.in_shapes[k], f"input {k}")
            packed_ins.append((pack(ins[k], self.in_shapes[k]), lengths_to_offsets(in_lens[k])))
        key, key_off = (o, oo) if self.backward else packed_ins[self.i]
        rows = self._rows(key, key_off)
        if rows.size:
            self._kept_full.append((o, oo, packed_ins, rows))
        self.n_full += len(out_lens)

    def add_pay(self, out: np.ndarray, out_lens: np.ndarray, pay_ids: np.ndarray) -> None:
        self._check(out, self.out_shape, "output")
        o = pack(out, self.out_shape)
        oo = lengths_to_offsets(out_lens)
        if self.keep_covered:
            self.covered.append(o)
        if self.backward:
            rows = self._rows(o, oo)
        else:
            cells, owner = self.map_p_pairs(out, oo, self.payloads, pay_ids, self.i)
            cells = np.asarray(cells, np.int64).reshape(-1, len(self.in_shapes[self.i]))
            bad = first_out_of_bounds(cells, self.in_shapes[self.i])
            if bad is not None:
                raise LineageError(f"operator {self.op_name!r}: map_p returned cell "
                                   f"{fmt_cell(cells[bad])} outside input {self.i} "
                                   f"(shape {tuple(self.in_shapes[self.i])})")
            packed = pack(cells, self.in_shapes[self.i]) if len(cells) else np.zeros(0, np.int64)
            rows = unique(np.asarray(owner, np.int64)[self.hit(packed)]) if len(cells) \
                else np.zeros(0, np.int64)
        if rows.size:
            self._kept_pay.append((o, oo, pay_ids, rows))
        self.n_pay += len(out_lens)

    def _rows(self, key: np.ndarray, key_off: np.ndarray) -> np.ndarray:
        """Rows of a CSR whose cells the query holds."""
        if key.size == 0:
            return np.zeros(0, np.int64)
        return sorted_unique(csr_rows(key_off)[self.hit(key)])

    def kept(self) -> tuple[Pairs | None, Pairs | None]:
        from subzero.model.cells import csr_take
        full = pay = None
        if self._kept_full:
            outs: list[np.ndarray] = []
            olens: list[np.ndarray] = []
            ins: list[list[np.ndarray]] = [[] for _ in range(self.n_inputs)]
            ilens: list[list[np.ndarray]] = [[] for _ in range(self.n_inputs)]
            for o, oo, pins, rows in self._kept_full:
                outs.append(csr_take(o, oo, rows))
                olens.append(oo[rows + 1] - oo[rows])
                for k, (c, co) in enumerate(pins):
                    ins[k].append(csr_take(c, co, rows))
                    ilens[k].append(co[rows + 1] - co[rows])
            full = Pairs(np.concatenate(outs), lengths_to_offsets(np.concatenate(olens)),
                         [np.concatenate(x) for x in ins],
                         [lengths_to_offsets(np.concatenate(x)) for x in ilens])
        if self._kept_pay:
            outs, olens, pids = [], [], []
            for o, oo, pay_ids, rows in self._kept_pay:
                outs.append(csr_take(o, oo, rows))
                olens.append(oo[rows + 1] - oo[rows])
                pids.append(np.asarray(pay_ids)[rows])
            pay = Pairs(np.concatenate(outs), lengths_to_offsets(np.concatenate(olens)),
                        pay_ids=np.concatenate(pids).astype(np.int64), payloads=list(self.payloads))
        return full, pay


@dataclass
class Rerun:
    """What a re-run gives: the query's pairs (full, payload), for composite lineage the
    covered output cells, and the output itself (to check against the stored one; None
    when the re-run already checked it, as a tile-limited re-run does per tile)."""

    full: Pairs | None
    pay: Pairs | None
    covered: np.ndarray | None
    output: ArrayLike | xr.DataArray | None


def check_deterministic(name: str, op: Operator) -> None:
    if not op.deterministic:
        raise QueryError(f"operator {name!r} is not deterministic, so its lineage cannot be "
                         f"recomputed by re-running it; store it (e.g. `strategies={{{name!r}: 'full'}}`)")
    if op.deterministic_lineage is False:
        raise QueryError(f"operator {name!r} declares its lineage not deterministic "
                         f"(deterministic_lineage = False), so it cannot be recomputed by "
                         f"re-running it; store it (e.g. `strategies={{{name!r}: 'full'}}`)")


def same_lineage(name: str, first: np.ndarray, second: np.ndarray, shape: tuple[int, ...]) -> None:
    """Raise a QueryError naming the operator unless two re-runs reached the same cells
    (packed ids of ``shape``, duplicates allowed) from the query's: its lineage, not
    only its output, must be a function of its inputs for re-execution to answer."""
    a, b = unique(np.asarray(first, np.int64)), unique(np.asarray(second, np.int64))
    if a.size == b.size and bool(np.array_equal(a, b)):
        return
    extra = np.setdiff1d(a, b, assume_unique=True)
    which, cell = ("first", extra[0]) if extra.size else \
        ("second", np.setdiff1d(b, a, assume_unique=True)[0])
    raise QueryError(
        f"operator {name!r} is not deterministic in its lineage: two re-runs on the same "
        f"inputs gave different lineage for the query's cells ({a.size} cells, then {b.size}; "
        f"cell {fmt_cell(unpack(np.array([cell]), shape)[0])} only in the {which}), so lineage "
        f"recomputed by re-running it cannot be trusted; store it (e.g. "
        f"`strategies={{{name!r}: 'full'}}`) and declare deterministic_lineage = False")


def rerun(name: str, op: Operator, inputs: Sequence[Any], out_shape: Sequence[int], mode: Mode,
          backward: bool, i: int, q: CellSet) -> Rerun:
    """Re-run ``op`` on whole inputs asking for ``mode``, keeping the pairs the query
    touches."""
    check_deterministic(name, op)
    in_shapes = [tuple(int(x) for x in np.shape(v)) or (1,) for v in inputs]

    def hit(ids: np.ndarray) -> np.ndarray:      # the one use of the query's set
        return q.contains(ids)
    return run_with_buffer(name, op, inputs, in_shapes, tuple(out_shape), mode, backward, i,
                           hit, "")


def run_with_buffer(name: str, op: Operator, inputs: Sequence[Any], in_shapes: list[tuple[int, ...]],
                    out_shape: tuple[int, ...], mode: Mode, backward: bool, i: int,
                    hit: Callable[[np.ndarray], np.ndarray], where: str,
                    origin: Sequence[int] | None = None, array_shape: Sequence[int] | None = None,
                    statistic: Any = NOT_GIVEN) -> Rerun:
    """Run ``op`` on ``inputs`` (of ``in_shapes``; the whole arrays, or one tile's read
    regions with ``where`` naming the tile) with a :class:`QueryBuffer` that keeps the
    pairs whose key cells ``hit`` (packed ids in these shapes -> bool mask) holds.

    A tile's run sees what the run's own tile saw: its ``origin`` in the array, the
    whole output's ``array_shape`` and the whole array's ``statistic`` (an operator
    that places blocks on the image's grid or masks a region in array coordinates
    computes something else without them)."""
    mctx = Context(name, op, frozenset(), in_shapes, out_shape, tile_origin=origin,
                   array_shape=array_shape)

    def mpp(cells: np.ndarray, off: np.ndarray, payloads: Sequence[bytes], pay_ids: np.ndarray,
            k: int) -> tuple[np.ndarray, np.ndarray]:
        with own_code(name, op, "map_p_pairs"):
            got = op.map_p_pairs(np.asarray(cells, np.int64), off, payloads, pay_ids, k, mctx)
        return got

    buf = QueryBuffer(name, len(inputs), out_shape, in_shapes, backward, i, hit, mpp,
                      keep_covered=(mode is Mode.COMP))
    ctx = Context(name, op, {mode}, in_shapes, out_shape, buf, tile_origin=origin,
                  array_shape=array_shape, statistic=statistic_source(op, inputs, statistic))
    try:
        output = op.run(ctx, *inputs)
    except SubZeroError:
        raise
    except Exception as e:
        raise OperatorError(f"re-running operator {name!r} for a trace failed{where}: "
                            f"{type(e).__name__}: {e}") from e
    full, pay = buf.kept()
    covered = unique(np.concatenate(buf.covered)) if buf.covered else (
        np.zeros(0, np.int64) if mode is Mode.COMP else None)
    return Rerun(full, pay, covered, output)


def check_region(cells: np.ndarray, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The bounding box of ``cells`` (packed ids, or a boolean bitmap of ``shape``) as
    slices; with no cells, the first tile (a sample that still catches an operator
    whose every run differs)."""
    from subzero.tuning import DEFAULT_TILE
    if cells.dtype == bool:
        lo, hi = [], []
        for d in range(len(shape)):
            hit = np.flatnonzero(cells.any(axis=tuple(k for k in range(len(shape)) if k != d)))
            if not hit.size:
                break
            lo.append(int(hit[0]))
            hi.append(int(hit[-1]) + 1)
        else:
            return tuple(slice(a, b) for a, b in zip(lo, hi))
    elif cells.size:
        c = unpack(np.asarray(cells, np.int64), shape)
        return tuple(slice(int(a), int(b) + 1) for a, b in zip(c.min(axis=0), c.max(axis=0)))
    return tuple(slice(0, min(n, DEFAULT_TILE)) for n in shape)


def verify_output(name: str, output: ArrayLike | xr.DataArray, out_shape: tuple[int, ...],
                  region: tuple[slice, ...],
                  stored: Callable[[tuple[slice, ...]], np.ndarray]) -> None:
    """Raise a QueryError naming the operator unless the re-run ``output`` equals the
    stored output (``stored(region)`` reads it) on ``region``: same shape, same dtype,
    same values with NaN equal to NaN."""
    new = as_values(output, name)
    if new.shape != tuple(out_shape):
        not_deterministic(name, f"shape {new.shape} instead of {tuple(out_shape)}")
    compare(name, new[region], np.asarray(stored(region)), [s.start or 0 for s in region])


def compare(name: str, new: np.ndarray, old: np.ndarray, origin: Sequence[int]) -> None:
    """Raise the not-deterministic QueryError unless ``new`` equals ``old``."""
    why = differs(new, old, origin)
    if why:
        not_deterministic(name, why)


def differs(new: np.ndarray, old: np.ndarray, origin: Sequence[int]) -> str:
    """How a re-run's ``new`` values differ from the stored ``old`` ones of the same
    region (whose first cell is ``origin`` in the array), or "" when they are equal:
    same dtype, same values with NaN equal to NaN."""
    if new.dtype != old.dtype:
        return f"dtype {new.dtype} instead of {old.dtype}"
    same = (new == old) | ((new != new) & (old != old)) if new.dtype.kind in "fc" \
        else (new == old)
    same = np.asarray(same, bool)
    if same.all():
        return ""
    first = np.argwhere(~same)[0]
    cell = [int(a) + int(o) for a, o in zip(first, origin)]
    return (f"at cell {fmt_cell(cell)}: {new[tuple(first)].item()!r} instead of "
            f"{old[tuple(first)].item()!r}")


def not_deterministic(name: str, why: str) -> NoReturn:
    raise QueryError(f"operator {name!r} is not deterministic: its re-run output differs "
                     f"from the stored output ({why}), so lineage recomputed by re-running it "
                     f"cannot be trusted; declare it deterministic = False and store its lineage "
                     f"(e.g. `strategies={{{name!r}: 'full'}}`)")
