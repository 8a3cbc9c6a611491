"""The plain gnomonic (TAN) sky WCS in numpy, so a trace's sky region costs no astropy.

Importing astropy's WCS and coordinates takes most of a second, several times
what a whole trace takes, and every trace that ends on an image with a WCS
reports where its answer lies on the sky.  Nearly every such image (all of the
LSST exposures) carries the simplest celestial WCS there is: RA---TAN/DEC--TAN
in ICRS, a linear matrix (CDi_j, or PCi_j with CDELTi), default poles, no
distortion.  For that WCS the pixel-to-sky mapping is a few lines of
spherical trigonometry (Calabretta & Greisen 2002, FITS paper II, sections 2.5
and 5.1.3), computed here in float64 as wcslib computes it.

:func:`simple_tan` recognises exactly that case and returns None for anything
else -- another projection, a distortion (SIP, PVi_m), a frame other than ICRS
(FK5 needs astropy's frame transformation), explicit poles, more axes -- so the
caller falls back to astropy there.  tests/test_coords_tan.py checks the two
agree on random headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: the cards this module understands; any other card (PVi_m, LONPOLE, A_ORDER...) means
#: astropy decides
_KNOWN = frozenset({"WCSAXES", "CTYPE1", "CTYPE2", "CRPIX1", "CRPIX2", "CRVAL1", "CRVAL2",
                    "CDELT1", "CDELT2", "CUNIT1", "CUNIT2", "CD1_1", "CD1_2", "CD2_1", "CD2_2",
                    "PC1_1", "PC1_2", "PC2_1", "PC2_2", "RADESYS", "EQUINOX", "EPOCH"})


@dataclass(frozen=True)
class Tan:
    """A 2-axis RA---TAN/DEC--TAN WCS in ICRS: FITS axis 1 is RA (the array's last
    axis), axis 2 is Dec."""

    crpix: tuple[float, float]
    crval: tuple[float, float]
    #: the linear matrix from pixel offsets to intermediate world coordinates (degrees)
    cd: tuple[tuple[float, float], tuple[float, float]]

    def pixel_to_world(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """RA and Dec in degrees (RA in [0, 360)) of 0-based pixel positions ``x``
        (the last axis) and ``y``, as astropy's ``pixel_to_world`` gives them."""
        dx = np.asarray(x, np.float64) + 1.0 - self.crpix[0]
        dy = np.asarray(y, np.float64) + 1.0 - self.crpix[1]
        (a, b), (c, d) = self.cd
        xi = np.deg2rad(a * dx + b * dy)          # intermediate world coordinates
        eta = np.deg2rad(c * dx + d * dy)
        ra0, dec0 = np.deg2rad(self.crval[0]), np.deg2rad(self.crval[1])
        # the gnomonic inverse with the native pole at (ra0, dec0) and LONPOLE 180
        den = np.cos(dec0) - eta * np.sin(dec0)
        ra = ra0 + np.arctan2(xi, den)
        dec = np.arctan2(np.sin(dec0) + eta * np.cos(dec0), np.hypot(xi, den))
        return np.rad2deg(ra) % 360.0, np.rad2deg(dec)


def simple_tan(cards: Mapping[str, Any] | None) -> Tan | None:
    """The :class:`Tan` these FITS cards describe, or None when they describe anything
    else (astropy then reads them)."""
    if not cards or not set(cards) <= _KNOWN:
        return None
    if int(cards.get("WCSAXES", 2)) != 2:
        return None
    if (str(cards.get("CTYPE1", "")).strip().upper() != "RA---TAN"
            or str(cards.get("CTYPE2", "")).strip().upper() != "DEC--TAN"):
        return None
    if str(cards.get("RADESYS", "")).strip().upper() != "ICRS":
        return None
    if any(str(cards.get(f"CUNIT{k}", "deg")).strip().lower() not in ("deg", "")
           for k in (1, 2)):
        return None
    try:
        crpix = (float(cards.get("CRPIX1", 0.0)), float(cards.get("CRPIX2", 0.0)))
        crval = (float(cards.get("CRVAL1", 0.0)), float(cards.get("CRVAL2", 0.0)))
        has_cd = any(k.startswith("CD") and "_" in k for k in cards)
        has_pc = any(k.startswith("PC") for k in cards)
        if has_cd and (has_pc or "CDELT1" in cards or "CDELT2" in cards):
            return None                  # mixed forms: wcslib has rules of precedence
        if has_cd:
            m = [[float(cards.get(f"CD{i}_{j}", 0.0)) for j in (1, 2)] for i in (1, 2)]
        else:
            pc = [[float(cards.get(f"PC{i}_{j}", 1.0 if i == j else 0.0)) for j in (1, 2)]
                  for i in (1, 2)]
            cdelt = (float(cards.get("CDELT1", 1.0)), float(cards.get("CDELT2", 1.0)))
            m = [[cdelt[i] * pc[i][j] for j in range(2)] for i in range(2)]
    except (TypeError, ValueError):
        return None
    values = [*crpix, *crval, *m[0], *m[1]]
    if not all(np.isfinite(values)) or not -90.0 < crval[1] < 90.0:
        return None
    if m[0][0] * m[1][1] - m[0][1] * m[1][0] == 0.0:
        return None                       # singular: astropy says what is wrong
    return Tan(crpix, crval, ((m[0][0], m[0][1]), (m[1][0], m[1][1])))


def hmsdms(ra: float, dec: float, precision: int = 2) -> str:
    """``23h47m09.79s -02d17m37.24s``: a position as astropy's
    ``SkyCoord.to_string("hmsdms", precision=2)`` writes it (RA 360 reads 00h, where
    astropy writes 24h)."""
    scale = 10 ** precision
    total = int(round((float(ra) % 360.0) / 15.0 * 3600.0 * scale)) % (24 * 3600 * scale)
    h, rest = divmod(total, 3600 * scale)
    m, s = divmod(rest, 60 * scale)
    sign = "-" if np.signbit(dec) else "+"
    total = int(round(abs(float(dec)) * 3600.0 * scale))
    d, rest = divmod(total, 3600 * scale)
    dm, ds = divmod(rest, 60 * scale)
    width = 3 + precision if precision else 2

    def secs(v: int) -> str:
        return f"{v / scale:0{width}.{precision}f}"
    return f"{h:02d}h{m:02d}m{secs(s)}s {sign}{d:02d}d{dm:02d}m{secs(ds)}s"
