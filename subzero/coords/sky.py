"""Sky positions to cells and cells to sky regions, through an image's FITS WCS.

Pixel conventions: astropy's 0-based pixel coordinates, where pixel ``i``
covers ``[i - 0.5, i + 0.5)``; the WCS's FITS axis 1 is the array's last axis.
A position names the pixel it falls in; a radius names every pixel whose centre
lies within it (and always the pixel of the position itself), so a query of
"2 arcsec around this star" is a disc of cells, not a box.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from subzero.coords.tan import hmsdms, simple_tan
from subzero.errors import QueryError
from subzero.model.cells import box
from subzero.model.grid import Grid


def celestial_from_cards(cards: Mapping[str, Any]):
    """An astropy celestial WCS from FITS keywords, or None when they make none."""
    from astropy.io import fits
    from astropy.wcs import WCS
    header = fits.Header()
    for k, v in cards.items():
        header[k] = v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            w = WCS(header)
        except Exception:
            return None
    return w.celestial if w.has_celestial else None


def celestial(grid: Grid | None, array: str):
    """The array's sky WCS; a clear error when it has none."""
    w = celestial_from_cards(grid.wcs) if grid is not None and grid.wcs else None
    if w is None:
        raise QueryError(f"array {array!r} has no sky coordinates: neither it nor the inputs it "
                         f"derives from carry a FITS WCS (CTYPEi/CRPIXi/CRVALi header cards)")
    return w


def parse_position(value):
    """A SkyCoord from ``"RA,DEC"`` (degrees, or sexagesimal hours and degrees),
    a pair of numbers in degrees, or a SkyCoord."""
    import astropy.units as u
    from astropy.coordinates import SkyCoord
    if isinstance(value, SkyCoord):
        return value
    if isinstance(value, str):
        parts = [p.strip() for p in (value.split(",") if "," in value else value.split())]
    else:
        parts = list(value)
    hint = ("write RA,DEC in degrees (356.79,-2.29) or in hours and degrees "
            "(23:47:09.8,-2:17:37 or 23h47m09.8s,-2d17m37s)")
    if len(parts) != 2:
        raise QueryError(f"cannot read sky position {value!r}: {hint}")
    try:
        ra, dec = float(parts[0]), float(parts[1])
        if not (np.isfinite(ra) and np.isfinite(dec)):
            raise QueryError(f"cannot read sky position {value!r}: RA and Dec must be finite "
                             f"numbers")
        pos = SkyCoord(ra * u.deg, dec * u.deg, frame="icrs")
    except QueryError:
        raise
    except (TypeError, ValueError):
        try:
            pos = SkyCoord(str(parts[0]), str(parts[1]), unit=(u.hourangle, u.deg), frame="icrs")
        except Exception as err:
            raise QueryError(f"cannot read sky position {value!r}: {hint}") from err
    except Exception as err:
        raise QueryError(f"cannot read sky position {value!r}: {hint}") from err
    return pos


def parse_radius(value):
    """An Angle from ``"2arcsec"``, ``"0.5 deg"``, a Quantity, or a number of arcseconds."""
    import astropy.units as u
    if value is None:
        return None
    try:
        if isinstance(value, (int, float)):
            q = float(value) * u.arcsec
        elif isinstance(value, u.Quantity):
            q = value
        else:
            text = str(value).strip()
            try:
                q = float(text) * u.arcsec
            except ValueError:
                q = u.Quantity(text)
        angle = q.to(u.deg)
    except Exception as err:
        raise QueryError(f"cannot read radius {value!r}: give an angle such as 2arcsec, "
                         f"0.5arcmin or 0.001deg (a bare number is arcseconds)") from err
    if not np.isfinite(angle.value) or angle.value < 0:
        raise QueryError(f"radius {value!r} must be a non-negative angle")
    return angle


