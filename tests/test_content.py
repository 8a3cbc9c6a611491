"""Content digests (issue 29): the same values, shape, type and labels give the same
digest wherever they come from -- any file format, byte order, memory layout, region
by region or whole -- and any change of a cell, the shape, the type or a label gives
another.  Memory follows one band, not the array."""

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from subzero.model import content
from subzero.model.grid import Grid
from subzero.storage.inputs import open_input

DTYPES = st.sampled_from(["<f8", ">f8", "<f4", ">i2", "<i8", "|u1", "|b1", "<c16", "<U3", "|S2",
                          "<M8[s]"])


def arrays(min_side=0):
    return DTYPES.flatmap(lambda dt: hnp.arrays(
        np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=4, min_side=min_side, max_side=6)))


class Regions:
    """An array read region by region, counting the cells each read returns."""

    def __init__(self, a):
        self.a, self.shape, self.dtype, self.reads = a, a.shape, a.dtype, []

    def read_region(self, region):
        part = self.a[region]
        self.reads.append(part.size)
        return np.array(part)


@settings(max_examples=150, deadline=None)
@given(arrays())
def test_layout_byte_order_and_reading_region_by_region_do_not_change_it(a):
    d = content.digest(a)
    assert content.is_digest(d)
    assert content.digest(a.copy(order="F")) == d
    assert content.digest(a.astype(a.dtype.newbyteorder("S"))) == d
    assert content.digest(Regions(a)) == d
    if a.ndim:
        assert content.digest(a[::-1].copy()[::-1]) == d          # a view with negative strides


@settings(max_examples=150, deadline=None)
@given(arrays(min_side=1), st.data())
def test_any_cell_changed_changes_it(a, data):
    idx = tuple(data.draw(st.integers(0, n - 1)) for n in a.shape)
    b = a.copy()
    if a.dtype.kind == "b":
        b[idx] = not b[idx]
    elif a.dtype.kind in "US":
        b[idx] = "z" if a.dtype.kind == "U" else b"z"
        if b[idx] == a[idx]:
            b[idx] = "y" if a.dtype.kind == "U" else b"y"
    elif a.dtype.kind == "M":
        b[idx] = a[idx] + np.timedelta64(1, "s") if not np.isnat(a[idx]) else np.datetime64(0, "s")
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            b[idx] = 1 if np.all(a[idx] != 1) else 2
    assert content.digest(b) != content.digest(a)


def test_shape_type_and_labels_are_content():
    a = np.arange(12, dtype="<i4")
    d = content.digest(a)
    assert content.digest(a.reshape(3, 4)) != d                   # the same bytes, another shape
    assert content.digest(a.view("<f4")) != d                     # the same bytes, another type
    g = Grid(("y", "x"), {"x": np.arange(4) * 0.5})
    m = a.reshape(3, 4)
    assert content.digest(m, g) != content.digest(m)
    assert content.digest(m, g) != content.digest(m, Grid(("y", "x"), {"x": np.arange(4) * 0.25}))
    assert content.digest(m, Grid(("y", "x"))) != content.digest(m)
    assert content.digest(m, Grid(("dim_0", "dim_1"))) == content.digest(m)   # numpy's own names
    wcs = {"CTYPE1": "RA---TAN", "CTYPE2": "DEC--TAN", "CRVAL1": 10.0, "CRVAL2": 20.0}
    moved = dict(wcs, CRVAL1=10.0 + 1e-12)
    assert content.digest(m, Grid(("y", "x"), wcs=wcs)) != content.digest(m, Grid(("y", "x"), wcs=moved))


def test_every_nan_is_the_same_nan_but_minus_zero_is_not_zero():
    a = np.array([1.0, np.nan, 3.0])
    b = a.copy()
    b.view(np.uint64)[1] = 0x7FF8DEADBEEF0001                       # another NaN payload
    assert np.isnan(b[1]) and content.digest(a) == content.digest(b)
    assert content.digest(np.array([0.0])) != content.digest(np.array([-0.0]))


def test_object_arrays_have_none():
    with pytest.raises(content.ContentError, match="no content digest"):
        content.digest(np.array([object()]))


def test_bands_bound_memory_and_do_not_depend_on_tiling():
    a = np.random.default_rng(0).random((3000, 700))               # 16.8 MB: 5 bands
    src = Regions(a)
    d = content.digest(src)
    banding = content.Banding.of(a.shape, a.dtype)
    assert banding.count >= 4 and len(src.reads) == banding.count
    assert max(src.reads) * 8 <= content.BAND_BYTES
    # bands digested anywhere (a Spark task each, say) and combined give the same digest
    parts = [content.band_digest(a[r], banding.dtype) for r in reversed(list(banding.bands()))][::-1]
    assert content.combine(content.header(banding, {}), parts) == d


@pytest.mark.filterwarnings("ignore:Consolidated metadata")
def test_the_same_image_from_npy_fits_zarr_and_memory(tmp_path):
    from astropy.io import fits
    a = np.random.default_rng(1).normal(size=(40, 30)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    fits.PrimaryHDU(a.astype(">f4")).writeto(tmp_path / "a.fits")
    xr.DataArray(a).to_dataset(name="v").to_zarr(tmp_path / "a.zarr")
    want = content.digest(a)
    for f in ("a.npy", "a.fits", "a.zarr"):
        src = open_input(tmp_path / f)
        values = src.values if isinstance(src, xr.DataArray) else src
        assert content.digest(values) == want, f
