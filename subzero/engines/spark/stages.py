"""Fused stages: consecutive tile-parallel operators run as one Spark job, one
task per tile, instead of one job per operator.

A *stage* is a set of operators that all tile over the same array shape and
whose inputs are either already stored (run earlier) or computed in the stage
itself.  Independent branches (the two exposures of the astronomy workflow)
fall into the same stage, so they run side by side.  Inside a task the
operators run in workflow order on the tile; an intermediate result stays in
memory for the operators of the stage that read it, and every operator's
core still goes to its Zarr array (every array of a run is kept and can be
traced through).

Halos accumulate: an operator must produce its output not only over the
tile's core but over every region an operator downstream in the stage reads
(its core plus its own halo), so the region an operator reads grows with the
halos of the operators after it (:func:`plan_boxes`).  Cells near the
region's edge are computed from a clipped neighbourhood, exactly as an
operator run per tile would, and never kept: only the core is written, and
only the lineage of core cells (:func:`subzero.capture.tiles.globalize`).

Plain data and pure functions: the planning runs on the driver, the boxes
inside Spark tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from subzero.model.operator import Operator
from subzero.model.strategy import Strategy
from subzero.model.workflow import Workflow

#: a region of an array: ``[start, stop)`` per axis
Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Member:
    """One operator of a stage, as a task needs it (plain data, picklable)."""

    name: str
    op: Operator
    inputs: tuple[str, ...]
    strategies: tuple[Strategy, ...]
    radius: int          # its stencil radius (0: elementwise)
    in_shapes: tuple[tuple[int, ...], ...] = ()    # its inputs' shapes (a one-cell input is read whole)


def next_stage(wf: Workflow, pending: Sequence[str], shapes: Mapping[str, tuple[int, ...]],
               halo_of: Callable[[Operator, list[tuple[int, ...]]], int | None]) -> list[str]:
    """The operators to run next, in workflow order: the first pending operator,
    and -- when it tiles (``halo_of`` gives its halo, None when it cannot run per
    tile) -- every later pending operator that tiles over the same shape and
    whose inputs are stored (in ``shapes``) or computed in the stage.

    ``pending`` is in topological order, so its first operator's inputs are
    all stored."""
    first = pending[0]
    shape = tiled_shape(wf, first, shapes, halo_of)
    if shape is None:
        return [first]
    stage, inside = [first], {first}
    for name in pending[1:]:
        step = wf.steps[name]
        if not all(a in shapes or a in inside for a in step.inputs):
            continue
        known = {**shapes, **{n: shape for n in inside}}
        if tiled_shape(wf, name, known, halo_of) == shape:
            stage.append(name)
            inside.add(name)
    return stage


def tiled_shape(wf: Workflow, name: str, shapes: Mapping[str, tuple[int, ...]],
                halo_of: Callable[[Operator, list[tuple[int, ...]]], int | None]) -> tuple[int, ...] | None:
    """The shape the operator tiles over, or None when it does not run per tile."""
    step = wf.steps[name]
    if not step.inputs or any(a not in shapes for a in step.inputs):
        return None
    in_shapes = [tuple(shapes[a]) for a in step.inputs]
    if halo_of(step.operator, in_shapes) is None:
        return None
    return in_shapes[0]


def grow(box: Box, radius: int, shape: Sequence[int]) -> Box:
    """``box`` widened by ``radius`` cells on every side, clipped at the array's edges."""
    return tuple((max(0, a - radius), min(int(n), b + radius)) for (a, b), n in zip(box, shape))


def union(a: Box, b: Box) -> Box:
    """The smallest box holding both."""
    return tuple((min(x0, y0), max(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))


def within(inner: Box, outer: Box) -> tuple[slice, ...]:
    """Slices of ``outer``-shaped data that select ``inner``."""
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(inner, outer))


def plan_boxes(members: Sequence[Member], core: Box, shape: Sequence[int]) -> dict[str, tuple[Box, Box]]:
    """Per operator of a stage, for one tile: (the region of its output the stage
    needs, the region of its inputs it reads).  Every operator needs its core
    (it is stored); an operator read by another of the stage also needs what
    that one reads, which is wider by that one's halo."""
    boxes: dict[str, tuple[Box, Box]] = {}
    for m in reversed(members):
        need = core
        for later in members:
            if m.name in later.inputs and later.name in boxes:
                need = union(need, boxes[later.name][1])
        boxes[m.name] = (need, grow(need, m.radius, shape))
    return boxes


def last_readers(members: Sequence[Member]) -> dict[str, int]:
    """For each operator of the stage, the position of the last stage operator that
    reads it (its own position when none does): its tile can be dropped after."""
    last = {m.name: k for k, m in enumerate(members)}
    for k, m in enumerate(members):
        for a in m.inputs:
            if a in last:
                last[a] = k
    return last