def cells_at(grid: Grid | None, shape: Sequence[int], position, radius, array: str) -> np.ndarray:
    """Cells of ``array`` at a sky position (the pixel it falls in), or within
    ``radius`` of it; arrays with axes before the sky axes take every cell along them."""
    w = celestial(grid, array)
    pos = parse_position(position)
    rad = parse_radius(radius)
    ny, nx = int(shape[-2]), int(shape[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x, y = (float(v) for v in w.world_to_pixel(pos))
    if not (np.isfinite(x) and np.isfinite(y)):     # not on this image's projection at all
        raise _outside(pos, w, nx, ny, array, rad)
    cx, cy = int(np.floor(x + 0.5)), int(np.floor(y + 0.5))
    inside = 0 <= cx < nx and 0 <= cy < ny
    if rad is None or rad.value == 0:
        if not inside:
            raise _outside(pos, w, nx, ny, array)
        image = np.array([[cy, cx]], np.int64)
    else:
        scale = float(np.min(_pixel_scales(w)))           # degrees per pixel
        r = rad.to_value("deg") / scale + 1.0
        y0, y1 = max(int(np.floor(y - r)), 0), min(int(np.ceil(y + r)) + 1, ny)
        x0, x1 = max(int(np.floor(x - r)), 0), min(int(np.ceil(x + r)) + 1, nx)
        if y0 >= y1 or x0 >= x1:
            raise _outside(pos, w, nx, ny, array, rad)
        yy, xx = np.mgrid[y0:y1, x0:x1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sep = w.pixel_to_world(xx.ravel(), yy.ravel()).separation(pos).deg
        keep = sep <= rad.to_value("deg")
        image = np.stack([yy.ravel()[keep], xx.ravel()[keep]], axis=1).astype(np.int64)
        if inside and not ((image[:, 0] == cy) & (image[:, 1] == cx)).any():
            image = np.concatenate([image, [[cy, cx]]]).astype(np.int64)
        if not len(image):
            raise _outside(pos, w, nx, ny, array, rad)
    lead = tuple(int(n) for n in shape[:-2])
    if not lead:
        return image
    front = box((0,) * len(lead), lead)
    return np.concatenate([np.repeat(front, len(image), axis=0),
                           np.tile(image, (len(front), 1))], axis=1)


def footprint(grid: Grid | None, lo: Sequence[int], hi: Sequence[int], array: str) -> dict[str, Any]:
    """The sky region of the cell box ``[lo, hi)`` (its last two axes): centre,
    the four outer corners, and RA/Dec ranges in degrees (RA unwrapped around the
    centre, so a box across RA 0 reads 359.9..360.1).  A plain TAN WCS in ICRS is
    computed in numpy (:mod:`.tan`); any other goes through astropy."""
    (y0, x0), (y1, x1) = (int(v) for v in lo[-2:]), (int(v) for v in hi[-2:])
    xs = np.array([x0 - 0.5, x1 - 0.5, x1 - 0.5, x0 - 0.5, (x0 + x1 - 1) / 2])
    ys = np.array([y0 - 0.5, y0 - 0.5, y1 - 0.5, y1 - 0.5, (y0 + y1 - 1) / 2])
    tan = simple_tan(grid.wcs) if grid is not None else None
    if tan is not None:
        ra, dec = tan.pixel_to_world(xs, ys)
        centre = hmsdms(float(ra[4]), float(dec[4]), precision=2)
    else:
        w = celestial(grid, array)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sky = w.pixel_to_world(xs, ys).icrs
        ra, dec = sky.ra.deg, sky.dec.deg
        centre = sky[4].to_string("hmsdms", precision=2)
        if centre.startswith("24h"):     # a hair below RA 360: 00h, as the fast path writes it
            centre = "00h" + centre[3:]
    ra = ra[4] + (ra - ra[4] + 180.0) % 360.0 - 180.0
    return {"frame": "icrs", "center": [float(ra[4] % 360.0), float(dec[4])],
            "center_hmsdms": centre,
            "corners": [[float(a % 360.0), float(d)] for a, d in zip(ra[:4], dec[:4])],
            "ra": [float(ra[:4].min()), float(ra[:4].max())],
            "dec": [float(dec[:4].min()), float(dec[:4].max())]}


def _pixel_scales(w) -> np.ndarray:
    from astropy.wcs.utils import proj_plane_pixel_scales
    return np.abs(proj_plane_pixel_scales(w))


def _outside(pos, w, nx: int, ny: int, array: str, rad=None) -> QueryError:
    fp = footprint(Grid(("y", "x"), {}, dict(w.to_header())), (0, 0), (ny, nx), array)
    near = f" (nor within {rad.to_value('arcsec'):g} arcsec of it)" if rad is not None else ""
    return QueryError(
        f"sky position RA {pos.icrs.ra.deg:.6f} Dec {pos.icrs.dec.deg:.6f} is outside array "
        f"{array!r}{near}: it covers RA {fp['ra'][0]:.5f}..{fp['ra'][1]:.5f}, "
        f"Dec {fp['dec'][0]:.5f}..{fp['dec'][1]:.5f}")
