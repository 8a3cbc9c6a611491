"""Lineage in the user's own coordinates: sky positions through the FITS WCS the LSST
exposures carry, and xarray labels of NetCDF inputs.

Oracles are independent of SubZero's grid code: astropy's WCS read straight from the
FITS file on disk, and xarray's own ``.sel`` on the input DataArray."""

import json

import numpy as np
import pytest
import xarray as xr
from astropy import units as u
from astropy.coordinates import SkyCoord
from astropy.io import fits
from astropy.wcs import WCS
from conftest import ROOT

import subzero
from subzero import Workflow
from subzero.errors import QueryError
from subzero.model.grid import Grid
from subzero.operators import Pad, Reduce, Slice, Transpose, Unary

FITS = ROOT / "workflows" / "data" / "lsst" / "imsim_85408556_R23_S11_C04_E000.fits"


@pytest.fixture(scope="module")
def astro(tmp_path_factory):
    st = subzero.open_store(tmp_path_factory.mktemp("coords") / "s")
    run = st.run("subzero.workflows.astronomy", progress=False)
    yield st, run
    st.close()


@pytest.fixture(scope="module")
def peak(astro):
    """The brightest star's peak pixel, from the arrays themselves."""
    _, run = astro
    labels = run.array("stars").values
    image = run.array("combine").values
    return tuple(int(v) for v in np.unravel_index(np.argmax(np.where(labels > 0, image, -np.inf)),
                                                  labels.shape))


def _file_wcs():
    with fits.open(FITS) as h:
        return WCS(h[0].header)


def test_inputs_and_derived_arrays_carry_the_files_wcs(astro):
    _, run = astro
    truth = _file_wcs()
    ys, xs = np.array([0, 17, 1162, 2000]), np.array([0, 300, 112, 512])
    want = truth.pixel_to_world(xs, ys)
    for name in ("raw_1", "calibrated_1" if "calibrated_1" in run.shapes() else "flat_1", "stars"):
        da = run.array(name)
        assert da.dims == ("y", "x") and da.attrs["CTYPE1"] == "RA---TAN"
        got = WCS(fits.Header({k: v for k, v in run.grid(name).wcs.items()})).pixel_to_world(xs, ys)
        assert np.all(got.separation(want).arcsec < 1e-6), name


def test_sky_position_names_the_pixel_it_falls_in(astro, peak):
    _, run = astro
    sky = _file_wcs().pixel_to_world(peak[1] + 0.3, peak[0] - 0.4)     # inside the peak pixel
    assert run.cells_at("stars", sky=(sky.ra.deg, sky.dec.deg)).tolist() == [list(peak)]
    hms = sky.to_string("hmsdms", sep=":", precision=3).split()
    assert run.cells_at("stars", sky=",".join(hms)).tolist() == [list(peak)]
    nearby = _file_wcs().pixel_to_world(peak[1] + 1, peak[0])
    assert run.cells_at("stars", sky=nearby).tolist() != [list(peak)]      # a SkyCoord works


def test_trace_from_the_sky_equals_the_trace_from_cells(astro, peak):
    _, run = astro
    sky = _file_wcs().pixel_to_world(peak[1], peak[0])
    by_sky = run.trace("stars", sky=(sky.ra.deg, sky.dec.deg), to="raw_1", record=False)
    by_cell = run.trace("stars", [peak], to="raw_1", record=False)
    assert len(by_sky) > 1 and np.array_equal(by_sky.cells, by_cell.cells)


def test_radius_selects_every_pixel_centre_within_it(astro, peak):
    _, run = astro
    truth = _file_wcs()
    centre = truth.pixel_to_world(peak[1], peak[0])
    for radius in ("1.3arcsec", 0.7, "0.05arcsec"):
        got = run.cells_at("stars", sky=centre, radius=radius)
        r = (float(radius) * u.arcsec if isinstance(radius, float) else u.Quantity(radius))
        yy, xx = np.mgrid[peak[0] - 20:peak[0] + 21, peak[1] - 20:peak[1] + 21]
        inside = truth.pixel_to_world(xx.ravel(), yy.ravel()).separation(centre) <= r
        want = {(int(a), int(b)) for a, b in zip(yy.ravel()[inside], xx.ravel()[inside])} | {peak}
        assert {tuple(c) for c in got.tolist()} == want, radius


