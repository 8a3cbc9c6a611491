"""ArrayStore: every input, intermediate and output array of a run, in Zarr.

One Zarr store per array (``<run>/arrays/<name>.zarr``) written through
xarray, so dims, coords and attrs survive and any array of any run opens
with ``xarray.open_zarr``.  Arrays are chunked in tiles (the Spark engine's
partitions).  A run's folder is only renamed into place once every array is
written, which is what makes runs atomic.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from subzero.errors import StoreError
from subzero.tuning import DEFAULT_TILE


def as_dataarray(value, name: str) -> xr.DataArray:
    if isinstance(value, xr.DataArray):
        da = value
    else:
        arr = np.asarray(value)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        da = xr.DataArray(arr, dims=[f"dim_{k}" for k in range(arr.ndim)])
    if da.ndim == 0:
        da = da.expand_dims("dim_0")
    if da.dtype.byteorder not in ("=", "|"):
        da = da.astype(da.dtype.newbyteorder("="))
    return da.rename(name)


def _clean_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        try:
            json.dumps(v)
            out[str(k)] = v
        except TypeError:
            out[str(k)] = str(v)
    return out


class ArrayStore:
    def __init__(self, run_dir: str | Path, tile: int = DEFAULT_TILE):
        self.dir = Path(run_dir) / "arrays"
        self.tile = tile

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.zarr"

    def write(self, name: str, value) -> xr.DataArray:
        """Store an array (never overwrites); returns it as a DataArray."""
        da = as_dataarray(value, name)
        p = self.path(name)
        if p.exists():
            raise StoreError(f"array {name!r} already stored in this run")
        self.dir.mkdir(parents=True, exist_ok=True)
        ds = da.to_dataset(name="data")
        ds["data"].attrs = _clean_attrs(da.attrs)
        ds.attrs = {"subzero_name": name, "subzero_numpy": not isinstance(value, xr.DataArray)}
        chunks = tuple(min(n, self.tile) for n in da.shape) if da.ndim else ()
        enc = {"data": {"chunks": chunks}}
        for c in ds.coords:
            ds[c].attrs = _clean_attrs(ds[c].attrs)
            ds[c].encoding = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.to_zarr(p, mode="w-", encoding=enc, zarr_format=3, consolidated=False)
        return da

    # -- tiles (Spark executors read and write their own regions) -----------------
    def create(self, name: str, shape, dtype, dims=None, attrs=None) -> None:
        """An empty array whose regions tasks fill with :meth:`write_region`."""
        import dask.array as da
        p = self.path(name)
        if p.exists():
            raise StoreError(f"array {name!r} already stored in this run")
        self.dir.mkdir(parents=True, exist_ok=True)
        shape = tuple(int(n) for n in shape)
        chunks = tuple(min(n, self.tile) for n in shape)
        dims = list(dims) if dims else [f"dim_{k}" for k in range(len(shape))]
        lazy = da.zeros(shape, dtype=dtype, chunks=chunks)
        ds = xr.Dataset({"data": (dims, lazy, _clean_attrs(attrs or {}))})
        ds.attrs = {"subzero_name": name, "subzero_numpy": True}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.to_zarr(p, mode="w-", compute=False, encoding={"data": {"chunks": chunks}},
                       zarr_format=3, consolidated=False)

    def _zarr(self, name: str, mode: str):
        import zarr
        p = self.path(name)
        if not p.exists():
            raise StoreError(f"array {name!r} is missing from the run's array store ({p})")
        return zarr.open_array(str(p / "data"), mode=mode, zarr_format=3)

    def write_region(self, name: str, region: tuple[slice, ...], values) -> None:
        self._zarr(name, "r+")[region] = np.asarray(values)

    def read_region(self, name: str, region: tuple[slice, ...]) -> np.ndarray:
        return np.asarray(self._zarr(name, "r")[region])

    def read(self, name: str) -> xr.DataArray:
        p = self.path(name)
        if not p.exists():
            raise StoreError(f"array {name!r} is missing from the run's array store ({p})")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = xr.open_zarr(p, consolidated=False, zarr_format=3)
        da = ds["data"].load().rename(name)
        da.attrs = dict(ds["data"].attrs)
        return da

    def read_value(self, name: str):
        """The array as the operator originally saw it (numpy or DataArray)."""
        p = self.path(name)
        da = self.read(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            attrs = xr.open_zarr(p, consolidated=False, zarr_format=3).attrs
        return da.values if attrs.get("subzero_numpy", True) else da
