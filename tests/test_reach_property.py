"""The payload reach (``Operator.payload_reach``): forward steps over backward-keyed
payload lineage read only the pairs near their cells, and a declaration that is too
small is caught when the run captures its pairs -- never a wrong answer.

Property-based, against brute force in plain Python:

* :func:`subzero.model.reach.grown` (the query grown by the reach) against every
  output cell within the reach of a query cell;
* :func:`subzero.model.reach.check` against the true reach of random pairs;
* end to end, random operators of the oracle suite (``oracle_ops``) declaring a
  random reach, around the true one: the run fails with a :class:`LineageError`
  exactly when some payload pair reaches farther than declared; otherwise every
  forward trace through every backward-keyed payload strategy (the reach recorded
  with it) equals the oracle, and equals the same trace scanning every pair.
"""

from __future__ import annotations

import itertools

import numpy as np
import oracle_ops as oo
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_oracle_property import SETTINGS, input_arrays, op_specs, queries

import subzero
from subzero import LineageError
from subzero.model import reach
from subzero.model.cells import pack, unpack
from subzero.model.strategy import parse_one
from subzero.storage.lineage import LineageStore
from subzero.storage.reader import StrategyReader

NAMES = ("a", "b", "c")


def chebyshev(a, b) -> int:
    return max((abs(x - y) for x, y in zip(a, b)), default=0)


# -- the query grown by the reach ---------------------------------------------------------
@st.composite
def grow_cases(draw):
    nd = draw(st.integers(1, 3))
    in_shape = tuple(draw(st.integers(1, 7)) for _ in range(nd))
    out_shape = tuple(draw(st.integers(1, 7)) for _ in range(nd))
    n = int(np.prod(in_shape))
    q = sorted(draw(st.sets(st.integers(0, n - 1), max_size=min(n, 12))))
    return in_shape, out_shape, np.array(q, np.int64), draw(st.integers(0, 3))


@settings(max_examples=300, **SETTINGS)
@given(case=grow_cases())
def test_grown_is_every_output_cell_within_reach(case):
    in_shape, out_shape, q, r = case
    got = reach.grown(q, in_shape, r, out_shape, limit=1 << 30)
    qc = [tuple(c) for c in unpack(q, in_shape).tolist()] if q.size else []
    want = sorted(int(pack(np.array([o]), out_shape)[0])
                  for o in itertools.product(*map(range, out_shape))
                  if any(chebyshev(o, c) <= r for c in qc))
    assert got is not None and got.tolist() == want
    if q.size:               # both ways of growing, whichever grown() chose
        cells = unpack(q, in_shape)
        lo = cells.min(axis=0) - r
        ext = cells.max(axis=0) + r + 1 - lo
        assert reach._grown_box(cells, lo, ext, r, out_shape, 1 << 30).tolist() == want
        assert reach._grown_runs(q, cells, in_shape, r, out_shape, 1 << 30).tolist() == want


def test_grown_gives_up_beyond_its_limit():
    q = np.arange(10_000, dtype=np.int64)
    assert reach.grown(q, (100, 100), 3, (100, 100), limit=1000) is None
    assert reach.grown(q, (100, 100), 3, (100, 100), limit=1 << 20) is not None


# -- the check at capture time --------------------------------------------------------------
@st.composite
def check_cases(draw):
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(nd))
    n = int(np.prod(shape))
    pairs = draw(st.lists(st.tuples(st.lists(st.integers(0, n - 1), min_size=0, max_size=4),
                                    st.lists(st.integers(0, n - 1), max_size=5)),
                          min_size=1, max_size=6))
    return shape, pairs, draw(st.integers(0, 3))


def true_reach(shape, pairs) -> int:
    """The farthest an input cell of a pair is from the nearest output cell of the pair
    (pairs without output cells are never stored)."""
    worst = 0
    for out, ins in pairs:
        if not out:
            continue
        oc = [tuple(unpack(np.array([o]), shape)[0]) for o in out]
        for x in ins:
            c = tuple(unpack(np.array([x]), shape)[0])
            worst = max(worst, min(chebyshev(c, o) for o in oc))
    return worst


@settings(max_examples=300, **SETTINGS)
@given(case=check_cases())
def test_check_fails_exactly_when_a_pair_reaches_farther(case):
    shape, pairs, r = case
    lens = [len(o) for o, _ in pairs]
    out = unpack(np.array([o for p, _ in pairs for o in p], np.int64), shape)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

    def map_p_pairs(cells, offsets, payloads, pay_ids, i):     # pay_ids: the pairs' numbers
        ins = [np.array(pairs[k][1], np.int64) for k in pay_ids.tolist()]
        return (unpack(np.concatenate(ins), shape) if ins else np.zeros((0, len(shape)), np.int64),
                np.repeat(np.arange(len(ins)), [len(x) for x in ins]))

    def run():
        reach.check("op", (r,), out, off, [b""], np.arange(len(pairs)), map_p_pairs,
                    shape, [shape])
    saved = reach.CHECK_PAIRS
    for piece in (saved, 1, 2):              # in one piece, and pair by pair
        reach.CHECK_PAIRS = piece
        try:
            if true_reach(shape, pairs) > r:
                with pytest.raises(LineageError, match="payload_reach"):
                    run()
            else:
                run()
        finally:
            reach.CHECK_PAIRS = saved


