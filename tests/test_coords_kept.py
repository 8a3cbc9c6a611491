"""Coordinates kept through user operators by xarray's rules: an output of an input's
shape sits on its grid; a reduction keeps the remaining axes' labels (and the sky WCS
when its axes remain); an output whose axes match none of a labelled input's is told
once, when the run is made, in one warning."""

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from subzero import GLOBAL, Operator, Workflow
from subzero.errors import SubZeroWarning
from subzero.model.grid import Grid
from subzero.model.operator import reduced_axes
from subzero.operators import MeanFilter


class PeakOverTime(Operator):
    tiling = GLOBAL

    def __init__(self, keepdims=False):
        self.keepdims = keepdims

    def run(self, ctx, x):
        return np.asarray(x).max(axis=0, keepdims=self.keepdims)


class Corner(Operator):
    tiling = GLOBAL

    def run(self, ctx, x):
        return np.asarray(x)[0, :5, :5]


def cube():
    return xr.DataArray(np.random.default_rng(1).random((4, 20, 16)), dims=("time", "y", "x"),
                        coords={"time": pd.date_range("2026-01-01", periods=4),
                                "y": np.arange(20.0) * 2, "x": np.arange(16) + 0.5})


def test_reduced_axes_follow_xarrays_rule():
    assert reduced_axes((4, 20, 16), (20, 16)) == (1, 2)
    assert reduced_axes((4, 20, 16), (4, 16)) == (0, 2)
    assert reduced_axes((4, 20, 16), (1, 20, 16)) == (1, 2)          # keepdims
    assert reduced_axes((5, 5, 5), (5, 5)) is None                   # three ways: none
    assert reduced_axes((4, 20, 16), (7,)) is None
    assert reduced_axes((4, 20, 16), (4, 20, 16)) is None            # same shape: not a reduction


def test_a_reduction_keeps_the_labels_of_the_axes_it_keeps(store):
    wf = Workflow("peak")
    c = wf.input("cube")
    p = wf.add("peak", PeakOverTime(), c)
    wf.add("smooth", MeanFilter(size=3), p)
    wf.add("kept", PeakOverTime(keepdims=True), c)
    run = store.run(wf, inputs={"cube": cube()}, progress=False, engine="local")
    for name in ("peak", "smooth"):
        a = run.array(name)
        assert a.dims == ("y", "x") and list(a["x"].values) == list(cube()["x"].values)
    kept = run.grid("kept")
    assert kept.dims == ("time", "y", "x") and set(kept.coords) == {"y", "x"}
    cells = run.cells_at("smooth", sel={"y": 10.0, "x": 3.5})
    assert cells.tolist() == [[5, 3]]
    res = run.trace("smooth", cells, to="peak", record=False)
    assert res.label_region() == {"y": [8.0, 12.0], "x": [2.5, 4.5]}


def test_an_output_that_matches_no_labelled_axes_is_told_once(store):
    wf = Workflow("corner")
    c = wf.add("corner", Corner(), wf.input("cube"))
    wf.add("smooth", MeanFilter(size=3), c)
    with pytest.warns(SubZeroWarning) as seen:
        run = store.run(wf, inputs={"cube": cube()}, progress=False, engine="local")
    mine = [str(w.message) for w in seen if "coordinates" in str(w.message)]
    assert len(mine) == 1 and "corner (Corner)" in mine[0] and "output_grid" in mine[0]
    assert "smooth" not in mine[0]           # its input has no labels to lose
    assert run.grid("corner") is None


def test_a_sky_wcs_stays_when_its_axes_remain():
    wcs = {"WCSAXES": 2, "CTYPE1": "RA---TAN", "CTYPE2": "DEC--TAN", "CRPIX1": 8.0,
           "CRPIX2": 10.0, "CRVAL1": 150.0, "CRVAL2": 2.0, "CDELT1": -1e-4, "CDELT2": 1e-4}
    g = Grid(("time", "y", "x"), {"time": np.arange(4)}, wcs)
    assert Operator().output_grid([g], [(4, 20, 16)], (20, 16)) == Grid(("y", "x"), {}, wcs)
    assert Operator().output_grid([g], [(4, 20, 16)], (4, 16)) == Grid(("time", "x"),
                                                                      {"time": g.coords["time"]})
