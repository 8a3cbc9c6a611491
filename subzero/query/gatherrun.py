"""Box-limited re-execution of a structural operator (declared ``gather``): re-run it on
the box of its output a backward query spans, reading only the input box that box
comes from.

A :class:`~subzero.model.operator.Gathering` operator (a slice, a subsample) makes
each output cell from one input cell, and says which input box an output box
reads (``input_box``), how to make the output box from it (``gather``) and how
to write the output box's Full lineage (``emit_tile``) -- what the Spark engine
runs per output tile.  A backward trace step through it (the prescan strip of a
16-megapixel image, say) then reads the strip of the input, not the image: the
output over the query's bounding box is gathered, checked against the stored
output there, and its lineage written into a query buffer in array coordinates.
A box that differs makes the operator re-run whole with a warning (the whole
re-run's check decides), as for tiles (:mod:`subzero.query.tilerun`).  A forward
step re-runs whole: which output cells an input cell reaches is the lineage itself.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from subzero.capture.context import Context
from subzero.errors import OperatorError, SubZeroError, warn
from subzero.model.cells import unpack
from subzero.model.modes import Mode
from subzero.model.operator import Gathering, TilingKind
from subzero.query.reexec import QueryBuffer, Rerun, check_deterministic, differs
from subzero.query.relation import StepContext
from subzero.query.threads import one_thread_for
from subzero.query.tilerun import Region, TileAccess

__all__ = ["rerun_gather"]


def rerun_gather(sc: StepContext, mode: Mode, backward: bool, i: int, q: np.ndarray,
                 access: TileAccess, stored: Callable[[Region], np.ndarray],
                 hit: Callable[[np.ndarray], np.ndarray]) -> Rerun | None:
    """Re-run a ``gather`` operator of one input on the bounding box of the backward
    query ``q`` (sorted packed output cells; ``hit`` tests membership of packed ids);
    returns its Full pairs (``output`` None: already checked), or None when it must
    re-run whole (another kind of operator or mode, a forward step, a box that does
    not match the stored output)."""
    op, name, shape = sc.op, sc.name, sc.out_shape
    if op.tiling.kind is not TilingKind.GATHER or not isinstance(op, Gathering) \
            or not backward or mode is not Mode.FULL or access.whole \
            or len(sc.in_shapes) != 1 or q.size == 0:
        return None
    check_deterministic(name, op)
    c = unpack(q, shape)
    out_box = tuple((int(a), int(b) + 1) for a, b in zip(c.min(axis=0), c.max(axis=0)))
    in_shape = tuple(sc.in_shapes[0])
    try:
        box = tuple((int(a), int(b)) for a, b in op.input_box(out_box, in_shape))
        block = access.read_region(access.inputs[0], tuple(slice(a, b) for a, b in box))
        with one_thread_for(block.size):
            new = np.asarray(op.gather(block, box, out_box, in_shape))
    except SubZeroError:
        raise
    except Exception as e:
        raise OperatorError(f"re-running operator {name!r} for a trace failed on box "
                            f"{_describe(out_box)}: {type(e).__name__}: {e}") from e
    region = tuple(slice(a, b) for a, b in out_box)
    old = np.asarray(stored(region))
    why = f"shape {new.shape} instead of {old.shape}" if new.shape != old.shape else \
        differs(new, old, [a for a, _ in out_box])
    if why:
        warn(f"operator {name!r} is declared gather but its re-run on box {_describe(out_box)} "
             f"differs from the stored output ({why}); re-running it whole")
        access.whole = True
        return None
    buf = QueryBuffer(name, 1, shape, [in_shape], True, i, hit, _no_payloads, keep_covered=False)
    ctx = Context(name, op, {Mode.FULL}, [in_shape], shape, buf)
    try:
        op.emit_tile(ctx, out_box)
    except SubZeroError:
        raise
    except Exception as e:
        raise OperatorError(f"operator {name!r}: its emit_tile raised {type(e).__name__}: "
                            f"{e}") from e
    full, _ = buf.kept()
    return Rerun(full, None, None, None)


def _no_payloads(*_: object) -> tuple[np.ndarray, np.ndarray]:
    raise AssertionError("a gather re-run writes Full pairs only")


def _describe(box: tuple[tuple[int, int], ...]) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"
