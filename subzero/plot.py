"""Trace pictures: the start array with the query cells, and the result array
with the traced cells highlighted (``subzero trace --plot FILE.png``).

2-D arrays are drawn as images (percentile-stretched, so sky and stars are
both visible; on RA/Dec axes when the array has a sky WCS; row 0 at the top, as
in the explorer) and zoomed to the traced cells when they are a small part of
the array; 1-D arrays as strips; arrays with more dimensions as the maximum
projection over their leading axes, which the panel's title says.
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


#: overlay colours (RGB): the query, the cells reached directly, those only through
#: all-to-all steps
QUERY, DIRECT, VIA_ALL = (1.0, 0.85, 0.1), (1.0, 0.2, 0.1), (0.15, 0.8, 1.0)


def _axis_names(run, name: str, ndim: int) -> tuple[str, str]:
    """The drawn axes' names: the array's dims (with 'row'/'column' when unnamed)."""
    g = run.grid(name) if ndim >= 1 else None
    dims = list(g.dims) if g is not None and g.dims else []
    if len(dims) < 2 or any(d.startswith("dim_") for d in dims[-2:]):
        return ("row", "column") if ndim != 1 else ("", "cell")
    return dims[-2], dims[-1]


def _axis_labels(run, name: str, ndim: int) -> tuple[object, object]:
    """The labels along the drawn axes (the last two), where the array has them: its
    coordinates, for the ticks (None for an axis without)."""
    g = run.grid(name) if ndim >= 2 else None
    if g is None or len(g.dims) < 2:
        return None, None
    rows, cols = (np.asarray(g.coords[d]) if d in g.coords else None for d in g.dims[-2:])
    return rows, cols


def _ticks(axis, labels) -> None:
    """Tick an image axis with the cell's label instead of its index."""
    from matplotlib.ticker import FuncFormatter

    def fmt(v, _pos):
        k = int(round(v))
        if not 0 <= k < len(labels):
            return ""
        lab = labels[k]
        if isinstance(lab, np.datetime64):
            return str(lab)[:10]
        return f"{lab:.4g}" if isinstance(lab, (float, np.floating)) else str(lab)
    axis.set_major_formatter(FuncFormatter(fmt))


def _panel(fig, spec, values, layers, title, window=None, aspect="equal", wcs=None,
           names=("row", "column"), projection=None, labels=(None, None)):
    """One image panel, drawn as the explorer draws it (row 0 at the top), with each of
    ``layers`` -- (mask, RGB colour, label) -- as a translucent fill and an outline of
    its bounding box, so a thin strip stays visible at any zoom and nothing is hidden
    under an opaque block.  With a ``wcs`` the axes are RA/Dec.  Returns the image."""
    v = _as_2d(np.asarray(values), np.zeros(np.shape(values), bool))[0]
    if v.dtype.kind not in "biuf":
        v = np.zeros(v.shape)
    h, w = v.shape
    ys, xs = window if window is not None else (slice(0, h), slice(0, w))
    crop = v[ys, xs].astype(float)
    finite = crop[np.isfinite(crop)]
    lo, hi = (np.percentile(finite, [1, 99.5]) if finite.size else (0, 1))
    if wcs is not None:        # WCSAxes draws in the crop's own pixels: slice the WCS alike
        ax = fig.add_subplot(spec, projection=wcs[ys, xs])
        ext, off = None, (ys.start, xs.start)
    else:
        ax = fig.add_subplot(spec)
        ext, off = (xs.start - 0.5, xs.stop - 0.5, ys.stop - 0.5, ys.start - 0.5), (0, 0)
    im = ax.imshow(crop, cmap="gray", vmin=lo, vmax=hi if hi > lo else lo + 1,
                   origin="upper" if wcs is None else "lower", interpolation="nearest",
                   aspect=aspect, extent=ext)
    from matplotlib.patches import Rectangle
    for mask, colour, _label in layers:
        m = _as_2d(np.zeros(np.shape(mask)), np.asarray(mask, bool))[1]
        cm = m[ys, xs]
        over = np.zeros(cm.shape + (4,))
        over[cm] = (*colour, 0.35)
        ax.imshow(over, origin="upper" if wcs is None else "lower", interpolation="nearest",
                  aspect=aspect, extent=ext)
        idx = np.argwhere(cm)
        if len(idx):
            (r0, c0), (r1, c1) = idx.min(axis=0), idx.max(axis=0)
            x0 = c0 + xs.start - off[1] - 0.5
            y0 = r0 + ys.start - off[0] - 0.5
            # over the frame too: a strip along the array's edge stays visible
            ax.add_patch(Rectangle((x0, y0), c1 - c0 + 1, r1 - r0 + 1, fill=False,
                                   edgecolor=colour, linewidth=2.2, clip_on=False, zorder=5))
    if wcs is not None:
        ax.invert_yaxis()      # row 0 at the top, as in the explorer
        ax.coords.grid(color="white", alpha=0.35, linestyle="dotted")
        ax.coords[0].set_axislabel("RA (ICRS)")
        ax.coords[1].set_axislabel("Dec (ICRS)")
    else:
        ax.set_xlabel(names[1])
        ax.set_ylabel(names[0])
        if labels[0] is not None:           # the labels' values, not the cells' indices
            _ticks(ax.yaxis, labels[0])
        if labels[1] is not None:
            _ticks(ax.xaxis, labels[1])
    whole = (ys.stop - ys.start, xs.stop - xs.start) == (h, w)
    ax.set_title(title + ("" if whole else f"\nrows {ys.start}:{ys.stop}, cols {xs.start}:{xs.stop}")
                 + (f"\n{projection}" if projection else ""), fontsize=9)
    return im


