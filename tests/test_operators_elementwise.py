"""Elementwise, scalar, threshold, binary and masking operators: values against
numpy, lineage against the perturbation oracle, and Full pairs (stored and
re-executed) equal to the mapping functions."""

import numpy as np
import pytest

import subzero
import subzero.operators as O
from subzero.operators.testing import check_full, check_lineage, run_plain

rng = np.random.default_rng(42)
A2, B2 = rng.normal(size=(5, 6)), rng.normal(size=(5, 6))
A3, B3 = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 5))
P2 = rng.uniform(0.5, 3.0, size=(5, 6))
I2, J2 = rng.integers(0, 3, size=(5, 6)), rng.integers(0, 3, size=(5, 6))
M2, M3 = A2 > 0, A3 > 0
HOLEY = np.where(A2 > 0.5, np.nan, A2)

# name: (operator, inputs, expected output, mapping exact on this data?)
CASES = {
    "abs-2d": (O.Abs(), [A2], np.abs(A2), True),
    "abs-3d": (O.Abs(), [A3], np.abs(A3), True),
    "negative": (O.Negative(), [A3], -A3, True),
    "exp": (O.Exp(), [A2], np.exp(A2), True),
    "sqrt": (O.Sqrt(), [P2], np.sqrt(P2), True),
    "log": (O.Log(), [P2], np.log(P2), True),
    "clip": (O.Clip(-0.5, 0.5), [A3], np.clip(A3, -0.5, 0.5), True),
    "ufunc": (O.Unary(np.tanh), [A2], np.tanh(A2), True),
    "callable-args": (O.Unary(np.round, 1), [A3], np.round(A3, 1), True),
    "scalar-mul": (O.ScalarOp(np.multiply, 3.0), [A3], A3 * 3.0, True),
    "scalar-rsub": (O.ScalarOp(np.subtract, 1.0, reverse=True), [A2], 1.0 - A2, True),
    "threshold-gt": (O.Threshold(0.1), [A2], A2 > 0.1, True),
    "threshold-le-uint8": (O.Threshold(0.1, "<=", np.uint8), [A3], (A3 <= 0.1).astype(np.uint8),
                           True),
    "add": (O.Add(), [A2, B2], A2 + B2, True),
    "add-3d": (O.Add(), [A3, B3], A3 + B3, True),
    "sub": (O.Sub(), [A2, B2], A2 - B2, True),
    "mul-3d": (O.Mul(), [A3, B3], A3 * B3, True),
    "div": (O.Div(), [A2, B2], A2 / B2, True),
    "pow": (O.Pow(), [P2, B2], P2 ** B2, True),
    "minimum": (O.Minimum(), [A2, B2], np.minimum(A2, B2), True),
    "maximum-3d": (O.Maximum(), [A3, B3], np.maximum(A3, B3), True),
    "lt": (O.Lt(), [A2, B2], A2 < B2, True),
    "le": (O.Le(), [A2, B2], A2 <= B2, True),
    "gt-3d": (O.Gt(), [A3, B3], A3 > B3, True),
    "ge": (O.Ge(), [A2, B2], A2 >= B2, True),
    "eq": (O.Eq(), [I2, J2], I2 == J2, False),
    "ne": (O.Ne(), [I2, J2], I2 != J2, False),
    "binary-ufunc": (O.Binary(np.arctan2), [A2, B2], np.arctan2(A2, B2), True),
    "scalar-(1,)": (O.Sub(broadcast="scalar"), [A2, np.array([2.5])], A2 - 2.5, True),
    "scalar-(1,1)": (O.Div(broadcast="scalar"), [A2, np.full((1, 1), 2.5)], A2 / 2.5, True),
    "scalar-3d": (O.Mul(broadcast="scalar"), [A3, np.full((1, 1, 1), 2.5)], A3 * 2.5, True),
    "numpy-row": (O.Add(broadcast="numpy"), [A2, B2[:1]], A2 + B2[:1], True),
    "numpy-col": (O.Add(broadcast="numpy"), [B2[:, :1], A2], B2[:, :1] + A2, True),
    "numpy-1d": (O.Sub(broadcast="numpy"), [A2, B2[0]], A2 - B2[0], True),
    "numpy-new-axis": (O.Mul(broadcast="numpy"), [np.ones((3, 1, 6)) * 2, A2],
                       np.ones((3, 1, 6)) * 2 * A2, True),
    "where": (O.Where(), [M2, A2, B2], np.where(M2, A2, B2), False),
    "where-3d-broadcast": (O.Where(broadcast="numpy"), [M3, A3, np.array([7.0])],
                           np.where(M3, A3, 7.0), False),
    "mask": (O.Mask(), [A2, M2], np.where(M2, A2, np.nan), False),
    "mask-invert": (O.Mask(fill=0, invert=True), [A3, M3], np.where(M3, 0, A3), False),
    "merge": (O.Merge(), [HOLEY, B2], np.where(np.isnan(HOLEY), B2, HOLEY), False),
    "merge-missing": (O.Merge(missing=0), [I2, J2], np.where(I2 == 0, J2, I2), False),
}