def test_the_answer_reports_its_sky_region(astro, peak):
    _, run = astro
    res = run.trace("stars", [peak], to="raw_1", record=False)
    region = res.sky_region()
    lo, hi = res.cellset.bounds()
    truth = _file_wcs()
    corners = truth.pixel_to_world(np.array([lo[1], hi[1], hi[1], lo[1]]) - 0.5,
                                   np.array([lo[0], lo[0], hi[0], hi[0]]) - 0.5)
    got = SkyCoord(np.array(region["corners"])[:, 0] * u.deg, np.array(region["corners"])[:, 1] * u.deg)
    assert np.all(got.separation(corners).arcsec < 1e-6)
    assert region["ra"][0] <= region["center"][0] <= region["ra"][1]


def test_sky_errors_name_the_problem(astro, cli):
    st, run = astro
    with pytest.raises(QueryError, match="outside array 'stars'.*covers RA"):
        run.cells_at("stars", sky=(10.0, 10.0))
    with pytest.raises(QueryError, match="'overscanmean_1' has no sky coordinates"):
        run.cells_at("overscanmean_1", sky=(357.3, -2.75))
    with pytest.raises(QueryError, match="cannot read sky position"):
        run.cells_at("stars", sky="north of Orion")
    with pytest.raises(QueryError, match="cannot read radius"):
        run.cells_at("stars", sky=(357.3, -2.75), radius="3 parsec")
    code, out, err = cli("trace", "--store", st.path, "--from", "stars", "--sky", "10,10", "--to", "raw_1")
    assert code == 2 and out == "" and err.count("\n") == 1 and "outside array 'stars'" in err


def test_cli_sky_trace_prints_and_returns_the_sky_region(astro, peak, cli):
    st, run = astro
    sky = _file_wcs().pixel_to_world(peak[1], peak[0])
    code, out, err = cli("trace", "--store", st.path, "--from", "stars", "--to", "raw_1",
                         "--sky", f"{sky.ra.deg},{sky.dec.deg}", "--radius", "1arcsec", "--json")
    assert code == 0, err
    doc = json.loads(out)
    want = run.trace("stars", sky=sky, radius="1arcsec", to="raw_1", record=False)
    assert doc["count"] == len(want) and doc["cells_in"] == len(run.cells_at("stars", sky=sky, radius=1.0))
    assert doc["sky"] == want.sky_region()
    code, out, _ = cli("trace", "--store", st.path, "--from", "stars", "--to", "raw_1",
                       "--sky", f"{sky.ra.deg},{sky.dec.deg}")
    assert code == 0 and "sky region: centre 23h" in out


# -- a Slice moves the WCS with its pixels -------------------------------------------------

def _fits_input(tmp_path, header_kind: str):
    hdr = fits.Header()
    hdr.update({"CTYPE1": "RA---TAN", "CTYPE2": "DEC--TAN", "CRPIX1": 20.5, "CRPIX2": 11.0,
                "CRVAL1": 150.0, "CRVAL2": 2.2, "RADESYS": "ICRS"})
    if header_kind == "cd":
        hdr.update({"CD1_1": -5.5e-5, "CD1_2": 1.1e-5, "CD2_1": 1.2e-5, "CD2_2": 5.4e-5})
    else:
        hdr.update({"CDELT1": -5.5e-5, "CDELT2": 5.4e-5, "PC1_1": 0.98, "PC1_2": 0.2,
                    "PC2_1": -0.21, "PC2_2": 0.97})
    data = np.arange(60 * 45, dtype=np.float32).reshape(60, 45)
    path = tmp_path / f"img_{header_kind}.fits"
    fits.PrimaryHDU(data, hdr).writeto(path)
    return path, WCS(hdr)


