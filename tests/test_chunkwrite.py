"""Whole chunks written without zarr (``subzero.storage.chunkwrite``) are byte for byte
the chunk files zarr writes: random arrays, dtypes, ragged edges, 1 to 3 axes, whole
fills, tiles and regions off the grid (which zarr writes), then bound, read and
dropped as any array.  And a plain numeric array's metadata, written by zarr without
xarray, is byte for byte the files xarray writes."""

import json

import numpy as np
import pytest
from conftest import EXAMPLE, ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from subzero.storage import arrays as arrays_mod
from subzero.storage import chunkwrite
from subzero.storage.arrays import ArrayStore
from subzero.storage.chunks import chunk_sha, sums_file

DTYPES = ["float64", "float32", "int64", "int32", "int16", "uint8", "bool", "complex128"]


def _files(root):
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*"))
            if f.is_file()}


def _values(rng, shape, dtype):
    v = rng.random(shape) * 200 - 100
    if dtype == "bool":
        return v > 0
    if dtype == "complex128":
        return v + 1j * v[::-1]
    return v.astype(dtype)


def _write(tmp, label, shape, tile, dtype, v, how, direct):
    """One array written ``how``, with or without the direct writer."""
    saved = chunkwrite.writer
    if not direct:
        arrays_mod.chunkwrite.writer = lambda *a, **k: None
    try:
        store = ArrayStore(tmp / label, tile=tile, run_uid="uid")
        store.create("x", shape, np.dtype(dtype))
        if how == "fill":
            store.fill("x", v)
        else:                                  # row bands of tiles, then one off the grid
            w = store.region_writer("x")
            for a in range(0, shape[0], tile):
                region = (slice(a, min(a + tile, shape[0])),) + tuple(slice(0, n) for n in shape[1:])
                w(region, v[region])
            if how == "patched" and shape[0] > 2:
                region = (slice(1, 2),) + tuple(slice(0, n) for n in shape[1:])
                w(region, v[region])
        store.bind("x")
        return store
    finally:
        arrays_mod.chunkwrite.writer = saved


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 23), min_size=1, max_size=3),
       tile=st.integers(1, 9), dtype=st.sampled_from(DTYPES),
       how=st.sampled_from(["fill", "bands", "patched"]), seed=st.integers(0, 2**16))
def test_chunks_written_directly_are_the_files_zarr_writes(tmp_path_factory, shape, tile,
                                                           dtype, how, seed):
    tmp = tmp_path_factory.mktemp("w")
    shape = tuple(shape)
    v = _values(np.random.default_rng(seed), shape, dtype)
    mine = _write(tmp, "direct", shape, tile, dtype, v, how, direct=True)
    theirs = _write(tmp, "zarr", shape, tile, dtype, v, how, direct=False)
    a, b = mine.path("x"), theirs.path("x")
    assert _files(a) == _files(b)
    assert sums_file(a).read_bytes() == sums_file(b).read_bytes()
    np.testing.assert_array_equal(mine.read_value("x"), v)
    node = mine._open("x")[1]["data"]
    back = b"".join(chunk_sha(mine.read_region("x", node.chunk_slices(i)))
                    for i in node.chunks_all())
    mine.drop("x")
    assert mine._open("x")[1]["data"].dropped == back


def test_the_direct_writer_is_used_and_leaves_no_partial_file(tmp_path, monkeypatch):
    calls = []
    real = chunkwrite.writer

    def spy(*a, **k):
        w = real(*a, **k)
        calls.append(w is not None)
        return w
    monkeypatch.setattr(arrays_mod.chunkwrite, "writer", spy)
    store = ArrayStore(tmp_path / "r", tile=4, run_uid="uid")
    store.create("x", (10, 6), np.dtype("float64"))
    store.fill("x", np.arange(60.0).reshape(10, 6))
    assert calls == [True]
    assert not [f for f in store.path("x").rglob("*") if f.name.endswith(".partial")]


def test_a_link_in_a_chunk_place_is_replaced_not_followed(tmp_path):
    """A chunk's place holding a symbolic link (planted, or left by a copy) gets the
    chunk file; what the link pointed to is untouched."""
    store = ArrayStore(tmp_path / "r", tile=4, run_uid="uid")
    store.create("x", (4, 4), np.dtype("float64"))
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    place = store.path("x") / "data" / "c" / "0" / "0"
    place.parent.mkdir(parents=True, exist_ok=True)
    place.symlink_to(victim)
    store.fill("x", np.ones((4, 4)))
    assert victim.read_bytes() == b"keep me"
    assert not place.is_symlink()
    store.bind("x")
    np.testing.assert_array_equal(store.read_value("x"), np.ones((4, 4)))


