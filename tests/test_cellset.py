"""CellSet, the set a trace carries between steps: its algebra against a plain
bitmap oracle in every form (sparse, dense, entire), and traces whose memory
follows the answer, not the array."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

import subzero
from subzero import Workflow
from subzero.model.cellset import CellSet
from subzero.operators import Add, Negative, Slice
from subzero.tuning import DENSE_SET_RATIO

SHAPES = st.sampled_from([(1,), (7,), (5, 9), (16, 16), (3, 4, 5), (64, 33)])


@st.composite
def set_and_oracle(draw, shape=None):
    shape = draw(SHAPES) if shape is None else shape
    size = int(np.prod(shape))
    kind = draw(st.sampled_from(["empty", "few", "many", "all", "bitmap"]))
    if kind == "empty":
        ids = np.zeros(0, np.int64)
    elif kind == "all":
        ids = np.arange(size)
    else:
        n = draw(st.integers(1, max(1, size // (DENSE_SET_RATIO * 2) if kind == "few" else 3 * size)))
        ids = np.asarray(draw(st.lists(st.integers(0, size - 1), min_size=n, max_size=n)), np.int64)
    oracle = np.zeros(size, bool)
    oracle[ids] = True
    s = CellSet.of_bitmap(oracle.reshape(shape)) if kind == "bitmap" else CellSet.of_ids(ids, shape)
    return shape, s, oracle


def check(s: CellSet, oracle: np.ndarray) -> None:
    assert len(s) == int(oracle.sum())
    assert np.array_equal(s.ids(), np.flatnonzero(oracle))
    assert np.array_equal(s.bitmap().ravel(), oracle)
    probe = np.arange(oracle.size)
    assert np.array_equal(s.contains(probe), oracle)
    assert s.is_entire == bool(oracle.all() and oracle.size)
    want_form = "entire" if s.is_entire else (
        "dense" if oracle.sum() * DENSE_SET_RATIO >= oracle.size and oracle.any() else "sparse")
    assert s.form == want_form
    box = s.bounds()
    if not oracle.any():
        assert box is None
    else:
        cells = np.argwhere(oracle.reshape(s.shape))
        assert box == (tuple(cells.min(axis=0)), tuple(cells.max(axis=0) + 1))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_cellset_agrees_with_a_bitmap_in_every_form(data):
    shape, a, oa = data.draw(set_and_oracle())
    _, b, ob = data.draw(set_and_oracle(shape))
    check(a, oa)
    check(b, ob)
    check(a | b, oa | ob)
    assert (a == b) == bool(np.array_equal(oa, ob))
    assert CellSet.of_sorted(np.flatnonzero(oa), shape) == a


def test_the_entire_array_is_a_symbol():
    s = CellSet.everything((100_000, 100_000))          # 10**10 cells: never materialised
    assert len(s) == 10**10 and s.is_entire and s.form == "entire"
    assert s.contains(np.array([0, 10**10 - 1])).all()
    assert (s | CellSet.of_ids(np.array([5]), s.shape)) is s
    assert s.bounds() == ((0, 0), (100_000, 100_000))


def test_a_sparse_set_never_allocates_its_array():
    shape = (100_000, 100_000)
    tracemalloc.start()
    try:
        a = CellSet.of_ids(np.array([7, 3, 3, 10**9]), shape)
        b = a | CellSet.of_ids(np.array([12345678901]), shape)
        hit = b.contains(np.array([3, 4, 12345678901]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert b.form == "sparse" and len(b) == 4 and hit.tolist() == [True, False, True]
    assert peak < 1 << 20


def _chain(shape):
    wf = Workflow("chain")
    wf.input("a")
    wf.add("twice", Negative(), "a")
    wf.add("plus", Add(), "twice", "a")
    wf.add("crop", Slice((slice(10, None), slice(None, -5))), "plus")
    return wf


def _back(n):
    return ("crop", [[100, 200]], "a", [[110, 200]])


def _fwd(n):
    return ("a", [[n - 96, n - 96]], "crop", [[n - 106, n - 96]])


# mapping functions on a 16-megapixel image; stored lineage (whose capture costs ~3 s
# per million pairs) on 1 megapixel: a bitmap between steps would cost the array's size
@pytest.mark.parametrize("strategy,n,queries", [("map", 4096, [_back, _fwd]),
                                                ("full:fullone:backward", 1024, [_back])])
def test_a_small_trace_on_a_large_image_costs_its_answer(tmp_path, strategy, n, queries):
    """A 1-cell trace allocates a few kB per step, where a bitmap of one array between
    steps would cost its n*n bytes (peak traced memory < n*n/4 bytes).  (Stored lineage
    is read through its index; a step against it scans every pair.)"""
    _small_trace_on_a_large_image(tmp_path, strategy, n, queries)


def test_a_small_forward_trace_through_r_trees_on_a_large_image_costs_its_answer(tmp_path):
    """The same through FullMany R-trees, forward: their capture of three million pairs
    takes most of the time (slow tier, tests/conftest.py SLOW)."""
    _small_trace_on_a_large_image(tmp_path, "full:fullmany:forward", 1024, [_fwd])


def _small_trace_on_a_large_image(tmp_path, strategy, n, queries):
    shape = (n, n)
    store = subzero.Store(tmp_path / "store")
    a = np.random.default_rng(0).random(shape, dtype=np.float32)
    if strategy == "map":
        run = store.run(_chain(shape), {"a": a}, engine="local")
    else:
        run = store.run(_chain(shape), {"a": a}, engine="local",
                        strategies={"twice": strategy, "plus": strategy, "crop": strategy})
    try:
        for query in queries:
            start, cells, to, want = query(n)
            run.trace(start, cells, to=to)                       # warm: imports, readers
            tracemalloc.start()
            try:
                res = run.trace(start, cells, to=to)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert res.cells.tolist() == want
            assert all(st.cells_out <= 2 for st in res.steps)
            assert peak < n * n // 4, f"{start} -> {to}: {peak} bytes"
            assert res.values.shape == (1,)
    finally:
        store.close()


@pytest.mark.parametrize("strategy", ["full:fullone:backward", "full:fullmany:forward",
                                      "full:fullone:forward"])
def test_a_scan_against_the_index_reads_in_pieces_and_answers_the_same(tmp_path, monkeypatch,
                                                                        strategy):
    """A step against the direction lineage is indexed in scans every pair; read in pieces
    of 7 pairs it returns exactly what one read returns, both directions."""
    from subzero.query import relation
    shape = (40, 30)
    store = subzero.Store(tmp_path / "store")
    a = np.arange(1200, dtype=np.float64).reshape(shape)
    run = store.run(_chain(shape), {"a": a}, engine="local",
                    strategies={"twice": strategy, "plus": strategy, "crop": strategy})
    queries = [("crop", [[0, 0], [5, 7], [29, 24]], "a"), ("a", [[10, 0], [39, 24], [3, 3]], "crop")]
    try:
        want = [run.trace(s, c, to=t).cells.tolist() for s, c, t in queries]
        monkeypatch.setattr(relation, "SCAN_PAIRS", 7)
        run.executor().clear_cache()
        got = [run.trace(s, c, to=t).cells.tolist() for s, c, t in queries]
        mapped = [run.trace(s, c, to=t, prefer="map").cells.tolist() for s, c, t in queries]
    finally:
        store.close()
    assert got == want == mapped
    assert want[0] == [[10, 0], [15, 7], [39, 24]] and want[1] == [[0, 0], [29, 24]]


def test_a_scan_finds_its_key_cells_in_one_pass_over_the_key_index(tmp_path, monkeypatch):
    """A backward step against FullOne forward lineage finds the key cells of the pairs
    it hit by decoding the whole key index (its records do not keep them).  Read in
    pieces, it asks for them once per step, not once per piece with hits: that decoded
    the key index five times over for genomics' extract at 1,000x."""
    from subzero.query import relation
    from subzero.storage.reader import StrategyReader
    shape = (40, 30)
    store = subzero.Store(tmp_path / "store")
    a = np.arange(1200, dtype=np.float64).reshape(shape)
    run = store.run(_chain(shape), {"a": a}, engine="local",
                    strategies={op: "full:fullone:forward" for op in ("twice", "plus", "crop")})
    calls: list[int] = []
    real = StrategyReader.scan_keys

    def counted(self, space, pids):
        calls.append(len(pids))
        return real(self, space, pids)
    try:
        monkeypatch.setattr(relation, "SCAN_PAIRS", 7)
        monkeypatch.setattr(StrategyReader, "scan_keys", counted)
        res = run.trace("crop", [[0, 0], [5, 7], [29, 24]], to="a")
        scans = [s for s in res.steps if s.method == "stored:full:fullone:forward"]
    finally:
        store.close()
    assert res.cells.tolist() == [[10, 0], [15, 7], [39, 24]]
    assert len(scans) == 4 and len(calls) == 4      # crop, plus (both inputs), twice


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 3), min_size=2, max_size=2), max_size=30))
def test_unique_rows_is_numpys_unique_along_axis_0(rows):
    """``unique_rows`` replaces ``np.unique(a, axis=0)`` (which imports numpy.ma) in the
    trace log's query signature: the same rows in the same order, byte for byte, so a
    query logged before is still recognised."""
    from subzero.model.cells import unique_rows
    a = np.asarray(rows, np.int64).reshape(-1, 2)
    assert unique_rows(a).tobytes() == np.unique(a, axis=0).tobytes()
    assert unique_rows(a).shape == np.unique(a, axis=0).shape


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=40), data=st.data())
def test_csr_take_is_the_rows_slices_in_order(lengths, data):
    """``csr_take`` gathers rows' slices by index arrays, slice by slice when the rows
    are wide (``CSR_WIDE_ROW_CELLS`` values on average), or as one slice when they are
    consecutive: each is the rows' values in the order asked, repeats included."""
    from subzero.model.cells import csr_take, lengths_to_offsets
    from subzero.tuning import CSR_WIDE_ROW_CELLS
    off = lengths_to_offsets(np.asarray(lengths, np.int64))
    values = np.arange(int(off[-1]), dtype=np.int64) * 7 + 3
    if data.draw(st.booleans(), label="consecutive rows"):     # a record's pairs: one slice
        first = data.draw(st.integers(0, len(lengths) - 1))
        rows = np.arange(first, data.draw(st.integers(first, len(lengths))), dtype=np.int64)
    else:
        rows = np.asarray(data.draw(st.lists(st.integers(0, len(lengths) - 1), max_size=60)),
                          np.int64)
    want = np.concatenate([values[off[r]:off[r + 1]] for r in rows]) if rows.size else values[:0]
    got = csr_take(values, off, rows)
    assert got.tolist() == want.tolist()
    # both ways of gathering are asked of: wide rows, and narrow ones
    wide = rows.size > 1 and int((off[rows + 1] - off[rows]).sum()) >= CSR_WIDE_ROW_CELLS * rows.size
    target(float(wide), label="wide rows")


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 5000), n_set=st.integers(1, 60), n_ids=st.integers(0, 300),
       seed=st.integers(0, 2**32 - 1), cluster=st.booleans(), floor=st.sampled_from([0, 1 << 12, 1 << 23]),
       rows=st.sampled_from([1, 3]), mix=st.sampled_from(["far", "few near", "most near"]))