@pytest.mark.parametrize("kind", ["cd", "pc"])
def test_slices_and_pads_move_the_wcs_with_their_pixels(store, tmp_path, kind):
    path, truth = _fits_input(tmp_path, kind)
    wf = Workflow("cut")
    x = wf.input("img")
    wf.add("cut", Slice(np.s_[7:52:2, 40:3:-3]), x)
    wf.add("padded", Pad(((4, 1), (2, 3))), x)
    wf.add("flipped", Transpose(), x)
    wf.add("colmean", Reduce("mean", axis=0), x)
    run = store.run(wf, inputs={"img": str(path)}, progress=False)
    q = np.array([[0, 0], [5, 9], [22, 12], [13, 4]])                 # cut cells (y, x)
    cut = WCS(fits.Header(dict(run.grid("cut").wcs))).pixel_to_world(q[:, 1], q[:, 0])
    src = truth.pixel_to_world(40 - 3 * q[:, 1], 7 + 2 * q[:, 0])
    assert np.all(cut.separation(src).arcsec < 1e-6)
    pad = WCS(fits.Header(dict(run.grid("padded").wcs))).pixel_to_world(q[:, 1] + 2, q[:, 0] + 4)
    assert np.all(pad.separation(truth.pixel_to_world(q[:, 1], q[:, 0])).arcsec < 1e-6)
    assert run.grid("flipped") is None and run.grid("colmean") is None
    assert np.array_equal(run.array("cut").values, fits.getdata(path)[7:52:2, 40:3:-3])


# -- labelled axes ---------------------------------------------------------------------

@pytest.fixture
def cube(store, tmp_path):
    time = np.array(np.arange(6), "timedelta64[D]") + np.datetime64("2020-01-01")
    da = xr.DataArray(np.random.default_rng(5).normal(size=(6, 9, 8)).astype("float32"),
                      dims=("time", "lat", "lon"),
                      coords={"time": time, "lat": np.linspace(-20.0, 20.0, 9),
                              "lon": np.arange(8) * 45.0}, name="t2m")
    path = tmp_path / "t2m.nc"
    da.to_netcdf(path)
    wf = Workflow("climate")
    x = wf.input("t2m")
    wf.add("kelvin", Unary(lambda v: v + 273.15), x)
    wf.add("mean_t", Reduce("mean", axis=0), "kelvin")
    wf.add("box", Slice(np.s_[:, 2:7, ::2]), "kelvin")
    run = store.run(wf, inputs={"t2m": str(path)}, progress=False)
    return da, run


def _sel_cells(da, **sel):
    """xarray's own answer: the positions .sel keeps, as cells."""
    idx = xr.DataArray(np.arange(da.size).reshape(da.shape), dims=da.dims, coords=da.coords)
    flat = np.atleast_1d(idx.sel(**sel).values).ravel()
    return {tuple(int(v) for v in np.unravel_index(f, da.shape)) for f in flat}


def test_label_selection_equals_xarray_sel(cube):
    da, run = cube
    for sel, xsel in [({"time": "2020-01-03"}, {"time": "2020-01-03"}),
                      ({"lat": slice("-5", "10")}, {"lat": slice(-5, 10)}),
                      ({"time": slice("2020-01-02", "2020-01-04"), "lon": "90"},
                       {"time": slice("2020-01-02", "2020-01-04"), "lon": 90.0})]:
        for name in ("t2m", "kelvin"):                    # stored and derived labels
            got = {tuple(c) for c in run.cells_at(name, sel=sel).tolist()}
            assert got == _sel_cells(da, **xsel), (name, sel)
    got = {tuple(c) for c in run.cells_at("kelvin", sel={"lat": "11.1"}).tolist()}
    assert got == _sel_cells(da, lat=11.1, method="nearest")


