"""Loading workflow inputs from files: .npy, .fits, .zarr, .nc (one variable of many
as ``FILE:VARIABLE``), .csv/.tsv/.txt tables."""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from subzero.errors import SubZeroError
from subzero.model import content
from subzero.model.grid import stored_grid
from subzero.model.labelled import is_dataarray

if TYPE_CHECKING:
    import xarray as xr


#: the files whose variables are read region by region, with their labels
_LABELLED = (".zarr", ".nc", ".nc4", ".cdf", ".h5", ".hdf5")

#: ``FILE:VARIABLE`` (or ``FILE:GROUP/VARIABLE``) names one variable of a NetCDF, HDF5
#: or Zarr file holding several
_VARIABLE = re.compile(r"^(.*\.(?:nc|nc4|cdf|h5|hdf5|zarr))/?:([^:]+)$", re.IGNORECASE)


def split_variable(path: str | os.PathLike[str]) -> tuple[Path, str | None, str | None]:
    """(file, group, variable) of an input path: ``cube.nc:temp`` is variable ``temp`` of
    ``cube.nc``; ``obs.zarr:night1/flux`` variable ``flux`` of group ``night1``.  A path
    that exists as given is a file (its name may hold a colon)."""
    p = Path(path)
    m = _VARIABLE.match(str(path))
    if p.exists() or m is None:
        return p, None, None
    group, _, var = m.group(2).strip("/").rpartition("/")
    return Path(m.group(1)), group or None, var


def load_path(path: str | os.PathLike[str], input_name: str = "input") -> np.ndarray | xr.DataArray:
    """Load an input file as a numpy array or xarray DataArray (``FILE:VARIABLE`` picks
    one variable of a NetCDF or Zarr file, see :func:`split_variable`)."""
    p, group, var = split_variable(path)
    if not p.exists():
        raise SubZeroError(f"input {input_name!r}: file not found: {p}")
    name = p.name.lower()
    if var is not None and not name.endswith((".zarr", ".nc", ".nc4", ".cdf", ".h5", ".hdf5")):
        raise SubZeroError(f"input {input_name!r}: {p} has no variables to choose from "
                           f"(`FILE:VARIABLE` is for NetCDF, HDF5 and Zarr files)")
    try:
        if name.endswith(".npy"):
            return _load_npy(p, input_name)
        if name.endswith((".fits", ".fit", ".fits.gz", ".fts")):
            return _load_fits(p, input_name)
        if name.endswith(".zarr"):
            import xarray as xr
            # a store without consolidated metadata is read without it, and not warned
            # about in several lines on stderr
            with _group(p, group, input_name), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                ds = xr.open_zarr(p, group=group, consolidated=None)
            return _single_var(ds, p, input_name, var).load()
        if name.endswith((".nc", ".nc4", ".cdf", ".h5", ".hdf5")):
            import xarray as xr
            with _group(p, group, input_name):
                ds = xr.open_dataset(p, group=group)
            with ds:
                return _single_var(ds, p, input_name, var).load()
        if name.endswith((".txt", ".tsv", ".csv")):
            return _load_table(p, "," if name.endswith(".csv") else "\t")
    except SubZeroError:
        raise
    except Exception as e:
        raise SubZeroError(f"input {input_name!r}: cannot read {p}: {type(e).__name__}: {e}") from e
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
                               f"which SubZero does not load; save a numeric array") from e
        raise


@contextlib.contextmanager
def _group(p: Path, group: str | None, input_name: str) -> Iterator[None]:
    """Opening a group: one that is not there is one line naming it."""
    try:
        yield
    except (OSError, KeyError, ValueError) as e:
        if group is None:
            raise
        raise SubZeroError(f"input {input_name!r}: {p} has no group {group!r} ({e})") from e


