"""The operator library through SubZero's public API: workflows of built-in
operators, xarray inputs, every lineage method agreeing end to end, batched
Full emission, pickling, and the package's exports."""

import pickle

import numpy as np
import pytest
import xarray as xr

import subzero
import subzero.operators as O
from subzero.operators.testing import check_full

rng = np.random.default_rng(5)
IMG = rng.normal(size=(12, 10))
FLAT = rng.uniform(0.9, 1.1, size=(12, 10))
K = rng.uniform(0.5, 1.5, size=(3, 3))


def chain() -> subzero.Workflow:
    wf = subzero.Workflow("chain")
    img, flat = wf.input("img"), wf.input("flat")
    calib = wf.add("calib", O.Div(), img, flat)
    padded = wf.add("padded", O.Pad(2, "symmetric"), calib)
    smooth = wf.add("smooth", O.Convolve(K, mode="wrap"), padded)
    crop = wf.add("crop", O.Slice(np.s_[2:-2, 2:-2]), smooth)
    hot = wf.add("hot", O.Threshold(1.0), crop)
    clean = wf.add("clean", O.Where(), hot, wf.add("median", O.MedianFilter(3), calib), calib)
    wf.add("cols", O.Mean(axis=0), clean)
    wf.add("total", O.Sum(), clean)
    return wf


def test_chain_values(tmp_path):
    with subzero.open_store(tmp_path) as st:
        run = st.run(chain(), inputs={"img": IMG, "flat": FLAT}, progress=False)
        from scipy import ndimage
        calib = IMG / FLAT
        crop = ndimage.convolve(np.pad(calib, 2, "symmetric"), K, mode="wrap")[2:-2, 2:-2]
        clean = np.where(crop > 1.0, ndimage.median_filter(calib, 3), calib)
        np.testing.assert_allclose(run.array("clean").values, clean)
        np.testing.assert_allclose(run.array("cols").values, clean.mean(0))
        np.testing.assert_allclose(run.array("total").values, [clean.sum()])


@pytest.mark.parametrize("start,cells,to", [
    ("cols", [(3,), (7,)], "img"),
    ("clean", [(0, 0), (11, 9), (5, 4)], "img"),
    ("crop", [(0, 9)], "calib"),
    ("img", [(0, 0)], "clean"),
    ("flat", [(6, 5), (11, 0)], "cols"),
])
def test_every_lineage_method_gives_the_same_answer(tmp_path, start, cells, to):
    """Map lineage, stored Full lineage (both indexes) and re-execution agree
    across a chain of stencils with wrapped and reflected edges."""
    wf = chain()
    answers = []
    with subzero.open_store(tmp_path) as st:
        for strategy in ("map", "full:fullone:backward", "full:fullmany:forward"):
            run = st.run(wf, inputs={"img": IMG, "flat": FLAT},
                         strategies={s: strategy for s in wf.steps}, progress=False)
            answers.append(run.trace(start, cells, to=to).bitmap)
            answers.append(run.trace(start, cells, to=to, shortcut=False).bitmap)
        answers.append(run.trace(start, cells, to=to, prefer="reexec", shortcut=False).bitmap)
    assert answers[0].any()
    for a in answers[1:]:
        assert np.array_equal(a, answers[0])


def test_xarray_inputs(tmp_path):
    wf = subzero.Workflow("x")
    wf.add("out", O.MeanFilter(3, mode="nearest"), wf.input("a"))
    da = xr.DataArray(IMG, dims=("y", "x"))
    with subzero.open_store(tmp_path) as st:
        run = st.run(wf, inputs={"a": da}, strategies={"out": "full"}, progress=False)
        from scipy import ndimage
        np.testing.assert_allclose(run.array("out").values,
                                   ndimage.uniform_filter(IMG, 3, mode="nearest"))
        assert len(run.trace("out", [(0, 0)], to="a")) == 4


def test_full_emission_in_small_batches(tmp_path, monkeypatch):
    """Batches of a few output cells give the same pairs as one big batch."""
    from subzero.operators import base
    monkeypatch.setattr(base, "EMIT_BATCH_CELLS", 7)
    a, b = rng.normal(size=(5, 6)), rng.normal(size=(2, 6))
    check_full([(O.Convolve(K, mode="constant"), [a]), (O.Convolve(K, mode="reflect"), [a]),
                (O.Concat(), [a, b]), (O.Sum(axis=1), [a]), (O.Add(broadcast="scalar"), [a, b[:1, :1]]),
                (O.Pad((2, 1)), [a])], tmp_path)


