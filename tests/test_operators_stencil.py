"""Convolution, correlation and sliding-window filters with every edge mode:
values against scipy.ndimage, lineage against the perturbation oracle (exact,
wrapped and reflected edge cells included), Full == Map."""

import numpy as np
import pytest
from scipy import ndimage

import subzero
import subzero.operators as O
from subzero.operators.boundary import MODES, Neighbourhood, fold
from subzero.operators.testing import check_full, check_lineage, mapping_context, run_plain

rng = np.random.default_rng(3)
A2 = rng.normal(size=(5, 6))
A3 = rng.normal(size=(3, 4, 5))
V1 = rng.normal(size=3)
U8 = rng.integers(0, 256, size=(4, 5)).astype(np.uint8)
K3 = rng.uniform(0.5, 2.0, size=(3, 3)) * rng.choice([-1, 1], size=(3, 3))
K24 = rng.uniform(0.5, 2.0, size=(2, 4))
K9 = rng.uniform(0.5, 2.0, size=9)
KC = np.array([[0, 1.5, 0], [2.0, -1.0, 0.7], [0, 0.3, 0]])     # zeros are not dependencies
K333 = rng.uniform(0.5, 2.0, size=(3, 3, 3))
CROSS = KC != 0

# name: (operator, input, expected, oracle also perturbs to NaN?)
CASES = {}
for m in MODES:
    CASES[f"convolve-{m}"] = (O.Convolve(K3, mode=m, cval=0.5), A2,
                              ndimage.convolve(A2, K3, mode=m, cval=0.5), True)
    CASES[f"convolve-wide-1d-{m}"] = (O.Convolve(K9, mode=m), V1,
                                      ndimage.convolve(V1, K9, mode=m), True)
    CASES[f"mean-{m}"] = (O.MeanFilter(3, mode=m), A2, ndimage.uniform_filter(A2, 3, mode=m),
                          False)            # running sums: a NaN spreads along the line
CASES.update({
    "correlate-even-origin": (O.Correlate(K24, origin=(0, 1)), A2,
                              ndimage.correlate(A2, K24, origin=(0, 1)), True),
    "convolve-even": (O.Convolve(K24, mode="nearest"), A2,
                      ndimage.convolve(A2, K24, mode="nearest"), True),
    "convolve-even-origin": (O.Convolve(K24, mode="wrap", origin=(-1, 1)), A2,
                             ndimage.convolve(A2, K24, mode="wrap", origin=(-1, 1)), True),
    "convolve-sparse-kernel": (O.Convolve(KC, mode="mirror"), A2,
                               ndimage.convolve(A2, KC, mode="mirror"), True),
    "convolve-3d-wrap": (O.Convolve(K333, mode="wrap"), A3,
                         ndimage.convolve(A3, K333, mode="wrap"), True),
    "correlate-3d-reflect": (O.Correlate(K333, mode="reflect"), A3,
                             ndimage.correlate(A3, K333, mode="reflect"), True),
    "median-reflect": (O.MedianFilter(3), A2, ndimage.median_filter(A2, 3), True),
    "median-cross-mirror": (O.MedianFilter(footprint=CROSS, mode="mirror"), A2,
                            ndimage.median_filter(A2, footprint=CROSS, mode="mirror"), True),
    "median-3d-wrap": (O.MedianFilter(3, mode="wrap"), A3,
                       ndimage.median_filter(A3, 3, mode="wrap"), True),
    "min-even-nearest": (O.MinFilter((2, 3), mode="nearest"), A2,
                         ndimage.minimum_filter(A2, (2, 3), mode="nearest"), True),
    "min-wide-1d-mirror": (O.MinFilter(5, mode="mirror"), V1,
                           ndimage.minimum_filter(V1, 5, mode="mirror"), True),
    "max-wrap": (O.MaxFilter(3, mode="wrap"), A2, ndimage.maximum_filter(A2, 3, mode="wrap"), True),
    "max-3d-constant": (O.MaxFilter((1, 3, 2), mode="constant", cval=9.0), A3,
                        ndimage.maximum_filter(A3, (1, 3, 2), mode="constant", cval=9.0), True),
    "mean-footprint": (O.MeanFilter(footprint=CROSS, mode="wrap"), A2,
                       ndimage.correlate(A2, CROSS / CROSS.sum(), mode="wrap"), True),
    "max-uint8-wrap": (O.MaxFilter(3, mode="wrap"), U8, ndimage.maximum_filter(U8, 3, mode="wrap"),
                       True),
    "generic-ptp": (O.Filter(np.ptp, size=3, mode="constant"), A2,
                    ndimage.generic_filter(A2, np.ptp, size=3, mode="constant"), True),
})