def test_labels_follow_reductions_and_slices(cube):
    da, run = cube
    mean_t = run.array("mean_t")
    assert mean_t.dims == ("lat", "lon") and np.array_equal(mean_t["lon"], da["lon"])
    box = run.array("box")
    assert np.array_equal(box["lat"], da["lat"][2:7]) and np.array_equal(box["lon"], da["lon"][::2])
    res = run.trace("t2m", sel={"time": "2020-01-05", "lat": slice(0, 5), "lon": 90}, to="box",
                    record=False)
    assert res.label_region() == {"time": ["2020-01-05T00:00:00", "2020-01-05T00:00:00"],
                                  "lat": [0.0, 5.0], "lon": [90.0, 90.0]}
    back = run.trace("mean_t", sel={"lat": -10, "lon": slice("0", "45")}, to="t2m", record=False)
    assert {tuple(c) for c in back.cells.tolist()} == _sel_cells(da, lat=-10, lon=slice(0, 45))


def test_label_errors_name_the_problem(cube, store, cli):
    _, run = cube
    with pytest.raises(QueryError, match="no coordinate 'depth'.*labelled: time, lat, lon"):
        run.cells_at("kelvin", sel={"depth": "3"})
    with pytest.raises(QueryError, match="lat=40 is outside"):
        run.cells_at("kelvin", sel={"lat": "40"})
    with pytest.raises(QueryError, match="selects no cells"):
        run.cells_at("kelvin", sel={"lat": slice("21", "30")})
    with pytest.raises(QueryError, match="not a datetime64"):
        run.cells_at("kelvin", sel={"time": "yesterday-ish"})
    code, out, err = cli("trace", "--store", store.path, "--from", "kelvin", "--sel", "lat", "--to", "t2m")
    assert code == 2 and "cannot read selection 'lat'" in err
    code, out, err = cli("trace", "--store", store.path, "--from", "kelvin", "--sel", "time=2020-01-03",
                         "--sel", "lat=-5:5", "--to", "mean_t")
    assert code == 0, err
    assert "labels: lat -5.0..5.0, lon 0.0..315.0" in out


@pytest.mark.parametrize("sel", [{"lat": "nan"}, {"lat": "inf"}, {"lat": "1e400"},
                                 {"lat": slice("-inf", "5")}, {"time": "NaT"}, {"time": "nan"}])
def test_a_label_that_is_no_number_or_time_is_refused(cube, sel):
    """NaN, infinity or NaT have no nearest label: they were answered with the first
    label's cells (a silent wrong answer); now they are one clear error."""
    _, run = cube
    with pytest.raises(QueryError, match="is not a (float64|datetime64)"):
        run.cells_at("kelvin", sel=sel)


@pytest.mark.parametrize("sky", ["nan,-2.75", "357.3,inf", "1e400,5"])
def test_a_sky_position_that_is_no_number_is_refused(astro, sky, cli):
    st, run = astro
    with pytest.raises(QueryError, match="RA and Dec must be finite numbers"):
        run.cells_at("stars", sky=sky)
    code, out, err = cli("trace", "--store", st.path, "--from", "stars", "--sky", sky, "--to", "raw_1")
    assert code == 2 and err.count("\n") == 1 and "must be finite numbers" in err


def test_grid_slicing_arithmetic_matches_astropy():
    g = Grid(("y", "x"), {}, {"CTYPE1": "RA---TAN", "CTYPE2": "DEC--TAN", "CRPIX1": 3.0, "CRPIX2": -7.5,
                              "CRVAL1": 10.0, "CRVAL2": -30.0, "CD1_1": 1e-4, "CD1_2": 0.0,
                              "CD2_1": 0.0, "CD2_2": 1e-4})
    cut = g.sliced([5, 90], [3, -2], [10, 20], [0, 1])
    a, b = WCS(fits.Header(dict(g.wcs))), WCS(fits.Header(dict(cut.wcs)))
    ys, xs = np.array([0, 4, 9]), np.array([0, 7, 19])
    assert np.all(b.pixel_to_world(xs, ys).separation(a.pixel_to_world(90 - 2 * xs, 5 + 3 * ys)).arcsec
                  < 1e-6)


