"""ArrayStore: every input, intermediate and output array of a run, in Zarr.

One Zarr store per array (``<run>/arrays/<name>.zarr``) written through
xarray, so dims, coords and attrs survive and any array of any run opens
with ``xarray.open_zarr``.  Arrays are chunked in tiles (the Spark engine's
partitions).  A run's folder is only renamed into place once every array is
written, which is what makes runs atomic.  Every chunk carries a checksum and
every read verifies what it touches (``chunks.py``).  In a run with a uid every
array is bound to its place: its sidecar names the run and the array and, once
:meth:`ArrayStore.bind` ran, holds the manifest of its chunks, so a chunk or a
whole array taken from elsewhere is refused like damage.  An input stored once
for the whole store (:mod:`.shared`) is read through the run's reference to it,
checked like the run's own arrays.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from subzero.errors import CorruptArray, StoreError, UnsafeFile
from subzero.model import content
from subzero.model.grid import stored_grid
from subzero.model.labelled import is_dataarray
from subzero.storage import chunkread, chunkwrite, shared
from subzero.storage.chunkread import plain_layout
from subzero.storage.chunks import (
    SUMS,
    ArrayNode,
    bad_chunk,
    bind,
    check_present,
    checksum_codecs,
    chunk_sha,
    drop,
    metadata_files,
    open_nodes,
    read_metadata,
    remove_chunks,
    seal,
    share_chunks,
    sums_file,
)
from subzero.storage.slabs import SlabWriter, slabs
from subzero.tuning import DEFAULT_TILE, FILL_SLAB_BYTES

if TYPE_CHECKING:
    import xarray as xr


def as_dataarray(value: ArrayLike | xr.DataArray, name: str) -> xr.DataArray:
    import xarray as xr
    if is_dataarray(value):
        da = value
    else:
        arr = np.asarray(value)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        dims = [f"dim_{k}" for k in range(arr.ndim)]
        if type(arr) is np.ndarray and arr.dtype.kind not in "OMm":
            # already what xarray would make of it (a plain array, nothing to convert), so
            # it skips xarray's checks, one of which imports dask.array to ask whether the
            # value is a dask array: 0.6 s of CPU in every process that stores a numpy array
            da = xr.DataArray(xr.Variable(dims, arr, fastpath=True))
        else:
            da = xr.DataArray(arr, dims=dims)
    if da.ndim == 0:
        da = da.expand_dims("dim_0")
    if da.dtype.byteorder not in ("=", "|"):
        da = da.astype(da.dtype.newbyteorder("="))
    return da.rename(name)


def as_values(value: ArrayLike | xr.DataArray, name: str) -> np.ndarray:
    """The values :func:`as_dataarray` would store for ``value`` (a 0-d value as one
    cell, native byte order), without xarray for a plain numeric numpy array: a re-run's
    output is compared with the stored one this way, and xarray's import is 1 s of a
    fresh process's first re-execution."""
    if not is_dataarray(value):
        arr = np.asarray(value)
        if type(arr) is np.ndarray and arr.dtype.kind not in "OMm":
            if arr.ndim == 0:
                arr = arr.reshape(1)
            if arr.dtype.byteorder not in ("=", "|"):
                arr = arr.astype(arr.dtype.newbyteorder("="))
            return arr
    return np.asarray(as_dataarray(value, name).values)


#: the ``_FillValue`` attribute xarray gives a float array it writes (NaN, as the
#: little-endian bytes of a float64, in base64, whatever the float's size)
_NAN_FILL = "AAAAAAAA+H8="


def _create_plain(p: Path, name: str, shape: tuple[int, ...], dtype: np.dtype,
                  chunks: tuple[int, ...], dims: Sequence[Hashable], labelled: bool) -> None:
    """:meth:`ArrayStore.create`'s metadata for a numeric or fixed-length string array with no
    attributes or labels (every output an operator returns as numpy), written by zarr itself: the very
    files xarray writes for it (a test compares them), without xarray's lazy template,
    whose dask import alone costs 0.6 s of CPU in every process that runs an operator."""
    import zarr
    group = zarr.open_group(str(p), mode="w-", zarr_format=3,
                            attributes={"subzero_name": name, "subzero_numpy": not labelled})
    with warnings.catch_warnings():   # zarr's warning that strings have no v3 spec yet, as xarray's
        warnings.simplefilter("ignore")
        group.create_array("data", shape=shape, chunks=chunks, dtype=dtype,
                           fill_value=np.nan if dtype.kind == "f" else "" if dtype.kind == "U" else 0,
                           compressors=checksum_codecs(), dimension_names=[str(d) for d in dims],
                           attributes={"_FillValue": _NAN_FILL} if dtype.kind == "f" else {})


def _create_xarray(p: Path, name: str, shape: tuple[int, ...], dtype: DTypeLike,
                   chunks: tuple[int, ...], dims: list[Hashable],
                   attrs: Mapping[Any, Any] | None, coords: Mapping[str, Any] | None,
                   coord_attrs: Mapping[str, Mapping[str, Any]] | None,
                   labelled: bool) -> None:
    """:meth:`ArrayStore.create`'s metadata written by xarray (attributes, labels, any dtype):
    a lazy dask array of the shape, its metadata only (``compute=False``)."""
    import dask.array as da
    import xarray as xr
    lazy = da.zeros(shape, dtype=dtype, chunks=chunks)
    ds = xr.Dataset({"data": (dims, lazy, _clean_attrs(attrs or {}))})
    enc = {"data": {"chunks": chunks, "compressors": checksum_codecs()}}
    for c, v in (coords or {}).items():
        ds = ds.assign_coords({c: (c, np.asarray(v), _clean_attrs(dict((coord_attrs or {})
                                                                      .get(c, {}))))})
        enc[str(c)] = {"compressors": checksum_codecs()}
    ds.attrs = {"subzero_name": name, "subzero_numpy": not labelled}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(p, mode="w-", compute=False, encoding=enc, zarr_format=3,
                   consolidated=False, write_empty_chunks=True)