@pytest.mark.parametrize("fill", ["0x7fc00000", "nan", [1.0]])
def test_metadata_other_than_its_own_layout_is_left_to_zarr(tmp_path, fill):
    store = ArrayStore(tmp_path / "r", tile=4, run_uid="uid")
    store.create("x", (4, 4), np.dtype("float64"))
    import json
    meta = json.loads((store.path("x") / "data" / "zarr.json").read_text())
    node = store._open("x")[1]["data"]
    assert chunkwrite.writer(meta, node, store.path("x")) is not None
    assert chunkwrite.writer({**meta, "fill_value": fill}, node, store.path("x")) is None
    codecs = [dict(c) for c in meta["codecs"]]
    codecs[1] = {"name": "gzip", "configuration": {"level": 1}}
    assert chunkwrite.writer({**meta, "codecs": codecs}, node, store.path("x")) is None


def test_a_write_that_fails_leaves_no_partial_file(tmp_path, monkeypatch):
    """A full disk mid-chunk: the error reaches the caller and no temporary file stays."""
    import errno
    store = ArrayStore(tmp_path / "r", tile=4, run_uid="uid")
    store.create("x", (8, 8), np.dtype("float64"))

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(chunkwrite.os, "write", full)
    with pytest.raises(OSError, match="No space"):
        store.fill("x", np.ones((8, 8)))
    monkeypatch.undo()
    assert not [f for f in store.path("x").rglob("*") if ".partial" in f.name]


PLAIN_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64"]
#: fixed-length strings: their metadata is written by zarr too (their chunks are zarr's)
STRING_DTYPES = ["<U1", "<U7"]


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 23), min_size=1, max_size=3), tile=st.integers(1, 9),
       dtype=st.sampled_from(PLAIN_DTYPES + STRING_DTYPES), named=st.booleans(),
       labelled=st.booleans())
def test_a_plain_arrays_metadata_is_the_files_xarray_writes(tmp_path_factory, shape, tile,
                                                            dtype, named, labelled):
    """``create`` writes a numeric array without attributes through zarr itself: the same
    files, byte for byte, as xarray's lazy template (which any other array still takes),
    so a reader cannot tell them apart; then filled, bound and read like any array."""
    tmp = tmp_path_factory.mktemp("m")
    shape = tuple(shape)
    store = ArrayStore(tmp / "run", tile=tile, run_uid="uid")
    chunks = tuple(min(n, tile) for n in shape)
    dims = [f"axis{k}" if named else f"dim_{k}" for k in range(len(shape))]
    arrays_mod._create_plain(tmp / "plain.zarr", "x", shape, np.dtype(dtype), chunks, dims,
                             labelled)
    arrays_mod._create_xarray(tmp / "xarray.zarr", "x", shape, np.dtype(dtype), chunks, dims,
                              None, None, None, labelled)
    assert _files(tmp / "plain.zarr") == _files(tmp / "xarray.zarr")
    store.create("x", shape, np.dtype(dtype), dims if named else None, labelled=labelled)
    assert _files(store.path("x")) == _files(tmp / "plain.zarr")
    v = _values(np.random.default_rng(tile), shape, dtype)
    store.fill("x", v)
    store.bind("x")
    back = store.read_value("x")
    np.testing.assert_array_equal(np.asarray(back), v)
    if labelled:
        assert list(back.dims) == dims
    assert store.describe("x") == (shape, np.dtype(dtype), not labelled)


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 23), min_size=1, max_size=3), tile=st.integers(1, 9),
       dtype=st.sampled_from(PLAIN_DTYPES + STRING_DTYPES), holes=st.booleans())
def test_a_plain_arrays_value_is_the_one_xarray_reads(tmp_path_factory, shape, tile, dtype, holes):
    """``read_value`` of an array operators saw as numpy reads its chunks itself (every
    one checked; zarr decodes strings) where xarray would read the stored values as they
    are: the same values and dtype as xarray's read, NaN cells included."""
    tmp = tmp_path_factory.mktemp("v")
    store = ArrayStore(tmp / "run", tile=tile, run_uid="uid")
    v = _values(np.random.default_rng(tile), tuple(shape), dtype)
    if holes and v.dtype.kind == "f":
        v.flat[:: 3] = np.nan
    store.write("x", v)
    store.bind("x")
    assert store._read_plain("x") is not None
    direct = store.read_value("x")
    by_xarray = store._as_array("x", store._dataset("x")).values
    assert type(direct) is np.ndarray and direct.dtype == by_xarray.dtype == v.dtype
    np.testing.assert_array_equal(direct, by_xarray)
    np.testing.assert_array_equal(direct, v)


