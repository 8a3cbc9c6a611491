"""Connected components over tiles (the label-merge pattern): per-tile labels merged
across tile borders give the whole-array labels cell for cell, on any tiling, and
the Spark engine's lineage of regions that span tiles answers as the in-process
engine's does, for every strategy."""

import numpy as np
import pytest
from astropy.io import fits
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from subzero import Statistic, Workflow
from subzero.capture.components import label, merge_tiles, region_cells, tile_components
from subzero.capture.tiles import tiles_for
from subzero.operators import ConnectedComponents
from subzero.workflows.astronomy import DetectStars


def by_tiles(mask, tile, connectivity, min_size):
    """The engine's three passes, in one process: labels of every tile, the merge,
    the relabelling; and the cells each owner gathers for a region spanning tiles."""
    tiles = tiles_for(mask.shape, tile)
    done = [tile_components(mask[t.core_slices()], t.core, mask.shape, connectivity, t.index)
            for t in tiles]
    answers, n = merge_tiles([s for _, s in done], mask.shape, connectivity, min_size)
    out = np.zeros(mask.shape, np.int32)
    gathered = {}
    for t, (local, _), a in zip(tiles, done, answers):
        out[t.core_slices()] = a.relabel[local]
        for r in a.owned:
            assert r.label not in gathered                    # one owner per region
            box = tuple(slice(lo, hi + 1) for lo, hi in zip(r.lo, r.hi))
            gathered[r.label] = region_cells(mask[box], r.lo, r.first, mask.shape, connectivity)
    return out, n, gathered


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_tiles_merged_equal_whole_array_labels(data):
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 12 if ndim < 3 else 6), min_size=ndim,
                                     max_size=ndim)))
    density = data.draw(st.floats(0.05, 0.95))
    seed = data.draw(st.integers(0, 2**31))
    mask = np.random.default_rng(seed).random(shape) < density
    connectivity = data.draw(st.sampled_from(["full", "faces"]))
    min_size = data.draw(st.integers(1, 4))
    tile = data.draw(st.integers(1, 9))
    want, n = label(mask, connectivity, min_size)
    got, m, gathered = by_tiles(mask, tile, connectivity, min_size)
    np.testing.assert_array_equal(got, want)
    assert m == n
    for k, cells in gathered.items():
        assert {tuple(c) for c in cells} == {tuple(c) for c in np.argwhere(want == k)}
    # every region in more than one tile is gathered by exactly one owner
    spans = {k for k in range(1, n + 1)
             if len({tuple(c // tile) for c in np.argwhere(want == k)}) > 1}
    assert spans == set(gathered)


class FracOfMax(Statistic):
    """A fraction of the whole array's maximum (a merge exact on any tiling)."""

    def __init__(self, frac):
        self.frac = frac

    def partial(self, block, core, origin, shape, prior):
        return float(np.max(block[core]))

    def merge(self, a, b):
        return max(a, b)

    def finish(self, state, prior):
        return self.frac * state


class AboveMax(ConnectedComponents):
    """Cells above a fraction of the whole array's maximum."""

    def __init__(self, frac=0.5, connectivity="full", min_size=1):
        self.connectivity, self.min_size = connectivity, min_size
        self.statistic = FracOfMax(frac)

    def foreground(self, values, level):
        return np.asarray(values) > level


def blobs(shape=(37, 29)):
    """Blobs of every size, a snake that crosses many tile borders, a diagonal
    chain (8- but not 4-connected) and single cells."""
    x = np.random.default_rng(5).normal(0, 1, shape)
    x[2:30, 5] = 10             # the snake: down, across, up
    x[29, 5:25] = 10
    x[3:30, 24] = 10
    for k in range(12):         # a diagonal chain
        x[5 + k, 8 + k] = 9
    x[33:36, 1:4] = 8
    x[0, 28] = 9
    x[36, 0] = 9
    return x


def components_wf(op):
    wf = Workflow("cc")
    wf.add("lab", op, wf.input("x"))
    return wf


CELLS = [(15, 5), (29, 15), (10, 13), (34, 2), (0, 28), (20, 20)]


def check_same(sp, lo, x):
    np.testing.assert_array_equal(sp.array("lab").values, lo.array("lab").values)
    lab = lo.array("lab").values
    for c in CELLS:
        a, b = sp.trace("lab", [c], to="x", shortcut=False), lo.trace("lab", [c], to="x", shortcut=False)
        np.testing.assert_array_equal(a.bitmap, b.bitmap, err_msg=f"backward {c}")
        truth = np.argwhere(lab == lab[c]) if lab[c] else np.array([c])
        assert {tuple(v) for v in a.cells} == {tuple(v) for v in truth}
        a, b = sp.trace("x", [c], to="lab", shortcut=False), lo.trace("x", [c], to="lab", shortcut=False)
        np.testing.assert_array_equal(a.bitmap, b.bitmap, err_msg=f"forward {c}")


@pytest.mark.parametrize("tile,strategy", [(3, "full"), (3, "comp:payone:backward"),
                                           (7, "pay:paymany:forward"), (7, "full:fullmany:forward"),
                                           (5, "blackbox"), (64, "comp:payone:backward")])
def test_spark_labels_and_lineage_equal_in_process(spark, store, tile, strategy):
    x = blobs()
    wf = components_wf(AboveMax(0.5, "full", 2))
    lo = store.run(wf, inputs={"x": x}, strategies={"lab": strategy}, progress=False)
    sp = store.run(wf, inputs={"x": x}, strategies={"lab": strategy}, engine="spark", spark=spark,
                   tile=tile, progress=False)
    check_same(sp, lo, x)
    log = (sp.dir / "run.log").read_text()
    assert "lab: connected components over" in log and "one task on the whole array" not in log
    if tile < 10:
        assert " 0 across tile borders" not in log
    assert sp.array("lab").values.max() == 3     # snake, chain, block; the lone cells dropped
    if strategy != "blackbox":
        assert sp.ops()[0]["pairs"] == lo.ops()[0]["pairs"]   # one pair per region, not per tile


def test_spark_3d_faces_connectivity(spark, store):
    x = np.random.default_rng(3).random((9, 8, 7))
    wf = components_wf(AboveMax(0.6, "faces", 1))
    lo = store.run(wf, inputs={"x": x}, strategies={"lab": "full"}, progress=False)
    sp = store.run(wf, inputs={"x": x}, strategies={"lab": "full"}, engine="spark", spark=spark,
                   tile=4, progress=False)
    np.testing.assert_array_equal(sp.array("lab").values, lo.array("lab").values)
    lab = lo.array("lab").values
    big = np.bincount(lab.ravel())[1:].argmax() + 1
    c = tuple(np.argwhere(lab == big)[0])
    a = sp.trace("lab", [c], to="x")
    assert {tuple(v) for v in a.cells} == {tuple(v) for v in np.argwhere(lab == big)}


def test_star_finding_on_a_real_exposure_per_tile(spark, store):
    """DetectStars on the real LSST exposure, tiled to odd tiles on Spark: the same
    stars as the whole-image run (its threshold is the same sample's median)."""
    img = fits.getdata(ROOT / "workflows" / "data" / "lsst" / "imsim_85408556_R23_S11_C04_E000.fits")
    img = img.astype(float)[1:, 4:]
    img -= np.median(img)
    wf = components_wf(DetectStars())
    lo = store.run(wf, inputs={"x": img}, progress=False)
    sp = store.run(wf, inputs={"x": img}, engine="spark", spark=spark, tile=97, progress=False)
    a, b = sp.array("lab").values, lo.array("lab").values
    np.testing.assert_array_equal(a, b)
    assert b.max() > 10
    log = (sp.dir / "run.log").read_text()
    assert "statistic merged in a tree" in log and " 0 across tile borders" not in log
    # the brightest star, and a star cut by a tile border
    peak = np.unravel_index(np.argmax(np.where(b > 0, img, -np.inf)), b.shape)
    cut = next(k for k in range(1, b.max() + 1)
               if len({tuple(c // 97) for c in np.argwhere(b == k)}) > 1)
    for c in (peak, tuple(np.argwhere(b == cut)[0])):
        np.testing.assert_array_equal(sp.trace("lab", [c], to="x").bitmap,
                                      lo.trace("lab", [c], to="x").bitmap)
        assert sp.trace("lab", [c], to="x").bitmap.sum() == (b == b[c]).sum()
