"""Inputs read region by region: .npy and FITS files (and any object with shape,
dtype and read_region) go into a run a tile at a time -- on Spark by the executors
-- and never whole through the driver."""

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


def test_labelled_and_table_inputs_are_still_loaded_whole(tmp_path):
    import xarray as xr
    xr.DataArray(np.ones((3, 4)), dims=("t", "lat")).to_dataset(name="v").to_netcdf(tmp_path / "a.nc")
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
