"""Answers that explain themselves, checked against an independent oracle: the cells a
trace reached without any step through an all-to-all input (``TraceResult.direct``,
walked alongside the answer) and the answer of ``exclude_all_to_all`` both equal the
union of the single-path traces (``path=``, another walk) over every DAG path that
avoids such steps; the answer itself is the union over every path; and the parts
split the answer exactly.  Random queries, both directions, stored lineage, mapping
functions and re-execution."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import subzero
from subzero import Workflow
from subzero.operators import Add, Mean, MeanFilter, Slice, Sub

SHAPE = (14, 12)


def branching():
    """An overscan-like branch: a mean over the smoothed image (all-to-all), subtracted
    as a scalar (all-to-all on that input), beside the direct path."""
    wf = Workflow("branching")
    x, y = wf.input("x"), wf.input("y")
    s = wf.add("smooth", MeanFilter(3), x)
    m = wf.add("level", Mean(), s)
    d = wf.add("minus", Sub(broadcast="scalar"), s, m)
    e = wf.add("plus", Add(), d, y)
    wf.add("corner", Slice(np.s_[2:11, 1:9]), e)
    return wf


STRATEGIES = [{}, {"smooth": "full:fullone:backward", "plus": "full:fullmany:forward"},
              {"smooth": "blackbox", "minus": "blackbox"}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    st_ = subzero.open_store(tmp_path_factory.mktemp("explain") / "store")
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=SHAPE), rng.normal(size=SHAPE)
    out = [st_.run(branching(), inputs={"x": x, "y": y}, strategies=s, progress=False,
                   engine="local") for s in STRATEGIES]
    yield out
    st_.close()


def paths(run, start: str, to: str, backward: bool):
    """Every DAG path from ``start`` to ``to`` as (operator, input) steps, and whether
    one of its steps reads an input all-to-all."""
    wf = run.workflow
    ins = {n: list(s.inputs) for n, s in wf.steps.items()}

    def walk(a):
        if a == to:
            yield []
            return
        if backward:
            for i, src in enumerate(ins.get(a, [])):
                for rest in walk(src):
                    yield [(a, i)] + rest
        else:
            for op, srcs in ins.items():
                for i, src in enumerate(srcs):
                    if src == a:
                        for rest in walk(op):
                            yield [(op, i)] + rest
    for p in walk(start):
        yield p, any(wf.steps[op].operator.is_all_to_all(i) for op, i in p)


def union(sets, shape):
    out = np.zeros(shape, bool)
    for c in sets:
        if len(c):
            out[tuple(np.asarray(c).T)] = True
    return {tuple(int(v) for v in c) for c in np.argwhere(out)}


def as_set(cells):
    return {tuple(int(v) for v in c) for c in cells}


QUERIES = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 7)), min_size=1, max_size=6,
                   unique=True)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(q=QUERIES, which=st.integers(0, len(STRATEGIES) - 1), backward=st.booleans(),
       prefer=st.sampled_from([None, "map", "reexec"]))
def test_direct_cells_are_the_paths_without_all_to_all_steps(runs, q, which, backward, prefer):
    run = runs[which]
    start, to = ("corner", "x") if backward else ("x", "corner")
    cells = np.array(q) if backward else np.array(q) + 2
    res = run.trace(start, cells, to=to, record=False, prefer=prefer)
    per_path = [(p, a2a, run.trace(start, cells, path=p, record=False, prefer=prefer).cells)
                for p, a2a in paths(run, start, to, backward)]
    assert len(per_path) == 2 and sum(a2a for _, a2a, _ in per_path) == 1
    shape = run.shapes()[to]
    assert as_set(res.cells) == union([c for _, _, c in per_path], shape)
    want = union([c for _, a2a, c in per_path if not a2a], shape)
    direct = res.direct if res.direct is not None else res.cellset
    assert as_set(direct.cells()) == want
    excluded = run.trace(start, cells, to=to, record=False, prefer=prefer, exclude_all_to_all=True)
    assert as_set(excluded.cells) == want and excluded.explain()["excluded_all_to_all"]
    ex = res.explain()
    assert ex["direct"] == len(want) and ex["direct"] + ex["all_to_all_only"] == len(res)
    parts = res.parts()
    assert sum(p["count"] for p in parts) == len(res)
    if ex["all_to_all_only"]:
        assert [p["via"] for p in parts] == ["direct", "all-to-all only"]
        assert set(ex["all_to_all_steps"]) <= {"level:0", "minus:1"}


def test_a_trace_without_all_to_all_steps_is_all_direct(runs):
    res = runs[0].trace("plus", [(3, 3)], to="y", record=False)
    assert res.direct is None and res.explain()["all_to_all_only"] == 0
    assert [p["via"] for p in res.parts()] == ["direct"]


def test_untrusted_runs_cannot_exclude_what_their_code_declares(runs, monkeypatch, tmp_path):
    from subzero.storage.trust import CONFIG_ENV
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "config-of-another-user"))
    st_ = subzero.open_store(runs[0].store.path, create=False)
    run = st_.get(runs[0].id)
    with pytest.raises(subzero.QueryError, match="not trusted"):
        run.trace("corner", [(1, 1)], to="x", record=False, exclude_all_to_all=True)
    st_.close()


def test_the_cli_explains_and_excludes(runs, cli):
    store = runs[0].store.path
    code, out, err = cli("trace", "--store", store, "--run", runs[0].id, "--from", "corner",
                         "--cells", "1,1", "--to", "x")
    assert code == 0, err
    assert "more only through all-to-all steps (level input 0" in out or \
           "more only through all-to-all steps (minus input 1" in out, out
    assert "--exclude-all-to-all leaves them out" in out
    code, out2, err = cli("trace", "--store", store, "--run", runs[0].id, "--from", "corner",
                          "--cells", "1,1", "--to", "x", "--exclude-all-to-all", "--json")
    import json
    d = json.loads(out2)
    assert d["explain"]["excluded_all_to_all"] and d["count"] == d["explain"]["direct"]
    assert d["count"] < runs[0].trace("corner", [(1, 1)], to="x", record=False).cellset.size
    assert all(s["method"] != "all-to-all" for s in d["steps"])