def test_show_lists_what_each_array_can_be_queried_by(astro, cube, store, cli):
    st, _ = astro
    code, out, _ = cli("show", "--store", st.path)
    assert code == 0 and "sky coordinates (--sky) on 26 of 31 arrays; not on bias" in out
    code, out, _ = cli("show", "--store", st.path, "--json")
    coords = json.loads(out)["coordinates"]
    assert coords["stars"] == {"dims": ["y", "x"], "labels": [], "sky": True}
    assert coords["overscanmean_1"]["sky"] is False
    code, out, _ = cli("show", "--store", store.path)
    assert "labelled axes (--sel): t2m (time, lat, lon); kelvin (time, lat, lon); mean_t (lat, lon)" in out


@pytest.mark.parametrize("given", ["dataarray", "zarr"])
def test_labels_of_dataarray_and_zarr_inputs(store, tmp_path, given):
    da = xr.DataArray(np.arange(20.0).reshape(4, 5), dims=("gene", "patient"),
                      coords={"gene": ["MYC", "OTX2", "TP53", "SHH"],
                              "patient": [f"MD_{k}" for k in range(101, 106)]})
    value = da
    if given == "zarr":
        value = str(tmp_path / "m.zarr")
        da.to_dataset(name="m").to_zarr(value, zarr_format=3, consolidated=False)
    wf = Workflow("genes")
    wf.add("scaled", Unary(lambda v: 2 * v), wf.input("m"))
    run = store.run(wf, inputs={"m": value}, progress=False)
    res = run.trace("scaled", sel={"gene": "TP53", "patient": slice("MD_102", "MD_104")}, to="m",
                    record=False)
    assert res.cells.tolist() == [[2, 1], [2, 2], [2, 3]]
    assert res.label_region() == {"gene": ["TP53", "TP53"], "patient": ["MD_102", "MD_104"]}
    with pytest.raises(QueryError, match="no gene label 'BRCA1' \\(its labels: MYC, OTX2, TP53, SHH\\)"):
        run.cells_at("scaled", sel={"gene": "BRCA1"})


def test_workload_queries_in_sky_and_label_terms(astro, cube, peak):
    from subzero.query.workload import parse_workload, run_workload
    _, run = astro
    sky = _file_wcs().pixel_to_world(peak[1], peak[0])
    qs = parse_workload({"queries": [{"name": "star", "from": "stars", "to": "raw_1",
                                      "cells": {"sky": f"{sky.ra.deg},{sky.dec.deg}", "radius": 0.5}}]})
    (row,) = run_workload(run, qs, record=False)
    assert row["cells_in"] == len(run.cells_at("stars", sky=sky, radius=0.5)) > 1
    assert np.array_equal(row["result"].cells,
                          run.trace("stars", sky=sky, radius=0.5, to="raw_1", record=False).cells)
    da, crun = cube
    qs = parse_workload({"queries": [{"name": "day", "from": "t2m", "to": "mean_t",
                                      "cells": {"sel": {"time": "2020-01-02", "lat": "-5:5"}}}]})
    (row,) = run_workload(crun, qs, record=False)
    assert row["cells_in"] == len(_sel_cells(da, time="2020-01-02", lat=slice(-5, 5)))


# -- property-based: grids against astropy and xarray -------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402


@hs.composite
def _axis_slice(draw, n):
    """A slice of an axis of length n that keeps at least one cell (any step sign)."""
    step = draw(hs.sampled_from([1, 2, 3, -1, -2, 5]))
    a = draw(hs.integers(0, n - 1))
    k = draw(hs.integers(1, 12))
    b = a + step * k
    return slice(a, b if b >= 0 else None, step)


@settings(max_examples=60, deadline=None)
@given(ys=_axis_slice(40), xs=_axis_slice(30), cd=hs.booleans(),
       m=hs.lists(hs.floats(-2e-4, 2e-4).filter(lambda v: abs(v) > 1e-6), min_size=4, max_size=4))