def _single_var(ds: xr.Dataset, p: Path, input_name: str, var: str | None = None) -> xr.DataArray:
    names = [str(n) for n in ds.data_vars]
    if var is not None:
        if var not in ds.data_vars:
            raise SubZeroError(f"input {input_name!r}: {p} has no variable {var!r}; its variables: "
                               f"{', '.join(names) or 'none'}")
        return ds[var]
    if "data" in ds.data_vars:
        return ds["data"]
    if len(names) != 1:
        raise SubZeroError(f"input {input_name!r}: {p} holds {len(names)} variables "
                           f"({', '.join(names)}); choose one as {p.name}:VARIABLE "
                           f"(e.g. {p.name}:{names[0] if names else 'temp'})")
    return ds[names[0]]


def _load_fits(p: Path, input_name: str) -> xr.DataArray:
    import xarray as xr
    from astropy.io import fits
    with fits_errors(p, input_name), fits.open(p, memmap=False) as hdul:
        for hdu in hdul:
            if hdu.data is not None and getattr(hdu.data, "ndim", 0) >= 1:
                data = np.array(hdu.data)
                data = data.astype(data.dtype.newbyteorder("="))
                attrs = {k: (v if isinstance(v, (int, float, str, bool)) else str(v))
                         for k, v in hdu.header.items() if k and k not in ("COMMENT", "HISTORY")}
                dims = ["y", "x"] if data.ndim == 2 else [f"dim_{k}" for k in range(data.ndim)]
                return xr.DataArray(data, dims=dims, attrs=attrs)
    raise SubZeroError(f"FITS file {p} has no image data")


@contextlib.contextmanager
def fits_errors(p: str | os.PathLike[str], input_name: str) -> Iterator[None]:
    """Reading a FITS file: astropy's complaints about a damaged file (warnings that its
    logger prints as several lines on stderr) are silenced, and a file it cannot read
    is one line naming the input and the file."""
    from astropy.utils.exceptions import AstropyWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AstropyWarning)
        try:
            yield
        except SubZeroError:
            raise
        except Exception as e:
            why = " ".join(str(e).split()).split(". ")[0].rstrip(".") or type(e).__name__
            raise SubZeroError(f"input {input_name!r}: {p} is not a readable FITS file "
                               f"({why})") from e


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


# -- inputs read region by region ------------------------------------------------------------

class RegionSource:
    """An input that can be read region by region, so no process ever has to hold
    it whole: Spark executors (and the in-process engine, tile by tile) copy it into
    the run's array store a tile at a time.  Plain data: it is pickled into tasks.

    Any object with ``shape``, ``dtype`` and ``read_region(region)`` (a tuple of
    slices -> numpy array) is used the same way -- a workflow's lazily built input,
    for one (see ``workflows/astronomy.py``'s ``TiledInput``); ``dims`` and ``attrs``
    are kept when it has them."""

    def __init__(self, path: str | os.PathLike[str], input_name: str, kind: str,
                 shape: Sequence[int], dtype: DTypeLike, dims: Sequence[str] | None = None,
                 attrs: Mapping[str, Any] | None = None, hdu: int = 0,
                 coords: Mapping[str, np.ndarray] | None = None,
                 coord_attrs: Mapping[str, Mapping[str, Any]] | None = None,
                 group: str | None = None, variable: str | None = None):
        self.path, self.input_name, self.kind = str(Path(path).resolve()), input_name, kind
        self.shape = tuple(int(n) for n in shape)
        dt = np.dtype(dtype)
        self.dtype = dt if dt.isnative else dt.newbyteorder("=")    # as the store keeps it
        self.dims = list(dims) if dims else None
        self.attrs = dict(attrs or {})
        self.hdu = hdu
        #: a NetCDF or Zarr variable ("netcdf", "zarr"): its group and name, its dimension
        #: coordinates (small: read whole) and their attributes; kept a DataArray
        self.group, self.variable = group, variable
        self.coords = {str(k): np.asarray(v) for k, v in (coords or {}).items()}
        self.coord_attrs = {str(k): dict(v) for k, v in (coord_attrs or {}).items()}
        self.labelled = kind in ("netcdf", "zarr")

    def read_region(self, region: tuple[slice, ...]) -> np.ndarray:
        try:
            if self.kind == "npy":
                part = np.load(self.path, mmap_mode="r", allow_pickle=False)[region]
            elif self.labelled:
                with _open_dataset(Path(self.path), self.kind, self.group, self.input_name) as ds:
                    part = np.asarray(ds[self.variable][region].values)
            else:
                from astropy.io import fits
                with fits_errors(self.path, self.input_name), \
                        fits.open(self.path, memmap=False, lazy_load_hdus=True) as hdul:
                    part = np.asarray(hdul[self.hdu].section[region])
            return np.array(part, dtype=self.dtype)
        except Exception as e:
            raise SubZeroError(f"input {self.input_name!r}: cannot read {self.path}: "
                               f"{type(e).__name__}: {e}") from e

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        whole = self.read_region(tuple(slice(0, n) for n in self.shape))
        return whole if dtype is None else whole.astype(dtype)

    def __repr__(self) -> str:
        return f"RegionSource({self.path!r}, {self.shape}, {self.dtype})"