@pytest.mark.parametrize(("attrs", "dtype", "as_stored"), [
    (None, "int32", True), ({}, "float64", True),
    ({"_FillValue": "AAAAAAAA+H8="}, "float64", True),      # xarray's NaN, float64
    ({"_FillValue": "AADAfw=="}, "float32", True),          # and float32
    ({"_FillValue": "NaN"}, "float64", True),
    ({"_FillValue": "AAAAAAAA+H8="}, "float16", True),      # xarray's float64 NaN for any float
    ({"_FillValue": "AAB+"}, "float64", False),             # 3 bytes: no float
    ({"_FillValue": "AAAAAAAAWcA="}, "float64", False),     # -100.0: xarray masks it to NaN
    ({"_FillValue": -100.0}, "float64", False),
    ({"_FillValue": 0}, "int16", False),
    ({"_FillValue": "AAAAAAAA+H8=", "scale_factor": 2.0}, "float64", False),
    ({"units": "days since 2000-01-01"}, "int64", False),
    ({"_FillValue": "not base64!"}, "float64", False),
])
def test_only_attributes_xarray_reads_as_stored_skip_it(attrs, dtype, as_stored):
    """A numpy array is read without xarray only when xarray would not decode its values
    into others (a numeric fill value masked, a scale applied, times decoded)."""
    assert arrays_mod._read_as_stored(attrs, np.dtype(dtype)) is as_stored


@pytest.mark.parametrize("value", [
    np.arange(12.0).reshape(3, 4), np.float32(2.5), np.arange(6, dtype=">i4"), np.array(True),
    np.arange(4, dtype="<u2").reshape(2, 2), [1, 2, 3], np.array(["a", "bc"]),
    np.array(["2020-01-01", "2021-06-01"], dtype="datetime64[D]"),
    np.arange(6.0).reshape(2, 3).T, np.ma.masked_array([1.0, 2.0], mask=[False, True]),
])
def test_values_without_xarray_are_the_ones_xarray_stores(value):
    """What a re-run's output is compared as: the values ``as_dataarray`` stores (0-d as
    one cell, native byte order), made without xarray for a plain numeric array."""
    got = arrays_mod.as_values(value, "x")
    want = np.asarray(arrays_mod.as_dataarray(value, "x").values)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_labelled_or_coordinated_array_is_still_read_by_xarray(tmp_path):
    """A DataArray input keeps xarray's read (its labels are part of its value)."""
    import xarray as xr
    store = ArrayStore(tmp_path / "run", tile=4, run_uid="uid")
    store.write("x", xr.DataArray(np.arange(6.0).reshape(2, 3), dims=("y", "x"),
                                  coords={"x": [10, 20, 30]}, attrs={"units": "adu"}))
    store.bind("x")
    assert store._read_plain("x") is None
    back = store.read_value("x")
    assert isinstance(back, xr.DataArray) and back.attrs["units"] == "adu"


@pytest.mark.parametrize("value", [np.arange(64.0).reshape(8, 8),
                                   np.arange(64).astype("<U3").reshape(8, 8)],
                         ids=["numbers", "strings"])
def test_a_damaged_chunk_of_a_plain_array_is_named(tmp_path, value):
    """The whole-array read without xarray checks every chunk, as xarray's path did."""
    from subzero.errors import CorruptArray
    store = ArrayStore(tmp_path / "run", tile=4, run_uid="uid")
    store.write("x", value)
    store.bind("x")
    chunk = sorted(p for p in (store.path("x") / "data").rglob("*") if p.is_file() and p.name != "zarr.json")[-1]
    raw = bytearray(chunk.read_bytes())
    raw[-1] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(CorruptArray, match="damaged"):
        store.read_value("x")


@pytest.mark.parametrize("workflow", [EXAMPLE, str(ROOT / "workflows" / "genomics.py")],
                         ids=["example", "genomics-with-strings"])
def test_a_run_of_numpy_arrays_imports_neither_xarray_nor_dask(tmp_path, workflow):
    """An in-process run whose inputs and outputs are all numeric or string numpy arrays
    stores them without importing xarray, pandas or dask (about 1 s of CPU a process):
    the CLI's `run` of such a workflow (genomics has its patients' names), with no
    warning from zarr about its strings."""
    import subprocess
    import sys
    code = ("import sys, subzero, warnings\n"
            "warnings.filterwarnings('error', message='.*Zarr V3')\n"
            "from subzero.cli import main\n"
            f"assert main(['run', {workflow!r}, '--store', {str(tmp_path / 's')!r}, "
            "'--engine', 'local', '-q']) == 0\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'xarray', 'pandas', 'dask'}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_a_trace_re_running_an_operator_on_numpy_arrays_imports_no_xarray(tmp_path):
    """A fresh process whose trace re-executes an operator over numeric arrays reads its
    inputs without xarray, pandas or dask (their imports were 1.3 s of the first
    re-execution of a `subzero trace`)."""
    import subprocess
    import sys
    store = str(tmp_path / "s")
    ran = subprocess.run([sys.executable, "-m", "subzero.cli", "run", str(EXAMPLE), "--store", store,
                          "--engine", "local", "-q", "--strategy", "stars=blackbox",
                          "--strategy", "clean=blackbox"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    code = ("import sys, json\n"
            "from subzero.cli import main\n"
            f"assert main(['trace', '--store', {store!r}, '--from', 'stars', '--cells', '40,70', "
            "'--to', 'raw', '--json']) == 0\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'xarray', 'pandas', 'dask'}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "[]", out.stdout
    got = json.loads("\n".join(lines[:-1]))
    assert "reexec" in json.dumps(got), got