def test_any_slice_keeps_every_pixel_on_its_sky_position(ys, xs, cd, m):
    """Property: pixel q of x[ys, xs] is at the sky position of the input pixel it copies."""
    hdr = {"CTYPE1": "RA---TAN", "CTYPE2": "DEC--TAN", "CRPIX1": 7.5, "CRPIX2": -3.0,
           "CRVAL1": 200.0, "CRVAL2": 40.0}
    if cd:
        hdr.update({"CD1_1": m[0], "CD1_2": m[1], "CD2_1": m[2], "CD2_2": m[3]})
    else:
        hdr.update({"CDELT1": 1e-4, "CDELT2": 2e-4, "PC1_1": m[0] * 1e4, "PC1_2": m[1] * 1e4,
                    "PC2_1": m[2] * 1e4, "PC2_2": m[3] * 1e4})
    if abs(m[0] * m[3] - m[1] * m[2]) < 1e-12:
        return                                   # a singular matrix is no WCS
    shape = (40, 30)
    op = Slice((ys, xs))
    out_grid = op.output_grid([Grid(("y", "x"), {}, hdr)], [shape], op.output_shape(shape))
    src_rows, src_cols = np.arange(40)[ys], np.arange(30)[xs]
    q = np.array([(r, c) for r in range(len(src_rows)) for c in range(len(src_cols))])
    got = WCS(fits.Header(dict(out_grid.wcs))).pixel_to_world(q[:, 1], q[:, 0])
    want = WCS(fits.Header(hdr)).pixel_to_world(src_cols[q[:, 1]], src_rows[q[:, 0]])
    assert np.all(got.separation(want).arcsec < 1e-5)


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(2, 30), start=hs.floats(-100, 100), step=hs.floats(0.1, 10),
       descending=hs.booleans(), a=hs.floats(-120, 420), b=hs.floats(-120, 420), v=hs.floats(-120, 420))
def test_label_selections_equal_xarray_sel(n, start, step, descending, a, b, v):
    """Property: a label range is xarray's .sel of that range; a single numeric label is
    xarray's nearest .sel (or an error beyond one step off the axis's ends)."""
    from subzero.coords import cells_for
    lat = start + step * np.arange(n)
    lat = lat[::-1] if descending else lat
    da = xr.DataArray(np.zeros((n, 3)), dims=("lat", "band"), coords={"lat": lat})
    g = Grid(("lat", "band"), {"lat": lat})
    lo, hi = (a, b) if not descending else (max(a, b), min(a, b))
    want = _sel_cells(da, lat=slice(lo, hi))
    try:
        got = {tuple(c) for c in cells_for(g, (n, 3), {"lat": slice(lo, hi)}, "x").tolist()}
    except QueryError as e:
        assert not want and "selects no cells" in str(e)
    else:
        assert got == want
    far = v < lat.min() - step or v > lat.max() + step
    if min(abs(v - (lat.min() - step)), abs(v - (lat.max() + step))) < 1e-6 * step:
        return                                   # on the one-step boundary: either answer
    try:
        got = {tuple(c) for c in cells_for(g, (n, 3), {"lat": v}, "x").tolist()}
    except QueryError as e:
        assert far and "is outside" in str(e)
    else:
        assert not far and got == _sel_cells(da, lat=v, method="nearest")


class _BadGrid(Unary):
    """An operator whose output_grid is wrong (too few labels)."""

    def output_grid(self, grids, input_shapes, output_shape):
        return Grid(("y",), {})


@pytest.mark.filterwarnings("default::subzero.errors.SubZeroWarning")
def test_a_wrong_output_grid_is_named_and_the_cells_still_answer(store, cli):
    wf = Workflow("bad")
    wf.add("twice", _BadGrid(lambda v: 2 * v), wf.input("x"))
    run = store.run(wf, inputs={"x": np.zeros((4, 5))}, progress=False)
    with pytest.raises(QueryError, match="the operator of 'twice' gave a grid of \\('y',\\)"):
        run.grid("twice")
    code, out, err = cli("trace", "--store", store.path, "--from", "x", "--cells", "1,2",
                         "--to", "twice", "--json")
    assert code == 0 and json.loads(out)["cells"] == [[1, 2]], err
    assert "subzero: warning: the operator of 'twice'" in err and "cells only" in err
