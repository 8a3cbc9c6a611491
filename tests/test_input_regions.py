"""Inputs read region by region: .npy and FITS files, NetCDF and Zarr variables
(with their labels), and any object with shape, dtype and read_region go into a run
a tile at a time -- on Spark by the executors -- and never whole through the driver."""

import numpy as np
import pytest

from subzero import Workflow
from subzero.operators import MeanFilter, Mul
from subzero.storage.inputs import RegionSource, load_path, open_input


class NeverWhole:
    """An input that refuses to be loaded whole: only regions may be read."""

    def __init__(self, data):
        self._data = data
        self.shape, self.dtype = data.shape, data.dtype
        self.regions = 0

    def read_region(self, region):
        return np.array(self._data[region])

    def __array__(self, dtype=None, copy=None):
        raise AssertionError("the whole input was loaded")


def wf():
    w = Workflow("regions")
    a = w.input("a")
    w.add("out", Mul(), w.add("smooth", MeanFilter(size=3, mode="reflect"), a), a)
    return w


@pytest.mark.parametrize("dtype", [">i2", "<f4", ">f8", "uint16"])
def test_file_regions_equal_the_whole_file(tmp_path, dtype):
    from astropy.io import fits
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(37, 23)) * 1000).astype(dtype)
    np.save(tmp_path / "a.npy", x)
    fits.PrimaryHDU(x).writeto(tmp_path / "a.fits")        # uint16: stored with BZERO
    for name in ("a.npy", "a.fits"):
        src = open_input(tmp_path / name, "a")
        assert isinstance(src, RegionSource), name
        whole = np.asarray(load_path(tmp_path / name, "a"))
        assert src.shape == whole.shape and src.dtype == whole.dtype.newbyteorder("=")
        for reg in (np.s_[0:5, 0:23], np.s_[30:37, 7:8], np.s_[11:29, 3:19]):
            part = src.read_region(reg)
            assert part.dtype.isnative and np.array_equal(part, whole[reg]), (name, reg)


def labelled(shape=(30, 26)):
    import pandas as pd
    import xarray as xr
    rng = np.random.default_rng(5)
    return xr.Dataset({"t2m": (("time", "lat"), rng.normal(size=shape).astype("<f4"),
                               {"units": "K"}),
                       "mask": (("time", "lat"), rng.random(shape) > 0.5)},
                      coords={"time": pd.date_range("2026-01-01", periods=shape[0]),
                              "lat": np.linspace(-60, 60, shape[1])})


@pytest.mark.parametrize("fmt", ["nc", "zarr"])
def test_a_labelled_variable_is_read_region_by_region_with_its_labels(tmp_path, fmt):
    """A NetCDF/Zarr variable: a region source (nothing read but metadata and its
    labels), whose regions, labels and content digest are those of the variable loaded
    whole; a run of it equals a run of the DataArray given in memory."""
    import subzero
    from subzero.storage.inputs import input_digest
    ds = labelled()
    path = tmp_path / f"c.{fmt}"
    ds.to_netcdf(path) if fmt == "nc" else ds.to_zarr(path, zarr_format=2, consolidated=False)
    src = open_input(f"{path}:t2m", "a")
    assert isinstance(src, RegionSource) and src.labelled
    whole = load_path(f"{path}:t2m", "a")
    for reg in (np.s_[0:5, 0:26], np.s_[17:30, 3:4]):
        assert np.array_equal(src.read_region(reg), whole.values[reg])
    assert list(src.coords) == ["time", "lat"] and src.attrs == {"units": "K"}
    assert input_digest(f"{path}:t2m", "a") == input_digest(whole, "a")
    with subzero.open_store(tmp_path / "s") as st:
        run = st.run(wf(), inputs={"a": f"{path}:t2m"}, tile=8, progress=False, engine="local")
        ref = st.run(wf(), inputs={"a": whole}, tile=8, progress=False, engine="local")
        for name in ("a", "smooth", "out"):
            got, want = run.array(name), ref.array(name)
            assert got.values.tobytes() == want.values.tobytes(), name
        assert run.array("a").identical(ref.array("a"))           # labels and attrs too
        assert st.input_digests(run.id)["a"] == st.input_digests(ref.id)["a"]


