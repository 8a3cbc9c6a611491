"""A trace's answer as a labelled boolean mask: an xarray DataArray over the target.

The mask has the target array's shape, dims and coordinates, so a lab's own
tools line it up with the data by label (``data.where(mask)``, a sky region
by world coordinates, a genomics slice by sample name).  The target's attrs
come along (a FITS header with its WCS keywords still describes where the
cells are) except those that describe the target's *values* (units, scaling,
fill values), which would misdescribe a boolean mask.

:meth:`subzero.query.trace.TraceResult.to_xarray` builds it here; the export
layer (:mod:`subzero.export.mask`) writes it to Zarr and NetCDF.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from subzero.errors import StoreError
from subzero.model.cellset import CellSet

if TYPE_CHECKING:
    import xarray as xr

#: attrs of the target that describe its values, not its cells: not copied to the mask
VALUE_ATTRS = frozenset({
    "units", "standard_name", "long_name", "scale_factor", "add_offset", "_FillValue",
    "missing_value", "valid_min", "valid_max", "valid_range", "flag_values", "flag_masks",
    "flag_meanings", "dtype", "BUNIT", "BSCALE", "BZERO", "BLANK", "DATAMIN", "DATAMAX"})


def labelled_mask(cells: CellSet, like: xr.DataArray | None, name: str, target: str,
                  attrs: Mapping[str, Any]) -> xr.DataArray:
    """``cells`` as a boolean mask named ``name``, labelled as ``like`` (the target
    array ``target`` opened lazily: its dims, coords and attrs; None: plain
    ``dim_<k>`` dims), with ``attrs`` (what the mask answers) over the target's own.
    Costs the target's size in memory; the target's data is not read."""
    import xarray as xr
    mask = cells.bitmap()
    dims: tuple[Hashable, ...]
    if like is None:
        dims, coords, own = tuple(f"dim_{k}" for k in range(mask.ndim)), None, {}
    else:
        if tuple(like.shape) != tuple(mask.shape):
            raise StoreError(f"array {target!r} has shape {tuple(like.shape)} but the "
                             f"trace's answer has shape {tuple(mask.shape)}")
        dims, coords = like.dims, like.coords
        own = {k: v for k, v in like.attrs.items() if k not in VALUE_ATTRS}
    da = xr.DataArray(mask, dims=dims, coords=coords, name=name, attrs={**own, **attrs})
    for c in da.coords:
        da[c].encoding = {}
    return da