def test_check_refuses_a_reach_across_dimensions():
    def map_p_pairs(cells, offsets, payloads, pay_ids, i):
        return np.zeros((1, 1), np.int64), np.zeros(1, np.int64)
    with pytest.raises(LineageError, match="dimensions"):
        reach.check("op", (1,), np.zeros((1, 2), np.int64), np.array([0, 1]), [b""],
                    np.zeros(1, np.int64), map_p_pairs, (3, 3), [(3,)])


@pytest.mark.parametrize("bad", [-1, 1.5, "2", (1, 2), True])
def test_a_malformed_declaration_is_an_error(bad):
    class Op(subzero.Operator):
        payload_reach = bad
    with pytest.raises(LineageError, match="payload_reach"):
        reach.declared(Op(), 1)


# -- end to end ----------------------------------------------------------------------------------
def spec_true_reach(spec: oo.OpSpec, i: int) -> int:
    """The true reach on input ``i`` of the spec's payload pairs, in plain Python."""
    worst = 0
    for call in spec.calls:
        for pair in call.pairs:
            if not pair.out:
                continue
            oc = [oo.unflat(o, spec.out_shape) for o in set(pair.out)]
            for x in oo.oracle_pair_inputs(spec, pair, i):
                c = oo.unflat(x, spec.in_shapes[i])
                worst = max(worst, min(chebyshev(c, o) for o in oc))
    return worst


@st.composite
def reach_cases(draw):
    spec = draw(op_specs(kind=draw(st.sampled_from(["pay", "map"]))))
    declared = []
    for i, s in enumerate(spec.in_shapes):
        if len(s) != len(spec.out_shape) or draw(st.integers(0, 5)) == 0:
            declared.append(None)
            continue
        declared.append(max(0, spec_true_reach(spec, i) + draw(st.sampled_from([-1, 0, 0, 1, 3]))))
    in_qs = [draw(st.lists(queries(s), min_size=1, max_size=3)) for s in spec.in_shapes]
    return spec, tuple(declared), in_qs


def payload_copies(spec: oo.OpSpec) -> dict[str, list[str]]:
    """Operator copies holding the spec's backward-keyed payload strategies."""
    out = {}
    if "comp" in spec.modes and spec.has_mapping:
        out["op"] = ["comp:payone:backward", "comp:paymany:backward"]
    if "pay" in spec.modes:
        out["op_pay"] = ["pay:payone:backward", "pay:paymany:backward"]
    return out


@pytest.fixture(scope="module")
def rstore(tmp_path_factory):
    """One store for every example (each example is a run of its own in it): a store
    made per example cost its catalog and folders 120 times."""
    st_ = subzero.open_store(tmp_path_factory.mktemp("reach") / "store")
    yield st_
    st_.close()


@settings(max_examples=120, **SETTINGS)
@given(case=reach_cases())
def test_forward_traces_with_a_declared_reach_match_the_oracle(rstore, case):
    spec, declared, in_qs = case
    copies = payload_copies(spec)
    if not copies:
        return
    wf = subzero.Workflow("reach")
    nodes = {n: wf.input(n) for n in NAMES[:spec.n_inputs]}
    for name in copies:
        op = oo.make_op(spec)
        op.payload_reach = declared                 # type: ignore[attr-defined]
        wf.add(name, op, *nodes.values())
    too_far = any(r is not None and spec_true_reach(spec, i) > r for i, r in enumerate(declared))
    event("declared too small: the run must fail" if too_far else
          "declared" if any(x is not None for x in declared) else "none declared")

    def run():
        return rstore.run(wf, inputs=input_arrays(spec.in_shapes, NAMES),
                         strategies={k: "+".join(v) for k, v in copies.items()}, progress=False)
    if too_far:
        with pytest.raises(LineageError, match="payload_reach"):
            run()
        return
    r = run()
    lineage = LineageStore(r.dir / "lineage", readonly=True, run_uid=r.uid)
    for copy, strategies in copies.items():
        kind = "comp" if copy == "op" else "pairs"
        mats = oo.relation(spec, kind)
        for s in strategies:
            recorded = lineage.meta(copy, parse_one(s)).reach
            assert recorded == (declared if any(x is not None for x in declared) else None)
            for i, qs in enumerate(in_qs):
                for q in qs:
                    cells = oo.cells_of(sorted(q), spec.in_shapes[i])
                    qbits = np.zeros(oo.size_of(spec.in_shapes[i]), bool)
                    qbits[list(q)] = True
                    want = np.flatnonzero(oo.step(mats[i], qbits, backward=False))
                    if want.size and declared[i] is not None:
                        event("a forward trace through a recorded reach reached cells")
                    got = traced(r, NAMES[i], cells, copy, i, s)
                    assert got.tolist() == want.tolist(), (copy, s, i, q, declared)
                    assert scanned(r, NAMES[i], cells, copy, i, s).tolist() == want.tolist()
    lineage.close()
    r.close()


def traced(run, start, cells, copy, i, strategy) -> np.ndarray:
    run.executor().clear_cache()
    res = run.trace(start, cells, path=[(copy, i)], prefer=strategy, record=False)
    assert [st.method for st in res.steps] == ([f"stored:{strategy}"] if len(cells) else ["empty"])
    shape = run.shapes()[copy]
    return np.unique(pack(np.asarray(res.cells, np.int64).reshape(-1, len(shape)), shape))


def scanned(run, start, cells, copy, i, strategy) -> np.ndarray:
    """The same trace with the recorded reach hidden: every payload pair decoded."""
    saved = StrategyReader.reach
    StrategyReader.reach = lambda self, i: None        # type: ignore[method-assign]
    try:
        return traced(run, start, cells, copy, i, strategy)
    finally:
        StrategyReader.reach = saved