def test_tables_and_labels_other_than_the_dims_are_still_loaded_whole(tmp_path):
    import xarray as xr
    xr.DataArray(np.ones((3, 4)), dims=("t", "lat"),
                 coords={"aux": (("t", "lat"), np.zeros((3, 4)))}).to_dataset(name="v") \
        .to_netcdf(tmp_path / "a.nc")
    assert isinstance(open_input(tmp_path / "a.nc", "a"), xr.DataArray)
    with pytest.raises(Exception, match="file not found"):
        open_input(tmp_path / "missing.npy", "a")
    (tmp_path / "fake.npy").write_text("not numpy")
    with pytest.raises(Exception, match="not a NumPy .npy file"):
        open_input(tmp_path / "fake.npy", "a")


def test_local_engine_copies_inputs_tile_by_tile(store):
    x = np.random.default_rng(1).normal(size=(41, 29))
    run = store.run(wf(), inputs={"a": NeverWhole(x)}, tile=8)
    ref = store.run(wf(), inputs={"a": x}, tile=8)
    assert np.array_equal(run.array("a").values, x)
    assert np.array_equal(run.array("out").values, ref.array("out").values)
    assert run.trace("out", [(3, 3)], to="a").cells.tolist() == \
        ref.trace("out", [(3, 3)], to="a").cells.tolist()


def test_spark_executors_read_the_inputs(spark, store, tmp_path):
    from astropy.io import fits
    x = (np.random.default_rng(2).normal(size=(33, 45)) * 100).astype(">i2")
    fits.PrimaryHDU(x).writeto(tmp_path / "a.fits")
    run = store.run(wf(), inputs={"a": str(tmp_path / "a.fits")}, engine="spark", spark=spark,
                    tile=16, progress=False)
    ref = store.run(wf(), inputs={"a": x.astype("<i2")}, tile=16)
    log = (run.dir / "run.log").read_text()
    assert "inputs a: 9 tile(s) in 9 task(s), read from their sources on the executors" in log
    assert run.array("a").attrs["NAXIS"] == 2
    for name in ("a", "smooth", "out"):
        assert np.array_equal(run.array(name).values, ref.array(name).values), name
    y = np.random.default_rng(4).normal(size=(20, 20))
    run = store.run(wf(), inputs={"a": NeverWhole(y)}, engine="spark", spark=spark, tile=7,
                    progress=False)
    assert np.array_equal(run.array("a").values, y)
    labelled().to_netcdf(tmp_path / "c.nc")          # a NetCDF variable, labels and all
    run = store.run(wf(), inputs={"a": f"{tmp_path / 'c.nc'}:t2m"}, engine="spark", spark=spark,
                    tile=8, progress=False)
    ref = store.run(wf(), inputs={"a": f"{tmp_path / 'c.nc'}:t2m"}, tile=8, progress=False)
    assert "inputs a: 16 tile(s) in 16 task(s)" in (run.dir / "run.log").read_text()
    for name in ("a", "smooth", "out"):
        assert run.array(name).identical(ref.array(name)), name


def test_tiled_astronomy_input_regions():
    from subzero.workflows import astronomy
    t = astronomy.TiledInput("raw_2", (2, 3))
    whole = np.asarray(t)
    assert whole.shape == t.shape and whole.dtype == t.dtype
    for reg in (np.s_[0:5, 0:7], np.s_[1990:2100, 500:1100], np.s_[3000:4001, 1000:1525]):
        assert np.array_equal(t.read_region(reg), whole[reg])


def test_memo_makes_once_keeps_read_only_and_forgets_the_oldest():
    from subzero.storage.inputs import memo
    calls = []

    def make(k):
        calls.append(k)
        return np.full(3, k)
    a = memo(("test-memo", 0), lambda: make(0))
    assert memo(("test-memo", 0), lambda: make(0)) is a and calls == [0]
    with pytest.raises(ValueError):
        a[0] = 5                                    # shared between tasks: read-only
    for k in range(1, 10):                          # eight are kept
        memo(("test-memo", k), lambda k=k: make(k))
    memo(("test-memo", 0), lambda: make(0))
    assert calls == list(range(10)) + [0]