@pytest.mark.parametrize("name", CASES)
def test_values_and_perturbation_oracle(name):
    op, arrays, expected, exact = CASES[name]
    out = run_plain(op, *arrays)
    assert out.shape == np.shape(expected)
    assert out.dtype == np.asarray(expected).dtype
    np.testing.assert_allclose(out, expected, equal_nan=True)
    check_lineage(op, *arrays, exact=exact, full=False)


# One case per distinct lineage shape (the emitter is shared, so more cases add time, not coverage).
FULL_CASES = ["abs-3d", "threshold-gt", "add", "mul-3d", "scalar-(1,)", "scalar-(1,1)", "scalar-3d",
              "numpy-row", "numpy-col", "numpy-1d", "numpy-new-axis", "where", "where-3d-broadcast",
              "mask-invert", "merge"]


def test_full_pairs_equal_mapping(tmp_path):
    """One run with the cases stored as Full lineage; every single-cell trace
    (stored backward and forward, re-executed, mapped) gives the same cells."""
    check_full([CASES[k][:2] for k in FULL_CASES], tmp_path)


def test_where_lineage_is_the_coordinate_relation():
    m = np.zeros((5, 6), bool)           # b is always chosen: a still counts, coordinates only
    rel = check_lineage(O.Where(), m, A2, B2, full=False)
    assert all(np.array_equal(r, np.eye(30, dtype=bool)) for r in rel)


def test_scalar_broadcast_declares_second_input_all_to_all(tmp_path):
    op = O.Sub(broadcast="scalar")
    assert not op.is_all_to_all(0) and op.is_all_to_all(1)
    assert op.tiling == subzero.ELEMENTWISE          # the one cell is read whole per tile
    assert O.Sub(broadcast="numpy").tiling == subzero.GLOBAL
    wf = subzero.Workflow("t")
    wf.add("op", op, wf.input("a"), wf.input("b"))
    with subzero.open_store(tmp_path) as st:
        run = st.run(wf, inputs={"a": A2, "b": np.array([1.0])}, strategies={"op": "full"},
                     progress=False, tile=2)
        whole = st.run(wf, inputs={"a": A2, "b": np.array([1.0])}, strategies={"op": "full"},
                       progress=False)
        assert np.array_equal(run.array("op").values, whole.array("op").values)
        for cells, to in (([(0, 0), (4, 5)], "a"), ([(1, 1)], "b")):
            assert np.array_equal(run.trace("op", cells, to=to, shortcut=False).bitmap,
                                  whole.trace("op", cells, to=to, shortcut=False).bitmap)
        res = run.trace("op", [(2, 3)], to="b")
        assert res.cells.tolist() == [[0]] and res.steps[0].method == "all-to-all"
        assert len(run.trace("b", [(0,)], to="op")) == 30
        assert run.trace("op", [(2, 3)], to="a").cells.tolist() == [[2, 3]]


def test_scalar_broadcast_rejects_a_bigger_second_input():
    with pytest.raises(ValueError, match="one-cell"):
        run_plain(O.Add(broadcast="scalar"), A2, B2[:1])


def test_shapes_must_match_without_broadcast():
    with pytest.raises(ValueError, match="broadcast="):
        run_plain(O.Add(), A2, A2[:, :3])
    with pytest.raises(ValueError, match="do not broadcast"):
        run_plain(O.Add(broadcast="numpy"), A2, A2[:, :3])


def test_non_elementwise_callable_is_refused():
    with pytest.raises(ValueError, match="not elementwise"):
        run_plain(O.Unary(np.sum), A2)


def test_declarations():
    for op in (O.Abs(), O.Add(), O.Where(), O.Threshold(1.0), O.Mask(), O.Merge()):
        assert op.tiling == subzero.ELEMENTWISE
        assert op.deterministic and not op.is_all_to_all(0)
        assert subzero.Mode.FULL in op.supported_modes() and op.has_mapping()
    assert O.Add(broadcast="numpy").tiling == subzero.GLOBAL
    assert O.Add().n_inputs() == 2 and O.Where().n_inputs() == 3 and O.Abs().n_inputs() == 1
    with pytest.raises(ValueError, match="comparison"):
        O.Threshold(1.0, "approx")
    with pytest.raises(ValueError, match="broadcast must be"):
        O.Add(broadcast="yes")


def test_function_is_required():
    """Unary and Binary take a function unless a subclass declares one (Abs, Add...)."""
    with pytest.raises(TypeError, match="Unary needs an elementwise function"):
        O.Unary()
    with pytest.raises(TypeError, match="Binary needs a binary elementwise function"):
        O.Binary()
    assert O.Abs().func is np.abs and O.Add().func is np.add and O.Unary(np.tanh).func is np.tanh
