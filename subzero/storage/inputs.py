"""Loading workflow inputs from files: .npy, .fits, .zarr, .nc."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import xarray as xr

from subzero.errors import SubZeroError


def load_path(path: str | os.PathLike, input_name: str = "input"):
    """Load an input file as a numpy array or xarray DataArray."""
    p = Path(path)
    if not p.exists():
        raise SubZeroError(f"input {input_name!r}: file not found: {p}")
    name = p.name.lower()
    try:
        if name.endswith(".npy"):
            return _load_npy(p, input_name)
        if name.endswith((".fits", ".fit", ".fits.gz", ".fts")):
            return _load_fits(p)
        if name.endswith(".zarr"):
            return _single_var(xr.open_zarr(p), p, input_name).load()
        if name.endswith((".nc", ".nc4", ".cdf")):
            return _single_var(xr.open_dataset(p), p, input_name).load()
        if name.endswith((".txt", ".tsv", ".csv")):
            return _load_table(p, "," if name.endswith(".csv") else "\t")
    except SubZeroError:
        raise
    except Exception as e:
        raise SubZeroError(f"input {input_name!r}: cannot read {p}: {type(e).__name__}: {e}") from None
    raise SubZeroError(f"input {input_name!r}: unsupported file type {p.suffix!r} "
                       f"(use .npy, .fits, .zarr, .nc, or .txt/.tsv/.csv tables)")


#: how every .npy file begins (numpy.lib.format)
NPY_MAGIC = b"\x93NUMPY"


def _load_npy(p: Path, input_name: str) -> np.ndarray:
    """A .npy file, checked first: numpy would call anything else "pickled data"."""
    with open(p, "rb") as f:
        head = f.read(len(NPY_MAGIC))
    if head != NPY_MAGIC:
        raise SubZeroError(f"input {input_name!r}: {p} is not a NumPy .npy file (it lacks the .npy "
                           f"header); write it with numpy.save, or give a .fits/.zarr/.nc/.csv file")
    try:
        return np.load(p, allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise SubZeroError(f"input {input_name!r}: {p} holds Python objects (an object array), "
                               f"which SubZero does not load; save a numeric array") from None
        raise


def _single_var(ds: xr.Dataset, p: Path, input_name: str) -> xr.DataArray:
    if "data" in ds.data_vars:
        return ds["data"]
    names = [str(n) for n in ds.data_vars]
    if len(names) != 1:
        raise SubZeroError(f"input {input_name!r}: {p} holds {len(names)} variables "
                           f"({', '.join(names)}); give a file with exactly one")
    return ds[names[0]]


def _load_fits(p: Path) -> xr.DataArray:
    from astropy.io import fits
    with fits.open(p, memmap=False) as hdul:
        for hdu in hdul:
            if hdu.data is not None and getattr(hdu.data, "ndim", 0) >= 1:
                data = np.array(hdu.data)
                data = data.astype(data.dtype.newbyteorder("="))
                attrs = {k: (v if isinstance(v, (int, float, str, bool)) else str(v))
                         for k, v in hdu.header.items() if k and k not in ("COMMENT", "HISTORY")}
                dims = ["y", "x"] if data.ndim == 2 else [f"dim_{k}" for k in range(data.ndim)]
                return xr.DataArray(data, dims=dims, attrs=attrs)
    raise SubZeroError(f"FITS file {p} has no image data")


def _load_table(p: Path, sep: str) -> np.ndarray:
    """A delimited text table as a 2-D array of strings (all rows, header included).

    Numeric conversion is left to the workflow, which knows which columns are
    labels; ragged rows are an error naming the line.
    """
    rows = [line.rstrip("\r\n").split(sep) for line in p.read_text().splitlines() if line.strip()]
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        bad = next(i for i, r in enumerate(rows) if len(r) != len(rows[0]))
        raise SubZeroError(f"table {p} is ragged: line {bad + 1} has {len(rows[bad])} fields, "
                           f"line 1 has {len(rows[0])}")
    return np.array(rows, dtype=str)
