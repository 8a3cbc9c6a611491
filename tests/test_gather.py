"""Structural operators as gathers: a tile of a slice's output reads only the box of
the input its cells come from, on any key (steps of either sign, dropped axes) and
any tiling, and the Spark engine's arrays and lineage equal the in-process engine's."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subzero import GATHER, Workflow
from subzero.capture.tiles import tiles_for
from subzero.operators import Slice, Subarray, Subsample


@st.composite
def keys(draw, shape):
    key = []
    for n in shape:
        if draw(st.booleans()) and draw(st.integers(0, 4)) == 0:
            key.append(draw(st.integers(-n, n - 1)))
        else:
            key.append(slice(draw(st.none() | st.integers(-n - 2, n + 2)),
                             draw(st.none() | st.integers(-n - 2, n + 2)),
                             draw(st.sampled_from([1, 2, 3, -1, -2]))))
    return tuple(key)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_gathered_tiles_equal_the_whole_slice(data):
    shape = tuple(data.draw(st.lists(st.integers(1, 11), min_size=1, max_size=3)))
    x = np.random.default_rng(data.draw(st.integers(0, 2**31))).random(shape)
    op = Slice(data.draw(keys(shape)))
    want = op.compute(x)
    tile = data.draw(st.integers(1, 5))
    got = np.full(want.shape, np.nan)
    for t in tiles_for(want.shape, tile):
        box = op.input_box(t.core, shape)
        block = x[tuple(slice(a, b) for a, b in box)]
        assert block.size <= x.size
        got[t.core_slices()] = op.gather(block, box, t.core, shape)
    np.testing.assert_array_equal(got, want)


def test_slices_declare_gather():
    assert Slice(np.s_[:, 0:4]).tiling == GATHER
    assert Subarray((1, 2), (5, 6)).tiling == GATHER and Subsample(2).tiling == GATHER


def slices_wf():
    wf = Workflow("slices")
    x = wf.input("x")
    wf.add("cols", Slice(np.s_[:, 0:4]), x)
    wf.add("flip", Slice(np.s_[::-3, 5:1:-1]), x)
    wf.add("row", Slice(np.s_[7]), x)
    wf.add("every2", Subsample(2, 1), x)
    return wf


@pytest.mark.parametrize("strategy", ["full", "map"])
def test_spark_gathers_equal_in_process(spark, store, strategy):
    x = np.random.default_rng(2).random((37, 29))
    wf = slices_wf()
    strategies = {n: strategy for n in ("cols", "flip", "row", "every2")}
    lo = store.run(wf, inputs={"x": x}, strategies=strategies, progress=False)
    sp = store.run(wf, inputs={"x": x}, strategies=strategies, engine="spark", spark=spark, tile=5,
                   progress=False)
    log = (sp.dir / "run.log").read_text()
    assert "one task on the whole array" not in log and "cols: gather, 8 tile task(s)" in log
    for name in ("cols", "flip", "row", "every2"):
        a, b = sp.array(name).values, lo.array(name).values
        np.testing.assert_array_equal(a, b)
        out = np.argwhere(np.ones(a.shape, bool))
        for c in out[:: max(1, len(out) // 5)]:
            c = tuple(int(v) for v in c)
            np.testing.assert_array_equal(sp.trace(name, [c], to="x").bitmap,
                                          lo.trace(name, [c], to="x").bitmap)
        for c in [(0, 0), (7, 3), (36, 28), (20, 10)]:
            np.testing.assert_array_equal(sp.trace("x", [c], to=name).bitmap,
                                          lo.trace("x", [c], to=name).bitmap)
    if strategy == "full":
        assert [o["pairs"] for o in sp.ops()] == [o["pairs"] for o in lo.ops()]
