"""Sharded lineage: Spark tasks encode their tiles' lineage into shards, the
driver commits the attempts that succeeded, and readers open only the shards a
query touches.  The same relation as one store, for every strategy; faults in
shards answered exactly (by re-execution) or refused, never wrong."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from relations import space_edges
from test_spark import FailFirstAttempt, Twice

from subzero import Mode, Operator, Workflow, stencil
from subzero.capture.buffer import Pairs
from subzero.capture.tiles import concat_pairs
from subzero.errors import SubZeroWarning
from subzero.model.cells import lengths_to_offsets, pack
from subzero.model.cellset import CellSet
from subzero.model.strategy import parse_one
from subzero.operators import ConnectedComponents, WindowComposite
from subzero.storage.lineage import LineageStore, commit_shard_files, write_shard
from subzero.storage.metadata import SHARDED_FORMAT
from subzero.storage.shards import ShardedReader

SHAPE = (24, 10)
IN_SHAPE = (24, 12)
STRATEGIES = ["full:fullone:backward", "full:fullmany:backward", "full:fullone:forward",
              "full:fullmany:forward", "pay:payone:backward", "pay:paymany:backward",
              "comp:payone:backward", "comp:paymany:backward"]


def tile_pairs(rng, rows: range, payload: bool) -> Pairs:
    """Random pairs whose output cells lie in the rows of one tile (a tile owns its
    output cells); input cells anywhere (halos overlap between tiles)."""
    n = int(rng.integers(1, 12))
    outs, ins, pay_ids = [], [], []
    for _ in range(n):
        k = int(rng.integers(1, 5))
        cells = np.stack([rng.integers(rows.start, rows.stop, k), rng.integers(0, SHAPE[1], k)], 1)
        outs.append(np.unique(pack(cells, SHAPE)))
        m = int(rng.integers(1, 6))
        src = np.stack([rng.integers(0, IN_SHAPE[0], m), rng.integers(0, IN_SHAPE[1], m)], 1)
        ins.append(np.unique(pack(src, IN_SHAPE)))
        pay_ids.append(int(rng.integers(0, 3)))
    out_off = lengths_to_offsets(np.array([len(o) for o in outs]))
    if payload:
        return Pairs(np.concatenate(outs), out_off, pay_ids=np.array(pay_ids, np.int64),
                     payloads=[b"p0", b"p1-" + bytes([rows.start]), b"p2"])
    return Pairs(np.concatenate(outs), out_off, [np.concatenate(ins)],
                 [lengths_to_offsets(np.array([len(i) for i in ins]))])


def looked_up(reader, space: str, q: CellSet, payload: bool) -> set:
    """Values of the pairs whose keys meet ``q``."""
    pids = reader.lookup(space, q)
    field = "pay" if payload else ("v0" if space == "b" else "v")
    rec = reader.records(space, pids, [field])[field]
    if payload:
        return {bytes(rec[1][i]) for i in np.asarray(rec[0]).tolist()}
    return set(rec[0].tolist())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strategy=hst.sampled_from(STRATEGIES), seed=hst.integers(0, 2**31), tiles=hst.integers(1, 5))
def test_shards_hold_the_same_relation_as_one_store(tmp_path_factory, strategy, seed, tiles):
    s = parse_one(strategy)
    rng = np.random.default_rng(seed)
    bands = np.array_split(np.arange(SHAPE[0]), tiles)
    parts = [tile_pairs(rng, range(int(b[0]), int(b[-1]) + 1), s.payload) for b in bands]
    root = tmp_path_factory.mktemp("shards")
    one = LineageStore(root / "one")
    one.write("op", s, concat_pairs(parts, 1), SHAPE, [IN_SHAPE])
    sharded = LineageStore(root / "sharded")
    written = [write_shard(sharded.path, f"t{k}", 100 + k, "op", s, p, SHAPE, [IN_SHAPE])
               for k, p in enumerate(parts)]
    metas = commit_shard_files(sharded.path, "op", s, [w.meta for w in written if w is not None])
    sharded.commit_shards("op", s, SHAPE, [IN_SHAPE], metas)
    a, b = one.reader("op", s), sharded.reader("op", s)
    assert isinstance(b, ShardedReader) and len(b.shards) == tiles
    assert b.meta.version == SHARDED_FORMAT
    spaces = ["b"] if s.direction.value == "backward" else ["f0"]
    for space in spaces:
        assert space_edges(a, space, s.payload) == space_edges(b, space, s.payload)
        key_shape = SHAPE if space == "b" else IN_SHAPE
        for _ in range(5):
            cells = np.stack([rng.integers(0, key_shape[0], 3), rng.integers(0, key_shape[1], 3)], 1)
            q = CellSet.of_ids(np.unique(pack(cells, key_shape)), key_shape)
            assert looked_up(a, space, q, s.payload) == looked_up(b, space, q, s.payload)
    if s.mode is Mode.COMP:
        assert np.array_equal(a.covered(), b.covered())
        near = np.unique(pack(np.array([[0, 0], [SHAPE[0] - 1, 3]]), SHAPE))
        got = b.covered(near)
        assert set(np.intersect1d(a.covered(), near).tolist()) <= set(got.tolist())
    one.close()
    sharded.close()


def test_a_query_opens_only_the_shards_it_touches(tmp_path):
    s = parse_one("full:fullone:backward")
    rng = np.random.default_rng(3)
    store = LineageStore(tmp_path / "lin")
    bands = np.array_split(np.arange(SHAPE[0]), 6)
    written = [write_shard(store.path, f"t{k}", 1, "op", s,
                           tile_pairs(rng, range(int(b[0]), int(b[-1]) + 1), False), SHAPE, [IN_SHAPE])
               for k, b in enumerate(bands)]
    store.commit_shards("op", s, SHAPE, [IN_SHAPE],
                        commit_shard_files(store.path, "op", s, [w.meta for w in written]))
    r = store.reader("op", s)
    r.lookup("b", CellSet.of_ids(pack(np.array([[0, 0], [1, 5]]), SHAPE), SHAPE))
    assert r.opened == 1
    r.lookup("b", CellSet.of_ids(pack(np.array([[0, 0], [SHAPE[0] - 1, 9]]), SHAPE), SHAPE))
    assert r.opened == 2
    r.all_pairs("b")             # numbering needs no shard opened
    assert r.opened == 2
    store.close()


def test_commit_keeps_the_attempt_that_succeeded_and_removes_the_others(tmp_path):
    s = parse_one("full:fullone:backward")
    rng = np.random.default_rng(4)
    p = tile_pairs(rng, range(0, 4), False)
    store = LineageStore(tmp_path / "lin")
    lost = write_shard(store.path, "t0", 7, "op", s, p, SHAPE, [IN_SHAPE])
    won = write_shard(store.path, "t0", 9, "op", s, p, SHAPE, [IN_SHAPE])
    assert lost is not None and won is not None
    folder = store.shard_folder("op", s)
    assert sorted(f.name for f in folder.iterdir()) == ["t0.a7.szs", "t0.a9.szs"]
    metas = commit_shard_files(store.path, "op", s, [won.meta])
    assert [f.name for f in folder.iterdir()] == ["t0.szs"] and metas[0].file.endswith("/t0.szs")
    store.commit_shards("op", s, SHAPE, [IN_SHAPE], metas)
    assert store.reader("op", s).all_pairs("b").size == p.n     # once, not twice
    store.close()


# -- on Spark ------------------------------------------------------------------------------
def test_spark_tasks_write_shards_and_a_failed_attempt_leaves_none(spark, store):
    """In a fused stage, a task's first attempt writes its first operator's shard and
    then fails; the retry writes it again.  Only the retry's shard is kept: each pair
    once, one shard per tile, the answers of the in-process engine."""
    wf = Workflow("retry")
    t = wf.add("twice", Twice(), wf.input("x"))
    wf.add("plus", FailFirstAttempt(), t)
    x = np.arange(80.0).reshape(10, 8)
    strat = {"twice": "full:fullone:backward", "plus": "full:fullmany:forward"}
    sp = store.run(wf, inputs={"x": x}, engine="spark", spark=spark, tile=4, strategies=strat,
                   progress=False)
    lo = store.run(wf, inputs={"x": x}, strategies=strat)
    assert "stage of 2 operators (twice, plus)" in (sp.dir / "run.log").read_text()
    assert [o["pairs"] for o in sp.ops()] == [x.size, x.size]
    lin = LineageStore(sp.dir / "lineage", readonly=True, run_uid=sp.row.uid)
    for name, s in strat.items():
        files = sorted(f.name for f in lin.shard_folder(name, parse_one(s)).iterdir())
        assert files == sorted(f"t{i}-{j}.szs" for i in range(3) for j in range(2)), files
        assert lin.meta(name, parse_one(s)).sharded
    lin.close()
    for start, cells, to in [("plus", [(0, 0), (9, 7)], "x"), ("x", [(4, 4)], "plus"),
                             ("twice", [(5, 3)], "x")]:
        a, b = sp.trace(start, cells, to=to), lo.trace(start, cells, to=to)
        assert np.array_equal(a.bitmap, b.bitmap)


def wide_run(spark, store, strategy: str):
    """``twice`` on a 20x20 array in 16 tiles (16 shards), on Spark."""
    wf = Workflow("wide")
    wf.add("twice", Twice(), wf.input("x"))
    return store.run(wf, inputs={"x": np.arange(400.0).reshape(20, 20)}, engine="spark",
                     spark=spark, tile=5, strategies={"twice": strategy}, progress=False)


def test_a_small_trace_opens_one_shard_of_many(spark, store):
    run = wide_run(spark, store, "full:fullone:backward")
    res = run.trace("twice", [(12, 7)], to="x", shortcut=False)
    assert res.cells.tolist() == [[12, 7]]
    reader = next(iter(run.executor()._readers.values()))
    assert isinstance(reader, ShardedReader) and len(reader.shards) == 16 and reader.opened == 1


def _damage(path, at: int = -10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("strategy", ["full:fullone:backward", "full:fullmany:forward"])
@pytest.mark.parametrize("fault", ["flip", "truncate", "delete", "swap", "fifo", "link"])
def test_a_damaged_shard_is_answered_exactly(spark, store, fault, strategy):
    """A shard damaged, cut short, missing or replaced by another tile's, or a FIFO or a
    link to /dev/zero in its place (which a read blocked on, or read without end): the
    trace still returns exactly the right cells (re-execution), with a warning naming
    the damage; the shards a query does not touch are not read."""
    run = wide_run(spark, store, strategy)
    lin = LineageStore(run.dir / "lineage", readonly=True)
    folder = lin.shard_folder("twice", parse_one(strategy))
    lin.close()
    victim, other = folder / "t0-0.szs", folder / "t1-1.szs"
    if fault == "flip":
        _damage(victim)
    elif fault == "truncate":
        victim.write_bytes(victim.read_bytes()[:-7])
    elif fault == "delete":
        victim.unlink()
    elif fault == "fifo":
        victim.unlink()
        os.mkfifo(victim)
    elif fault == "link":
        victim.unlink()
        victim.symlink_to("/dev/zero")
    else:
        victim.write_bytes(other.read_bytes())
    run.close()
    start, to = ("twice", "x") if strategy.endswith("backward") else ("x", "twice")
    assert run.trace(start, [(17, 17)], to=to, shortcut=False).cells.tolist() == [[17, 17]]
    match = {"fifo": "is a FIFO", "link": "is a symbolic link"}.get(fault, "damaged|missing")
    with pytest.warns(SubZeroWarning, match=match):
        res = run.trace(start, [(1, 2), (3, 4)], to=to, shortcut=False)
    assert res.cells.tolist() == [[1, 2], [3, 4]]


class Straggler(Operator):
    """Plays a speculative attempt that outlives its operator's commit: while the run
    goes on, it drops an attempt's shard and a half-written file beside the committed
    shards of the operators before it (and notes where).  It runs whole, in a job after
    theirs, so it writes after they were committed."""

    def __init__(self, store: str, note: str):
        self.store, self.note = store, note

    def run(self, ctx, x):
        from pathlib import Path
        wrote = []
        for folder in Path(self.store, "runs").glob("*.partial/lineage/shards/*"):
            for name in ("t7-7.a999.szs", ".t7-7.a999.szs.4242.tmp"):
                (folder / name).write_bytes(b"late")
                wrote.append(str(folder / name))
        Path(self.note).write_text("\n".join(wrote))
        return x


def test_shards_of_late_attempts_are_swept_when_the_run_commits(spark, store, tmp_path):
    wf = Workflow("late")
    wf.add("late", Straggler(str(store.path), str(tmp_path / "wrote")),
           wf.add("twice", Twice(), wf.input("x")))
    x = np.arange(64.0).reshape(8, 8)
    run = store.run(wf, inputs={"x": x}, engine="spark", spark=spark, tile=4,
                    strategies={"twice": "full:fullone:backward"}, progress=False)
    assert (tmp_path / "wrote").read_text().count(".szs") == 2      # the stragglers were there
    folder = run.dir / "lineage" / "shards"
    assert sorted(f.name for f in folder.glob("*/*")) == ["t0-0.szs", "t0-1.szs", "t1-0.szs",
                                                           "t1-1.szs"]
    assert run.trace("twice", [(5, 6)], to="x").cells.tolist() == [[5, 6]]


class Spikes(WindowComposite):
    """Cells above 60 flagged, each depending on its 3x3 window; per tile (halo 1)."""

    radius = 1
    payload_reach = 1
    tiling = stencil(1)
    deterministic_lineage = True

    def compute_flagged(self, x):
        x = np.asarray(x, float)
        return np.where(x > 60, 0.0, x), x > 60


class Blobs(ConnectedComponents):
    """Regions above 30 (declares payload_reach = 0: a region's own cells)."""

    def foreground(self, values, stat):
        return np.asarray(values) > 30


def test_spark_shards_record_the_checked_reach(spark, store):
    """Tasks check their payload pairs against the declared reach; the sharded record
    keeps it, and forward traces through it equal the in-process run's and the same
    traces scanning every pair."""
    wf = Workflow("reach")
    s = wf.add("spikes", Spikes(), wf.input("x"))
    wf.add("blobs", Blobs(), s)
    x = (np.arange(120.0).reshape(12, 10) * 7919) % 97
    strat = {"spikes": "comp:payone:backward", "blobs": "comp:paymany:backward"}
    sp = store.run(wf, inputs={"x": x}, engine="spark", spark=spark, tile=4, strategies=strat,
                   progress=False)
    lo = store.run(wf, inputs={"x": x}, strategies=strat)
    lin = LineageStore(sp.dir / "lineage", readonly=True, run_uid=sp.row.uid)
    for name, want in (("spikes", (1,)), ("blobs", (0,))):
        meta = lin.meta(name, parse_one(strat[name]))
        assert meta.sharded and meta.reach == want
    lin.close()
    for cells in ([(0, 0)], [(5, 5), (5, 6), (6, 5)], [(11, 9)], [(3, 2), (8, 7)]):
        a, b = sp.trace("x", cells, to="blobs"), lo.trace("x", cells, to="blobs")
        assert np.array_equal(a.bitmap, b.bitmap)
        saved = ShardedReader.reach
        ShardedReader.reach = lambda self, i: None          # type: ignore[method-assign]
        try:
            sp.executor().clear_cache()
            scanned = sp.trace("x", cells, to="blobs")
        finally:
            ShardedReader.reach = saved
        assert np.array_equal(a.bitmap, scanned.bitmap)
