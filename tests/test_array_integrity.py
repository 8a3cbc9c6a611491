"""Stored arrays carry checksums: every Zarr chunk a crc32c, every metadata file a
digest; a read finds a deleted, garbled or truncated chunk and a damaged or deleted
zarr.json and says which file of which array of which run, never reading damage as
data (issue 11: a deleted chunk used to be read as fill values, a garbled one gave
"internal error: RuntimeError: Zstd decompression error")."""

import json
import os
import shutil
import warnings

import numpy as np
import pytest
import xarray as xr
from conftest import EXAMPLE, stored_path

import subzero
from subzero.errors import CorruptArray, StoreError
from subzero.storage.arrays import ArrayStore
from subzero.storage.chunks import sums_file


@pytest.fixture
def arrays(tmp_path):
    return ArrayStore(tmp_path / "runs" / "7", tile=4)


def grid_files(p):
    return sorted(os.path.relpath(os.path.join(r, f), p) for r, _, fs in os.walk(p) for f in fs)


def garble(path, at=-6, n=3):
    data = bytearray(path.read_bytes())
    for k in range(n):
        data[at + k] ^= 0xA5
    path.write_bytes(bytes(data))


def test_every_chunk_checksummed_and_written(arrays):
    """Zeros are the fill value of an int array: zarr alone would skip those chunks, and a
    deleted chunk could then not be told from an empty one."""
    x = np.zeros((10, 9), np.int32)
    x[0, 0] = 5
    arrays.write("x", x)
    p = arrays.path("x")
    meta = json.loads((p / "data" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "zstd", "crc32c"]
    chunks = [f for f in grid_files(p / "data") if f.startswith("c")]
    assert len(chunks) == 3 * 3                         # (10, 9) in 4x4 tiles: all of them
    assert set(json.loads(sums_file(p).read_text())["metadata"]) == {"zarr.json", "data/zarr.json"}
    assert sums_file(p).name == "x.sums.json" and sums_file(p).parent == p.parent
    np.testing.assert_array_equal(arrays.read_value("x"), x)
    np.testing.assert_array_equal(arrays.read_region("x", (slice(3, 9), slice(0, 2))), x[3:9, :2])
    assert arrays.checksummed("x")
    with warnings.catch_warnings():        # still a plain Zarr group to xarray: nothing unknown in it
        warnings.simplefilter("error")
        got = xr.open_zarr(p, zarr_format=3, consolidated=False)["data"].values
    np.testing.assert_array_equal(got, x)


def labelled(arrays):
    da = xr.DataArray(np.arange(48.0).reshape(6, 8), dims=["y", "x"],
                      coords={"y": np.arange(6) * 10, "x": np.linspace(0, 1, 8)}, attrs={"unit": "e"})
    arrays.write("img", da)
    return arrays.path("img")


DAMAGE = {
    "deleted chunk": (lambda p: (p / "data/c/1/1").unlink(), "chunk file", "data/c/1/1", "is missing"),
    "garbled chunk": (lambda p: garble(p / "data/c/1/1"), "chunk file", "data/c/1/1", "fails its checksum"),
    "truncated chunk": (lambda p: os.truncate(p / "data/c/1/1", 5), "chunk file", "data/c/1/1",
                        "fails its checksum"),
    "empty chunk file": (lambda p: os.truncate(p / "data/c/1/1", 0), "chunk file", "data/c/1/1",
                         "fails its checksum"),
    "garbled coordinate chunk": (lambda p: garble(p / "x/c/0"), "chunk file", "x/c/0", "fails its checksum"),
    "deleted coordinate chunk": (lambda p: (p / "y/c/0").unlink(), "chunk file", "y/c/0", "is missing"),
    "deleted array zarr.json": (lambda p: (p / "data/zarr.json").unlink(), "metadata file",
                                "data/zarr.json", "is missing"),
    "edited array zarr.json": (lambda p: (p / "data/zarr.json").write_text(
        (p / "data/zarr.json").read_text().replace('"float64"', '"float32"')),
        "metadata file", "data/zarr.json", "fails its checksum"),
    "deleted group zarr.json": (lambda p: (p / "zarr.json").unlink(), "metadata file", "img.zarr/zarr.json",
                                "is missing"),
    "garbled coordinate zarr.json": (lambda p: garble(p / "y/zarr.json", at=10), "metadata file",
                                     "y/zarr.json", "fails its checksum"),
    "deleted checksum file": (lambda p: sums_file(p).unlink(), "checksum file", "img.sums.json", "is missing"),
    "garbled checksum file": (lambda p: garble(sums_file(p), at=20), "checksum file", "img.sums.json",
                              "unreadable"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_a_clear_error_naming_array_run_and_file(arrays, kind):
    p = labelled(arrays)
    damage, what, rel, how = DAMAGE[kind]
    damage(p)
    for read in (lambda: arrays.read("img"), lambda: arrays.read_value("img")):
        with pytest.raises(CorruptArray) as e:
            read()
        msg = str(e.value)
        assert msg.startswith("array 'img' of run 7 is damaged: ") and "\n" not in msg, msg
        assert what in msg and rel in msg and how in msg, msg
    assert isinstance(e.value, StoreError)


def test_region_read_checks_only_the_chunks_it_touches(arrays):
    x = np.arange(100.0).reshape(10, 10)
    arrays.write("x", x)
    (arrays.path("x") / "data/c/2/2").unlink()          # rows 8:10, cols 8:10
    garble(arrays.path("x") / "data/c/0/2")             # rows 0:4, cols 8:10
    np.testing.assert_array_equal(arrays.read_region("x", (slice(0, 8), slice(0, 8))), x[:8, :8])
    np.testing.assert_array_equal(arrays.read_region("x", (slice(4, 10), slice(0, 6))), x[4:, :6])
    with pytest.raises(CorruptArray, match=r"chunk file .*x\.zarr/data/c/2/2 is missing"):
        arrays.read_region("x", (slice(7, 9), slice(7, 9)))
    with pytest.raises(CorruptArray, match=r"chunk file .*x\.zarr/data/c/0/2 fails its checksum"):
        arrays.read_region("x", (slice(3, 4), slice(9, 10)))
    with pytest.raises(CorruptArray, match="data/c/2/2 is missing"):   # the first one found
        arrays.read("x")


def test_region_written_array_is_checksummed_and_complete(arrays):
    """``create`` + ``write_region`` (the Spark engine's path) seals the metadata and writes
    every chunk, fill-valued ones included; a region never written reads as damage."""
    arrays.create("y", (8, 6), np.int64)
    arrays.write_region("y", (slice(0, 4), slice(0, 6)), np.zeros((4, 6), np.int64))
    with pytest.raises(CorruptArray, match=r"array 'y' of run 7 is damaged: chunk file .*c/1/0 is missing"):
        arrays.read_value("y")
    arrays.write_region("y", (slice(4, 8), slice(0, 6)), np.ones((4, 6), np.int64))
    want = np.r_[np.zeros((4, 6)), np.ones((4, 6))]
    np.testing.assert_array_equal(arrays.read_value("y"), want)
    p = arrays.path("y")
    assert [f for f in grid_files(p / "data") if f.startswith("c")] == ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]
    (p / "data/c/0/1").unlink()
    with pytest.raises(CorruptArray, match="c/0/1 is missing"):
        arrays.read_region("y", (slice(0, 2), slice(4, 6)))


@pytest.mark.parametrize("shape,most", [((9, 14), 1), ((9, 14), 8 * 4 * 14), ((3, 30), 8 * 3 * 8),
                                        ((30,), 10**6), ((0, 5), 64)])
def test_a_whole_array_filled_in_slabs_is_chunk_for_chunk_a_region_by_region_write(
        tmp_path, shape, most, monkeypatch):
    """``fill`` (a whole in-memory output, one zarr call per slab of whole chunks) writes
    the very chunk files, checksums and sidecar that one ``write_region`` per chunk
    writes, whatever the slab size (one chunk, several, a ragged last slab, all), and
    reads back as the array; every chunk of zeros is there too."""
    from subzero.storage import arrays as arrays_mod
    value = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) % 5
    by_region = ArrayStore(tmp_path / "a" / "runs" / "7", tile=4)
    by_region.create("x", shape, np.int64)
    for idx in np.ndindex(*[-(-n // 4) for n in shape]):
        region = tuple(slice(4 * k, min(4 * k + 4, n)) for k, n in zip(idx, shape))
        by_region.write_region("x", region, value[region])
    monkeypatch.setattr(arrays_mod, "FILL_SLAB_BYTES", most)
    filled = ArrayStore(tmp_path / "b" / "runs" / "7", tile=4)
    filled.create("x", shape, np.int64)
    filled.fill("x", value)
    a, b = by_region.path("x"), filled.path("x")
    assert grid_files(a) == grid_files(b)
    for f in grid_files(a):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert sums_file(a).read_bytes() == sums_file(b).read_bytes()
    np.testing.assert_array_equal(filled.read_value("x"), value)


def test_slabs_cover_the_array_once_in_whole_chunks():
    """The slabs ``fill`` writes: every cell once, cut only at chunk boundaries, across
    the axis with the most chunks, no slab over the byte limit unless one chunk-thick
    cut is over it."""
    from subzero.storage.slabs import slabs
    for shape, chunks, most in [((10, 7), (4, 4), 8 * 7 * 4), ((7, 10), (4, 4), 1), ((5,), (2,), 24),
                                ((1000, 3, 2), (512, 3, 2), 48 * 600), ((4, 4), (4, 4), 1)]:
        seen = np.zeros(shape, np.int64)
        for region in slabs(shape, chunks, 8, most):
            seen[region] += 1
            for s, n, c in zip(region, shape, chunks):
                assert s.start % c == 0 and (s.stop % c == 0 or s.stop == n)
            cells = int(np.prod([s.stop - s.start for s in region]))
            one_cut = max(int(np.prod(shape)) // max(shape[k], 1) * chunks[k]
                          for k in range(len(shape)))
            assert cells * 8 <= max(most, one_cut * 8)
        assert (seen == 1).all()


@pytest.mark.parametrize("most", [1, 8 * 4 * 14, 10**6])
@pytest.mark.parametrize("order", ["grid", "shuffled"])
def test_tiles_written_in_slabs_are_chunk_for_chunk_those_written_one_by_one(tmp_path, most, order):
    """A tiled step's tiles held and written in slabs (``tile_writer``): the same chunk
    files as a ``write_region`` per tile, in the grid order steps make them (whole bands
    of tiles per slab) and in any other (tiles that do not make one rectangle are
    written one by one); nothing is written before ``close`` that is not complete."""
    from subzero.capture.tiles import tiles_for
    from subzero.storage import arrays as arrays_mod
    shape = (13, 10, 3)
    value = (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 0.5) % 7
    tiles = [t.core_slices() for t in tiles_for(shape, 4)]
    if order == "shuffled":
        tiles = [tiles[k] for k in np.random.default_rng(1).permutation(len(tiles))]
    one = ArrayStore(tmp_path / "a" / "runs" / "7", tile=4)
    one.create("x", shape, np.float64)
    for region in tiles:
        one.write_region("x", region, value[region])
    arrays_mod.FILL_SLAB_BYTES, was = most, arrays_mod.FILL_SLAB_BYTES
    try:
        slabbed = ArrayStore(tmp_path / "b" / "runs" / "7", tile=4)
        slabbed.create("x", shape, np.float64)
        writer = slabbed.tile_writer("x")
    finally:
        arrays_mod.FILL_SLAB_BYTES = was
    for region in tiles:
        writer.add(region, value[region].copy())
    writer.close()
    a, b = one.path("x"), slabbed.path("x")
    assert grid_files(a) == grid_files(b)
    for f in grid_files(a):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    np.testing.assert_array_equal(slabbed.read_value("x"), value)


def legacy_write(arrays, name, value):
    """An array as today's main writes it: no crc32c codec, no digests, empty chunks skipped."""
    p = arrays.path(name)
    p.parent.mkdir(parents=True, exist_ok=True)
    ds = xr.DataArray(value).to_dataset(name="data")
    ds.attrs = {"subzero_name": name, "subzero_numpy": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(p, mode="w-", encoding={"data": {"chunks": (4, 4)}}, zarr_format=3,
                   consolidated=False)
    return p


def test_arrays_written_before_checksums_still_read(arrays):
    x = np.zeros((8, 8))
    x[:4, :4] = np.arange(16.0).reshape(4, 4)
    p = legacy_write(arrays, "old", x)
    assert not sums_file(p).exists() and not arrays.checksummed("old")
    np.testing.assert_array_equal(arrays.read_value("old"), x)
    np.testing.assert_array_equal(arrays.read_region("old", (slice(2, 6), slice(2, 6))), x[2:6, 2:6])
    garble(p / "data/c/0/0", at=8, n=8)              # no checksum: zstd finds it, we name it
    with pytest.raises(CorruptArray, match=r"array 'old' of run 7 is damaged: cannot read .*old\.zarr"):
        arrays.read_value("old")


def test_checksummed_array_without_digest_file_is_damage_not_legacy(arrays):
    arrays.write("x", np.ones((3, 3)))
    sums_file(arrays.path("x")).unlink()
    with pytest.raises(CorruptArray, match=r"checksum file .*arrays/x\.sums\.json is missing"):
        arrays.read_region("x", (slice(0, 1), slice(0, 1)))


# -- through a run, the CLI and the trace -------------------------------------------------

@pytest.fixture
def example_run(store):
    return store.run(EXAMPLE, tile=32, strategies={"stars": "blackbox"})


def test_deleted_input_chunk_of_a_reexecution_is_an_error_not_count_0(example_run, cli, store):
    """The issue's case: black-box re-execution used to run on fill values and answer
    ``"count": 0``; now the trace stops with one line naming the chunk file."""
    run = example_run
    assert len(run.trace("stars", [(40, 70)], to="clean")) > 0
    chunk = stored_path(run.dir, "clean") / "data" / "c" / "1" / "2"
    chunk.unlink()
    store.close()
    code, out, err = cli("trace", "--store", store.path, "--run", run.id, "--from", "stars",
                         "--cells", "40,70", "--to", "clean", "--json")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"array 'clean' of run {run.id} is damaged" in lines[0]
    assert str(chunk) in lines[0] and "is missing" in lines[0]


def test_garbled_chunk_is_named_not_an_internal_error(example_run, cli, store):
    run = example_run
    garble(stored_path(run.dir, "raw") / "data" / "c" / "0" / "0", at=40, n=8)
    store.close()
    code, _, err = cli("trace", "--store", store.path, "--run", run.id, "--from", "calib",
                       "--cells", "3,3", "--to", "raw")
    assert code == 2 and "internal error" not in err
    assert f"array 'raw' of run {run.id} is damaged: chunk file" in err and "fails its checksum" in err
    assert "/inputs/" in err                # the store's copy, which every run of it reads


def test_damaged_metadata_of_an_array_a_run_reads(example_run, store):
    run = example_run
    shutil.copy(stored_path(run.dir, "flat") / "zarr.json", run.dir / "saved.json")
    (stored_path(run.dir, "flat") / "zarr.json").write_text("{}")
    with pytest.raises(CorruptArray, match=r"array 'flat' of run \d+ .*is damaged: its metadata file "
                                           r".*\.zarr/zarr\.json fails its checksum"):
        run.array("flat")
    shutil.copy(run.dir / "saved.json", stored_path(run.dir, "flat") / "zarr.json")
    assert run.array("flat").shape == (64, 96)


# -- Spark: region-written arrays -----------------------------------------------------------

def test_spark_region_written_array_is_checksummed(spark, store):
    run = store.run(EXAMPLE, engine="spark", spark=spark, tile=32, progress=False,
                    strategies={"stars": "blackbox"})
    p = stored_path(run.dir, "smooth")             # a tile operator: written tile by tile
    meta = json.loads((p / "data" / "zarr.json").read_text())
    assert "crc32c" in [c["name"] for c in meta["codecs"]] and sums_file(p).exists()
    assert len([f for f in grid_files(p / "data") if f.startswith("c")]) == 2 * 3
    want = run.array("smooth").values
    mine = ArrayStore(run.dir, run_uid=run.row.uid)
    np.testing.assert_array_equal(mine.read_region("smooth", (slice(0, 64), slice(0, 96))), want)
    (p / "data" / "c" / "1" / "0").unlink()
    with pytest.raises(CorruptArray, match=r"array 'smooth' of run \d+ is damaged: chunk file "
                                           r".*smooth\.zarr/data/c/1/0 is missing"):
        run.array("smooth")
    res = store.get(run.id).trace("calib", [(40, 10)], to="smooth")
    with pytest.raises(subzero.SubZeroError, match="smooth.zarr/data/c/1/0 is missing"):
        np.asarray(res.values)
