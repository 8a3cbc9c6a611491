"""Reductions (whole array and along axes) and matrix multiply: values against
numpy, exact lineage against the perturbation oracle, Full == Map, and the
compact Full forms (one pair for an all-to-all reduction, row/column pairs
for matmul)."""

import numpy as np
import pytest

import subzero
import subzero.operators as O
from subzero.operators.testing import check_full, check_lineage, run_plain

rng = np.random.default_rng(11)
A2 = rng.normal(size=(5, 6))
A3 = rng.normal(size=(3, 4, 5))
HOLEY = np.where(A2 > 0.8, np.nan, A2)
M, N = rng.normal(size=(5, 4)), rng.normal(size=(4, 6))

CASES = {
    "sum": (O.Sum(), [A2], np.array([A2.sum()])),
    "sum-axis0": (O.Sum(axis=0), [A2], A2.sum(0)),
    "sum-axis1": (O.Sum(axis=1), [A2], A2.sum(1)),
    "mean-axes-0-2": (O.Mean(axis=(0, 2)), [A3], A3.mean((0, 2))),
    "median-last": (O.Median(axis=-1), [A3], np.median(A3, -1)),
    "min-axis1": (O.Min(axis=1), [A3], A3.min(1)),
    "max-3d": (O.Max(), [A3], np.array([A3.max()])),
    "median-3d": (O.Median(), [A3], np.array([np.median(A3)])),
    "count-axis0": (O.Count(axis=0), [HOLEY], (~np.isnan(HOLEY)).sum(0)),
    "count": (O.Count(), [HOLEY], np.array([(~np.isnan(HOLEY)).sum()])),
    "sum-int-axis0": (O.Sum(axis=0), [(A2 * 10).astype(np.int32)], (A2 * 10).astype(np.int32).sum(0)),
    "std-axis1": (O.Reduce(np.std, axis=1), [A2], A2.std(1)),
    "sum-all-axes": (O.Reduce("sum", axis=(0, 1)), [A2], np.array([A2.sum()])),
    "matmul": (O.MatMul(), [M, N], M @ N),
    "matmul-thin": (O.MatMul(), [M[:, :1], N[:1, :2]], M[:, :1] @ N[:1, :2]),
}


@pytest.mark.parametrize("name", CASES)
def test_values_and_perturbation_oracle(name):
    op, arrays, expected = CASES[name]
    out = run_plain(op, *arrays)
    assert out.shape == expected.shape == op.output_shape(*[a.shape for a in arrays])
    np.testing.assert_allclose(out, expected)
    check_lineage(op, *arrays, exact=True, full=False)


def test_full_pairs_equal_mapping(tmp_path):
    check_full([(op, arrays) for op, arrays, _ in CASES.values()], tmp_path)


def _run(tmp_path, op, *arrays, strategy="full"):
    wf = subzero.Workflow("t")
    wf.add("op", op, *[wf.input(f"in{i}") for i in range(len(arrays))])
    st = subzero.open_store(tmp_path)
    return st, st.run(wf, inputs={f"in{i}": a for i, a in enumerate(arrays)},
                      strategies={"op": strategy}, progress=False)


def test_whole_reduction_is_all_to_all_with_one_pair(tmp_path):
    op = O.Sum()
    assert op.is_all_to_all(0) and op.output_shape((5, 6)) == (1,)
    st, run = _run(tmp_path, op, A2)
    with st:
        assert run.ops()[0]["pairs"] == 1
        res = run.trace("op", [(0,)], to="in0")
        assert len(res) == 30 and res.steps[0].method == "all-to-all"
        assert run.trace("in0", [(3, 3)], to="op").cells.tolist() == [[0]]


def test_axis_reduction_maps_to_its_line(tmp_path):
    st, run = _run(tmp_path, O.Max(axis=0), A3, strategy="map")
    with st:
        got = run.trace("op", [(2, 1)], to="in0").cells.tolist()
        assert got == [[0, 2, 1], [1, 2, 1], [2, 2, 1]]
        assert run.trace("in0", [(1, 3, 4)], to="op").cells.tolist() == [[3, 4]]
    assert not O.Max(axis=0).is_all_to_all(0)


def test_matmul_full_is_row_and_column_pairs(tmp_path):
    st, run = _run(tmp_path, O.MatMul(), M, N)
    with st:
        assert run.ops()[0]["pairs"] == 5 + 6
        assert run.trace("op", [(2, 3)], to="in0").cells.tolist() == [[2, k] for k in range(4)]
        assert run.trace("op", [(2, 3)], to="in1").cells.tolist() == [[k, 3] for k in range(4)]
        assert len(run.trace("in1", [(1, 1)], to="op")) == 5


def test_errors():
    with pytest.raises(ValueError, match="func must be"):
        O.Reduce("mode")
    with pytest.raises(ValueError, match="out of range or repeated"):
        run_plain(O.Sum(axis=(0, 0)), A2)
    with pytest.raises(ValueError, match=r"\(n, k\) and \(k, m\)"):
        run_plain(O.MatMul(), M, M)


def test_declarations():
    assert O.Sum().tiling == O.Mean().tiling == subzero.AGGREGATE       # partials per tile
    assert O.Median().tiling == subzero.GLOBAL                           # no exact partials
    for op in (O.Sum(), O.Mean(axis=1), O.MatMul()):
        assert op.tiling in (subzero.GLOBAL, subzero.AGGREGATE) and op.deterministic
        assert op.has_mapping()
        assert subzero.Mode.FULL in op.supported_modes()
    assert O.MatMul().n_inputs() == 2 and not O.MatMul().is_all_to_all(1)


def test_axis_forms():
    """One axis or several, as ints, numpy integers, lists or tuples: one tuple of ints."""
    assert O.Sum(axis=1).axis == O.Sum(axis=np.int64(1)).axis == O.Sum(axis=[1]).axis == (1,)
    assert O.Sum(axis=(0, np.int32(2))).axis == (0, 2) and O.Sum().axis is None
    assert np.allclose(run_plain(O.Sum(axis=np.int64(1)), A2), A2.sum(1))
