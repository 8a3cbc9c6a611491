"""Typed, versioned storage formats: lineage metadata and catalog migrations.

Stores written before the formats had numbers must keep answering exactly;
formats newer than this SubZero must be refused clearly, never misread."""

import dataclasses
import json
import sqlite3

import numpy as np
import pytest
from conftest import EXAMPLE, unbound_runs

import subzero
import subzero.storage.lineage as ls
import subzero.storage.metadata as metadata
from subzero import Mode, Operator, Workflow
from subzero.capture.buffer import Pairs
from subzero.errors import CorruptLineage, NewerLineageFormat, StoreError, SubZeroWarning
from subzero.model.cellset import CellSet
from subzero.model.strategy import Direction, Encoding, Strategy, parse_one
from subzero.storage import schema
from subzero.storage.catalog import Catalog
from subzero.storage.encodings import LEGACY_KEY_BITS
from subzero.storage.metadata import (
    FORMAT_VERSION,
    LEGACY_FORMAT,
    WRITE_FORMAT,
    SpaceMeta,
    StrategyMeta,
    decode_record,
    encode_record,
)
from subzero.tuning import KEY_BITS


# -- lineage metadata ---------------------------------------------------------------------
def _rewrite_meta(lineage_dir, op, strategy, edit):
    """Rewrite one stored strategy's raw META JSON (as another SubZero version would have)."""
    lin = ls.LineageStore(lineage_dir)
    try:
        name = f"{op}|{strategy}".encode()
        db = lin.database(name, create=False)
        with lin.env.begin(write=True, db=db) as txn:
            meta = decode_record(txn.get(ls.META), db=name)
            edit(meta)
            txn.put(ls.META, encode_record(meta, name))
    finally:
        lin.close()


def _as_legacy(meta):
    """Format 1: no format number, no key_bits (2**14-cell key blocks); the store must
    have been written in format 2 (``metadata.WRITE_FORMAT``: no checksums)."""
    assert meta.pop("format") == 2
    for sp in meta["spaces"].values():
        assert sp.pop("key_bits") == LEGACY_KEY_BITS


def test_metadata_round_trips_and_is_frozen():
    s = parse_one("full:fullone:forward")
    meta = StrategyMeta.new(s, (4, 5), [(4, 5), (3,)])
    meta = meta.with_space(SpaceMeta.new("f0", (4, 5), ["v"], {"v": (4, 5)}, KEY_BITS)
                           .appended(0, 1500, [0, 1]))
    meta = meta.with_space(SpaceMeta.new("f1", (3,), ["v"], {"v": [4, 5]}, 12))
    meta = meta.with_covered_chunk()
    back = StrategyMeta.from_bytes(meta.to_bytes())
    assert back == meta
    assert back.version == WRITE_FORMAT and back.strategy == s
    assert back.strategy.encoding is Encoding.FULLONE and back.strategy.direction is Direction.FORWARD
    assert back.space("f0").pairs == 1500 and back.space("f0").blocks == (0, 1)
    assert back.space("f1").key_bits == 12 and back.space_names == ["f0", "f1"]
    assert back.space("f2") is None and back.covered_chunks == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.covered_chunks = 5
    # replacing a space keeps the others and their order
    again = back.with_space(dataclasses.replace(back.space("f0"), pairs=3000))
    assert again.space_names == ["f0", "f1"] and again.space("f0").pairs == 3000
    assert back.space("f0").pairs == 1500


