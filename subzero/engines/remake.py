"""Making an array a run did not keep again (see :mod:`subzero.runs.keep`): its
operator run on its inputs, as the operator read them -- chunk by chunk where the
operator is tile-local (declared elementwise or a stencil, as the engines run it
per tile: a chunk's values are what it computes from the chunk grown by its halo),
else whole.  Plain code over a workflow and readers of the run's arrays, so the
same runs in the driver, in a re-run of the run, and on a Spark executor
re-running it.  What it returns is checked by the array store against the
SHA-256 of each chunk recorded when the array was dropped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from subzero.capture.runner import run_operator, run_tile
from subzero.capture.tiles import input_slices, tile_at, tile_plan
from subzero.model.workflow import Workflow


def remaker(wf: Workflow, read_value: Callable[[str], Any]) -> Callable[[str], np.ndarray]:
    """A function giving the values of array ``name`` of a run of ``wf`` made again:
    its operator on its inputs, each read by ``read_value`` (the run's array store,
    which makes an input it did not keep either again, in turn, and checks what this
    returns against the checksums it recorded)."""
    def remake(name: str) -> np.ndarray:
        from subzero.errors import StoreError
        from subzero.storage.arrays import as_values
        step = wf.steps.get(name)
        if step is None:
            raise StoreError(f"array {name!r} was not kept, and no operator of workflow "
                             f"{wf.name!r} makes it")
        out = run_operator(name, step.operator, [read_value(i) for i in step.inputs], (),
                           capture=False)[0]
        return as_values(out, name)
    return remake


def chunk_halo(op: Any, in_shapes: list[tuple[int, ...]], shape: tuple[int, ...]) -> int | None:
    """The halo with which an array of ``shape`` that ``op`` made from inputs of
    ``in_shapes`` is made again chunk by chunk, or None when it is made again whole
    (global, a statistic of the whole array, no inputs, inputs of another shape)."""
    if op.statistic is not None or not in_shapes:
        return None
    h = tile_plan(op, in_shapes)
    if h is None or tuple(in_shapes[0]) != tuple(shape):
        return None
    return h


def chunk_remaker(wf: Workflow, describe: Callable[[str], tuple[Any, Any, bool]],
                  read_region: Callable[[str, tuple[slice, ...]], np.ndarray],
                  ) -> Callable[[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]],
                                np.ndarray | None]:
    """A function giving the values of one chunk (index ``idx`` of the grid of
    ``chunks`` over ``shape``) of array ``name`` made again from its inputs' regions
    (read by ``read_region``: made again in turn, chunk by chunk, where not kept), or
    None when its operator cannot run on part of the array (global, a statistic of
    the whole array, labelled inputs, inputs of other shapes): the array is then made
    again whole.  ``describe(name)`` is the array store's (shape, dtype, numpy)."""
    def remake(name: str, shape: tuple[int, ...], chunks: tuple[int, ...],
               idx: tuple[int, ...]) -> np.ndarray | None:
        step = wf.steps.get(name)
        if step is None or step.operator.statistic is not None or not step.inputs:
            return None
        info = [describe(i) for i in step.inputs]
        if not all(numpy for _, _, numpy in info):
            return None
        in_shapes = [tuple(int(n) for n in s) for s, _, _ in info]
        h = chunk_halo(step.operator, in_shapes, shape)
        if h is None:
            return None
        tile = tile_at(shape, chunks, idx, h)
        ins = [read_region(i, input_slices(tile, s)) for i, s in zip(step.inputs, in_shapes)]
        return run_tile(name, step.operator, ins, (), False, tile, shape, in_shapes).core
    return remake