def _values(run, name: str) -> np.ndarray:
    """The array's cells, checked, as numpy: read chunk by chunk (``Run.read_region``),
    not as a labelled array, whose reading imports xarray, zarr and dask (seconds a
    plot's user waits for, and what they give it the grid gives already)."""
    return run.read_region(name, tuple(slice(0, n) for n in run.shapes()[name]))


def plot_trace(run, start: str, cells: np.ndarray, res, path: str) -> None:
    """Three panels, as the explorer shows them (row 0 at the top): the query (zoomed),
    the whole result array, and the result zoomed where the query points.  The cells
    reached directly and those only through all-to-all steps (``res.parts()``) have
    their own colours, a legend says which is which and how many, and a colour bar
    gives the result's values."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    start_vals = _values(run, start)
    qmask = np.zeros(start_vals.shape, bool)
    qmask[tuple(np.asarray(cells).T)] = True
    target_vals = _values(run, res.target)
    _, qm = _as_2d(start_vals, qmask)
    direct = res.direct if res.direct is not None else res.cellset
    dmask = direct.bitmap()
    layers = [(dmask, DIRECT, f"reached directly: {len(direct):,} cells")]
    if res.direct is not None:
        layers.append((res.bitmap & ~dmask, VIA_ALL,
                       f"only through all-to-all steps: {len(res) - len(direct):,} cells"))
    _, tm = _as_2d(target_vals, dmask if dmask.any() else res.bitmap)
    q_centre = np.argwhere(qm).mean(axis=0).round().astype(int)
    t_centre = q_centre if qm.shape == tm.shape else (
        np.argwhere(tm).mean(axis=0).round().astype(int) if tm.any() else None)
    fig = plt.figure(figsize=(15, 6.2))
    grid = fig.add_gridspec(1, 4, width_ratios=[1, 0.55, 1, 0.04])
    sw, tw = _sky(run, start, start_vals.ndim), _sky(run, res.target, target_vals.ndim)
    sn, tn = _axis_names(run, start, start_vals.ndim), _axis_names(run, res.target, target_vals.ndim)
    sl, tl = _axis_labels(run, start, start_vals.ndim), _axis_labels(run, res.target, target_vals.ndim)

    def folded(a: np.ndarray, name: str) -> str | None:
        if a.ndim <= 2:
            return None
        dims = _axis_names(run, name, a.ndim)
        return f"maximum over the leading axes of {a.shape} (drawn: {dims[0]}, {dims[1]})"
    _panel(fig, grid[0, 0], start_vals, [(qmask, QUERY, f"query: {int(qmask.sum()):,} cells")],
           f"{start}: {int(qmask.sum())} query cell(s)", _window(qm, q_centre), wcs=sw, names=sn,
           labels=sl,
           projection=folded(start_vals, start))
    _panel(fig, grid[0, 1], target_vals, layers, f"{res.target}: all {len(res):,} lineage cells",
           wcs=tw, names=tn, projection=folded(target_vals, res.target), labels=tl)
    im = _panel(fig, grid[0, 2], target_vals, layers, f"{res.target}: near the query",
                _window(tm, t_centre) if t_centre is not None else None, wcs=tw, names=tn,
                labels=tl,
                projection=folded(target_vals, res.target))
    fig.colorbar(im, cax=fig.add_subplot(grid[0, 3]), label=f"{res.target} value")
    handles = [Patch(facecolor=(*QUERY, 0.5), edgecolor=QUERY, label=f"query ({start})")] + \
        [Patch(facecolor=(*c, 0.5), edgecolor=c, label=lab) for _, c, lab in layers]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)
    excluded = " (all-to-all steps left out)" if res.excluded_all_to_all else ""
    fig.suptitle(f"run {run.id}: {res.direction} trace {start} -> {res.target}{excluded} "
                 f"({res.seconds * 1000:.1f} ms); outlines: each part's bounding box", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