def test_operator_errors_name_the_operator(tmp_path):
    wf = subzero.Workflow("bad")
    wf.add("sum", O.Add(), wf.input("a"), wf.input("b"))
    with subzero.open_store(tmp_path) as st:
        with pytest.raises(subzero.OperatorError, match=r"'sum' \(Add\).*broadcast="):
            st.run(wf, inputs={"a": IMG, "b": IMG[:3]}, progress=False)


def test_workflow_checks_the_number_of_inputs():
    wf = subzero.Workflow("arity")
    a = wf.input("a")
    with pytest.raises(subzero.WorkflowError, match="takes 2 inputs, got 1"):
        wf.add("x", O.Add(), a)
    wf.add("cat", O.Concat(), a, a, a)            # any number


def test_operators_pickle():
    ops = [O.Abs(), O.Clip(0, 1), O.Threshold(2.0, ">="), O.Add(broadcast="scalar"), O.Where(),
           O.Slice(np.s_[1:, ::2]), O.Subsample(2), O.Pad(1, "wrap"), O.Rebin(2, "mean"),
           O.Convolve(K, mode="wrap"), O.MedianFilter(footprint=K > 1), O.Sum(axis=1), O.MatMul()]
    for op in ops:
        back = pickle.loads(pickle.dumps(op))
        assert type(back) is type(op) and back.tiling == op.tiling
        assert [back.is_all_to_all(i) for i in range(2)] == [op.is_all_to_all(i) for i in range(2)]


def test_tiling_kinds_are_an_enum_that_reads_as_its_name():
    """``Tiling.kind`` is a TilingKind, equal to its name (code that compares with strings
    keeps working); a name is accepted, an unknown one refused; a pickle made when the
    kind was a string loads as the enum."""
    from subzero.model.operator import Tiling, TilingKind
    assert subzero.stencil(2).kind is TilingKind.STENCIL and subzero.stencil(2).kind == "stencil"
    assert Tiling("aggregate") == subzero.AGGREGATE and Tiling("aggregate").kind is TilingKind.AGGREGATE
    assert f"{subzero.GLOBAL.kind}" == "global" and subzero.ELEMENTWISE.kind.tile_local
    with pytest.raises(ValueError, match="unknown tiling 'diagonal'"):
        Tiling("diagonal")
    made_before = object.__new__(Tiling)            # as pickled when the kind was a str
    made_before.__dict__.update(kind="stencil", radius=3)
    old = pickle.dumps(made_before)
    assert b"TilingKind" not in old
    back = pickle.loads(old)
    assert back.kind is TilingKind.STENCIL and back.radius == 3 and back == subzero.stencil(3)


def test_what_the_engines_check_an_operator_can_do_are_protocols():
    """Aggregation, gathering and labelling are declared as protocols: the built-in
    operators that declare those tilings implement them, the others do not."""
    from subzero.model.operator import Aggregating, Gathering, Labelling, TilingKind

    class Stars(O.ConnectedComponents):
        def foreground(self, values, stat):
            return values > 0

    assert O.Sum().tiling.kind is TilingKind.AGGREGATE and isinstance(O.Sum(), Aggregating)
    assert O.Slice(np.s_[1:]).tiling.kind is TilingKind.GATHER and isinstance(O.Slice(np.s_[1:]), Gathering)
    assert Stars().tiling.kind is TilingKind.COMPONENTS and isinstance(Stars(), Labelling)
    for op in (O.Abs(), O.Convolve(K), subzero.Operator()):
        assert not isinstance(op, (Aggregating, Gathering, Labelling)), op


def test_every_export_is_a_documented_operator():
    for name in O.__all__:
        obj = getattr(O, name)
        if isinstance(obj, type):
            assert issubclass(obj, subzero.Operator), name
        assert obj.__doc__, name


def test_forward_trace_of_an_unused_cell_over_backward_full_lineage(tmp_path):
    """A forward trace from an input cell that no output reads, answered from
    lineage stored with the backward index (fullone), should be empty."""
    wf = subzero.Workflow("unused")
    wf.add("head", O.Slice(np.s_[:1]), wf.input("x"))
    with subzero.open_store(tmp_path) as st:
        run = st.run(wf, inputs={"x": np.arange(3.0)}, strategies={"head": "full"}, progress=False)
        assert len(run.trace("x", [(2,)], to="head")) == 0