def test_legacy_metadata_reads_with_its_defaults():
    legacy = {"strategy": "full:fullone:backward", "out_shape": [4, 5], "in_shapes": [[4, 5]],
              "covered_chunks": 0,
              "spaces": {"b": {"next": 3, "key_shape": [4, 5], "fields": ["v0"],
                               "value_shapes": {"v0": [4, 5]}, "blocks": [0]}}}
    meta = StrategyMeta.from_json(legacy)
    assert meta.version == LEGACY_FORMAT
    assert meta.space("b").key_bits == LEGACY_KEY_BITS and meta.space("b").pairs == 3
    # what format 1 wrote explicitly it keeps
    legacy["spaces"]["b"]["key_bits"] = 10
    assert StrategyMeta.from_json(legacy).space("b").key_bits == 10
    # format 2 always names its key-block size: a record without one is damaged, not guessed
    with pytest.raises(CorruptLineage, match="malformed metadata.*key_bits"):
        StrategyMeta.from_json({**legacy, "format": 2, "spaces": {"b": {
            k: v for k, v in legacy["spaces"]["b"].items() if k != "key_bits"}}})
    for bad in (b"not json", b"[1, 2]", b'{"format": "2"}', b'{"format": 2}'):
        with pytest.raises(CorruptLineage):
            StrategyMeta.from_bytes(bad)


def test_newer_metadata_is_refused_in_one_line():
    meta = StrategyMeta.new(parse_one("full"), (3,), [(3,)])
    newer = {**meta.to_json(), "format": FORMAT_VERSION + 1}
    with pytest.raises(NewerLineageFormat) as e:
        StrategyMeta.from_json(newer, "stored lineage of 'op' (full:fullone:backward)")
    msg = str(e.value)
    assert "\n" not in msg and "newer SubZero" in msg and "upgrade" in msg
    assert isinstance(e.value, StoreError) and isinstance(e.value, CorruptLineage)