class RegionReadable(Protocol):
    """An input read region by region (:class:`RegionSource`, or a workflow's own
    lazily built input): what the engines copy into a run a tile at a time."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def read_region(self, region: tuple[slice, ...]) -> np.ndarray:
        """The input's cells in ``region`` (one slice per axis)."""
        ...


def is_region_source(value: object) -> TypeGuard[RegionReadable]:
    """Whether an input can be copied into a run region by region (see RegionSource):
    it has what :class:`RegionReadable` names (checked by name, as duck typing does)."""
    return all(hasattr(value, a) for a in ("shape", "dtype", "read_region"))


def _open_dataset(p: Path, kind: str, group: str | None, input_name: str) -> xr.Dataset:
    """A NetCDF/HDF5 file or a Zarr store, opened lazily (nothing read but metadata)."""
    import xarray as xr
    with _group(p, group, input_name), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if kind == "zarr":
            return xr.open_zarr(p, group=group, consolidated=None)
        return xr.open_dataset(p, group=group)


def _labelled_source(path: str | os.PathLike[str], input_name: str) -> RegionSource | None:
    """One variable of a NetCDF or Zarr file as a source read region by region, with its
    dimension coordinates (read whole: one label per cell along an axis) and attributes;
    None when it cannot be read so (other coordinates than its dims' labels, a non-numeric
    variable, no variables to choose from): then it is loaded whole, as before."""
    p, group, var = split_variable(path)
    kind = "zarr" if p.name.lower().endswith(".zarr") else "netcdf"
    try:
        with _open_dataset(p, kind, group, input_name) as ds:
            da = _single_var(ds, p, input_name, var)
            if da.ndim < 1 or da.dtype.kind not in "biuf" or set(da.coords) - set(da.dims):
                return None
            coords = {str(d): np.asarray(da[d].values) for d in da.dims if d in da.coords}
            coord_attrs = {str(d): dict(da[d].attrs) for d in coords}
            return RegionSource(p, input_name, kind, da.shape, da.dtype, [str(d) for d in da.dims],
                                dict(da.attrs), coords=coords, coord_attrs=coord_attrs,
                                group=group, variable=str(da.name))
    except SubZeroError:
        raise
    except Exception:
        return None             # load_path says what is wrong, in the user's terms


def open_input(path: str | os.PathLike[str], input_name: str = "input",
               ) -> np.ndarray | xr.DataArray | RegionSource:
    """An input file, opened to be read region by region when its format allows it
    (.npy, an uncompressed FITS image, a variable of a NetCDF/HDF5 file or a Zarr store,
    with its labels), else loaded whole (:func:`load_path`)."""
    p = Path(path)
    name = p.name.lower()
    file, _, _ = split_variable(path)
    if file.exists() and file.name.lower().endswith(_LABELLED):
        return _labelled_source(path, input_name) or load_path(path, input_name)
    if not p.exists() or not name.endswith((".npy", ".fits", ".fit", ".fts")):
        return load_path(path, input_name)
    try:
        if name.endswith(".npy"):
            _load_npy_header(p, input_name)
            m = np.load(p, mmap_mode="r", allow_pickle=False)
            if m.dtype.kind not in "biuf":
                return load_path(p, input_name)
            return RegionSource(p, input_name, "npy", m.shape, m.dtype)
        return _fits_source(p, input_name) or load_path(p, input_name)
    except SubZeroError:
        raise
    except Exception:
        return load_path(p, input_name)     # its own error message, in the user's terms


