"""Trace pictures: the start array with the query cells, and the result array
with the traced cells highlighted (``subzero trace --plot FILE.png``).

2-D arrays are drawn as images (percentile-stretched, so sky and stars are
both visible; on RA/Dec axes when the array has a sky WCS) and zoomed to the
traced cells when they are a small part of the array; 1-D arrays as lines;
arrays with more dimensions as the maximum projection over their leading axes.
"""

from __future__ import annotations

import numpy as np


def _as_2d(values: np.ndarray, mask: np.ndarray):
    if values.ndim == 1:
        return values[None, :], mask[None, :]
    if values.ndim == 2:
        return values, mask
    lead = tuple(range(values.ndim - 2))
    v = values.astype(float) if values.dtype.kind in "biuf" else np.zeros(values.shape[-2:])
    return (np.nanmax(v, axis=lead) if values.dtype.kind in "biuf" else v), mask.any(axis=lead)


def _window(mask: np.ndarray, centre=None, margin: int = 12, max_half: int = 60):
    """Rows/cols to show: a crop around the highlighted cells near ``centre``
    (or all of them), or the whole array when they fill most of it."""
    idx = np.argwhere(mask)
    h, w = mask.shape
    if len(idx) == 0:
        return slice(0, h), slice(0, w)
    if centre is not None:
        near = idx[np.all(np.abs(idx - np.asarray(centre)) <= max_half, axis=1)]
        idx = near if len(near) else np.asarray([centre])
    lo, hi = idx.min(axis=0), idx.max(axis=0)
    if centre is None and (hi[0] - lo[0] + 1) * (hi[1] - lo[1] + 1) > 0.25 * h * w:
        return slice(0, h), slice(0, w)
    return (slice(max(0, lo[0] - margin), min(h, hi[0] + margin + 1)),
            slice(max(0, lo[1] - margin), min(w, hi[1] + margin + 1)))


def _sky(run, name: str, ndim: int):
    """The array's celestial astropy WCS when it is a 2-D image with one, else None."""
    if ndim != 2:
        return None
    from subzero.coords.sky import celestial
    from subzero.errors import QueryError
    try:
        return celestial(run.grid(name), name)
    except QueryError:
        return None


def _panel(fig, spec, values, mask, title, window=None, aspect="equal", wcs=None):
    """One image panel; with a ``wcs`` its axes are RA/Dec with a coordinate grid."""
    v, m = _as_2d(np.asarray(values), np.asarray(mask, bool))
    if v.dtype.kind not in "biuf":
        v = np.zeros(v.shape)
    ys, xs = window if window is not None else (slice(0, m.shape[0]), slice(0, m.shape[1]))
    crop, cm = v[ys, xs].astype(float), m[ys, xs]
    finite = crop[np.isfinite(crop)]
    lo, hi = (np.percentile(finite, [1, 99.5]) if finite.size else (0, 1))
    if wcs is not None:        # WCSAxes draws in the crop's own pixels: slice the WCS alike
        ax = fig.add_subplot(spec, projection=wcs[ys, xs])
        ext = None
    else:
        ax = fig.add_subplot(spec)
        ext = (xs.start - 0.5, xs.stop - 0.5, ys.start - 0.5, ys.stop - 0.5)
    ax.imshow(crop, cmap="gray", vmin=lo, vmax=hi if hi > lo else lo + 1, origin="lower",
              interpolation="nearest", aspect=aspect, extent=ext)
    over = np.zeros(cm.shape + (4,))
    over[cm] = (1.0, 0.2, 0.1, 0.55)
    ax.imshow(over, origin="lower", interpolation="nearest", aspect=aspect, extent=ext)
    whole = (ys.stop - ys.start, xs.stop - xs.start) == m.shape
    ax.set_title(title + ("" if whole else f"\nrows {ys.start}:{ys.stop}, cols {xs.start}:{xs.stop}"),
                 fontsize=9)
    if wcs is not None:
        ax.coords.grid(color="white", alpha=0.35, linestyle="dotted")
        ax.coords[0].set_axislabel("RA")
        ax.coords[1].set_axislabel("Dec")
    else:
        ax.set_xlabel("column")
        ax.set_ylabel("row")


def plot_trace(run, start: str, cells: np.ndarray, res, path: str) -> None:
    """Three panels: the query (zoomed), the whole result array, and the result
    zoomed where the query points (same place when the shapes agree)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start_vals = run.array(start).values
    qmask = np.zeros(start_vals.shape, bool)
    qmask[tuple(np.asarray(cells).T)] = True
    target_vals = run.array(res.target).values
    qv, qm = _as_2d(start_vals, qmask)
    tv, tm = _as_2d(target_vals, res.bitmap)
    q_centre = np.argwhere(qm).mean(axis=0).round().astype(int)
    t_centre = q_centre if qm.shape == tm.shape else (
        np.argwhere(tm).mean(axis=0).round().astype(int) if tm.any() else None)
    fig = plt.figure(figsize=(15, 5.4))
    grid = fig.add_gridspec(1, 3, width_ratios=[1, 0.55, 1])
    sw, tw = _sky(run, start, start_vals.ndim), _sky(run, res.target, target_vals.ndim)
    _panel(fig, grid[0, 0], start_vals, qmask, f"{start}: {int(qmask.sum())} query cell(s)",
           _window(qm, q_centre), wcs=sw)
    _panel(fig, grid[0, 1], target_vals, res.bitmap, f"{res.target}: all {len(res)} lineage cells",
           wcs=tw)
    _panel(fig, grid[0, 2], target_vals, res.bitmap, f"{res.target}: near the query",
           _window(tm, t_centre) if t_centre is not None else None, wcs=tw)
    fig.suptitle(f"run {run.id}: {res.direction} trace {start} -> {res.target} "
                 f"({res.seconds * 1000:.1f} ms)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
