"""A trace's answer as a labelled mask on disk: a Zarr store, a NetCDF file.

The mask itself is the query result's (:meth:`TraceResult.to_xarray
<subzero.query.trace.TraceResult.to_xarray>`, built in :mod:`subzero.query.mask`):
the target array's shape, dims, coordinates and attrs (except those describing its
values), and ``subzero_*`` attrs saying which query it answers.  This module
writes it so that xarray and dask open it lazily, and other readers too.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from subzero.errors import ExportError
from subzero.export.output import write_atomic
from subzero.tuning import DEFAULT_TILE

if TYPE_CHECKING:
    from subzero.query.trace import TraceResult

#: mask suffixes and the writer each selects
MASK_SUFFIXES = (".zarr", ".nc")


def _portable(attrs: dict[str, Any]) -> dict[str, Any]:
    """Attrs every netCDF flavour can store: strings, numbers, numeric vectors; the rest
    (booleans, None, mappings, mixed lists) as numbers or JSON text."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if isinstance(v, enum.Enum):
            v = v.value
        if isinstance(v, (bool, np.bool_)):
            out[k] = int(v)
        elif isinstance(v, (str, int, float, np.integer, np.floating)):
            out[k] = v
        elif isinstance(v, (list, tuple, np.ndarray)) and len(v) and all(
                isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
                for x in v):
            out[k] = np.asarray(v)
        elif v is not None:
            out[k] = json.dumps(v, default=str)
    return out


def netcdf_engine() -> Literal["h5netcdf", "scipy"]:
    """h5netcdf (NetCDF4: int64 coordinates, compressed chunks) when installed, else
    scipy's NetCDF3 writer."""
    have = all(importlib.util.find_spec(m) is not None for m in ("h5netcdf", "h5py"))
    return "h5netcdf" if have else "scipy"


def write_mask(result: TraceResult, path: str | os.PathLike, force: bool = False) -> Path:
    """Write the answer's labelled mask (:meth:`TraceResult.to_xarray`) to ``path``:
    ``.zarr`` (Zarr v3, chunked in tiles so dask reads it lazily:
    ``xr.open_zarr(path)``) or ``.nc`` (NetCDF4 through h5netcdf, compressed in
    the same tiles; NetCDF3 through scipy when h5netcdf is missing:
    ``xr.open_dataset(path, chunks={})``).  xarray reads the mask as booleans; in a
    NetCDF file it is 0/1 bytes with CF flag attributes, for other readers.
    An existing ``path`` is refused unless ``force``."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in MASK_SUFFIXES:
        raise ExportError(f"cannot write a mask to {p}: give a path ending in .zarr or .nc")
    da = result.to_xarray()
    da.attrs = _portable(da.attrs)
    for c in da.coords:
        da[c].attrs = _portable(da[c].attrs)
    var = str(da.name)
    title = {"title": da.attrs["long_name"], "source": "SubZero lineage trace"}
    chunks = tuple(min(int(n), DEFAULT_TILE) for n in da.shape)

    def zarr(tmp: Path) -> None:
        ds = da.to_dataset()
        ds.attrs = title
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # zarr: consolidated metadata is not in the v3 spec
            ds.to_zarr(tmp, mode="w-", zarr_format=3, consolidated=True,
                       encoding={var: {"chunks": chunks}})

    def netcdf(tmp: Path) -> None:
        # bytes in the file; the "dtype" attr is xarray's own convention to read them as bool
        flags = da.astype(np.int8)
        flags.attrs = {**da.attrs, "dtype": "bool", "flag_values": np.array([0, 1], np.int8),
                       "flag_meanings": "outside_lineage in_lineage"}
        ds = flags.to_dataset()
        ds.attrs = title
        engine = netcdf_engine()
        enc = {var: {"chunksizes": chunks, "zlib": True}} if engine == "h5netcdf" else None
        try:
            ds.to_netcdf(tmp, engine=engine, encoding=enc)
        except (ValueError, TypeError) as e:
            why = str(e).split(". ")[0]
            raise ExportError(f"cannot write {p} as NetCDF ({engine}): {why}; write .zarr "
                              f"instead" + (", or install h5netcdf" if engine == "scipy" else "")) from e

    return write_atomic(p, zarr if suffix == ".zarr" else netcdf, force)
