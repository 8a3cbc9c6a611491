"""What profiling costs: a lineage mode that takes real time is run once (a fast one is
timed best of 3), a small lineage's sample grows straight to the size it needs (it is
not encoded again and again), and the profile's numbers stay what a stored run of the
same strategy measures."""

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from subzero import Mode, Operator, Workflow
from subzero.capture.runner import run_operator
from subzero.engines.lineage import store_lineage
from subzero.engines.stats import OpStats
from subzero.model.strategy import Direction, Strategy
from subzero.optimizer.profile import Profiler, profile_workflow
from subzero.storage.lineage import LineageStore
from subzero.tuning import FAST_OP_REPEATS, FAST_OP_S


class Cellwise(Operator):
    """Elementwise copy that writes one Full pair per cell; sleeps ``slow`` seconds when
    it captures lineage, and counts the runs that did."""

    def __init__(self, slow: float = 0.0):
        self.slow, self.lineage_runs, self.runs = slow, 0, 0

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        self.runs += 1
        if Mode.FULL in ctx.modes:
            self.lineage_runs += 1
            time.sleep(self.slow)
            cells = np.argwhere(np.ones(np.shape(x), bool))
            ctx.lwrite(cells, cells, each=True)
        return np.asarray(x) + 0


def _workflow(slow_op, fast_op):
    wf = Workflow("cost")
    a = wf.input("a")
    b = wf.add("slow", slow_op, a)
    wf.add("fast", fast_op, b)
    return wf


def test_slow_lineage_mode_is_run_once_fast_one_best_of_three(store):
    slow, fast = Cellwise(slow=2 * FAST_OP_S), Cellwise()
    prof = profile_workflow(store, _workflow(slow, fast), inputs={"a": np.zeros((8, 16))},
                            progress=False)
    assert slow.lineage_runs == 1 and fast.lineage_runs == FAST_OP_REPEATS
    full = prof["ops"]["slow"]["modes"]["full"]
    assert full["run_s"] >= 2 * FAST_OP_S and full["gen_s"] >= FAST_OP_S
    assert full["pairs"] == 128 and prof["ops"]["fast"]["modes"]["full"]["pairs"] == 128


def _pairs(shape):
    op = Cellwise()
    _out, full, _pay, _ctx = run_operator("op", op, [np.zeros(shape)],
                                          (Strategy(Mode.FULL, "fullone", Direction.BACKWARD),))
    return op, full


def _stored(tmp_path, op, s, pairs, shape) -> dict:
    """What storing ``s`` for real writes (bytes, spaces)."""
    lin = LineageStore(tmp_path / "real")
    try:
        st = OpStats("op", "", [], [], shape)
        store_lineage("op", op, (s,), pairs, None, shape, [shape], lin, st)
        return st.per_strategy[0]
    finally:
        lin.close()


def test_small_lineage_sample_grows_straight_to_all_pairs(tmp_path):
    shape = (50, 400)                           # 20,000 pairs: a few LMDB pages
    op, pairs = _pairs(shape)
    s = Strategy(Mode.FULL, "fullone", Direction.FORWARD)
    prof = Profiler(tmp_path / "scratch", sample_pairs=1024)
    try:
        got = prof._encode("op", op, s, pairs, shape, [shape])
        writes = prof._n
    finally:
        prof.close()
    # one sample, then all pairs: stepping 4x at a time took 4 encodings (1K, 4K, 16K, all)
    assert writes == 2
    real = _stored(tmp_path, op, s, pairs, shape)
    assert got["exact"] and got["bytes"] == real["bytes"]
    assert got["spaces"] == real["spaces"]


def test_sampled_prediction_stays_close_to_the_stored_bytes(tmp_path):
    shape = (300, 1000)                         # 300,000 pairs, sampled
    op, pairs = _pairs(shape)
    s = Strategy(Mode.FULL, "fullmany", Direction.BACKWARD)
    prof = Profiler(tmp_path / "scratch", sample_pairs=8192)
    try:
        got = prof._encode("op", op, s, pairs, shape, [shape])
    finally:
        prof.close()
    real = _stored(tmp_path, op, s, pairs, shape)
    assert not got["exact"] and got["sample_frac"] < 0.5
    assert abs(got["bytes"] - real["bytes"]) <= 0.25 * real["bytes"]


class Window(Operator):
    """A payload per cell (the radius of its input window), as cosmic-ray detection
    stores one."""

    def supported_modes(self):
        return {Mode.PAY}

    def run(self, ctx, x):
        cells = np.argwhere(np.ones(np.shape(x), bool))
        ctx.lwrite(cells, payload=b"\x01", each=True)
        return np.asarray(x) + 0

    def map_p(self, cells, payload, i, ctx):
        from subzero import window
        return window(cells, payload[0], ctx.input_shape(i))