class Fan(Operator):
    """Output cell (r, c) depends on input cells (r, c) and (r, c // 2)."""

    def supported_modes(self):
        return {Mode.FULL, Mode.PAY, Mode.COMP, Mode.BLACKBOX}

    def run(self, ctx, a):
        out = np.argwhere(np.ones(a.shape, bool))
        if Mode.FULL in ctx.modes:
            ins = np.stack([out, np.column_stack([out[:, 0], out[:, 1] // 2])], axis=1)
            ctx.lwrite(out, ins, each=True)
        if Mode.PAY in ctx.modes or Mode.COMP in ctx.modes:
            ctx.lwrite(out, payload=b"\x02", each=True)
        return a * 2

    def map_b(self, cells, i, ctx):
        return cells

    def map_f(self, cells, i, ctx):
        return cells

    def map_p(self, cells, payload, i, ctx):
        return np.concatenate([cells, np.column_stack([cells[:, 0], cells[:, 1] // payload[0]])])


def _fan_workflow():
    wf = Workflow("fan")
    wf.add("fan", Fan(), wf.input("a"))
    return wf


@pytest.mark.parametrize("strategy", ["full:fullone:backward", "full:fullone:forward",
                                      "full:fullmany:backward", "pay:payone:forward",
                                      "comp:payone:backward"])
def test_lineage_store_in_the_old_format_answers_exactly(store, monkeypatch, strategy):
    """A store written before metadata had a format number (2**14-cell key blocks,
    no key_bits) answers every trace as re-execution does, through the stored lineage."""
    a = np.arange(150 * 150, dtype=float).reshape(150, 150)
    monkeypatch.setattr(ls, "KEY_BITS", LEGACY_KEY_BITS)
    monkeypatch.setattr(metadata, "WRITE_FORMAT", 2)
    unbound_runs(monkeypatch)                 # a run made before runs had uids
    old = store.run(_fan_workflow(), inputs={"a": a}, strategies={"fan": strategy})
    monkeypatch.undo()
    _rewrite_meta(old.dir / "lineage", "fan", strategy, _as_legacy)
    reopened = subzero.open_store(store.path).get(old.id)
    try:
        lin = ls.LineageStore(old.dir / "lineage", readonly=True)
        meta = lin.reader("fan", parse_one(strategy)).meta
        lin.close()
        assert meta.version == LEGACY_FORMAT
        assert {sp.key_bits for sp in meta.spaces} == {LEGACY_KEY_BITS}
        backward = parse_one(strategy).direction is Direction.BACKWARD
        start = "fan" if backward else "a"
        for cells in ([(0, 0)], [(149, 149), (20, 37)], [(r, 3) for r in range(0, 150, 7)],
                      [(r, c) for r in range(100, 150) for c in range(0, 150, 2)]):
            got = reopened.trace(start, cells, path=[("fan", 0)], prefer=strategy, record=False)
            want = reopened.trace(start, cells, path=[("fan", 0)], prefer="reexec", record=False)
            assert got.steps[0].method == f"stored:{strategy}"
            assert np.array_equal(got.bitmap, want.bitmap)
            assert want.bitmap.sum() >= len(cells) if backward else want.bitmap.any()
    finally:
        reopened.close()


def _pairs(out: np.ndarray, ins: np.ndarray, per: int) -> Pairs:
    """Full pairs: pair k relates out[k] to ins[k * per:(k + 1) * per] (packed cells)."""
    n = len(out)
    return Pairs(out.astype(np.int64), np.arange(n + 1, dtype=np.int64),
                 [ins.astype(np.int64)], [np.arange(0, n * per + 1, per, dtype=np.int64)])


def test_append_to_an_old_format_store_keeps_its_key_blocks(tmp_path, monkeypatch):
    """Appending to format-1 lineage writes format 2 with the old block size made explicit,
    and lookups then find pairs of both writes, in key blocks shared by both."""
    shape = (200, 200)
    n = shape[0] * shape[1]
    s = Strategy(Mode.FULL, Encoding.FULLONE, Direction.BACKWARD)
    rng = np.random.default_rng(7)
    out_a = np.arange(0, n, 2)                         # every other cell
    in_a = rng.integers(0, n, 2 * len(out_a))
    out_b = np.arange(0, n, 3)                         # overlaps the first write's blocks and cells
    in_b = rng.integers(0, n, 2 * len(out_b))
    lin = ls.LineageStore(tmp_path / "lineage")
    monkeypatch.setattr(ls, "KEY_BITS", LEGACY_KEY_BITS)
    monkeypatch.setattr(metadata, "WRITE_FORMAT", 2)
    lin.write("op", s, _pairs(out_a, in_a, 2), shape, [shape])
    monkeypatch.undo()
    lin.close()
    _rewrite_meta(tmp_path / "lineage", "op", str(s), _as_legacy)
    lin = ls.LineageStore(tmp_path / "lineage")
    lin.write("op", s, _pairs(out_b, in_b, 2), shape, [shape])
    r = lin.reader("op", s)
    assert r.meta.version == 2 and not r.meta.checksummed       # blocks stay unchecked
    assert r.meta.space("b").key_bits == LEGACY_KEY_BITS        # not today's KEY_BITS
    assert r.meta.space("b").pairs == 1024 * -(-len(out_a) // 1024) + len(out_b)
    q = np.unique(rng.integers(0, n, 3000))
    flat = np.zeros(n, bool)
    flat[q] = True
    pids = r.lookup("b", CellSet.of_sorted(q, shape))
    cells, _ = r.records("b", pids, ["v0"])["v0"]
    want = np.unique(np.concatenate([in_a.reshape(-1, 2)[flat[out_a]].ravel(),
                                     in_b.reshape(-1, 2)[flat[out_b]].ravel()]))
    assert np.array_equal(np.unique(cells), want)
    lin.close()


def test_sharded_record_says_so_and_one_written_before_the_key_still_reads(tmp_path):
    """A sharded (format-4) record carries ``sharded``; one written before that key
    existed is sharded by its format number and reads the same; an unsharded format
    claiming shards is damage, not a reason to read blocks that are not there."""
    from subzero.storage.lineage import commit_shard_files, write_shard
    s = parse_one("full:fullone:backward")
    shape = (8, 6)
    lin = ls.LineageStore(tmp_path / "lineage")
    written = [write_shard(lin.path, f"t{k}", 1, "op", s,
                           _pairs(np.arange(24 * k, 24 * k + 24), np.arange(24 * k, 24 * k + 24), 1),
                           shape, [shape]) for k in range(2)]
    lin.commit_shards("op", s, shape, [shape], commit_shard_files(lin.path, "op", s,
                                                                  [w.meta for w in written]))
    q = CellSet.of_ids(np.array([3, 30, 47]), shape)
    want = lin.reader("op", s).records("b", lin.reader("op", s).lookup("b", q), ["v0"])["v0"][0]
    lin.close()
    name = f"op|{s}".encode()
    lin = ls.LineageStore(tmp_path / "lineage")
    with lin.env.begin(db=lin.database(name)) as txn:
        record = decode_record(txn.get(ls.META), db=name)
    lin.close()
    assert record["format"] == metadata.SHARDED_FORMAT and record["sharded"] is True

    def before_the_key(meta):
        del meta["sharded"]
    _rewrite_meta(tmp_path / "lineage", "op", str(s), before_the_key)
    lin = ls.LineageStore(tmp_path / "lineage", readonly=True)
    r = lin.reader("op", s)
    assert r.meta.sharded and r.meta.version == metadata.SHARDED_FORMAT and len(r.meta.shards) == 2
    assert np.array_equal(r.records("b", r.lookup("b", q), ["v0"])["v0"][0], want)
    lin.close()
    plain = StrategyMeta.new(s, shape, [shape]).to_json()
    assert "sharded" not in plain and StrategyMeta.from_json(plain).sharded is False
    with pytest.raises(CorruptLineage, match="malformed metadata .sharded True in format 3"):
        StrategyMeta.from_json({**plain, "sharded": True, "shards": []})


@pytest.mark.parametrize("sharded", [False, True])
def test_each_run_reads_its_own_formats_only(tmp_path, sharded):
    """A run with a uid writes format 5 (sharded or not, its shards too) and reads only
    lineage bound to it; a run without one (made before uids) writes and reads formats
    3 and 4 as before, and refuses bound lineage as another run's."""
    from subzero.storage.lineage import commit_shard_files, write_shard
    s = parse_one("full:fullone:backward")
    shape = (8, 6)
    q = CellSet.of_ids(np.array([3, 30, 47]), shape)
    uid, other = "0123456789abcdef" * 2, "fedcba9876543210" * 2
    for run_uid, version in ((None, metadata.SHARDED_FORMAT if sharded else WRITE_FORMAT),
                             (uid, metadata.BOUND_FORMAT)):
        folder = tmp_path / f"lineage-{run_uid}"
        lin = ls.LineageStore(folder, run_uid=run_uid)
        parts = [_pairs(np.arange(24 * k, 24 * k + 24), np.arange(24 * k, 24 * k + 24), 1)
                 for k in range(2)]
        if sharded:
            written = [write_shard(lin.path, f"t{k}", 1, "op", s, p, shape, [shape], run_uid=run_uid)
                       for k, p in enumerate(parts)]
            committed = commit_shard_files(lin.path, "op", s, [w.meta for w in written])
            lin.commit_shards("op", s, shape, [shape], committed)
        else:
            for p in parts:
                lin.write("op", s, p, shape, [shape])
        r = lin.reader("op", s)
        assert r.meta.version == version and r.meta.sharded == sharded and r.meta.run == run_uid
        want = r.records("b", r.lookup("b", q), ["v0"])["v0"][0]
        assert sorted(want.tolist()) == [3, 30, 47]
        lin.close()
        for reader_uid in {None, uid, other} - {run_uid}:
            lin = ls.LineageStore(folder, readonly=True, run_uid=reader_uid)
            with pytest.raises(CorruptLineage, match="belongs to another run" if run_uid
                               else "is not bound to this run"):
                lin.reader("op", s)
            lin.close()
        if sharded and run_uid is not None:
            # a shard holds its tile's place: two tiles' shards swapped are caught
            one, two = (folder / m.file for m in committed)
            a, b = one.read_bytes(), two.read_bytes()
            one.write_bytes(b)
            two.write_bytes(a)
            lin = ls.LineageStore(folder, readonly=True, run_uid=run_uid)
            with pytest.raises(CorruptLineage, match=r"shard .*t0\.szs: .*bytes|checksum mismatch"):
                r = lin.reader("op", s)
                r.records("b", r.lookup("b", q), ["v0"])
            lin.close()


def test_newer_lineage_format_falls_back_to_reexecution_with_a_warning(store):
    """A trace over lineage a newer SubZero wrote must not misread it: the step is answered
    by re-execution (exact) and the warning says to upgrade; appending to it is refused."""
    a = np.arange(40 * 30, dtype=float).reshape(40, 30)
    strategy = "full:fullone:backward"
    run = store.run(_fan_workflow(), inputs={"a": a}, strategies={"fan": strategy})

    def newer(meta):
        meta["format"] = FORMAT_VERSION + 1
    _rewrite_meta(run.dir / "lineage", "fan", strategy, newer)
    reopened = subzero.open_store(store.path).get(run.id)
    try:
        cells = [(3, 4), (39, 29)]
        want = reopened.trace("fan", cells, path=[("fan", 0)], prefer="reexec", record=False)
        with pytest.warns(SubZeroWarning, match=r"written by a newer SubZero .*upgrade SubZero"):
            got = reopened.trace("fan", cells, path=[("fan", 0)], prefer=strategy, record=False)
        assert got.steps[0].method != f"stored:{strategy}"
        assert np.array_equal(got.bitmap, want.bitmap) and got.bitmap.sum() == 4
    finally:
        reopened.close()
    lin = ls.LineageStore(run.dir / "lineage")
    s = parse_one(strategy)
    with pytest.raises(StoreError, match="newer SubZero"):
        lin.write("fan", s, _pairs(np.array([0]), np.array([0]), 1), (40, 30), [(40, 30)])
    lin.close()


# -- catalog migrations -------------------------------------------------------------------
#: The catalog as SubZero created it before it had a version (user_version 0): fewer
#: tables than today, no trace_steps.blocks_in.
PRE_VERSIONING = """
CREATE TABLE runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT, workflow TEXT, source TEXT, params TEXT,
  status TEXT, started REAL, ended REAL, error TEXT, inputs TEXT, pid INTEGER,
  host TEXT, engine TEXT);
CREATE TABLE arrays (
  run_id INTEGER, name TEXT, kind TEXT, shape TEXT, dtype TEXT, nbytes INTEGER,
  PRIMARY KEY (run_id, name));
CREATE TABLE ops (
  run_id INTEGER, name TEXT, cls TEXT, inputs TEXT, strategies TEXT, shape TEXT,
  run_s REAL, lwrite_s REAL, lineage_s REAL, pairs INTEGER, lineage_bytes INTEGER,
  seq INTEGER, PRIMARY KEY (run_id, name));
CREATE TABLE strategy_stats (
  run_id INTEGER, op TEXT, strategy TEXT, bytes INTEGER, write_s REAL, pairs INTEGER,
  PRIMARY KEY (run_id, op, strategy));
CREATE TABLE trace_steps (
  id INTEGER PRIMARY KEY AUTOINCREMENT, trace_id TEXT, run_id INTEGER, op TEXT,
  input_idx INTEGER, direction TEXT, method TEXT, cells_in INTEGER, cells_out INTEGER,
  seconds REAL, ts REAL);
INSERT INTO runs (workflow, source, params, status, started, ended, inputs, pid, host, engine)
  VALUES ('example', 'example.py', '{"n": 3}', 'complete', 1000.0, 1002.5, '{}', 1, 'elsewhere',
          'local');
INSERT INTO ops VALUES (1, 'cr', 'CosmicRays', '["raw"]', '["full:fullone:backward"]', '[4, 4]',
                        0.1, 0.01, 0.02, 12, 4096, 0);
INSERT INTO trace_steps (trace_id, run_id, op, input_idx, direction, method, cells_in, cells_out,
                         seconds, ts) VALUES ('t1', 1, 'cr', 0, 'backward', 'map', 1, 1, 0.001, 1003.0);
"""


def _old_catalog(path, extra: str = ""):
    db = sqlite3.connect(path)
    db.executescript(PRE_VERSIONING + extra)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    db.close()


def _version(path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def test_pre_versioning_catalog_migrates_on_open(tmp_path, cli):
    root = tmp_path / "store"
    root.mkdir()
    _old_catalog(root / "catalog.sqlite")
    code, out, err = cli("runs", "--store", root, "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["id"], r["workflow"], r["status"], r["params"]) for r in rows] == \
        [(1, "example", "complete", {"n": 3})]
    assert _version(root / "catalog.sqlite") == schema.SCHEMA_VERSION
    cat = Catalog(root / "catalog.sqlite")
    try:
        assert cat.opened_version == schema.SCHEMA_VERSION
        assert cat.ops(1)[0]["strategies"] == ["full:fullone:backward"]
        assert cat.trace_steps(1)[0]["blocks_in"] == 0          # the new column, defaulted
        assert cat.plan_names() == [] and cat.downgrades(1) == []   # tables added since exist
        cat.add_trace_steps([("t2", 1, "cr", 0, "forward", "map", 2, 2, 0.001, 1004.0, 3, 5)])
        assert [(s["blocks_in"], s["runs_in"]) for s in cat.trace_steps(1)] == [(0, 0), (3, 5)]
    finally:
        cat.close()
    # and the store runs and traces as a new one would
    with subzero.open_store(root) as st:
        run = st.run(EXAMPLE, strategies={"stars": "full"})
        assert [r.id for r in st.runs()] == [1, run.id] and run.id == 2
        run.trace("stars", [(40, 70)], to="raw")
        assert st.catalog.trace_steps(run.id)[0]["op"] == "stars"


def test_unversioned_catalog_that_already_had_blocks_in_migrates(tmp_path):
    path = tmp_path / "catalog.sqlite"
    _old_catalog(path, "ALTER TABLE trace_steps ADD COLUMN blocks_in INTEGER DEFAULT 0;")
    cat = Catalog(path)
    try:
        assert cat.opened_version == 0 and cat.runs()[0].workflow == "example"
    finally:
        cat.close()
    assert _version(path) == schema.SCHEMA_VERSION
    assert Catalog(path).opened_version == schema.SCHEMA_VERSION


def test_a_failing_migration_leaves_the_catalog_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "catalog.sqlite"
    _old_catalog(path)

    def boom(db):
        raise RuntimeError("migration failed halfway")
    nxt = schema.SCHEMA_VERSION + 1
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS + (schema.Migration(nxt, "x", boom),))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", nxt)
    with pytest.raises(RuntimeError, match="halfway"):
        Catalog(path)
    monkeypatch.undo()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 0
        cols = {r[1] for r in db.execute("PRAGMA table_info(trace_steps)")}
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        db.close()
    assert "blocks_in" not in cols and "plans" not in tables       # the earlier steps rolled back
    assert Catalog(path).opened_version == 0                       # and it still migrates


def test_newer_catalog_is_refused_in_one_line(tmp_path, cli):
    root = tmp_path / "store"
    with subzero.open_store(root):
        pass
    db = sqlite3.connect(root / "catalog.sqlite")
    db.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer SubZero") as e:
        subzero.open_store(root)
    assert "\n" not in str(e.value) and "upgrade" in str(e.value)
    code, out, err = cli("runs", "--store", root)
    assert code != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "newer SubZero" in lines[0] and "upgrade SubZero" in lines[0]
    assert _version(root / "catalog.sqlite") == schema.SCHEMA_VERSION + 1    # left untouched


def test_not_a_catalog_is_one_clear_line(tmp_path):
    path = tmp_path / "catalog.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot be opened"):
        Catalog(path)