def form_digest(dims: Sequence[Hashable], attrs: Mapping[str, Any],
                coords: Mapping[str, Mapping[str, Any]], numpy: bool, chunks: Sequence[int]) -> str:
    """The digest of an array's stored form (:meth:`ArrayStore.form`), 16 hex digits."""
    body = json.dumps({"dims": [str(d) for d in dims], "attrs": attrs, "coords": coords,
                       "numpy": bool(numpy), "chunks": [int(c) for c in chunks]},
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def value_form(value: Any, name: str, tile: int) -> str:
    """The form (:func:`form_digest`) an input would have once stored by a run with tile
    ``tile``: an array or DataArray as :meth:`ArrayStore.write` stores it, an input
    read region by region as :meth:`ArrayStore.create` does.  Equal to the stored
    array's :meth:`ArrayStore.form` for what SubZero writes; where it is not, the run
    only misses sharing before it stores the input (its commit still shares it)."""
    if hasattr(value, "read_region") and not (isinstance(value, np.ndarray) or is_dataarray(value)):
        shape = tuple(int(n) for n in value.shape)
        dims = list(getattr(value, "dims", None) or [f"dim_{k}" for k in range(len(shape))])
        attrs = json.loads(json.dumps(_clean_attrs(getattr(value, "attrs", None) or {})))
        coords = {str(c): json.loads(json.dumps(_clean_attrs(a)))
                  for c, a in (getattr(value, "coord_attrs", None) or {}).items()}
        return form_digest(dims, attrs, coords, not getattr(value, "labelled", False),
                           [min(n, tile) for n in shape])
    if not is_dataarray(value):
        # what as_dataarray makes of it (dims dim_0..., no attributes, no coordinates),
        # without xarray: its import was 0.8 s of every run of numpy inputs into a store
        # that keeps inputs of some form (a profiling run of genomics 1x took 2x a plain one)
        shape = tuple(int(n) for n in np.shape(value)) or (1,)
        return form_digest([f"dim_{k}" for k in range(len(shape))], {}, {}, True,
                           [min(n, tile) for n in shape])
    da = as_dataarray(value, name)
    attrs = json.loads(json.dumps(_clean_attrs(da.attrs)))
    coords = {str(c): json.loads(json.dumps(_clean_attrs(da[c].attrs))) for c in da.coords}
    return form_digest(list(da.dims), attrs, coords, not is_dataarray(value),
                       [min(n, tile) for n in da.shape])


#: attributes xarray writes to encode an array, which a read takes back out of ``attrs``
_ENCODING_ATTRS = ("_FillValue", "coordinates", "_ARRAY_DIMENSIONS")


def _zarr_dtype(data_type: Any) -> np.dtype:
    """The numpy dtype of a zarr v3 ``data_type``: a name (``"float32"``), or a named
    type with a configuration (fixed-length strings: ``fixed_length_utf32`` of
    ``length_bytes``, ``fixed_length_ascii`` / ``null_terminated_bytes`` of ``length_bytes``)."""
    if isinstance(data_type, str):
        return np.dtype(data_type)
    if isinstance(data_type, dict):
        name, n = data_type.get("name"), (data_type.get("configuration") or {}).get("length_bytes")
        if isinstance(n, int):
            if name == "fixed_length_utf32":
                return np.dtype(f"<U{n // 4}")
            if name in ("fixed_length_ascii", "null_terminated_bytes"):
                return np.dtype(f"S{n}")
    raise ValueError(f"unknown data type {data_type!r}")


def _fixed_strings(meta: Mapping[str, Any]) -> bool:
    """Whether an array node's metadata is a fixed-length string array with no attributes
    (as SubZero and xarray write a numpy array of strings), which zarr reads as the values
    xarray would return."""
    data_type = meta.get("data_type")
    return (isinstance(data_type, dict) and data_type.get("name") == "fixed_length_utf32"
            and not meta.get("attributes"))


def _read_as_stored(attrs: Any, dtype: np.dtype) -> bool:
    """Whether xarray reads an array node with these attributes as the stored values:
    none, or only a NaN ``_FillValue`` of a float array (NaN cells stay NaN; xarray
    writes it as a float64's bytes whatever the float), as SubZero and xarray write
    numeric arrays.  Any other (a numeric fill value, a scale,
    units of time) is decoded by xarray into other values."""
    if not attrs:
        return attrs is None or attrs == {}
    if not isinstance(attrs, dict) or set(attrs) != {"_FillValue"} or dtype.kind != "f":
        return False
    fill = attrs["_FillValue"]
    if isinstance(fill, str):
        if fill == "NaN":
            return True
        try:
            raw = base64.b64decode(fill, validate=True)
        except (ValueError, TypeError):
            return False
        width = {2: "<f2", 4: "<f4", 8: "<f8"}.get(len(raw))     # xarray writes a float64's
        return width is not None and bool(np.isnan(np.frombuffer(raw, width)[0]))
    return isinstance(fill, float) and fill != fill


def _decoded(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    """An array node's stored attributes as a read gives them back."""
    return {k: v for k, v in (attrs or {}).items() if k not in _ENCODING_ATTRS}


def _clean_attrs(attrs: Mapping[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        try:
            json.dumps(v)
            out[str(k)] = v
        except TypeError:
            out[str(k)] = str(v)
    return out


def _whole_chunks(node: ArrayNode | None, region: tuple[slice, ...], values: np.ndarray,
                  ) -> list[tuple[int, int]] | None:
    """The (start, stop) per axis of ``region`` when it is whole chunks of the array
    node's grid (the last ones may stop at the array's edge) and ``values`` fill it,
    else None.  An empty array has no chunks: None."""
    if node is None or not node.checksummed or len(region) != len(node.shape) or \
            not all(node.chunks):
        return None
    box = []
    for r, c, n in zip(region, node.chunks, node.shape):
        if not isinstance(r, slice) or r.step not in (None, 1):
            return None
        a, b = (r.start or 0), (n if r.stop is None else r.stop)
        if not 0 <= a < b <= n or a % c or (b % c and b != n):
            return None
        box.append((a, b))
    if values.shape != tuple(b - a for a, b in box):
        return None
    return box


class ArrayStore:
    """The arrays of one run, each a checksummed Zarr group (see :mod:`.chunks`).

    Reads verify what they read: the metadata digests on open, the presence of
    every chunk file the read touches, each chunk's crc32c as zarr decodes it.
    Damage is a :class:`CorruptArray` naming the array, the run and the file.

    ``run_uid`` is the run's uid (its catalog row's; None for a run made before
    runs had uids).  With one, every array written is bound to the run and its
    name, :meth:`bind` adds its chunk manifest once its chunks are final, and a
    read refuses an array whose sidecar names another run or array, and a chunk
    that is not the one its manifest records (swapped, copied, a link, a FIFO).
    """

    def __init__(self, run_dir: str | Path, tile: int = DEFAULT_TILE, run_uid: str | None = None,
                 inputs: Mapping[str, str | None] | None = None,
                 recompute: Callable[[str], np.ndarray] | None = None,
                 recompute_chunk: Callable[[str, tuple[int, ...], tuple[int, ...],
                                            tuple[int, ...]], np.ndarray | None] | None = None):
        self.dir = Path(run_dir) / "arrays"
        #: how the values of an array the run did not keep are made again (its operator
        #: on its inputs: :meth:`subzero.run.Run.recompute`); None: they cannot be here
        self.recompute = recompute
        #: the same for one chunk (name, shape, chunk shape, chunk index), None when the
        #: operator cannot run on part of the array (:mod:`subzero.engines.remake`)
        self.recompute_chunk = recompute_chunk
        self._remade: dict[str, np.ndarray] = {}
        self._remade_chunks: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}
        self.tile = tile
        #: the uid of the run these arrays belong to (None: an unbound run)
        self.run_uid = run_uid
        #: the content digests of the run's inputs, from its verified record: a reference
        #: to a shared copy of another content is then refused (None: not checked)
        self.inputs = dict(inputs) if inputs is not None else None
        self._store_uid: str | None = None
        #: array made here (:meth:`create`) -> the SHA-256 (``chunk_sha``) of each chunk
        #: written since, by its position in C order, taken from the values written, for
        #: :meth:`drop`: it need not read them back when it has them all.  None: a chunk
        #: came another way (linked, cast by zarr, a region not on the chunk grid)
        self._written: dict[str, dict[int, bytes] | None] = {}

    @property
    def root(self) -> Path:
        """The store's folder (``<root>/runs/<run>/arrays``)."""
        return self.dir.parent.parent.parent

    def ref(self, name: str) -> shared.Ref | None:
        """The run's reference to the store's copy of input ``name`` (None: the run keeps
        its own copy), checked to be this run's, of this input, of this store, and of
        the content the run's record names."""
        if self.run_uid is None:
            return None
        f = shared.ref_path(self.dir, name)
        ref = shared.read_ref(f, self.label(name))
        if ref is None:
            return None
        if ref.run != self.run_uid or ref.array != name:
            raise CorruptArray(f"{self.label(name)}: its reference {f} is not this run's (it names "
                               f"run uid {ref.run} and input {ref.array!r}): copied from another run")
        if ref.store != self.store_uid():
            raise CorruptArray(f"{self.label(name)}: its reference {f} names another store "
                               f"(uid {ref.store}, not {self.store_uid()})")
        want = (self.inputs or {}).get(name)
        if want is not None and want != ref.digest:
            raise CorruptArray(f"{self.label(name)}: its reference {f} names content {ref.digest}, "
                               f"not the {want} its run's record names")
        return ref

    def store_uid(self) -> str | None:
        if self._store_uid is None:
            from subzero.storage.place import read_store_uid
            self._store_uid = read_store_uid(self.root)
        return self._store_uid

    def is_shared(self, name: str) -> bool:
        """Whether the run reads input ``name`` from the store's copy."""
        return self.ref(name) is not None

    def path(self, name: str) -> Path:
        ref = self.ref(name)
        if ref is not None:
            return shared.SharedInputs(self.root).path(ref.digest, ref.form)
        return self._own(name)

    def _own(self, name: str) -> Path:
        return self.dir / f"{name}.zarr"

    def _identity(self, name: str) -> tuple[Path, str | None, str | None, str, str]:
        """Where array ``name`` is read and what its sidecar must name: (folder, uid,
        array, owner, label)."""
        ref = self.ref(name)
        if ref is None:
            return self._own(name), self.run_uid, name, "run", self.label(name)
        return (shared.SharedInputs(self.root).path(ref.digest, ref.form), ref.store,
                shared.owner_name(ref.digest, ref.form), "store", self.label(name))

    def label(self, name: str) -> str:
        """How errors name an array: ``array 'x' of run 3``."""
        run = self.dir.parent.name
        run = run[:-len(".partial")] if run.endswith(".partial") else run
        return f"array {name!r} of run {run}"

    def checksummed(self, name: str) -> bool:
        """Whether the array records checksums (False for one written before they existed,
        whose deleted chunks cannot be told from fill values)."""
        return sums_file(self.path(name)).exists()

    def write(self, name: str, value: ArrayLike | xr.DataArray, attempt: int | None = None,
              ) -> xr.DataArray:
        """Store an array (never overwrites); returns it as a DataArray.

        With ``attempt`` (a Spark task attempt's id) the array goes to a folder of that
        attempt's own, which :meth:`commit_attempt` moves into place for the attempt
        that succeeded: a retried task never meets its failed attempt's files."""
        da = as_dataarray(value, name)
        p = self._own(name) if attempt is None else self._attempt_path(name, attempt)
        if p.exists():
            if attempt is None:
                raise StoreError(f"array {name!r} already stored in this run")
            shutil.rmtree(p)
            sums_file(p).unlink(missing_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        ds = da.to_dataset(name="data")
        ds["data"].attrs = _clean_attrs(da.attrs)
        ds.attrs = {"subzero_name": name, "subzero_numpy": not is_dataarray(value)}
        chunks = tuple(min(n, self.tile) for n in da.shape) if da.ndim else ()
        enc = {"data": {"chunks": chunks, "compressors": checksum_codecs()}}
        for c in ds.coords:
            ds[c].attrs = _clean_attrs(ds[c].attrs)
            ds[c].encoding = {}
            enc[str(c)] = {"compressors": checksum_codecs()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.to_zarr(p, mode="w-", encoding=enc, zarr_format=3, consolidated=False,
                       write_empty_chunks=True)
        seal(p, name, self.run_uid)
        return da

    def _attempt_path(self, name: str, attempt: int) -> Path:
        return self.dir / f".{name}.attempt-{int(attempt)}.zarr"

    def commit_attempt(self, name: str, attempt: int) -> None:
        """The array written by task attempt ``attempt`` becomes the array ``name``;
        other attempts' folders of it are removed."""
        src = self._attempt_path(name, attempt)
        os.replace(sums_file(src), sums_file(self._own(name)))
        os.replace(src, self._own(name))
        for stale in self.dir.glob(f".{name}.attempt-*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)

    def describe(self, name: str) -> tuple[tuple[int, ...], np.dtype, bool]:
        """A stored array's shape, dtype, and whether operators saw it as numpy (not a
        DataArray), from its metadata (nothing is read)."""
        p, _ = self._open(name)
        try:
            meta = json.loads(read_metadata(p / "zarr.json"))
            arr = json.loads(read_metadata(p / "data" / "zarr.json"))
            shape = tuple(int(n) for n in arr["shape"])
            dtype = _zarr_dtype(arr["data_type"])
        except (OSError, ValueError, KeyError, TypeError, UnsafeFile) as e:
            raise CorruptArray(f"{self.label(name)} is damaged: cannot read its metadata in "
                               f"{p}: {e}") from e
        ref = self.ref(name)
        if ref is not None:
            return shape, dtype, ref.numpy
        return shape, dtype, bool(meta.get("attributes", {}).get("subzero_numpy", True))

    def remove(self, name: str) -> None:
        """Remove an array and any task attempt's folder of it (a resumed run redoes the
        operator that wrote it); of an input stored once, the run's reference only."""
        self._written.pop(name, None)
        shared.ref_path(self.dir, name).unlink(missing_ok=True)
        for p in [self._own(name), *self.dir.glob(f".{name}.attempt-*")]:
            if p.is_dir():
                shutil.rmtree(p)
            sums_file(p).unlink(missing_ok=True)
            if p.is_file():
                p.unlink()

    # -- tiles (Spark executors read and write their own regions) -----------------
    def create(self, name: str, shape: Sequence[int], dtype: DTypeLike,
               dims: Sequence[Hashable] | None = None, attrs: Mapping[Any, Any] | None = None,
               coords: Mapping[str, Any] | None = None,
               coord_attrs: Mapping[str, Mapping[str, Any]] | None = None,
               labelled: bool = False) -> None:
        """An empty array whose regions tasks fill with :meth:`write_region`.

        Its metadata is final here (region writes add chunk files only), so it is
        sealed now; every region must then be written for the array to read.
        ``coords`` (1-D labels of some dims, small) are written whole now; ``labelled``
        keeps it a DataArray for the operators that read it (a NetCDF or Zarr input)."""
        p = self._own(name)
        if p.exists():
            raise StoreError(f"array {name!r} already stored in this run")
        self.dir.mkdir(parents=True, exist_ok=True)
        shape = tuple(int(n) for n in shape)
        chunks = tuple(min(n, self.tile) for n in shape)
        dims = list(dims) if dims else [f"dim_{k}" for k in range(len(shape))]
        if not attrs and not coords and np.dtype(dtype).kind in "biufU":
            _create_plain(p, name, shape, np.dtype(dtype), chunks, dims, labelled)
        else:
            _create_xarray(p, name, shape, dtype, chunks, dims, attrs, coords, coord_attrs,
                           labelled)
        seal(p, name, self.run_uid)
        self._written[name] = {}

    def bind(self, name: str) -> None:
        """Bind a stored array's chunks to their place, once they are final: record each
        chunk file's crc32c trailer in the array's sidecar (:func:`.chunks.bind`).  The
        driver loop calls it after each operator's step and after the inputs are stored;
        a no-op in an unbound run."""
        if self.run_uid is not None and not self.is_shared(name):
            bind(self._own(name), name, self.run_uid, self.label(name))

    def sidecar_digests(self, unreadable: dict[str, str] | None = None) -> dict[str, str]:
        """Per stored array, the SHA-256 (hex) of its sidecar file: what a run's signed
        record lists, so that the signature covers every array's metadata digests and
        chunk manifest (call it once every array is bound, as the run commits).  Task
        attempts' folders that were never committed are not arrays of the run.  A sidecar
        is read as every metadata file is (a regular file, bounded: never through a link,
        never waiting on a FIFO); one that cannot be read raises, or with ``unreadable``
        is left out and named there (array name -> why)."""
        out = {}
        if self.dir.is_dir():
            for f in sorted(self.dir.iterdir()):
                if f.name.endswith(SUMS) and not f.name.startswith("."):
                    try:
                        data = read_metadata(f)
                    except (UnsafeFile, OSError) as e:
                        if unreadable is None:
                            raise
                        unreadable[f.name[:-len(SUMS)]] = str(e) if isinstance(e, UnsafeFile) \
                            else f"{f}: {e.strerror or e}"
                        continue
                    out[f.name[:-len(SUMS)]] = hashlib.sha256(data).hexdigest()
            for f in sorted(self.dir.iterdir()):
                if f.name.endswith(shared.REF) and not f.name.startswith("."):
                    name = f.name[:-len(shared.REF)]
                    try:
                        out[name] = hashlib.sha256(read_metadata(
                            sums_file(self._identity(name)[0]))).hexdigest()
                    except (UnsafeFile, OSError, CorruptArray) as e:
                        if unreadable is None:
                            raise
                        out.pop(name, None)
                        unreadable[name] = str(e) if not isinstance(e, OSError) \
                            else f"{f}: {e.strerror or e}"
        return out

    # -- inputs stored once for the store (see :mod:`.shared`) --------------------------
    def form(self, name: str) -> str:
        """The digest of a stored array's form: what a read gives back besides its values
        (dims, attributes, coordinates' attributes, numpy or DataArray, chunking).  Two
        inputs of the same content and form read the same in every way."""
        p, _ = self._open(name)
        try:
            group = json.loads(read_metadata(p / "zarr.json"))
            nodes = {rel: json.loads(read_metadata(p / rel)) for rel in
                     sorted(f"{c.name}/zarr.json" for c in p.iterdir()
                            if c.is_dir() and (c / "zarr.json").is_file())}
        except (OSError, ValueError, UnsafeFile) as e:
            raise self._damage(name, p, None, None, e) from e
        data = nodes.get("data/zarr.json", {})
        attrs = _decoded(data.get("attributes"))
        coords = {rel.split("/")[0]: _decoded(m.get("attributes")) for rel, m in nodes.items()
                  if rel != "data/zarr.json"}
        grid = (data.get("chunk_grid") or {}).get("configuration") or {}
        numpy = bool((group.get("attributes") or {}).get("subzero_numpy", True))
        return form_digest(list(data.get("dimension_names") or ()), attrs, coords, numpy,
                           list(grid.get("chunk_shape") or ()))

    def seen_as_numpy(self, name: str) -> bool:
        """Whether operators saw the stored array as numpy (not a DataArray), from its group's
        metadata alone (whatever its dtype: :meth:`describe` reads numeric ones)."""
        p, _ = self._open(name)
        return self._numpy_at(name, p)

    def _numpy_at(self, name: str, p: Path) -> bool:
        """:meth:`seen_as_numpy` of the array opened (verified) at ``p``."""
        ref = self.ref(name)
        if ref is not None:
            return ref.numpy
        try:
            meta = json.loads(read_metadata(p / "zarr.json"))
        except (OSError, ValueError, UnsafeFile) as e:
            raise self._damage(name, p, None, None, e) from e
        return bool((meta.get("attributes") or {}).get("subzero_numpy", True))

    def refer(self, name: str, digest: str, form: str, numpy: bool) -> None:
        """The run reads input ``name`` from the store's copy from now on: write its
        reference (durably), then remove the run's own copy, if any."""
        assert self.run_uid is not None and self.store_uid() is not None
        self.dir.mkdir(parents=True, exist_ok=True)
        shared.write_ref(shared.ref_path(self.dir, name),
                         shared.Ref(self.run_uid, name, digest, form, str(self.store_uid()), numpy))
        self.drop_own(name)

    def drop_own(self, name: str) -> None:
        """Remove the run's own copy of an input it now reads from the store's copy (a
        crash before this leaves both: the reference wins, the copy is removed again)."""
        own = self._own(name)
        if own.is_dir() and not own.is_symlink():
            shutil.rmtree(own)
        sums_file(own).unlink(missing_ok=True)

    # -- arrays a run does not keep (``--keep``) -------------------------------------
    def kept(self, name: str) -> bool:
        """Whether the run keeps the array's values (False: :meth:`drop` ran; its
        values are made again when read)."""
        _, nodes = self._open(name)
        return nodes is None or nodes["data"].dropped is None

    def drop(self, name: str) -> None:
        """Stop keeping a bound array of this run: record the SHA-256 of each chunk's
        values (read chunk by chunk, checked), then remove its chunk files
        (:func:`.chunks.drop`).  Its shape, dtype, labels and manifests stay."""
        if self.run_uid is None or self.is_shared(name):
            raise StoreError(f"{self.label(name)} cannot be dropped: only a bound run's own "
                             f"arrays can")
        p, nodes = self._open(name)
        node = (nodes or {}).get("data")
        if node is None or not node.checksummed or node.trailers is None:
            raise StoreError(f"{self.label(name)} cannot be dropped: it has no chunk manifest")
        if node.dropped is not None:
            remove_chunks(p, node)            # left by a drop a crash cut short
            return
        written = self._written.pop(name, None)
        if written is not None and len(written) == node.chunk_count():
            # from the values written (reading 1,134 chunks back to hash them was 0.6 s
            # of a 6 s genomics 1,000x run)
            sums = b"".join(written[k] for k in range(node.chunk_count()))
        else:
            sums = b"".join(chunk_sha(self.read_region(name, node.chunk_slices(idx)))
                            for idx in node.chunks_all())
        drop(p, name, self.run_uid, self.label(name), sums)

    def _remade_region(self, name: str, node: ArrayNode, region: Any) -> np.ndarray:
        """A region of an array the run did not keep: the chunks it touches made again
        one by one (each checked against its SHA-256) when its operator allows and the
        region is a box, else the whole array made again.  A chunk made alone that is
        not the one recorded (an operator declared elementwise that reads positions)
        sends the read to the whole array, whose check decides."""
        whole = name in self._remade or self.recompute_chunk is None or not (
            isinstance(region, tuple) and len(region) == len(node.shape)
            and all(isinstance(s, slice) and s.step in (None, 1) for s in region))
        if not whole:
            box = tuple(s.indices(n)[:2] for s, n in zip(region, node.shape))
            if any(b <= a for a, b in box):
                return np.empty(tuple(max(b - a, 0) for a, b in box), self._dtype(name))
            parts = {}
            for idx in node.touched(region):
                got = self._remade_chunk(name, node, idx)
                if got is None:
                    whole = True
                    break
                parts[idx] = got
        if whole:
            return np.array(self._remade_values(name, node)[region])
        out = np.empty(tuple(b - a for a, b in box), next(iter(parts.values())).dtype)
        for idx, v in parts.items():
            cs = node.chunk_slices(idx)
            lo = [max(c.start, a) for c, (a, _) in zip(cs, box)]
            hi = [min(c.stop, b) for c, (_, b) in zip(cs, box)]
            out[tuple(slice(lo_ - a, hi_ - a) for lo_, hi_, (a, _) in zip(lo, hi, box))] = \
                v[tuple(slice(lo_ - c.start, hi_ - c.start) for lo_, hi_, c in zip(lo, hi, cs))]
        return out

    def _dtype(self, name: str) -> np.dtype:
        return np.dtype(self.describe(name)[1])

    def _remade_chunk(self, name: str, node: ArrayNode, idx: tuple[int, ...]) -> np.ndarray | None:
        """One chunk of an array not kept, made again alone and checked; None when its
        operator cannot make it alone, or made it other than recorded."""
        key = (name, idx)
        got = self._remade_chunks.get(key)
        if got is not None:
            return got
        assert self.recompute_chunk is not None and node.dropped is not None
        values = self.recompute_chunk(name, node.shape, node.chunks, idx)
        if values is None:
            return None
        values = np.asarray(values)
        if chunk_sha(values) != node.chunk_sum(idx):
            return None
        values.setflags(write=False)
        self._remade_chunks[key] = values
        return values

    def _remade_values(self, name: str, node: ArrayNode) -> np.ndarray:
        """The values of an array the run did not keep: made again by :attr:`recompute`
        (once per store object), each chunk checked against the SHA-256 recorded when it
        was dropped.  A difference is an error naming the chunk, never other values."""
        got = self._remade.get(name)
        if got is not None:
            return got
        label = self.label(name)
        if self.recompute is None:
            raise StoreError(f"{label} was not kept (the run's --keep policy); its values are "
                             f"made again by its operator, which needs the run: read it "
                             f"through the run (`subzero export`, Run.array)")
        values = np.asarray(self.recompute(name))
        assert node.dropped is not None
        if values.shape != node.shape:
            raise StoreError(f"{label} was not kept, and making it again gave shape "
                             f"{values.shape} instead of {node.shape}; it cannot be read")
        for idx in node.chunks_all():
            if chunk_sha(values[node.chunk_slices(idx)]) != node.chunk_sum(idx):
                where = ", ".join(f"{s.start}:{s.stop}" for s in node.chunk_slices(idx))
                raise StoreError(f"{label} was not kept, and making it again gave other values "
                                 f"in its chunk [{where}] than the run stored (its operator is not "
                                 f"deterministic, or its code changed); it cannot be read")
        values.setflags(write=False)
        self._remade[name] = values
        return values

    def _open(self, name: str) -> tuple[Path, dict[str, ArrayNode] | None]:
        """The array's folder and its verified nodes (None: written before checksums)."""
        p, uid, array, owner, label = self._identity(name)
        if not p.exists():
            if owner == "store":
                raise CorruptArray(f"{label} is missing: the store's copy {p} is gone")
            raise StoreError(f"{label} is missing: the run's array store has no {p}")
        return p, open_nodes(p, label, uid, array, owner)

    def _zarr(self, name: str, mode: str) -> tuple[Path, dict[str, ArrayNode] | None, Any]:
        """The array's folder, verified nodes and zarr array (zarr's own type: ``zarr.Array``)."""
        import zarr
        p, nodes = self._open(name)
        try:
            z = zarr.open_array(str(p / "data"), mode=mode, zarr_format=3)
        except Exception as e:
            raise CorruptArray(f"{self.label(name)} is damaged: cannot open {p / 'data'}: "
                               f"{type(e).__name__}: {e}") from e
        return p, nodes, z

    def write_region(self, name: str, region: tuple[slice, ...], values: ArrayLike) -> None:
        self.region_writer(name)(region, values)

    def region_writer(self, name: str) -> Callable[[tuple[slice, ...], ArrayLike], None]:
        """A function that writes regions of array ``name`` (made with :meth:`create`),
        the array opened once: a step writing its tiles one after another would
        otherwise verify the metadata and open the zarr array again for each (a third
        of a genomics 10,000x run's array writes, 5,625 tiles).  Every chunk is written,
        even one of fill values: a missing chunk means damage."""
        p, nodes, z = self._zarr(name, "r+")
        z = z.with_config({"write_empty_chunks": True})
        node = (nodes or {}).get("data")
        dtype = np.dtype(z.dtype) if node is not None and node.checksummed else None
        direct = None
        if dtype is not None and node is not None:
            try:
                meta = json.loads(read_metadata(p / "data" / "zarr.json"))
            except (OSError, ValueError, UnsafeFile):
                meta = None                   # zarr writes it (and says what is wrong)
            direct = chunkwrite.writer(meta, node, p) if isinstance(meta, dict) else None

        def write(region: tuple[slice, ...], values: ArrayLike) -> None:
            values = np.asarray(values)
            box = _whole_chunks(node, region, values) if values.dtype == dtype else None
            written = self._written.get(name)
            if box is None:                   # zarr writes it; its chunks' sums are not had
                z[region] = values
                if written is not None and values.size:
                    self._written[name] = None
                return
            assert node is not None
            grid = node.grid()
            for idx in node.touched(region):
                sub = values[tuple(slice(s.start - a, s.stop - a)
                                   for s, (a, _) in zip(node.chunk_slices(idx), box))]
                if direct is not None:
                    direct(idx, sub)
                if written is not None:
                    written[node.chunk_index(idx, grid)] = chunk_sha(sub)
            if direct is None:
                z[region] = values
        return write

    def fill(self, name: str, value: np.ndarray) -> None:
        """Write the whole of an in-memory array into array ``name`` (made with
        :meth:`create` with its shape and dtype): in slabs of whole chunks of at most
        ``FILL_SLAB_BYTES``, so that zarr encodes and writes each slab's chunks
        together.  The chunk files are those region-by-region writes make; one zarr
        call per chunk cost ~2.5 ms of a 4 KB chunk's write (genomics 10,000x: 1,875
        chunks per array, 24,000 calls, 40% of a plain run)."""
        write = self.region_writer(name)
        chunks = self.chunk_shape(name)
        for region in slabs(value.shape, chunks, value.dtype.itemsize, FILL_SLAB_BYTES):
            write(region, value[region])

    def tile_writer(self, name: str) -> SlabWriter:
        """A writer of array ``name``'s tiles as a step makes them, one after another in
        grid order (:func:`subzero.capture.tiles.tiles_for`): whole bands of tiles go to
        zarr together, up to ``FILL_SLAB_BYTES`` (see :meth:`fill`); ``close`` writes the
        rest.  What is not yet written is in memory: at most one slab and a band."""
        return SlabWriter(self.region_writer(name), FILL_SLAB_BYTES)

    def create_like(self, name: str, other: ArrayStore) -> None:
        """An empty array made as :meth:`create` makes it, with the metadata of array
        ``name`` of another run (``other``, verified as it is read): the same shape,
        dtype, dims, attributes and chunks, without xarray writing it again (a re-run's
        arrays, whose chunks come from its parent or its tiles).  Only for arrays with
        no coordinate arrays (what :meth:`create` makes); else :class:`StoreError`."""
        src, _ = other._open(name)
        files = metadata_files(src)
        if sorted(files) != ["data/zarr.json", "zarr.json"]:
            raise StoreError(f"{other.label(name)} has coordinate arrays: it cannot be made like")
        p = self._own(name)
        if p.exists():
            raise StoreError(f"array {name!r} already stored in this run")
        (p / "data").mkdir(parents=True)
        for rel in files:
            try:
                data = read_metadata(src / rel)
            except (OSError, UnsafeFile) as e:
                raise CorruptArray(f"{other.label(name)} is damaged: {src / rel}: {e}") from e
            (p / rel).write_bytes(data)
        seal(p, name, self.run_uid)
        self._written[name] = {}

    def share_region(self, name: str, other: ArrayStore, region: tuple[slice, ...]) -> int:
        """Take the chunks ``region`` covers (whole chunks) of array ``name`` of another
        run (``other``, verified as it is read) as this run's, without decoding them:
        hard links where the file system allows, else byte copies (:func:`.chunks.share_chunks`).
        The array must have been made with :meth:`create` with the same shape and dtype.
        A re-run's unchanged tiles; returns the chunks linked."""
        src_root, src_nodes = other._open(name)
        dst_root, dst_nodes = self._open(name)
        if src_nodes is not None and src_nodes["data"].dropped is not None:
            # the other run did not keep it: its values, made again and checked, are written
            self.write_region(name, region, other.read_region(name, region))
            return 0
        if src_nodes is None or dst_nodes is None or "data" not in src_nodes:
            raise CorruptArray(f"{other.label(name)}: its chunks cannot be shared (no checksums)")
        mine, theirs = self._written.get(name), other._written.get(name)
        self._written[name] = None             # chunks not written here: read back ...
        node = dst_nodes["data"]
        linked = share_chunks(src_root, src_nodes["data"], dst_root, node, region,
                              other.label(name))
        if mine is not None and theirs is not None:
            grid = node.grid()
            ks = [node.chunk_index(idx, grid) for idx in node.touched(region)]
            if all(k in theirs for k in ks):   # ... unless their writer's sums came along
                mine.update((k, theirs[k]) for k in ks)   # the same files: the same values
                self._written[name] = mine
        return linked

    def chunk_sums(self, name: str) -> dict[int, bytes] | None:
        """The SHA-256 of the chunks of array ``name`` this store wrote (by position in C
        order), as taken from the values written; None when it has none.  Those who use
        them check they have every chunk they need (:meth:`share_region`, :meth:`drop`)."""
        written = self._written.get(name)
        return dict(written) if written else None

    def vouch_sums(self, sums: Mapping[str, Mapping[int, bytes]]) -> None:
        """Chunk sums of this run's arrays that the process which wrote them took from the
        values written (:meth:`chunk_sums` of that run's own store: a budget run's
        profiling run).  Chunks :meth:`share_region` shares from here into another run
        carry them, so that run's :meth:`drop` need not read its linked chunks back.
        Only for a store of a run this process wrote."""
        for name, got in sums.items():
            self._written[name] = dict(got)

    def chunk_shape(self, name: str) -> tuple[int, ...]:
        """The array's chunk shape as stored: the run's tile, clipped to the shape (from
        the verified metadata; zarr only for an array written before checksums)."""
        _, nodes = self._open(name)
        node = nodes.get("data") if nodes is not None else None
        if node is not None and node.checksummed:
            return node.chunks
        _, _, z = self._zarr(name, "r")
        return tuple(int(k) for k in z.chunks)

    def read_region(self, name: str, region: tuple[slice, ...]) -> np.ndarray:
        """A region of the array, checking only the chunks it touches: decoded here
        when the array has SubZero's own layout (:mod:`.chunkread`), else by zarr."""
        direct = self._read_direct(name, region)
        if direct is not None:
            return direct
        p, nodes, z = self._zarr(name, "r")
        node = nodes["data"] if nodes is not None else None
        if node is not None and node.dropped is not None:
            return self._remade_region(name, node, region)
        if node is not None:
            check_present(p, node, region, self.label(name))
        try:
            return np.asarray(z[region])
        except (IndexError, TypeError):
            raise
        except Exception as e:
            raise self._damage(name, p, node, region, e) from e

    def _read_direct(self, name: str, region: tuple[slice, ...]) -> np.ndarray | None:
        """:meth:`read_region` without zarr, or None when the array or the region is not
        one :mod:`.chunkread` decodes (zarr then reads it)."""
        p, nodes = self._open(name)
        node = nodes.get("data") if nodes is not None else None
        if node is not None and node.dropped is not None:
            return self._remade_region(name, node, region)
        if (node is None or not isinstance(region, tuple) or len(region) != len(node.shape)
                or not all(isinstance(s, slice) and s.step in (None, 1) for s in region)):
            return None
        _, dtype = self._plain_meta(name, p, node)
        if dtype is None:
            return None
        return chunkread.read_region(p, node, dtype, region, self.label(name))

    def _plain_meta(self, name: str, p: Path, node: ArrayNode) -> tuple[dict, np.dtype | None]:
        """The data node's metadata, and its dtype when it is SubZero's own numeric layout
        of the node's shape (else None: zarr or xarray reads it)."""
        try:
            meta = json.loads(read_metadata(p / "data" / "zarr.json"))
        except (OSError, ValueError, UnsafeFile) as e:
            raise self._damage(name, p, None, None, e) from e
        if not isinstance(meta, dict):
            return {}, None
        dtype = plain_layout(meta, node)
        if dtype is None or tuple(meta.get("shape") or ()) != node.shape:
            return meta, None
        return meta, dtype

    def _read_plain(self, name: str) -> np.ndarray | None:
        """The whole of an array operators saw as numpy, read as :meth:`read_region` reads
        (every chunk checked), or None when xarray must read it: not SubZero's own
        numeric layout nor fixed-length strings, more nodes than the data, no axes, or
        attributes xarray would decode into other values.  A re-execution reads its inputs this way, so a
        command that re-runs an operator on numeric arrays imports neither xarray nor
        dask, pandas or scipy (1.3 s of a fresh process's first re-execution)."""
        p, nodes = self._open(name)
        node = nodes.get("data") if nodes is not None else None
        if node is None or len(nodes or {}) != 1 or not node.shape or not self._numpy_at(name, p):
            return None
        meta, dtype = self._plain_meta(name, p, node)
        whole = tuple(slice(None) for _ in node.shape)
        if dtype is None and _fixed_strings(meta):       # zarr decodes them; xarray is not needed
            return self.read_region(name, whole)
        if dtype is None or dtype.kind not in "biuf" or not _read_as_stored(meta.get("attributes"), dtype):
            return None
        if node.dropped is not None:
            return self._remade_region(name, node, whole)
        return chunkread.read_region(p, node, dtype, whole, self.label(name))

    def _damage(self, name: str, p: Path, node: ArrayNode | None,
                region: tuple[slice, ...] | None, err: Exception) -> CorruptArray:
        """The error for a read that failed on stored bytes: the damaged chunk when the
        checksums can tell which, else the array's folder and zarr's message."""
        found = bad_chunk(p, node, region) if node is not None else None
        if found is not None:
            return CorruptArray(f"{self.label(name)} is damaged: {found}")
        return CorruptArray(f"{self.label(name)} is damaged: cannot read {p}: "
                            f"{type(err).__name__}: {err}")

    def _dataset(self, name: str) -> xr.Dataset:
        """The whole array, loaded and verified (every chunk of every node present and
        passing its checksum)."""
        import xarray as xr
        p, nodes = self._open(name)
        data = nodes.get("data") if nodes is not None else None
        remade = data is not None and data.dropped is not None
        if nodes is not None:
            for node in nodes.values():
                if node is not data or not remade:
                    check_present(p, node, None, self.label(name))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = xr.open_zarr(p, consolidated=False, zarr_format=3)
                for c in ds["data"].coords:
                    ds[c].load()
                if not remade:
                    ds["data"].load()
        except Exception as e:
            for node in (nodes or {}).values():
                found = bad_chunk(p, node, None)
                if found is not None:
                    raise CorruptArray(f"{self.label(name)} is damaged: {found}") from e
            raise self._damage(name, p, None, None, e) from e
        if remade:
            assert data is not None
            ds["data"] = ds["data"].copy(data=self._remade_values(name, data))
        return ds

    def grid_parts(self, name: str) -> tuple[tuple[str, ...], dict[str, np.ndarray], dict]:
        """An array's dims, dimension coordinates and attributes, without reading its
        cells: what :mod:`subzero.coords` needs, from the verified metadata and the
        (small, verified) coordinate arrays only."""
        p, nodes = self._open(name)
        try:
            meta = json.loads(read_metadata(p / "data" / "zarr.json"))
        except (OSError, ValueError, UnsafeFile) as e:
            raise self._damage(name, p, None, None, e) from e
        dims = tuple(str(d) for d in (meta.get("dimension_names") or ()))
        coords: dict[str, np.ndarray] = {}
        labelled = [d for d in dims if (p / d / "zarr.json").is_file()]
        if labelled:
            for key, node in (nodes or {}).items():
                if key.strip("/") in labelled:
                    check_present(p, node, None, self.label(name))
            import xarray as xr
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ds = xr.open_zarr(p, consolidated=False, zarr_format=3)
                    coords = {d: np.asarray(ds[d].values) for d in labelled if d in ds.coords}
            except Exception as e:
                for key, node in (nodes or {}).items():
                    found = bad_chunk(p, node, None) if key.strip("/") in labelled else None
                    if found is not None:
                        raise CorruptArray(f"{self.label(name)} is damaged: {found}") from e
                raise self._damage(name, p, None, None, e) from e
        return dims, coords, dict(meta.get("attributes") or {})

    def content_digest(self, name: str) -> str:
        """The array's content digest (:mod:`subzero.model.content`): its values read
        band by band through the checksums, and its labels (dims, coordinates, sky WCS)."""
        shape, dtype, _ = self.describe(name)
        label = self.label(name)

        class _Source:
            def __init__(self, store: ArrayStore):
                self.shape, self.dtype, self.store = shape, dtype, store

            def read_region(self, region: tuple[slice, ...]) -> np.ndarray:
                return self.store.read_region(name, region)

        try:
            return content.digest(_Source(self), stored_grid(*self.grid_parts(name)))
        except content.ContentError as e:
            raise StoreError(f"{label}: {e}") from e

    def lazy(self, name: str) -> xr.DataArray:
        """The array with its dims, coordinates and attrs, its data left unread (a dask
        array): the coordinates are loaded and verified, the data chunks are not
        touched.  For labelling a result over this array without reading it."""
        import xarray as xr
        p, nodes = self._open(name)
        for key, node in (nodes or {}).items():
            if key != "data":
                check_present(p, node, None, self.label(name))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = xr.open_zarr(p, consolidated=False, zarr_format=3)
                for c in ds["data"].coords:
                    ds[c].load()
        except Exception as e:
            raise self._damage(name, p, None, None, e) from e
        data = (nodes or {}).get("data")
        if data is not None and data.dropped is not None:
            # never zarr's reads of its chunks: they are gone, and zarr would fill them in
            import dask.array as da
            ds["data"] = ds["data"].copy(data=da.from_array(
                _Remade(self, name, data.shape, ds["data"].dtype), chunks=data.chunks))
        return self._as_array(name, ds)

    def read(self, name: str) -> xr.DataArray:
        return self._as_array(name, self._dataset(name))

    @staticmethod
    def _as_array(name: str, ds: xr.Dataset) -> xr.DataArray:
        da = ds["data"].rename(name)
        da.attrs = dict(ds["data"].attrs)
        return da

    def read_value(self, name: str) -> np.ndarray | xr.DataArray:
        """The array as the operator originally saw it (numpy or DataArray)."""
        plain = self._read_plain(name)
        if plain is not None:
            return plain
        ds = self._dataset(name)
        da = self._as_array(name, ds)
        return da.values if ds.attrs.get("subzero_numpy", True) else da


class _Remade:
    """An array not kept, as dask reads it: region by region through the store (which
    makes it again, checked, on the first read)."""

    def __init__(self, store: ArrayStore, name: str, shape: tuple[int, ...], dtype: Any):
        self.store, self.name, self.shape, self.dtype = store, name, shape, np.dtype(dtype)
        self.ndim = len(shape)

    def __getitem__(self, region: Any) -> np.ndarray:
        return self.store.read_region(self.name, region)