def test_sampled_forward_payload_key_blocks_follow_the_key_index_blocks(tmp_path, monkeypatch):
    """Regression: the extrapolated key-index blocks of a sampled forward payload
    strategy were capped at the block count of the old 2**14-cell blocks, 16x fewer than
    the blocks written (2**KEY_BITS cells each)."""
    import subzero.optimizer.profile as profile
    from subzero.tuning import KEY_BITS
    monkeypatch.setattr(profile, "SMALL_SAMPLE_BYTES", 1)     # the first sample is kept
    shape = (100, 500)
    op = Window()
    s = Strategy(Mode.PAY, "payone", Direction.FORWARD)
    _out, _full, pairs, _ctx = run_operator("op", op, [np.zeros(shape)], (s,))
    prof = Profiler(tmp_path / "scratch", sample_pairs=4096)
    try:
        got = prof._encode("op", op, s, pairs, shape, [shape])
    finally:
        prof.close()
    lin = LineageStore(tmp_path / "real")
    try:
        st = OpStats("op", "", [], [], shape)
        store_lineage("op", op, (s,), None, pairs, shape, [shape], lin, st)
        real = st.per_strategy[0]["spaces"]
    finally:
        lin.close()
    assert not got["exact"]
    blocks, want = got["spaces"]["f0"]["key_blocks"], real["f0"]["key_blocks"]
    assert want > shape[0] * shape[1] // 2**14 + 1          # more than the old cap allowed
    assert 0.5 * want <= blocks <= -(-shape[0] * shape[1] // 2**KEY_BITS)


def test_what_dropping_an_array_saves_is_read_from_the_run_s_own_array_store(store, monkeypatch):
    """The profiler sizes each operator's array where the profiling run has just written
    it (the run may drop it when it ends), not by writing it a second time: its numbers
    are a run's that keeps the arrays, byte for byte."""
    from subzero.runs.keep import array_bytes
    from subzero.storage.arrays import ArrayStore
    roots = []

    def spying(real):              # where arrays are written: whole, or made to be filled
        def spy(self, name, *a, **kw):
            roots.append(str(self.dir))
            return real(self, name, *a, **kw)
        return spy
    monkeypatch.setattr(ArrayStore, "write", spying(ArrayStore.write))
    monkeypatch.setattr(ArrayStore, "create", spying(ArrayStore.create))
    a = {"a": np.arange(4096.0).reshape(64, 64)}
    prof = profile_workflow(store, _workflow(Cellwise(), Cellwise()), inputs=a, progress=False)
    assert roots and not any(r.endswith("-arrays") for r in roots), roots
    kept = store.run(_workflow(Cellwise(), Cellwise()), inputs=a, keep="all", progress=False)
    arrays = ArrayStore(kept.dir)
    for name in ("slow", "fast"):
        want = array_bytes(arrays, name) - array_bytes(arrays, name, dropped=True)
        assert want > 0 and prof["ops"][name]["drop_saves"] == want, name


class Groups(Operator):
    """Few big pairs, as genomics' ``model`` makes at cohort scale: output cell g is made
    of every row r of its input with r % G == g."""

    G = 12

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def output_shape(self, shape):
        return (self.G,)

    def run(self, ctx, x):
        shape = np.shape(x)
        for g in range(self.G):
            rows = np.arange(g, shape[0], self.G)
            ctx.lwrite(np.array([[g]]), np.column_stack([np.repeat(rows, shape[1]),
                                                         np.tile(np.arange(shape[1]), rows.size)]))
        return np.asarray(x).reshape(self.G, -1).sum(axis=1)


@pytest.mark.parametrize("direction", [Direction.BACKWARD, Direction.FORWARD])
def test_sample_reads_of_big_pairs_ask_fewer_cells_and_scan_once_when_slow(tmp_path, monkeypatch,
                                                                             direction):
    """A sample read whose 64 cells would each return thousands asks fewer (at least 2,
    the return held near ``SAMPLE_READ_OUT_CELLS``), and a scan as slow as
    ``SAMPLE_SCAN_ONCE_S`` is not timed a second time; a cheap read keeps both sizes.
    Each read still returns what the stored lineage holds for the cells it asked."""
    import subzero.optimizer.sampleread as sampleread
    monkeypatch.setattr(sampleread, "SAMPLE_READ_OUT_CELLS", 5_000)
    monkeypatch.setattr(sampleread, "SAMPLE_SCAN_ONCE_S", 0.0)        # every scan is "slow"
    shape = (12 * 40, 50)                     # 12 pairs of 2,000 input cells
    op, s = Groups(), Strategy(Mode.FULL, "fullone", direction)
    _out, full, _pay, _ctx = run_operator("op", op, [np.ones(shape)], (s,))
    prof = Profiler(tmp_path / "scratch")
    try:
        got = prof._encode("op", op, s, full, (12,), [shape])
    finally:
        prof.close()
    reads = got["sample"]["reads"]
    index = [r for r in reads if r["backward"] == s.backward]
    scans = [r for r in reads if r["backward"] != s.backward]
    assert len(scans) == 1 and scans[0]["cells_in"] == 1
    assert [r["cells_in"] for r in index][0] == 1 and len(index) == 2
    if direction is Direction.BACKWARD:        # an output cell names 2,000 input cells
        assert index[0]["cells_out"] == 2000 and index[1]["cells_in"] == 2
        assert index[1]["cells_out"] == 4000
    else:                                      # an input cell names one output cell: cheap
        assert index[1]["cells_in"] == 64 and index[1]["cells_out"] >= 1


def test_sample_index_read_is_also_timed_big_and_big_queries_take_its_factor(tmp_path):
    """Cheap FullOne index reads are timed a third time, with up to
    ``SAMPLE_READ_BIG_CELLS`` of the sample's keys (the factor of a query of 10^5 cells
    is not the 64-cell one's); a scan is not, nor an R-tree (FullMany) index, whose
    cost per probe its 64-cell read measured."""
    from subzero.optimizer.sampleread import SAMPLE_READ_BIG_CELLS
    shape = (12 * 40, 50)                     # 12 pairs of 2,000 input cells
    op = Groups()
    for direction, big, enc in ((Direction.FORWARD, min(SAMPLE_READ_BIG_CELLS, 24_000), "fullone"),
                                (Direction.BACKWARD, None, "fullone"),
                                (Direction.FORWARD, None, "fullmany")):    # R-tree: per probe
        s = Strategy(Mode.FULL, enc, direction)
        _out, full, _pay, _ctx = run_operator("op", op, [np.ones(shape)], (s,))
        prof = Profiler(tmp_path / f"scratch-{direction.value}-{enc}")
        try:
            got = prof._encode("op", op, s, full, (12,), [shape])
        finally:
            prof.close()
        index = [r for r in got["sample"]["reads"] if r["backward"] == s.backward]
        scans = [r for r in got["sample"]["reads"] if r["backward"] != s.backward]
        assert len(scans) == 2
        if big is None:         # 12 output cells (64 asks all of them), or an R-tree
            assert [r["cells_in"] for r in index] == [1, 12 if s.backward else 64]
        else:                   # 24,000 input keys (at most that many), one output cell each
            assert [r["cells_in"] for r in index] == [1, 64, big]
            assert 1 <= index[2]["cells_out"] <= 12 and index[2]["seconds"] > 0


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.integers(0, 300), max_size=400), hst.booleans())
def test_distinct_owners_counts_the_pairs_map_p_expanded(owner, negative):
    """The expanded-pairs statistic of a forward payload strategy: one bincount where
    the owners are pair numbers, a unique otherwise; both what np.unique says."""
    from subzero.engines.lineage import _distinct
    a = np.array(owner, np.int64)
    if negative and a.size:
        a[0] = -1
    assert _distinct(a) == np.unique(a).size