def test_membership_of_a_sparse_set_is_isin_by_every_path(size, n_set, n_ids, seed, cluster, floor,
                                                          rows, mix):
    """``CellSet.contains`` of a sparse set answers what ``np.isin`` does, for ids of any
    shape, by each of its paths: one id, a bitmap of the set's span looked up for the few
    ids inside it or for all of them (and kept for the next call), and the binary search
    (a set spread over many more cells than it has members or the ids asked)."""
    import subzero.model.cellset as cellset
    rng = np.random.default_rng(seed)
    shape = (size, 1000)                         # sparse whatever the set's size
    if cluster:                                  # a small query: a few cells close together
        start = int(rng.integers(0, size * 1000 - 100))
        members = start + rng.choice(100, min(n_set, 100), replace=False)
    else:                                        # spread over the whole array
        members = rng.choice(size * 1000, n_set, replace=False)
    s = CellSet.of_ids(np.asarray(members, np.int64), shape)
    assert s.form == "sparse"
    k = n_ids * rows
    ids = rng.integers(0, size * 1000, k)                       # anywhere in the array
    lo, hi = int(members.min()), int(members.max())
    near = rng.integers(max(lo - 3, 0), min(hi + 4, size * 1000), k)   # in or by the span
    if mix == "far":
        ids[: k // 3] = rng.choice(members, k // 3)
    elif mix == "few near":                                     # a few in the span
        ids[: k // 20] = rng.choice(members, k // 20)
        ids[k // 20: k // 10] = near[k // 20: k // 10]
    else:                                                       # most in the span
        ids[: k // 3] = rng.choice(members, k // 3)
        ids[k // 3:] = near[k // 3:]
    ids = ids.reshape(rows, -1) if rows > 1 else ids
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cellset, "CONTAINS_BITMAP_MIN", floor)
        got = s.contains(ids)
        again = s.contains(ids.ravel()[:5])      # the bitmap kept, if one was made
    assert got.shape == ids.shape and got.dtype == bool
    assert np.array_equal(got, np.isin(ids, members))
    assert np.array_equal(again, np.isin(ids.ravel()[:5], members))


def test_a_pickled_set_leaves_the_bitmap_of_its_span_behind():
    """A sparse set keeps the bitmap of its span that ``contains`` made, but a pickle of it
    (a Spark task's) carries only the set, and answers the same."""
    import pickle
    s = CellSet.of_ids(np.array([5, 9, 100]), (100, 100))
    probe = np.arange(2000)
    want = s.contains(probe)
    assert s._span is not None
    t = pickle.loads(pickle.dumps(s))
    assert t._span is None and t == s and t.form == "sparse"
    assert np.array_equal(t.contains(probe), want)
    assert len(pickle.dumps(t)) < len(pickle.dumps(s._span[1])) + 1000


@settings(max_examples=200, deadline=None)
@given(keys=st.one_of(st.sets(st.integers(-50, 50), max_size=12),
                      st.builds(lambda a, n: set(range(a, a + n)), st.integers(-20, 20),
                                st.integers(0, 12))),
       values=st.lists(st.integers(-60, 60), max_size=40))
def test_positions_in_sorted_keys_are_a_binary_search(keys, values):
    """``sorted_positions`` (subtraction for consecutive keys, else a binary search) gives
    each value's place among sorted, distinct keys and which values are keys; no mask when
    all are; ``in_sorted`` is that mask: what ``np.searchsorted`` and ``np.isin`` say."""
    from subzero.model.cells import in_sorted, sorted_positions
    k = np.array(sorted(keys), np.int64)
    v = np.array(values, np.int64)
    pos, hit = sorted_positions(k, v)
    want = np.isin(v, k)
    assert want.all() if hit is None else np.array_equal(hit, want)
    assert hit is None or not want.all() or v.size == 0 or k.size == 0
    assert np.array_equal(pos[want], np.searchsorted(k, v[want]))
    assert np.array_equal(in_sorted(k, v), want)
