"""Slice, subarray, subsample, concat, transpose, pad and rebin: values against
numpy, exact lineage against the perturbation oracle, Full == Map."""

import numpy as np
import pytest

import subzero
import subzero.operators as O
from subzero.operators.testing import check_full, check_lineage, run_plain

rng = np.random.default_rng(7)
A2, B2 = rng.normal(size=(5, 6)), rng.normal(size=(2, 6))
C2 = rng.normal(size=(5, 3))
A3, B3 = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 2))
V1 = rng.normal(size=3)


def _blocks(x, f, func):
    """Reference rebin: reduce every block with a Python loop (small arrays only)."""
    shape = [-(-n // b) for n, b in zip(x.shape, f)]
    out = np.empty(shape)
    for idx in np.ndindex(*shape):
        sl = tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, f))
        out[idx] = func(x[sl])
    return out


CASES = {
    "slice-steps": (O.Slice(np.s_[1:4, ::2]), [A2], A2[1:4, ::2]),
    "slice-negative-step-and-int": (O.Slice(np.s_[::-2, 1]), [A2], A2[::-2, 1]),
    "slice-3d": (O.Slice(np.s_[2:0:-1, ::-3, 1:5:2]), [A3], A3[2:0:-1, ::-3, 1:5:2]),
    "slice-short-key": (O.Slice(np.s_[-2:]), [A3], A3[-2:]),
    "slice-one-cell": (O.Slice((1, -2)), [A2], A2[1, -2].reshape(1)),
    "subarray": (O.Subarray((1, 2), (4, 5)), [A2], A2[1:4, 2:5]),
    "subsample": (O.Subsample(2), [A3], A3[::2, ::2, ::2]),
    "subsample-offset": (O.Subsample((2, 3), offset=(1, 0)), [A2], A2[1::2, ::3]),
    "concat-0": (O.Concat(axis=0), [A2, B2], np.concatenate([A2, B2], 0)),
    "concat-1-three": (O.Concat(axis=1), [A2, C2, A2], np.concatenate([A2, C2, A2], 1)),
    "concat-3d-last": (O.Concat(axis=-1), [A3, B3], np.concatenate([A3, B3], -1)),
    "transpose": (O.Transpose(), [A2], A2.T),
    "transpose-3d": (O.Transpose((1, 2, 0)), [A3], A3.transpose(1, 2, 0)),
    "transpose-3d-neg": (O.Transpose((0, -1, 1)), [A3], A3.transpose(0, 2, 1)),
    "pad-constant": (O.Pad((1, 2), constant_values=9.0), [A2], np.pad(A2, (1, 2), constant_values=9.0)),
    "pad-edge": (O.Pad(((1, 0), (2, 3)), "edge"), [A2], np.pad(A2, ((1, 0), (2, 3)), "edge")),
    "pad-reflect": (O.Pad(2, "reflect"), [A2], np.pad(A2, 2, "reflect")),
    "pad-symmetric-wide": (O.Pad(7, "symmetric"), [V1], np.pad(V1, 7, "symmetric")),
    "pad-reflect-wide": (O.Pad((8, 5), "reflect"), [V1], np.pad(V1, (8, 5), "reflect")),
    "pad-wrap-wide": (O.Pad(7, "wrap"), [V1], np.pad(V1, 7, "wrap")),
    "pad-3d": (O.Pad(((0, 1), (1, 1), (2, 0)), "symmetric"), [A3],
               np.pad(A3, ((0, 1), (1, 1), (2, 0)), "symmetric")),
    "rebin-sum": (O.Rebin((2, 3)), [A2], _blocks(A2, (2, 3), np.sum)),
    "rebin-mean-3d": (O.Rebin(2, "mean"), [A3], _blocks(A3, (2, 2, 2), np.mean)),
    "rebin-min": (O.Rebin(2, "min"), [A2], _blocks(A2, (2, 2), np.min)),
    "rebin-max": (O.Rebin((1, 4), "max"), [A2], _blocks(A2, (1, 4), np.max)),
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


def test_concat_is_not_all_to_all(tmp_path):
    """The paper's counter-example: a cell of input 1 reaches only its own output place."""
    op = O.Concat(axis=0)
    assert not op.is_all_to_all(0) and not op.is_all_to_all(1)
    wf = subzero.Workflow("t")
    wf.add("cat", op, wf.input("a"), wf.input("b"))
    with subzero.open_store(tmp_path) as st:
        run = st.run(wf, inputs={"a": A2, "b": B2}, progress=False)
        assert run.trace("b", [(1, 4)], to="cat").cells.tolist() == [[6, 4]]
        assert run.trace("cat", [(6, 4)], to="b").cells.tolist() == [[1, 4]]
        assert len(run.trace("cat", [(6, 4)], to="a")) == 0


def test_rebin_sums_bools_as_counts():
    out = run_plain(O.Rebin(2), np.ones((3, 4), bool))
    assert out.tolist() == [[4, 4], [2, 2]]


@pytest.mark.parametrize("op,arrays,match", [
    (O.Slice(np.s_[1, 2, 3]), [A2], "3 entries"),
    (O.Slice((7,)), [A2], "outside axis 0"),
    (O.Concat(axis=0), [A2, C2], "differ off axis 0"),
    (O.Transpose((0, 0)), [A2], "not a permutation"),
    (O.Pad(-1), [A2], "negative pad"),
    (O.Rebin((2, 0)), [A2], "positive"),
])
def test_errors_name_the_problem(op, arrays, match):
    with pytest.raises((ValueError, IndexError), match=match):
        run_plain(op, *arrays)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="pad mode"):
        O.Pad(1, "maximum")
    with pytest.raises(ValueError, match="func must be"):
        O.Rebin(2, "median")
    with pytest.raises(TypeError, match="slices or integers"):
        O.Slice(([1, 2],))


def test_declarations():
    for op in (O.Slice(np.s_[1:]), O.Concat(), O.Transpose(), O.Pad(1), O.Rebin(2)):
        assert op.tiling == (subzero.GATHER if isinstance(op, O.Slice) else subzero.GLOBAL)
        assert op.deterministic and op.has_mapping()
        assert not op.is_all_to_all(0)
    assert O.Concat().n_inputs() is None and O.Slice(np.s_[:]).n_inputs() == 1