def _load_npy_header(p: Path, input_name: str) -> None:
    with open(p, "rb") as f:
        head = f.read(len(NPY_MAGIC))
    if head != NPY_MAGIC:
        _load_npy(p, input_name)            # raises the one-line error


def _fits_source(p: Path, input_name: str) -> RegionSource | None:
    from astropy.io import fits
    with fits_errors(p, input_name), fits.open(p, memmap=False, lazy_load_hdus=True) as hdul:
        for k, hdu in enumerate(hdul):
            ndim = int(hdu.header.get("NAXIS", 0))
            if ndim < 1 or not hdu.is_image or isinstance(hdu, fits.CompImageHDU):
                if hdu.header.get("NAXIS", 0) and not hdu.is_image:
                    return None
                continue
            shape = tuple(int(hdu.header[f"NAXIS{ndim - j}"]) for j in range(ndim))
            probe = np.asarray(hdu.section[tuple(slice(0, 1) for _ in shape)])
            attrs = {k2: (v if isinstance(v, (int, float, str, bool)) else str(v))
                     for k2, v in hdu.header.items() if k2 and k2 not in ("COMMENT", "HISTORY")}
            dims = ["y", "x"] if ndim == 2 else [f"dim_{j}" for j in range(ndim)]
            return RegionSource(p, input_name, "fits", shape, probe.dtype.newbyteorder("="),
                                dims, attrs, k)
    return None


class _Memo:
    """A small least-recently-used map of read-only arrays (see :func:`memo`)."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self.items: OrderedDict[Hashable, np.ndarray] = OrderedDict()

    def get(self, key: Hashable, make: Callable[[], ArrayLike]) -> np.ndarray:
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = np.array(make())
        value.flags.writeable = False
        self.items[key] = value
        while len(self.items) > self.keep:
            self.items.popitem(last=False)
        return value


_MEMO = _Memo()


def memo(key: Hashable, make: Callable[[], ArrayLike]) -> np.ndarray:
    """``make()``'s array, made once per process and kept read-only (the last 8 kept).

    For input objects that build each region from a small source (a file, a frame
    computed from parameters): on Spark every copy task of a run's inputs calls
    ``read_region`` in a Python worker that runs many such tasks, and reading the
    source once per worker instead of once per region is most of the copy's time.
    The cache lives in this importable module, so it is never pickled with the
    input object (a workflow module loaded from a file is shipped by value)."""
    return _MEMO.get(key, make)


def input_digest(value: Any, input_name: str = "input") -> str:
    """The content digest of an input as a run would read it: a file (opened as
    :func:`open_input` does, read region by region when it can be), an array, or a
    DataArray (its labels count)."""
    if isinstance(value, (str, os.PathLike)):
        value = open_input(value, input_name)
    grid = None
    if is_dataarray(value):
        grid = stored_grid(tuple(str(d) for d in value.dims),
                           {str(k): np.asarray(v.values) for k, v in value.coords.items()
                            if k in value.dims}, dict(value.attrs))
        value = np.asarray(value.values)
    elif isinstance(value, RegionSource):        # its labels count, as a DataArray's do
        grid = stored_grid(tuple(value.dims or ()), value.coords, value.attrs) \
            if value.dims else None
    elif not is_region_source(value):
        value = np.asarray(value)
    try:
        return content.digest(value, grid)
    except content.ContentError as e:
        raise SubZeroError(f"input {input_name!r}: {e}") from e
