"""What identifies an input: a digest of its content, not of its file.

A night of exposures shares its calibration frames: the same flat reaches 200
runs, perhaps as a FITS file in one and a ``.npy`` copy or an in-memory array
in another.  To answer "which runs used this flat?" a store needs a name for the
flat that is the same wherever it came from, and different the moment one cell,
the shape, the type or a label changes.  That name is the *content digest*:

    sz1:<64 hex digits>

a SHA-256 over a canonical header (format, dtype, shape, labels) followed by the
SHA-256 of each *band* of the values.  A band is a run of whole slices along the
first axis, as many as fit in :data:`BAND_BYTES` (at least one), so

* memory is bounded by one band, never the whole array, and a source read
  region by region (a FITS file, a Spark task's share) is read a band at a time;
* bands are independent: an array too big for one process is digested band by
  band anywhere (a Spark job over bands) and combined with :func:`combine`;
* the digest does not depend on how a run tiles the array, on the file format,
  on byte order or memory layout: values are hashed little-endian, C order.

Values are hashed as stored, bit for bit, except that every NaN is hashed as
the one quiet NaN of its type (files keep NaN payloads they do not mean).
Labels are the array's :class:`~subzero.model.grid.Grid`: its dimension names
(unless numpy's defaults), each labelled axis's coordinate values (digested
the same way), and its sky WCS cards.  Other header cards (observation notes,
file history) are not content.

The band size is part of the format: changing it changes every digest, so it
is fixed here, not a tuning knob.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from subzero.errors import ContentError
from subzero.model.grid import Grid

#: the digest's format, written in front of it (``sz1:...``) and into its header
FORMAT = 1
PREFIX = f"sz{FORMAT}:"
#: bytes of values per band (whole slices along the first axis, at least one)
BAND_BYTES = 4 << 20
#: dtype kinds a digest is defined for: bool, integers, floats, complex, text, bytes,
#: dates and durations (object arrays hold references, not values)
KINDS = "biufcUSMm"


class RegionReadable(Protocol):
    """Anything read region by region: ``shape``, ``dtype`` and ``read_region``."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def read_region(self, region: tuple[slice, ...]) -> np.ndarray: ...


@dataclass(frozen=True)
class Banding:
    """How an array of ``shape`` and ``dtype`` is cut into bands: plain data, the same
    in every process (a Spark task gets it and digests its bands)."""

    shape: tuple[int, ...]
    dtype: str                     # canonical: little-endian (``<f8``, ``|b1``, ``<U4``)

    @classmethod
    def of(cls, shape: Sequence[int], dtype: np.dtype | str) -> Banding:
        return cls(tuple(int(n) for n in shape), canonical_dtype(np.dtype(dtype)))

    @property
    def rows(self) -> int:
        """Slices along the first axis per band."""
        if not self.shape:
            return 1
        row = np.dtype(self.dtype).itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        return max(1, BAND_BYTES // max(1, row))

    @property
    def count(self) -> int:
        if not self.shape:
            return 1
        return max(1, -(-self.shape[0] // self.rows))

    def region(self, k: int) -> tuple[slice, ...]:
        """Band ``k`` as one slice per axis."""
        if not self.shape:
            return ()
        lo = k * self.rows
        return (slice(lo, min(self.shape[0], lo + self.rows)),) + tuple(slice(0, n) for n in self.shape[1:])

    def bands(self) -> Iterator[tuple[slice, ...]]:
        return (self.region(k) for k in range(self.count))


def canonical_dtype(dt: np.dtype) -> str:
    """The dtype's name as hashed: little-endian, whatever the file or machine kept."""
    if dt.kind not in KINDS or dt.fields is not None or dt.subdtype is not None:
        raise ContentError(f"arrays of dtype {dt} have no content digest (only plain numbers, "
                           f"booleans, text, bytes, dates and durations)")
    return dt.str if dt.byteorder == "|" else dt.newbyteorder("<").str


def band_digest(values: np.ndarray, dtype: str) -> bytes:
    """The SHA-256 of one band: its values as ``dtype`` (canonical), C order, NaNs as
    the one quiet NaN."""
    a = np.ascontiguousarray(values, dtype=np.dtype(dtype))
    if a.dtype.kind in "fc":
        nan = np.isnan(a)
        if nan.any():
            a = a.copy()
            a[nan] = np.nan
    return hashlib.sha256(a.reshape(-1).view(np.uint8).data).digest()


def header(banding: Banding, labels: Mapping[str, Any] | None) -> bytes:
    """The canonical header hashed in front of the bands."""
    doc = {"format": FORMAT, "dtype": banding.dtype, "shape": list(banding.shape),
           "band_bytes": BAND_BYTES, "labels": dict(labels or {})}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def combine(head: bytes, bands: Iterable[bytes]) -> str:
    """The digest from the header and every band's digest, in band order."""
    h = hashlib.sha256(b"subzero content\0")
    h.update(len(head).to_bytes(8, "little"))
    h.update(head)
    for b in bands:
        h.update(b)
    return PREFIX + h.hexdigest()


def labels_of(grid: Grid | None) -> dict[str, Any]:
    """The labels a digest covers: dimension names unless numpy's defaults, each
    labelled axis's coordinate values (by their own digest), the sky WCS cards."""
    if grid is None:
        return {}
    out: dict[str, Any] = {}
    if not all(d == f"dim_{i}" for i, d in enumerate(grid.dims)):
        out["dims"] = list(grid.dims)
    if grid.coords:
        out["coords"] = {str(k): digest(np.asarray(v)) for k, v in sorted(grid.coords.items())}
    if grid.wcs:
        out["wcs"] = {str(k): _card(v) for k, v in sorted(grid.wcs.items())}
    return out


def _card(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v).hex()              # exact, and JSON has no NaN
    return str(v)


def digest(source: np.ndarray | RegionReadable, grid: Grid | None = None) -> str:
    """The content digest of an array, or of a source read region by region (one band
    at a time: memory bounded by :data:`BAND_BYTES` rows, not the array)."""
    if isinstance(source, np.ndarray):
        arr = source
        banding = Banding.of(arr.shape, arr.dtype)
        bands = (band_digest(arr[r] if arr.ndim else arr, banding.dtype) for r in banding.bands())
    else:
        banding = Banding.of(source.shape, source.dtype)
        bands = (band_digest(source.read_region(r), banding.dtype) for r in banding.bands())
    return combine(header(banding, labels_of(grid)), bands)


def is_digest(text: str) -> bool:
    """Whether ``text`` is written as a content digest (``sz1:`` and 64 hex digits)."""
    body = text[len(PREFIX):]
    return text.startswith(PREFIX) and len(body) == 64 and all(c in "0123456789abcdef" for c in body)
