"""Block-local operators run per tile: the astronomy workflow's block background
(``BlockBackground``) declares a halo of ``block - 1`` and puts its read region on
the image's block grid with ``ctx.origin``.  Per-tile runs must give the whole-array
result bit for bit, and the same lineage, at any tile size: odd ones, tiles smaller
than the block, tiles smaller than the halo."""

import numpy as np
import pytest

import subzero
from subzero import Workflow
from subzero.workflows.astronomy import BlockBackground


def wf(block):
    w = Workflow("bg")
    a = w.input("a")
    w.add("bg", BlockBackground(block), a)
    return w


@pytest.mark.parametrize("block,shape", [(7, (50, 45)), (16, (64, 64)), (5, (23, 31))])
def test_per_tile_equals_whole_array(tmp_path, block, shape):
    x = np.random.default_rng(block).normal(100, 10, shape)
    x[3, 4] = np.nan                                        # a NaN stays a NaN, others unaffected
    st = subzero.open_store(tmp_path / "s")
    whole = st.run(wf(block), inputs={"a": x}, strategies={"bg": "full"}, tile=512)
    assert whole.ops()[0]["strategies"] == ["full:fullone:backward"]
    cells = [(0, 0), (shape[0] - 1, shape[1] - 1), (block, block - 1), (shape[0] // 2, 3)]
    for tile in (3, block - 1, block, block + 3, 2 * block):
        run = st.run(wf(block), inputs={"a": x}, strategies={"bg": "full"}, tile=tile)
        np.testing.assert_array_equal(run.array("bg").values, whole.array("bg").values,
                                      err_msg=f"tile {tile}")
        for c in cells:
            np.testing.assert_array_equal(run.trace("bg", [c], to="a").cells,
                                          whole.trace("bg", [c], to="a").cells)
            np.testing.assert_array_equal(run.trace("a", [c], to="bg").cells,
                                          whole.trace("a", [c], to="bg").cells)
    # the stored lineage is the mapping functions' answer: the cell's whole block
    got = whole.trace("bg", [(block + 1, 1)], to="a", prefer="map").cells
    assert {tuple(c) for c in got} == {(i, j) for i in range(block, min(2 * block, shape[0]))
                                       for j in range(0, block)}
