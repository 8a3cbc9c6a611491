"""Executor behaviour: the entire-array short-cut only where declared, the
concatenate counter-example, early stop, multi-input paths, step statistics."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subzero import LineageError, Mode, Operator, Workflow
from subzero.model.cellset import CellSet
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


# -- the executor's parts: pair sources, methods, planner protocol, DAG walks ------------------

class Shifted(Operator):
    """Output cell k depends on input cell k + p, p = k % 7 stored as its payload (so a
    read meets many payload values)."""

    def supported_modes(self):
        return {Mode.PAY, Mode.BLACKBOX}

    def run(self, ctx, x):
        n = len(x)
        ctx.lwrite(np.arange(n)[:, None], payload=[bytes([k % 7]) for k in range(n)], each=True)
        return x

    def map_p(self, cells, payload, i, ctx):
        return np.minimum(np.asarray(cells) + payload[0], ctx.input_shape(i)[0] - 1)


def _shifted_reader(store, n=50):
    from subzero.model.strategy import parse_one
    from subzero.storage.lineage import LineageStore
    wf = Workflow("shifted")
    wf.add("op", Shifted(), wf.input("x"))
    run = store.run(wf, inputs={"x": np.arange(float(n))}, strategies={"op": "pay:payone:backward"})
    lineage = LineageStore(run.dir / "lineage", readonly=True, run_uid=run.row.uid)
    return run, lineage, lineage.reader("op", parse_one("pay:payone:backward"))


def test_every_pair_source_implements_the_declared_protocol(store):
    """Stored lineage, in-memory pairs and the deadline wrapper answer the same calls,
    with the same parameters (the relation algorithms rely on nothing else)."""
    import inspect

    from subzero.capture.buffer import empty_pairs
    from subzero.query.planner import ReadBudget
    from subzero.query.sources import MemoryPairs, PairSource, TimedSource
    from subzero.storage.lineage import StrategyReader
    _run, lineage, reader = _shifted_reader(store)
    try:
        sources = [reader, MemoryPairs(empty_pairs(1, False)),
                   TimedSource(reader, ReadBudget(after=float("inf")), 1)]
        assert all(isinstance(s, PairSource) for s in sources)
        for cls in (StrategyReader, MemoryPairs, TimedSource):
            for name in ("has_space", "lookup", "records", "all_pairs", "scan_keys", "covered"):
                want = list(inspect.signature(getattr(PairSource, name)).parameters)
                assert list(inspect.signature(getattr(cls, name)).parameters) == want, (cls, name)
    finally:
        lineage.close()


def test_deadline_source_reads_in_chunks_like_one_read_and_gives_up_late(store):
    """Chunked records merge their payload tables into one: every pair keeps its own
    payload, and a scan's progress is the share of its pairs read; once the budget is
    spent the next chunk raises instead of reading."""
    from subzero.errors import Deadline
    from subzero.query.planner import ReadBudget
    from subzero.query.sources import TimedSource
    _run, lineage, reader = _shifted_reader(store)
    try:
        pids = reader.all_pairs("b")
        one = reader.records("b", pids, ["key", "pay"])
        timed = TimedSource(reader, ReadBudget(after=float("inf")), 50)
        assert timed.progress() is None
        assert np.array_equal(timed.all_pairs("b"), pids)
        timed.CHUNK = 3                        # growing chunks, each with its own payload table
        timed._room = lambda share: lambda done: 0.0   # never more than the growing pieces
        chunked = timed.records("b", pids, ["key", "pay"])
        for got, want in zip(chunked["key"], one["key"]):
            assert np.array_equal(got, want)
        (ids1, tab1), (ids2, tab2) = one["pay"], chunked["pay"]
        assert [tab2[k] for k in ids2] == [tab1[k] for k in ids1]
        assert len(tab2) == len(set(tab2)) == 7
        assert timed.progress() == 1.0 and timed.spent >= 0
        looked = TimedSource(reader, ReadBudget(after=float("inf")), 50)
        looked.CHUNK = 3
        hit = looked.lookup("b", CellSet.everything((50,)))
        assert looked.progress() is None                  # looked up, nothing fetched yet
        looked.records("b", hit, ["key"])
        assert looked.progress() == 1.0
        late = TimedSource(reader, ReadBudget(after=0.0), 50)
        with pytest.raises(Deadline):
            late.records("b", pids, ["key"])
        with pytest.raises(Deadline):
            late.lookup("b", CellSet.everything((50,)))
    finally:
        lineage.close()


def _spin(seconds: float) -> None:
    """Burn this thread's CPU time (what a timed read's clock counts)."""
    import time
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_scans_setup_is_not_extrapolated_as_its_rate(store):
    """A scan that spends long listing its pairs before its first record is judged by
    the rate its records then go at, not by its time so far over the share read: with
    1 pair of 50 read after 0.2 s of set-up, extrapolating from the start says 9.8 s
    are left and gives it up; the records' own rate says milliseconds.  A scan whose
    records are slow is still given up."""
    from subzero.errors import Deadline
    from subzero.query.planner import ReadBudget
    from subzero.query.sources import TimedSource
    _run, lineage, reader = _shifted_reader(store)

    class Slow:                              # the reader, with CPU-bound set-up or records
        def __init__(self, setup, per_records):
            self.setup, self.per_records = setup, per_records

        def __getattr__(self, name):
            return getattr(reader, name)

        def all_pairs(self, space):
            _spin(self.setup)
            return reader.all_pairs(space)

        def records(self, space, pids, fields):
            _spin(self.per_records)
            return reader.records(space, pids, fields)
    try:
        pids = reader.all_pairs("b")
        want = reader.records("b", pids, ["key"])["key"]
        assert len(pids) >= 40
        budget = ReadBudget(after=0.0, reexec=1.0)      # a switch when 2 s are left
        for setup, per_records, gives_up in ((0.2, 0.0, False), (0.0, 0.05, True)):
            timed = TimedSource(Slow(setup, per_records), budget, 50)
            timed.CHUNK = 1
            timed._room = lambda share: lambda done: 0.0     # pieces of 1, 2, 4, ...
            got = timed.all_pairs("b")
            if gives_up:
                with pytest.raises(Deadline):
                    timed.records("b", got, ["key"])
                assert 0 < timed.done < 0.5
            else:
                keys = timed.records("b", got, ["key"])["key"]
                assert all(np.array_equal(a, b) for a, b in zip(keys, want))
                assert timed.done > 0.9          # the set-up was most of its time
    finally:
        lineage.close()


def test_timed_pieces_grow_cover_everything_once_and_merge_to_one_lookup(store):
    """A timed read's pieces start small and double up to their cap, cover every item once
    and in order, and end in one piece when the rest fits; a lookup made of pieces finds
    exactly the pairs one lookup finds."""
    from subzero.query.planner import ReadBudget
    from subzero.query.sources import TimedSource, growing_chunks
    pieces = list(growing_chunks(1000, 10, most=8))
    assert pieces[0] == (0, 10) and pieces[-1][1] == 1000
    assert all(a == b for (_, a), (b, _) in zip(pieces, pieces[1:]))
    sizes = [b - a for a, b in pieces]
    assert sizes[:4] == [10, 20, 40, 80] and max(sizes) == 80
    rest = list(growing_chunks(1000, 10, room=lambda done: 1.0 if done >= 0.03 else 0.0))
    assert rest == [(0, 10), (10, 30), (30, 1000)]
    wide = list(growing_chunks(1000, 10, most=8, room=lambda done: 0.25 if done < 0.5 else 0.0))
    assert [b - a for a, b in wide] == [250, 250, 40] + [80] * 5 + [60]   # room from the start
    assert list(growing_chunks(0, 10)) == []
    _run, lineage, reader = _shifted_reader(store)
    try:
        q = CellSet.everything((50,))
        want = reader.lookup("b", q)
        timed = TimedSource(reader, ReadBudget(after=float("inf")), 50)
        timed.QUERY_CHUNK = 1                  # pieces of 1, 2, 4, ... cells
        timed._room = lambda share: lambda done: 0.0
        got = timed.lookup("b", q)
        assert len(want) > 1 and np.array_equal(got, want) and np.all(np.diff(got) > 0)
        calls = []

        class Counted:                         # the reader, its lookups counted
            def __getattr__(self, name):
                return getattr(reader, name)

            def lookup(self, space, cells):
                calls.append(len(cells))
                return reader.lookup(space, cells)
        # nothing is given up before `after`: within it, no piece beyond the first
        free = TimedSource(Counted(), ReadBudget(after=60.0), 50)
        free.QUERY_CHUNK = 1
        assert np.array_equal(free.lookup("b", q), want) and calls == [1, 49]
        calls.clear()
        # the read's next call starts at the read's own rate: within `after`, one piece
        assert np.array_equal(free.lookup("b", q), want) and calls == [50]
        calls.clear()
        tight = TimedSource(Counted(), ReadBudget(after=0.0, reexec=1e9), 50)
        tight.QUERY_CHUNK = 1
        assert np.array_equal(tight.lookup("b", q), want) and calls[:4] == [1, 2, 4, 8]
    finally:
        lineage.close()


def test_method_names_and_the_simple_rule():
    """Methods are values whose names are the step method strings; the simple rule
    orders matched index, mapping, mismatched index, re-execution; prefer moves the
    preferred method first only where the step can use it."""
    from subzero.model.strategy import parse
    from subzero.query.methods import Mapping, Reexec, Stored, rank
    op = Sub()                     # has mapping functions, supports MAP
    strategies = parse("pay:payone:backward+full:fullone:forward+full:fullone:backward+map")
    order = [m.name for m in rank(op, strategies, backward=True)]
    assert order == ["stored:full:fullone:backward", "stored:pay:payone:backward", "map",
                     "stored:full:fullone:forward", "reexec"]
    fwd = [m.name for m in rank(op, strategies, backward=False)]
    assert fwd[:2] == ["stored:full:fullone:forward", "map"]
    assert rank(op, strategies, True, prefer="reexec")[0] == Reexec()
    assert rank(op, strategies, True, prefer="full:fullone:forward")[0] == \
        Stored(parse("full:fullone:forward")[0])
    assert rank(op, strategies, True, prefer="comp")[0] == Stored(parse("full:fullone:backward")[0])
    assert Mapping().name == "map" and Mapping() == Mapping() and Mapping() in rank(op, strategies, True)
    # of a mode, a One encoding before a Many one (no R-tree to import), as listed or not
    for spec in ("full:fullmany:backward+full:fullone:backward+pay:paymany:backward+pay:payone:backward",
                 "pay:payone:backward+full:fullone:backward+pay:paymany:backward+full:fullmany:backward"):
        assert [m.name for m in rank(op, parse(spec), backward=True)][:4] == [
            "stored:full:fullone:backward", "stored:full:fullmany:backward",
            "stored:pay:payone:backward", "stored:pay:paymany:backward"]


class ReexecFirst:
    """A query-time planner written against the core's protocol alone: re-execution
    first, no deadline; it records what it was asked and told."""

    def __init__(self):
        self.asked, self.told = [], []

    def plan(self, step, methods):
        from subzero.query.methods import Reexec
        self.asked.append((step.op, step.input, step.backward, step.cells_in,
                           tuple(m.name for m in methods)))
        return sorted(methods, key=lambda m: not isinstance(m, Reexec)), None

    def observe(self, stat):
        self.told.append(stat)


def test_a_planner_is_a_per_query_option_on_the_declared_protocol(store):
    run = store.run(concat_wf(), inputs={"a": np.zeros((3, 4)), "b": np.ones((2, 4))},
                    strategies={"cat": "full"})
    plain = run.trace("cat", [(0, 0), (4, 1)], to="b", record=False)
    planner = ReexecFirst()
    planned = run.trace("cat", [(0, 0), (4, 1)], to="b", planner=planner, record=False)
    assert np.array_equal(planned.bitmap, plain.bitmap)
    assert planner.asked == [("cat", 1, True, 2, ("stored:full:fullone:backward", "reexec"))]
    assert planner.told == planned.steps and planned.steps[0].method.startswith("reexec:")
    assert planned.steps[0].blocks_in == 1
    # the next query without it (or forcing a method) neither asks nor reports to it
    again = run.trace("cat", [(0, 0), (4, 1)], to="b", record=False)
    forced = run.trace("cat", [(0, 0), (4, 1)], to="b", planner=planner, prefer="map", record=False)
    assert again.steps[0].method == "stored:full:fullone:backward"
    assert forced.steps[0].method == "map"
    assert len(planner.asked) == 1 and len(planner.told) == 1


def test_run_graph_walks_every_path_and_checks_explicit_ones():
    from subzero import QueryError
    from subzero.query.graph import Edge, RunGraph
    g = RunGraph(7, {"a": ["x"], "b": ["x"], "c": ["a", "b"]},
                 {"x": (4,), "a": (4,), "b": (4,), "c": (4,)})
    back = g.walk("c", "x")
    assert back.direction == "backward"
    assert back.stages[0] == ("c", (Edge("c", 0, True, "c", "a"), Edge("c", 1, True, "c", "b")))
    assert {a for a, _ in back.stages[1:]} == {"a", "b"}
    fwd = g.walk("x", "c")
    assert fwd.direction == "forward" and fwd.stages[0][0] == "x"
    assert [e.dst for _, edges in fwd.stages for e in edges] == ["a", "b", "c", "c"]
    assert g.walk("a", "c").stages == (("a", (Edge("c", 0, False, "a", "c"),)),)
    assert g.follow("c", [("c", 1), ("b", 0)]) == [Edge("c", 1, True, "c", "b"),
                                                   Edge("b", 0, True, "b", "x")]
    with pytest.raises(QueryError, match="not connected in run 7"):
        g.walk("a", "b")
    with pytest.raises(QueryError, match="path mixes directions at step b:0"):
        g.follow("a", [("a", 0), ("b", 0)])
    with pytest.raises(QueryError, match="operator 'c' has 2 inputs"):
        g.follow("c", [("c", 2)])
