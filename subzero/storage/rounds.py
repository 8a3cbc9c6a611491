"""A statistic's merged states, kept by the run that computed them, so that a re-run
can compute it again from the few tiles that changed.

A statistic whose merge is a sum (:attr:`~subzero.model.statistic.Statistic.subtractive`:
the histograms of :class:`~subzero.ExactMedian` and :class:`~subzero.ExactMAD`) is,
after each round, the sum of its tiles' partials.  A re-run whose input changed
in a few tiles takes the parent's sum, subtracts those tiles' old partials and
adds their new ones: the statistic of the whole new array, exactly (integer
counts), at the cost of the tiles that changed.

A run keeps each round's merged state in ``statistics/<operator>.npz`` (numpy
arrays only, read without pickles) and its record names the file's SHA-256, so
the signature covers it; a file that does not match is not used (the re-run
then computes the statistic over the whole array, as a run does).
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from subzero.errors import UnsafeFile
from subzero.storage.files import read_regular

#: the folder of a run that holds its statistics' merged states
FOLDER = "statistics"
#: the largest file read back (a float64 MAD: 8 rounds of 65,536 int64 counts, twice)
MAX_BYTES = 64 << 20


def path(run_dir: Path, op: str) -> Path:
    return Path(run_dir) / FOLDER / f"{op}.npz"


def save(run_dir: Path, op: str, states: list[Any]) -> str | None:
    """Keep the merged state of each round of ``op``'s statistic; returns the file's
    SHA-256 for the run's record (None when a state is not a numeric array: nothing is
    kept, and a re-run computes the statistic whole)."""
    if not states or not all(isinstance(s, np.ndarray) and s.dtype.kind in "biuf" for s in states):
        return None
    buf = io.BytesIO()
    # compressed: the states are histograms of 65,536 counts, almost all zero (1 MB each
    # as they are, a few KB compressed); read back only once the signed digest matches
    np.savez_compressed(buf, *states)
    data = buf.getvalue()
    f = path(run_dir, op)
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.{os.getpid()}.{secrets.token_hex(4)}")
    with open(tmp, "xb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, f)
    return hashlib.sha256(data).hexdigest()


def load(run_dir: Path, op: str, digest: str) -> list[np.ndarray] | None:
    """The merged states a run kept for ``op``, when its file is there and is the one
    its record names (``digest``); None otherwise (missing, replaced, damaged)."""
    try:
        data = read_regular(path(run_dir, op), MAX_BYTES, f"the statistic of {op!r}")
    except (OSError, UnsafeFile):
        return None
    if hashlib.sha256(data).hexdigest() != digest:
        return None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return [np.asarray(z[f"arr_{k}"]) for k in range(len(z.files))]
    except Exception:
        return None