class Rows(Operator):
    """Each output cell from an eighth of its input row's cells, scattered: few, wide
    pairs (as genomics' ``model``, whose 70 pairs hold 110,000 cells each at 1,000x), as
    Full pairs or as one payload per row that ``map_p`` expands to those cells."""

    def supported_modes(self):
        return {Mode.FULL, Mode.PAY}

    @staticmethod
    def cells(r: int, width: int) -> np.ndarray:
        cols = np.sort(np.random.default_rng(r).choice(width, width // 8, replace=False))
        return np.stack([np.full(cols.size, r), cols], 1)

    def run(self, ctx, x):
        rows, width = np.shape(x)
        for r in range(rows):
            if Mode.FULL in ctx.modes:
                ctx.lwrite(np.array([[r]]), self.cells(r, width))
            if Mode.PAY in ctx.modes:
                ctx.lwrite(np.array([[r]]), payload=r.to_bytes(4, "little"))
        return np.asarray(x).sum(axis=1)

    def map_p(self, cells, payload, i, ctx):
        return self.cells(int.from_bytes(payload, "little"), ctx.input_shape(i)[1])


@pytest.mark.parametrize("spec", ["full:fullone:forward", "pay:payone:forward"])
def test_few_wide_pairs_are_sampled_by_pairs_close_to_the_stored_bytes(tmp_path, monkeypatch,
                                                                        spec):
    """Lineage of few pairs each holding many cells is sampled by whole pairs, not
    encoded whole (only the sample, grown once when it fills a few pages, and its half
    are written), and the prediction stays close to what storing every pair writes.
    (Its other strategies -- R-trees, backward indexes of 48 keys -- fill fewer than
    ``SMALL_SAMPLE_BYTES`` in all and are rightly encoded whole.)"""
    import subzero.optimizer.profile as profile
    from subzero.model.strategy import parse_one
    monkeypatch.setattr(profile, "SAMPLE_CELLS", 80_000)     # 9 of the 48 pairs: 12, a quarter
    shape = (48, 2**16)                         # 48 pairs of 8,193 cells: 393,264 cells
    s = parse_one(spec)
    op = Rows()
    _out, full, pay, _ctx = run_operator("op", op, [np.zeros(shape)], (s,))
    pairs = pay if s.payload else full
    cells = full.n_cells() if not s.payload else 48 * 8193
    written = []
    real_write = Profiler._write

    def write(self, name, op_, s_, p, *a):
        written.append(p.n)
        return real_write(self, name, op_, s_, p, *a)
    monkeypatch.setattr(Profiler, "_write", write)
    prof = Profiler(tmp_path / "scratch")
    try:
        got = prof._encode("op", op, s, pairs, (48,), [shape], cells=cells)
    finally:
        prof.close()
    assert not got["exact"] and written[0] == 12 and max(written) <= 24, written  # never all
    lin = LineageStore(tmp_path / "real")
    try:
        st = OpStats("op", "", [], [], (48,))
        store_lineage("op", op, (s,), None if s.payload else pairs, pairs if s.payload else None,
                      (48,), [shape], lin, st)
        real = st.per_strategy[0]
    finally:
        lin.close()
    assert abs(got["bytes"] - real["bytes"]) <= 0.25 * real["bytes"], (got["bytes"], real["bytes"])


@pytest.mark.parametrize("encoding,shape", [("fullone", (50, 400)), ("fullmany", (300, 100))])
def test_a_rough_price_is_one_sample_and_its_price_again_is_the_profile_s_own(tmp_path, encoding,
                                                                              shape):
    """``Profiler.rough``: a strategy a plan may never store is priced from one sample, not
    grown however few pages it fills, and left unread; priced again on its pairs
    (``_price_again``, what a plan that chooses it does), it is priced exactly as a profile
    prices it at once -- bytes, sizes, share of the pairs -- and its sample is read."""
    from subzero.optimizer.profile import _price_again
    op, pairs = _pairs(shape)
    s = Strategy(Mode.FULL, encoding, Direction.FORWARD)
    prof = Profiler(tmp_path / "scratch", sample_pairs=1024)
    try:
        rough = prof._encode("op", op, s, pairs, shape, [shape], read=False, rough=True)
        writes = prof._n
        whole = prof._encode("op", op, s, pairs, shape, [shape], read=True)
    finally:
        prof.close()
    assert writes == 2 and rough["rough"] and not rough["exact"]      # the sample and its half
    assert rough["sample"] is None and "unread" in rough
    pending = {"op": op, "strategy": s, "pairs": pairs, "out_shape": shape, "in_shapes": [shape],
               "cells": None, "sample_pairs": 1024}
    again = _price_again(tmp_path / "again", "op", pending)
    assert not (tmp_path / "again").exists()
    assert "rough" not in again and "unread" not in again
    for k in ("bytes", "spaces", "exact", "sample_frac"):
        assert again.get(k) == whole.get(k), k
    assert again["sample"]["reads"] and [(r["backward"], r["cells_in"]) for r in again["sample"]["reads"]] \
        == [(r["backward"], r["cells_in"]) for r in whole["sample"]["reads"]]
    if encoding == "fullone":                # a few pages, grown to all pairs when priced in full
        assert whole["exact"] and whole["bytes"] == _stored(tmp_path, op, s, pairs, shape)["bytes"]


def test_a_rough_r_tree_price_of_few_wide_pairs_samples_them(tmp_path):
    """Few wide pairs (genomics' ``model``) priced roughly: an R-tree's from a few of them
    as any other strategy's, where a full price encodes them all (its reads need not scale
    from a few of its pairs, which is why a plan that chooses it prices it again)."""
    shape = (12 * 400, 50)                    # 12 pairs of 20,000 input cells
    op = Groups()
    s = Strategy(Mode.FULL, "fullmany", Direction.BACKWARD)
    _out, full, _pay, _ctx = run_operator("op", op, [np.ones(shape)], (s,))
    import subzero.optimizer.profile as profile
    prof = Profiler(tmp_path / "scratch")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(profile, "SAMPLE_CELLS", 50_000)      # 12 pairs of 20,000 cells are wide
            rough = prof._encode("op", op, s, full, (12,), [shape], read=False, rough=True)
            whole = prof._encode("op", op, s, full, (12,), [shape], read=False)
    finally:
        prof.close()
    assert rough["rough"] and rough["sample_frac"] < 1 and not rough["exact"]
    assert whole["exact"] and "rough" not in whole
