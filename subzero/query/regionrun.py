"""Region-limited re-execution of a connected-components operator: re-run it on a box
around the query that encloses every region the query's cells belong to.

An operator declared ``components`` (:class:`~subzero.model.operator.Labelling`,
such as star detection) decides each cell's foreground from the cell alone and
the whole array's statistic, then labels connected regions.  A region can be any
size, so no fixed halo bounds it, but the region of a cell is exactly what a
labelling of any box finds once the box encloses it: a region that does not
touch the box's sides (other than the array's own edges) cannot go on outside
it.  So a trace step re-runs the operator on the query's bounding box grown by a
margin, and doubles the margin while a region holding a query cell touches a
side, reading only the box (checksummed).  The whole array's statistic is the
one the run used (:mod:`subzero.query.statistic`), so the box's foreground is the
array's.

A region smaller than the operator's ``min_size`` is dropped by the box's run as
by the whole run when it is enclosed; regions that touch a side may be labelled
differently in the box, so their cells take no part in the answer: the query's
cells all lie in enclosed regions or in the background.

The box's labels must match the stored output on every cell of an enclosed
region and of the background: the same cells labelled, one box label for one
stored label, and no stored region reaching beyond the enclosed cells (labels are
numbered by first cell over the whole array, so the numbers themselves differ).
A box that does not match makes the operator re-run whole, with a warning, and
the whole re-run's check decides, as for tiles (:mod:`subzero.query.tilerun`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from subzero.capture.components import structure
from subzero.capture.runner import NOT_GIVEN
from subzero.capture.tiles import Tile, globalize
from subzero.errors import warn
from subzero.model.cells import unpack
from subzero.model.modes import Mode
from subzero.model.operator import Labelling, TilingKind, own_code
from subzero.query.reexec import Rerun, check_deterministic, run_with_buffer
from subzero.query.relation import StepContext
from subzero.query.threads import one_thread_for
from subzero.query.tilerun import Region, TileAccess, globalize_covered, local_hits

__all__ = ["MARGIN", "enclosing_box", "rerun_components"]

#: the first margin around the query's bounding box (doubled until its regions are enclosed)
MARGIN = 16

Box = tuple[tuple[int, int], ...]


def _slices(box: Box) -> Region:
    return tuple(slice(a, b) for a, b in box)


def _sides(labels: np.ndarray, box: Box, shape: tuple[int, ...]) -> np.ndarray:
    """The labels on the box's sides that are not the array's edges (sorted, distinct)."""
    parts = []
    for d, ((a, b), n) in enumerate(zip(box, shape)):
        take = [slice(None)] * labels.ndim
        if a > 0:
            take[d] = slice(0, 1)
            parts.append(labels[tuple(take)].ravel())
        if b < n:
            take[d] = slice(labels.shape[d] - 1, labels.shape[d])
            parts.append(labels[tuple(take)].ravel())
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, labels.dtype)


def enclosing_box(op: Labelling, name: str, shape: tuple[int, ...], cells: np.ndarray,
                  stat: object, read: Callable[[Region], np.ndarray]
                  ) -> tuple[Box, np.ndarray, np.ndarray, np.ndarray] | None:
    """The smallest box of the margins tried (``MARGIN`` doubled) around ``cells``
    (``(k, ndim)``) whose foreground regions holding a cell do not touch its sides;
    with its input values, its foreground regions (raw labels, 0 = background) and
    the labels touching a side.  None once the box would be the whole array (a whole
    re-run does the same work)."""
    from scipy import ndimage
    st = structure(len(shape), op.connectivity)
    lo, hi = cells.min(axis=0), cells.max(axis=0) + 1
    margin = MARGIN
    while True:
        box = tuple((int(max(0, a - margin)), int(min(n, b + margin)))
                    for a, b, n in zip(lo, hi, shape))
        if all(a == 0 and b == n for (a, b), n in zip(box, shape)):
            return None
        values = np.asarray(read(_slices(box)))
        with own_code(name, op, "foreground"):   # type: ignore[arg-type]
            fg = np.asarray(op.foreground(values, stat), bool)
        raw, _ = ndimage.label(fg, structure=st)
        mine = raw[tuple((cells - np.asarray([a for a, _ in box])).T)]
        sides = _sides(raw, box, shape)
        if not np.isin(mine[mine > 0], sides).any():
            return box, values, raw, sides
        margin *= 2


def _matches(new: np.ndarray, old: np.ndarray, ok: np.ndarray) -> str:
    """How the box's labels ``new`` differ from the stored ``old`` on the cells ``ok``
    (enclosed regions and background), or "": the same cells labelled, one label for
    one, and every stored region seen there lying wholly within ``ok``."""
    n, o = new[ok].astype(np.int64), old[ok].astype(np.int64)
    if not np.array_equal(n == 0, o == 0):
        return "another foreground"
    fg = n != 0
    pairs = np.unique(np.stack([n[fg], o[fg]]), axis=1)
    if len(np.unique(pairs[0])) != pairs.shape[1] or len(np.unique(pairs[1])) != pairs.shape[1]:
        return "other regions"
    seen, inside = np.unique(o[fg], return_counts=True)
    everywhere = np.unique(old[np.isin(old, seen)], return_counts=True)[1]
    if not np.array_equal(inside, everywhere):
        return "a region reaching beyond the cells compared"
    return ""


def rerun_components(sc: StepContext, mode: Mode, backward: bool, i: int, q: np.ndarray,
                     access: TileAccess, stored: Callable[[Region], np.ndarray]) -> Rerun | None:
    """Re-run a ``components`` operator on a box enclosing the regions of query ``q``
    (sorted packed cells of the output going backward, of the input going forward),
    checked against the stored output there.  Returns the pairs in array coordinates
    (``output`` None: already checked), or None when it must re-run whole (another
    kind of operator, a statistic that cannot be had, a box as big as the array, or a
    box that does not match the stored output)."""
    op, name, shape = sc.op, sc.name, sc.out_shape
    if op.tiling.kind is not TilingKind.COMPONENTS or not isinstance(op, Labelling) \
            or access.whole or len(sc.in_shapes) != 1 or tuple(sc.in_shapes[0]) != shape \
            or q.size == 0:
        return None
    check_deterministic(name, op)
    stat = access.statistic() if op.statistic is not None else None
    if stat is NOT_GIVEN:
        return None
    got = enclosing_box(op, name, shape, unpack(q, shape), stat,
                        lambda r: access.read_region(access.inputs[0], r))
    if got is None:
        return None
    box, values, raw, sides = got
    tile = Tile((), box, box)
    local = tile.read_shape()
    with one_thread_for(int(np.prod(local, dtype=np.int64))):
        r = run_with_buffer(name, op, [values], [local], local, mode, backward, i,
                            local_hits(tile, q, shape, box), f" on box {tile.describe()}",
                            origin=tile.origin, array_shape=shape,
                            statistic=NOT_GIVEN if op.statistic is None else stat)
    new = np.asarray(r.output) if r.output is not None else None
    why = "no output" if new is None or new.shape != local else \
        _matches(new, np.asarray(stored(_slices(box))), ~np.isin(raw, sides[sides > 0]))
    if why:
        warn(f"operator {name!r} is declared components but its re-run on box "
             f"{tile.describe()} differs from the stored output ({why}); re-running it whole "
             f"(its foreground must be decided cell by cell, from the cell and its statistic)")
        access.whole = True
        return None
    full = globalize(r.full, tile, shape, sc.in_shapes, [local])
    pay = globalize(r.pay, tile, shape, sc.in_shapes, [local])
    cov = globalize_covered(r.covered, tile, shape) if mode is Mode.COMP else None
    return Rerun(full, pay, cov, None)
