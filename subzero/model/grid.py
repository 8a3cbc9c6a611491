"""Where an array's cells sit in its user's own coordinates, as plain data.

A :class:`Grid` carries the two ways scientists name cells: labelled axes
(xarray dimension coordinates: time, latitude, gene...) and a FITS world
coordinate system (the ``CTYPEi``/``CRPIXi``/``CDi_j`` keywords that map an
image's pixels to the sky).  Inputs bring their grid from their files; an
operator's output gets one from :meth:`subzero.model.operator.Operator.output_grid`,
so a star found in a derived image can be named by RA/Dec without the pipeline
having to copy headers along.

The WCS stays a dict of FITS keywords here (the model depends on numpy only);
:mod:`subzero.coords.sky` turns it into an astropy WCS.  FITS axis 1 is the last
numpy axis, and FITS pixels count from 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Grid:
    """``dims``: one name per axis; ``coords``: label values of the axes that have
    them (1-D, one per cell along that axis); ``wcs``: FITS WCS keywords whose
    pixel axes are the array's last axes, or None."""

    dims: tuple[str, ...]
    coords: Mapping[str, np.ndarray] = field(default_factory=dict)
    wcs: Mapping[str, Any] | None = None

    @property
    def empty(self) -> bool:
        return not self.coords and not self.wcs

    def sliced(self, start: Sequence[int], step: Sequence[int], length: Sequence[int],
               kept: Sequence[int]) -> Grid | None:
        """The grid of ``array[key]`` for a key given per input axis as start,
        step and length; ``kept`` lists the input axes the output keeps (an integer
        index drops its axis)."""
        coords = {}
        for d in kept:
            name = self.dims[d]
            if name in self.coords:
                stop = start[d] + step[d] * length[d]
                coords[name] = np.asarray(self.coords[name])[
                    slice(start[d], stop if stop >= 0 else None, step[d])]
        wcs = None
        if self.wcs is not None:
            n = int(self.wcs.get("WCSAXES", self.wcs.get("NAXIS", 2)))
            axes = list(range(len(self.dims) - n, len(self.dims)))
            if all(a in kept for a in axes):
                wcs = _slice_wcs(dict(self.wcs), [(start[a], step[a]) for a in reversed(axes)])
        g = Grid(tuple(self.dims[d] for d in kept), coords, wcs)
        return None if g.empty else g

    def reduced(self, kept: Sequence[int], out_shape: Sequence[int]) -> Grid | None:
        """The grid of a reduction that keeps the axes ``kept`` whole: their labels (and
        the sky WCS when all its axes are kept); the others are gone, or stay with length
        1 (``keepdims``: no label, the name kept)."""
        keepdims = len(out_shape) == len(self.dims)
        coords = {self.dims[d]: self.coords[self.dims[d]] for d in kept if self.dims[d] in self.coords}
        wcs = None
        if self.wcs is not None:
            n = int(self.wcs.get("WCSAXES", self.wcs.get("NAXIS", 2)))
            axes = list(range(len(self.dims) - n, len(self.dims)))
            if all(a in kept for a in axes) and (keepdims or list(kept)[-n:] == axes):
                wcs = self.wcs
        dims = self.dims if keepdims else tuple(self.dims[d] for d in kept)
        g = Grid(dims, coords, wcs)
        return None if g.empty else g

    def transposed(self, axes: Sequence[int]) -> Grid | None:
        """Axes permuted (labels follow their axes; a WCS does not survive)."""
        g = Grid(tuple(self.dims[a] for a in axes), dict(self.coords), None)
        return None if g.empty else g

    def shifted(self, before: Sequence[int]) -> Grid | None:
        """The grid of the array padded with ``before[d]`` cells in front of axis d:
        the WCS moves with the pixels; labels have no values for the new cells."""
        if self.wcs is None:
            return None
        n = int(self.wcs.get("WCSAXES", self.wcs.get("NAXIS", 2)))
        axes = range(len(self.dims) - n, len(self.dims))
        wcs = _slice_wcs(dict(self.wcs), [(-int(before[a]), 1) for a in reversed(axes)])
        return Grid(self.dims, {}, wcs)


def _slice_wcs(wcs: dict[str, Any], per_fits_axis: list[tuple[int, int]]) -> dict[str, Any]:
    """Keywords of a WCS for the pixels ``start + step * k`` of FITS axis j (1-based
    j in order): output pixel q (1-based) is input pixel ``start + 1 + step*(q-1)``,
    so ``CRPIX' = 1 + (CRPIX - start - 1) / step`` and the matrix column of axis j
    (``CDi_j`` or ``PCi_j``) grows by step."""
    has_cd = any(k.startswith("CD") and "_" in k for k in wcs)
    naxes = len(per_fits_axis)
    for j, (start, step) in enumerate(per_fits_axis, start=1):
        crpix = float(wcs.get(f"CRPIX{j}", 0.0))
        wcs[f"CRPIX{j}"] = 1.0 + (crpix - start - 1.0) / step
        if step != 1:
            if has_cd:
                for i in range(1, naxes + 1):
                    key = f"CD{i}_{j}"
                    if key in wcs:
                        wcs[key] = float(wcs[key]) * step
            else:       # PC form: CDELT belongs to world axes, so scale PC's column j
                for i in range(1, naxes + 1):
                    key = f"PC{i}_{j}"
                    value = float(wcs.get(key, 1.0 if i == j else 0.0)) * step
                    if key in wcs or value:
                        wcs[key] = value
    return wcs


#: header cards that make an image's sky WCS.  Observation times (DATE-OBS, MJD-OBS)
#: are left out: the pixel-to-sky mapping does not use them, and astropy's checks of
#: them reach for leap-second tables it may try to download or cache in $HOME.
_WCS_PREFIXES = ("WCSAXES", "CTYPE", "CRPIX", "CRVAL", "CDELT", "CUNIT", "CD1_", "CD2_", "CD3_",
                 "PC1_", "PC2_", "PC3_", "CROTA", "PV1_", "PV2_", "PV3_", "LONPOLE", "LATPOLE",
                 "RADESYS", "EQUINOX", "EPOCH")
#: CTYPE prefixes of celestial axes (equatorial, galactic, ecliptic, supergalactic)
_SKY_AXES = ("RA-", "DEC-", "GLON", "GLAT", "ELON", "ELAT", "SLON", "SLAT")


def wcs_keywords(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The sky WCS cards among an array's attributes (FITS header cards); None when no
    axis is celestial.  astropy checks them only when a sky query needs them, so
    reading a grid stays cheap."""
    cards = {k.upper(): v for k, v in attrs.items()
             if isinstance(k, str) and k.upper().startswith(_WCS_PREFIXES)
             and isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    celestial = any(k.startswith("CTYPE") and str(v).upper().startswith(_SKY_AXES)
                    for k, v in cards.items())
    return cards if celestial else None


def stored_grid(dims: Sequence[str], coords: Mapping[str, np.ndarray],
                attrs: Mapping[str, Any]) -> Grid | None:
    """The grid an array was stored with: its dimension coordinates and any sky WCS
    in its attributes.  Default dims (``dim_0``...) with nothing else make none."""
    g = Grid(tuple(dims), {k: np.asarray(v) for k, v in coords.items()}, wcs_keywords(attrs))
    return None if g.empty else g
