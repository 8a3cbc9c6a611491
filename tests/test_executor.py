"""Executor behaviour: the entire-array short-cut only where declared, the
concatenate counter-example, early stop, multi-input paths, step statistics."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subzero import LineageError, Mode, Operator, Workflow
from subzero.operators import Add, Concat, Mean, Sub


def concat_wf():
    wf = Workflow("cat")
    a, b = wf.input("a"), wf.input("b")
    wf.add("cat", Concat(axis=0), a, b)
    return wf


def test_concatenate_is_not_all_to_all(store):
    """The paper's counter-example: a cell of one input maps only to its own
    place in the output, never to the whole array."""
    run = store.run(concat_wf(), inputs={"a": np.zeros((3, 4)), "b": np.ones((2, 4))})
    fwd = run.trace("b", [(1, 2)], to="cat")
    assert fwd.cells.tolist() == [[4, 2]] and fwd.steps[0].method != "all-to-all"
    back_a = run.trace("cat", [(4, 2)], to="a")
    assert len(back_a) == 0                           # that output cell came from b only
    back_b = run.trace("cat", [(4, 2)], to="b")
    assert back_b.cells.tolist() == [[1, 2]]
    assert not Concat(axis=0).is_all_to_all(0) and not Concat(axis=0).is_all_to_all(1)


def test_shortcut_only_where_declared_and_equal_without_it(store):
    wf = Workflow("mean")
    x = wf.input("x")
    m = wf.add("m", Mean(), x)
    wf.add("centred", Sub(broadcast="scalar"), x, m)
    run = store.run(wf, inputs={"x": np.arange(12.0).reshape(3, 4)})
    fast = run.trace("x", [(0, 0)], to="centred")
    slow = run.trace("x", [(0, 0)], to="centred", shortcut=False)
    assert np.array_equal(fast.bitmap, slow.bitmap) and fast.bitmap.all()
    assert "all-to-all" in [s.method for s in fast.steps]
    assert "all-to-all" not in [s.method for s in slow.steps]
    # input 0 of the subtraction is elementwise: no short-cut there
    direct = run.trace("x", [(0, 0)], path=[("centred", 0)])
    assert direct.cells.tolist() == [[0, 0]]


def test_early_stop_skips_steps_into_a_full_array(store):
    wf = Workflow("two")
    x = wf.input("x")
    m = wf.add("m", Mean(), x)
    c = wf.add("c", Sub(broadcast="scalar"), x, m)
    wf.add("d", Add(), c, x)
    run = store.run(wf, inputs={"x": np.arange(6.0)})
    res = run.trace("x", [(1,)], to="d")
    assert res.bitmap.all()
    ops = [(s.op, s.input) for s in res.steps]
    assert len(ops) == len(set(ops))          # no step repeated


def test_step_statistics(store):
    run = store.run(concat_wf(), inputs={"a": np.zeros((3, 4)), "b": np.ones((2, 4))},
                    strategies={"cat": "full"})
    res = run.trace("cat", [(0, 0), (4, 1)], to="b")
    (s,) = res.steps
    assert (s.op, s.input, s.direction, s.cells_in, s.cells_out) == ("cat", 1, "backward", 2, 1)
    assert s.method == "stored:full:fullone:backward" and s.seconds > 0


class FullOnly(Operator):
    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        ctx.lwrite([(0,)], payload=b"\x01")
        return x


def test_payload_from_a_full_only_operator_fails_the_run(store):
    wf = Workflow("p")
    wf.add("op", FullOnly(), wf.input("x"))
    with pytest.raises(LineageError, match="supports neither Mode.PAY nor Mode.COMP"):
        store.run(wf, inputs={"x": np.zeros(3)}, strategies={"op": "full"})
    assert store.runs()[-1].status == "failed"


class BadMapP(Operator):
    def supported_modes(self):
        return {Mode.PAY, Mode.BLACKBOX}

    def run(self, ctx, x):
        ctx.lwrite([(0,)], payload=b"\x09")
        return x

    def map_p(self, cells, payload, i, ctx):
        return cells + payload[0]          # walks off the end of the input


def test_map_p_out_of_range_is_a_clear_error(store):
    wf = Workflow("m")
    wf.add("op", BadMapP(), wf.input("x"))
    run = store.run(wf, inputs={"x": np.zeros(4)}, strategies={"op": "pay"})
    with pytest.raises(LineageError, match=r"operator 'op': map_p returned cell \(9,\) outside"):
        run.trace("op", [(0,)], to="x")


def test_map_p_out_of_range_at_capture_fails_the_run(store):
    """Forward-keyed payload lineage runs map_p while capturing: same clear error."""
    wf = Workflow("m")
    wf.add("op", BadMapP(), wf.input("x"))
    with pytest.raises(LineageError, match=r"map_p returned cell \(9,\) outside input 0"):
        store.run(wf, inputs={"x": np.zeros(4)}, strategies={"op": "pay:payone:forward"})


@given(st.lists(st.integers(0, 5000), max_size=3000), st.booleans())
@settings(max_examples=200, deadline=None)
def test_id_dedupe_helpers_equal_np_unique(ids, presort):
    """The executor's fast dedupes (a bitmap over the id range, one pass over sorted
    ids) give exactly np.unique."""
    from subzero.model.cells import sorted_unique, unique_ids
    a = np.asarray(ids, np.int64)
    if presort:
        a = np.sort(a)
        assert np.array_equal(sorted_unique(a), np.unique(a))
    assert np.array_equal(unique_ids(a, 5001), np.unique(a))
