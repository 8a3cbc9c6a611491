"""Regions read straight from chunk files (subzero.storage.chunkread) are zarr's own
reads, cell for cell, on random arrays, tiles and regions, bound or not; and a
chunk that is missing, damaged, swapped or a link is the same clear error."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subzero.errors import CorruptArray
from subzero.storage.arrays import ArrayStore

DTYPES = ["float64", "float32", "int16", "uint8", "int64", "bool", "complex64", "uint32"]


MAX_CHUNKS = 512


def _chunks(shape, tile) -> int:
    return int(np.prod([-(-n // tile) for n in shape]))


@st.composite
def arrays_and_regions(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 23)) for _ in range(ndim))
    # at most MAX_CHUNKS chunk files: a 3-d array of 1-cell tiles (12,167 files) shows
    # nothing a few hundred do not, and took most of a minute of the quick suite
    tile = draw(st.integers(min(t for t in range(1, 24) if _chunks(shape, t) <= MAX_CHUNKS), 9))
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    regions = []
    for _ in range(draw(st.integers(1, 4))):
        region = []
        for n in shape:
            a = draw(st.integers(0, n))
            b = draw(st.integers(a, n))
            region.append(slice(a, b) if draw(st.booleans()) else slice(a, None) if a < n else slice(None, b))
        regions.append(tuple(region))
    return shape, tile, dtype, seed, regions


def _values(shape, dtype, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind == "c":
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)
    if dtype.kind == "f":
        v = rng.normal(size=shape).astype(dtype)
        v.flat[::7] = np.nan          # the fill value is NaN: NaN cells must still be read
        return v
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays_and_regions(), st.booleans())
def test_direct_reads_are_zarrs(tmp_path_factory, case, bound):
    shape, tile, dtype, seed, regions = case
    root = tmp_path_factory.mktemp("direct")
    arrays = ArrayStore(root, tile=tile, run_uid="a" * 32 if bound else None)
    value = _values(shape, dtype, seed)
    arrays.write("x", value)
    arrays.bind("x")
    _, _, z = arrays._zarr("x", "r")
    for region in regions:
        direct = arrays._read_direct("x", region)
        assert direct is not None, "SubZero's own layout is read directly"
        want = np.asarray(z[region])
        assert direct.dtype == want.dtype and direct.shape == want.shape
        assert np.array_equal(direct, want, equal_nan=dtype.kind in "fc")
        assert np.array_equal(arrays.read_region("x", region), value[region],
                              equal_nan=dtype.kind in "fc")


@pytest.fixture
def stored(tmp_path):
    arrays = ArrayStore(tmp_path, tile=4, run_uid="b" * 32)
    arrays.write("x", np.arange(100, dtype=np.float64).reshape(10, 10))
    arrays.write("y", np.arange(100, 200, dtype=np.float64).reshape(10, 10))
    arrays.bind("x")
    arrays.bind("y")
    return arrays


def _chunk(arrays, name, i, j):
    return arrays.path(name) / "data" / "c" / str(i) / str(j)


def test_a_missing_chunk_is_named(stored):
    _chunk(stored, "x", 1, 1).unlink()
    with pytest.raises(CorruptArray, match=r"array 'x'.* chunk file .*c/1/1 is missing"):
        stored.read_region("x", (slice(4, 6), slice(4, 6)))
    # a region away from it still reads
    assert stored.read_region("x", (slice(0, 2), slice(0, 2)))[1, 1] == 11


def test_a_damaged_chunk_fails_its_checksum(stored):
    f = _chunk(stored, "x", 0, 1)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptArray, match=r"c/0/1 fails its checksum"):
        stored.read_region("x", (slice(0, 1), slice(4, 5)))


def test_a_swapped_chunk_is_not_the_chunk_its_place_names(stored):
    a, b = _chunk(stored, "x", 0, 0), _chunk(stored, "x", 2, 2)
    data = a.read_bytes()
    shutil.copyfile(b, a)
    with pytest.raises(CorruptArray, match=r"c/0/0 is not the chunk its place names"):
        stored.read_region("x", (slice(0, 1), slice(0, 1)))
    a.write_bytes(data)
    # a chunk of another array at the same place: the manifest of x does not record it
    shutil.copyfile(_chunk(stored, "y", 1, 0), _chunk(stored, "x", 1, 0))
    with pytest.raises(CorruptArray, match=r"c/1/0 is not the chunk its place names"):
        stored.read_region("x", (slice(4, 5), slice(0, 1)))


def test_a_link_or_fifo_is_not_read(stored, tmp_path):
    f = _chunk(stored, "x", 2, 0)
    copy = tmp_path / "elsewhere"
    shutil.copyfile(f, copy)
    f.unlink()
    f.symlink_to(copy)
    with pytest.raises(CorruptArray, match=r"c/2/0 is a link"):
        stored.read_region("x", (slice(8, 9), slice(0, 1)))
    f.unlink()
    os.mkfifo(f)
    with pytest.raises(CorruptArray, match=r"c/2/0 is not a regular file"):   # and no hang
        stored.read_region("x", (slice(8, 9), slice(0, 1)))


def test_a_truncated_chunk_is_damage(stored):
    f = _chunk(stored, "x", 1, 2)
    f.write_bytes(b"\x00\x01")
    with pytest.raises(CorruptArray, match=r"c/1/2"):
        stored.read_region("x", (slice(4, 5), slice(8, 9)))


def test_other_layouts_and_regions_go_to_zarr(stored):
    # a stepped region is zarr's to read
    assert stored._read_direct("x", (slice(0, 10, 2), slice(0, 10))) is None
    assert np.array_equal(stored.read_region("x", (slice(0, 10, 2), slice(0, 10))),
                          np.arange(100.0).reshape(10, 10)[::2])
    strings = ArrayStore(stored.dir.parent / "s", tile=4)
    strings.write("s", np.array(["a", "bc", "def"]))
    assert strings._read_direct("s", (slice(0, 3),)) is None
    assert list(strings.read_region("s", (slice(0, 3),))) == ["a", "bc", "def"]
