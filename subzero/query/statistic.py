"""The statistic a run used, for re-executing part of an operator that declares one.

An operator with a whole-array :attr:`~subzero.Operator.statistic` (a sky median,
a noise level) computes each tile from the tile and that one value.  Re-running
a few tiles for a trace needs the value the run used, not one computed from the
tiles at hand.  The run keeps it: a subtractive statistic's merged states in
``statistics/<operator>.npz``, whose SHA-256 its signed record names, and the
digest of the value itself (:func:`subzero.model.statistic.value_digest`).  The
value finished from kept states is used only when the file is the one the
record names and the value's digest is the recorded one; otherwise it is
computed again over the stored input's tiles (every cell read once), and a
value whose digest differs from the recorded one is not used at all (the step
then re-runs whole, whose output check decides).  Either way each re-run tile
is still checked against the stored output, so a value that somehow passed
would still not answer wrongly in silence.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from subzero.capture.runner import NOT_GIVEN
from subzero.capture.tiles import tiles_for
from subzero.errors import OperatorError, SubZeroError
from subzero.model.operator import Operator
from subzero.model.statistic import finished, over_blocks, value_digest
from subzero.storage import rounds

__all__ = ["kept_statistic", "run_statistic"]


def kept_statistic(op: Operator, run_dir: Path, name: str, recorded: str | None,
                   digest: str | None) -> Any:
    """The value finished from the merged states the run kept (``digest``: the SHA-256
    of their file as the record names it), when they verify against the record's
    value digest ``recorded``; else ``NOT_GIVEN``."""
    stat = op.statistic
    if stat is None or digest is None or recorded is None or not stat.subtractive:
        return NOT_GIVEN
    kept = rounds.load(run_dir, name, digest)
    if kept is None or len(kept) != int(stat.rounds):
        return NOT_GIVEN
    try:
        value = finished(stat, kept)
    except Exception:           # states the statistic cannot finish: not the run's
        return NOT_GIVEN
    return value if value_digest(value) == recorded else NOT_GIVEN


def run_statistic(name: str, op: Operator, run_dir: Path, recorded: str | None,
                  digest: str | None, shape: tuple[int, ...], tile: tuple[int, ...],
                  read: Callable[[tuple[slice, ...]], np.ndarray]) -> Any:
    """The value of ``op``'s statistic over its first input (of ``shape``, read by
    region through ``read``, in tiles of ``tile``) as the run used it: kept and
    verified (:func:`kept_statistic`), else computed again and, when the record names
    a digest, equal to it; ``NOT_GIVEN`` when neither can be had."""
    value = kept_statistic(op, run_dir, name, recorded, digest)
    if value is not NOT_GIVEN:
        return value
    stat = op.statistic
    assert stat is not None
    cores = [t.core for t in tiles_for(shape, tile)]
    try:
        value = over_blocks(stat, lambda box: read(tuple(slice(a, b) for a, b in box)), cores,
                            shape)
    except SubZeroError:
        raise
    except Exception as e:
        raise OperatorError(f"operator {name!r} ({type(op).__name__}) failed computing its "
                            f"statistic for a trace: {type(e).__name__}: {e}") from e
    if recorded is not None and value_digest(value) != recorded:
        return NOT_GIVEN
    return value