# A median over a window holding reflected duplicates can ignore a cell on this
# data (the duplicates pin the middle rank), so the oracle sees fewer dependencies.
NOT_EXACT = {"median-reflect", "median-cross-mirror"}


@pytest.mark.parametrize("name", CASES)
def test_values_and_perturbation_oracle(name):
    """The mapping is exact: linear kernels with random weights and rank filters
    under +-1e6 perturbations change exactly the cells the mapping names.
    NaN perturbations are skipped for uniform_filter, whose running sums carry
    a NaN beyond the window (numerical, not lineage)."""
    op, a, expected, nan = CASES[name]
    np.testing.assert_allclose(run_plain(op, a), expected)
    check_lineage(op, a, exact=name not in NOT_EXACT, full=False, nan=nan)


FULL_CASES = ["convolve-reflect", "convolve-mirror", "convolve-nearest", "convolve-wrap",
              "convolve-constant", "convolve-wide-1d-reflect", "convolve-wide-1d-wrap",
              "convolve-even-origin", "convolve-sparse-kernel", "convolve-3d-wrap",
              "median-cross-mirror", "min-even-nearest", "max-3d-constant"]


def test_full_pairs_equal_mapping(tmp_path):
    check_full([(CASES[k][0], [CASES[k][1]]) for k in FULL_CASES], tmp_path)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_fold_matches_numpy_pad(n):
    """Each edge mode, far beyond the array, reads what numpy.pad copies."""
    x = np.arange(n)
    v = np.arange(-13, n + 13)
    for mode, np_mode in [("reflect", "symmetric"), ("mirror", "reflect"), ("nearest", "edge"),
                          ("wrap", "wrap")]:
        idx, ok = fold(v, n, mode)
        assert ok is None
        assert np.array_equal(idx, np.pad(x, 13, np_mode)), mode
    idx, ok = fold(v, n, "constant")
    assert np.array_equal(v[ok], x)


def test_wrap_edge_depends_on_the_opposite_edge():
    op = O.MeanFilter(3, mode="wrap")
    ctx = mapping_context(op, [(5, 6)], (5, 6))
    got = {tuple(c) for c in op.map_b(np.array([[0, 0]]), 0, ctx)}
    assert got == {(r % 5, c % 6) for r in (-1, 0, 1) for c in (-1, 0, 1)}
    fwd = {tuple(c) for c in op.map_f(np.array([[4, 5]]), 0, ctx)}
    assert (0, 0) in fwd and len(fwd) == 9


def test_mapping_is_vectorized_on_big_inputs():
    """200k output cells through a 5x5 reflect stencil: one numpy pass, no cell loop."""
    import time
    op = O.Convolve(np.ones((5, 5)), mode="reflect")
    shape = (400, 500)
    ctx = mapping_context(op, [shape], shape)
    cells = np.argwhere(np.ones(shape, bool))
    t = time.perf_counter()
    b = op.map_b(cells, 0, ctx)
    f = op.map_f(cells, 0, ctx)
    assert len(b) == len(f) == 25 * len(cells)
    assert time.perf_counter() - t < 10


def test_neighbourhood_forward_of_nothing():
    rel = Neighbourhood(np.array([[-1], [0], [1]]), "nearest")
    assert rel.forward(np.zeros((0, 1), np.int64), (4,), (4,)).shape == (0, 1)


def test_declarations():
    assert O.Convolve(K3).tiling == subzero.stencil(1)
    assert O.Convolve(K3, mode="wrap").tiling == subzero.GLOBAL
    assert O.MedianFilter(5).tiling == subzero.stencil(2)
    assert O.MinFilter((2, 3)).tiling == subzero.stencil(1)
    assert O.Correlate(K24, origin=(0, 1)).tiling == subzero.stencil(3)
    op = O.MaxFilter(3)
    assert op.deterministic and not op.is_all_to_all(0) and op.has_mapping()
    assert subzero.Mode.FULL in op.supported_modes()


def test_bad_arguments():
    with pytest.raises(ValueError, match="edge mode"):
        O.MeanFilter(3, mode="periodic")
    with pytest.raises(ValueError, match="origin"):
        O.MedianFilter(3, origin=2)
    with pytest.raises(ValueError, match="func must be"):
        O.Filter("mode")
    with pytest.raises(ValueError, match="footprint has 2 dimensions"):
        run_plain(O.Convolve(K3), A3)
