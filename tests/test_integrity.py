"""Integrity of stored lineage: damaged values, R-tree files and metadata are noticed.

Every trace below is either exactly the answer re-execution gives (with a warning
that names the operator, the strategy and the damaged file) or one clear error —
never a wrong answer, never a crash.  Damage is done to the files on disk, the
way a disk or a careless copy would do it.
"""

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import unbound_runs

import subzero
import subzero.storage.lineage as ls
import subzero.storage.metadata as metadata
from subzero import Mode, Operator, Workflow
from subzero.errors import CorruptLineage, QueryError, SubZeroWarning
from subzero.model.strategy import parse_one
from subzero.query.methods import Mapping, Reexec, Stored, fallback_order
from subzero.storage import integrity
from subzero.storage.metadata import META, StrategyMeta, decode_record

SHAPE = (60, 50)          # 3000 pairs: three record blocks, several key-index blocks


class Fan(Operator):
    """Output (r, c) depends on input (r, c) and (r, c // 2); the mapping functions
    say exactly that, so every method gives the same answer."""

    def supported_modes(self):
        return {Mode.FULL, Mode.MAP, Mode.PAY, Mode.COMP, Mode.BLACKBOX}

    def run(self, ctx, a):
        out = np.argwhere(np.ones(a.shape, bool))
        if Mode.FULL in ctx.modes:
            ins = np.stack([out, np.column_stack([out[:, 0], out[:, 1] // 2])], axis=1)
            ctx.lwrite(out, ins, each=True)
        if Mode.PAY in ctx.modes or Mode.COMP in ctx.modes:
            ctx.lwrite(out, payload=b"\x02", each=True)
        return a * 2

    def map_b(self, cells, i, ctx):
        c = np.asarray(cells)
        return np.concatenate([c, np.column_stack([c[:, 0], c[:, 1] // 2])])

    def map_f(self, cells, i, ctx):
        c = np.asarray(cells)
        w = SHAPE[1]
        more = [c]
        for k in (0, 1):
            d = np.column_stack([c[:, 0], 2 * c[:, 1] + k])
            more.append(d[d[:, 1] < w])
        return np.concatenate(more)

    def map_p(self, cells, payload, i, ctx):
        c = np.asarray(cells)
        return np.concatenate([c, np.column_stack([c[:, 0], c[:, 1] // payload[0]])])


def _workflow():
    wf = Workflow("fan")
    wf.add("fan", Fan(), wf.input("a"))
    return wf


STRATEGIES = ["full:fullone:backward", "full:fullmany:backward", "pay:payone:backward",
              "pay:paymany:backward", "comp:payone:backward", "comp:paymany:backward",
              "full:fullone:forward", "full:fullmany:forward"]
EVERY_CELL = [(r, c) for r in range(SHAPE[0]) for c in range(SHAPE[1])]
FEW = [(0, 0), (59, 49), (31, 7)]


def _run(store, strategy):
    a = np.arange(SHAPE[0] * SHAPE[1], dtype=float).reshape(SHAPE)
    return store.run(_workflow(), inputs={"a": a}, strategies={"fan": strategy})


def _values(run, strategy) -> dict[bytes, bytes]:
    """Every stored value of one strategy, by key."""
    lin = ls.LineageStore(run.dir / "lineage", readonly=True)
    try:
        db = lin.database(lin.db_name("fan", parse_one(strategy)), create=False)
        with lin.env.begin(db=db) as txn:
            return dict(txn.cursor().iternext())
    finally:
        lin.close()


def _start(strategy):
    return "a" if strategy.endswith("forward") else "fan"


def _trace(store, run_id, strategy, cells, prefer="strategy", planner=None):
    """Trace in a freshly opened store (``prefer``: the strategy by default)."""
    run = subzero.open_store(store.path).get(run_id)
    try:
        prefer = strategy if prefer == "strategy" else prefer
        return run.trace(_start(strategy), cells, path=[("fan", 0)], prefer=prefer,
                         record=False, planner=planner)
    finally:
        run.close()


def _exact_with_warning(store, run, strategy, cells, match):
    """The trace warns (naming operator, strategy and ``match``) and answers exactly."""
    want = _trace(store, run.id, strategy, cells, prefer="reexec")
    with pytest.warns(SubZeroWarning, match=match) as rec:
        got = _trace(store, run.id, strategy, cells)
    msg = str(rec[0].message)
    assert "'fan'" in msg and strategy in msg and "answering this step another way" in msg
    assert "\n" not in msg
    assert got.steps[0].method != f"stored:{strategy}"
    assert np.array_equal(got.bitmap, want.bitmap) and got.bitmap.any()
    return got


def _flip_in_file(path: Path, needle: bytes, at: float = 0.5) -> bytes:
    """Flip one bit of ``needle`` wherever it lies in ``path`` (LMDB may keep a stale
    copy in a free page); returns the file's old bytes."""
    data = path.read_bytes()
    damaged = bytearray(data)
    off = data.find(needle)
    assert off >= 0, "value not found in the file"
    while off >= 0:
        damaged[off + min(len(needle) - 1, int(len(needle) * at))] ^= 0x10
        off = data.find(needle, off + 1)
    path.write_bytes(bytes(damaged))
    return data


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_damaged_value_is_noticed_and_answered_exactly(store, strategy):
    """A bit flipped inside any stored value (metadata, record blocks, key-index blocks,
    covered-cell chunks) is found by its checksum; the step is answered another way."""
    run = _run(store, strategy)
    mdb = run.dir / "lineage" / "data.mdb"
    values = _values(run, strategy)
    kinds = {k[k.index(b"\x00") + 1:k.index(b"\x00") + 2] if k != META else b"M" for k in values}
    assert {b"M", b"R"} <= kinds
    if "one" in strategy and not strategy.startswith(("pay", "comp")) or "payone" in strategy:
        assert b"K" in kinds
    if strategy.startswith("comp"):
        assert b"C" in kinds
    for value in values.values():
        for at in (0.0, 0.5, 1.0):           # first byte, middle, last (the checksum)
            old = _flip_in_file(mdb, value, at)
            try:
                _exact_with_warning(store, run, strategy, EVERY_CELL, r"damaged.*data\.mdb")
            finally:
                mdb.write_bytes(old)
    assert np.array_equal(_trace(store, run.id, strategy, FEW).bitmap,      # intact again
                          _trace(store, run.id, strategy, FEW, prefer="reexec").bitmap)


@pytest.mark.parametrize("strategy", ["full:fullone:backward", "full:fullone:forward"])
def test_a_scan_against_the_stored_direction_checks_every_key_block(store, strategy):
    """A step against the stored direction of FullOne lineage scans the key index (its
    records keep no key cells): a missing key-index block is damage there too."""
    run = _run(store, strategy)
    values = _values(run, strategy)
    kblocks = sorted(k for k in values if b"\x00K" in k)
    lin = ls.LineageStore(run.dir / "lineage")
    name = lin.db_name("fan", parse_one(strategy))
    with lin.env.begin(write=True, db=lin.database(name, create=False)) as txn:
        txn.delete(kblocks[len(kblocks) // 2])
    lin.close()
    other = strategy.replace("backward", "x").replace("forward", "backward").replace("x", "forward")
    cells = [(5, 5), (40, 20)]
    want = _trace(store, run.id, other, cells, prefer="reexec")
    run2 = subzero.open_store(store.path).get(run.id)
    try:
        with pytest.warns(SubZeroWarning, match=r"key-index blocks .* found by a scan"):
            got = run2.trace(_start(other), cells, path=[("fan", 0)], prefer=strategy,
                             record=False)
    finally:
        run2.close()
    assert np.array_equal(got.bitmap, want.bitmap)


@pytest.mark.parametrize("strategy", ["full:fullone:backward", "pay:payone:backward",
                                      "full:fullone:forward"])
def test_a_key_block_lost_from_the_btree_is_damage_not_missing_cells(store, strategy):
    """LMDB returning nothing for a key-index block the metadata lists (a damaged
    B-tree page) must not read as "these cells have no lineage"."""
    run = _run(store, strategy)
    values = _values(run, strategy)
    lin = ls.LineageStore(run.dir / "lineage")
    name = lin.db_name("fan", parse_one(strategy))
    with lin.env.begin(write=True, db=lin.database(name, create=False)) as txn:
        for k in values:
            if b"\x00K" in k:
                txn.delete(k)
    lin.close()
    _exact_with_warning(store, run, strategy, FEW, r"key-index block \d+ of space .* is missing")


def test_a_value_under_another_key_fails_its_checksum(store):
    """Checksums are seeded with the value's key: a B-tree that hands back another
    (intact) block for a key is caught."""
    strategy = "full:fullone:backward"
    run = _run(store, strategy)
    values = _values(run, strategy)
    r0, r1 = sorted(k for k in values if b"\x00R" in k)[:2]
    lin = ls.LineageStore(run.dir / "lineage")
    name = lin.db_name("fan", parse_one(strategy))
    with lin.env.begin(write=True, db=lin.database(name, create=False)) as txn:
        txn.put(r0, values[r1])
        txn.put(r1, values[r0])
    lin.close()
    _exact_with_warning(store, run, strategy, EVERY_CELL, r"record block \d .* fails its checksum")


@pytest.mark.parametrize("strategy", ["full:fullone:backward", "full:fullmany:backward"])
def test_a_value_copied_from_another_run_fails_its_checksum(store, strategy):
    """Two runs of one workflow on the same data store the same bodies; each value's
    checksum is seeded with its run's uid (format 5), so a value copied from the other
    run at the same key is caught -- and the other run's metadata record names its run."""
    run, other = _run(store, strategy), _run(store, strategy)
    mine, theirs = _values(run, strategy), _values(other, strategy)
    blocks = sorted(k for k in mine if b"\x00R" in k or b"\x00K" in k)
    assert blocks and all(mine[k] != theirs[k] and mine[k][:-4] == theirs[k][:-4] for k in blocks)
    lin = ls.LineageStore(run.dir / "lineage")
    name = lin.db_name("fan", parse_one(strategy))
    with lin.env.begin(write=True, db=lin.database(name, create=False)) as txn:
        txn.put(blocks[0], theirs[blocks[0]])
    lin.close()
    _exact_with_warning(store, run, strategy, EVERY_CELL, r"(record|key-index) block \d+ .* fails "
                                                          r"its checksum")
    lin = ls.LineageStore(run.dir / "lineage")
    with lin.env.begin(write=True, db=lin.database(name, create=False)) as txn:
        txn.put(blocks[0], mine[blocks[0]])
        txn.put(META, theirs[META])
    lin.close()
    _exact_with_warning(store, run, strategy, FEW, f"belongs to another run: its record names "
                                                   f"run uid {other.row.uid}")


def _rtree_files(run, space="b"):
    files = sorted((run.dir / "lineage" / "rtree").glob(f"*.{space}.*"))
    assert [f.suffix for f in files] == [".dat", ".idx"]
    return files


@pytest.mark.parametrize("strategy", ["full:fullmany:backward", "pay:paymany:backward",
                                      "comp:paymany:backward", "full:fullmany:forward"])
def test_damaged_rtree_files_are_caught_before_the_native_library_opens_them(store, strategy):
    """The issue's case: 8 bytes overwritten near the start of the R-tree's .dat file
    gave too few cells or a segfault.  Now every overwrite, truncation or deletion of
    either file is a warning naming the file, and the answer is exact."""
    run = _run(store, strategy)
    space = "f0" if strategy.endswith("forward") else "b"
    dat, idx = _rtree_files(run, space)
    cells = FEW
    for f in (dat, idx):
        old = f.read_bytes()
        somewhere = int(np.random.default_rng(3).integers(len(old) - 8))
        damages = [lambda b, o=o: b[:o] + b"\xff" * 8 + b[o + 8:]
                   for o in (0, 8, 16, 100, 700, somewhere)]
        damages += [lambda b: b[:len(b) // 2], lambda b: b + b"\x00" * 16]
        for damage in damages:
            new = damage(old)
            if new == old:
                continue
            f.write_bytes(new)
            try:
                _exact_with_warning(store, run, strategy, cells, re.escape(f.name))
            finally:
                f.write_bytes(old)
        f.unlink()
        try:
            _exact_with_warning(store, run, strategy, cells, re.escape(f.name) + ": missing")
        finally:
            f.write_bytes(old)
    assert np.array_equal(_trace(store, run.id, strategy, cells).bitmap,
                          _trace(store, run.id, strategy, cells, prefer="reexec").bitmap)


def test_metadata_without_its_seal_is_damage_not_an_older_format(store):
    """A checksummed (format 3 on) record that reads as plain JSON — its seal damaged
    into something parseable — must not switch the checks off."""
    strategy = "full:fullone:backward"
    run = _run(store, strategy)
    lin = ls.LineageStore(run.dir / "lineage")
    name = lin.db_name("fan", parse_one(strategy))
    with lin.env.begin(write=True, db=lin.database(name, create=False)) as txn:
        d = decode_record(txn.get(META), db=name)
        import json
        txn.put(META, json.dumps(d).encode())
    lin.close()
    _exact_with_warning(store, run, strategy, FEW,
                        f"format {metadata.BOUND_FORMAT} without its checksum")
    with pytest.raises(CorruptLineage, match="damaged metadata"):
        StrategyMeta.from_bytes(b"SZ\x03\x00" + b"{}" + b"\x00" * 4)


def test_after_damaged_stored_lineage_the_operators_other_stored_lineage_comes_first(store):
    """Order after a damaged strategy: the operator's other intact stored strategies
    (even one indexed the other way), then mapping functions, then re-execution; a
    step with nothing trustworthy left is one clear error naming the operator."""
    bw, fw = "full:fullone:backward", "full:fullone:forward"
    run = _run(store, f"{bw}+{fw}+map")
    cells = [(3, 4), (50, 49)]
    want = _trace(store, run.id, bw, cells, prefer="reexec")
    ok = _trace(store, run.id, bw, cells, prefer=None)
    assert ok.steps[0].method == f"stored:{bw}"
    mdb = run.dir / "lineage" / "data.mdb"
    _flip_in_file(mdb, _values(run, bw)[META])
    with pytest.warns(SubZeroWarning, match=re.escape(bw)):
        got = _trace(store, run.id, bw, cells, prefer=None)
    assert got.steps[0].method == f"stored:{fw}"          # not "map", which precedes it
    assert np.array_equal(got.bitmap, want.bitmap)
    _flip_in_file(mdb, _values(run, fw)[META])
    with pytest.warns(SubZeroWarning) as rec:
        got = _trace(store, run.id, bw, cells, prefer=None)
    assert {bw, fw} <= {s for r in rec for s in (bw, fw) if s in str(r.message)}
    assert got.steps[0].method == "map" and np.array_equal(got.bitmap, want.bitmap)

    class StoredOnly:
        """A planner that (wrongly) offers only stored lineage."""

        def plan(self, info, methods):
            return [m for m in methods if isinstance(m, Stored)], None

        def observe(self, stat):
            pass
    with pytest.warns(SubZeroWarning), pytest.raises(QueryError) as e:
        _trace(store, run.id, bw, cells, prefer=None, planner=StoredOnly())
    assert "'fan'" in str(e.value) and "damaged" in str(e.value) and "\n" not in str(e.value)


def test_fallback_order_keeps_each_group_in_its_order():
    a, b = Stored(parse_one("full:fullone:backward")), Stored(parse_one("full:fullmany:forward"))
    assert fallback_order([Mapping(), a, Reexec(), b]) == [a, b, Mapping(), Reexec()]


@pytest.mark.parametrize("strategy", ["full:fullone:backward", "full:fullmany:backward",
                                      "comp:payone:backward", "pay:paymany:forward"])
def test_a_store_written_before_checksums_still_traces(store, monkeypatch, strategy):
    """Format 2 (no checksums) is read unchecked, exactly as before (in a run made before
    runs had uids: a run with one reads only lineage bound to it)."""
    monkeypatch.setattr(metadata, "WRITE_FORMAT", 2)
    unbound_runs(monkeypatch)
    run = _run(store, strategy)
    monkeypatch.undo()
    lin = ls.LineageStore(run.dir / "lineage", readonly=True)
    meta = lin.reader("fan", parse_one(strategy)).meta
    lin.close()
    assert meta.version == 2 and not meta.checksummed
    assert all(not sp.files and not sp.key_index for sp in meta.spaces)
    for cells in (FEW, EVERY_CELL):
        got = _trace(store, run.id, strategy, cells)
        want = _trace(store, run.id, strategy, cells, prefer="reexec")
        assert got.steps[0].method == f"stored:{strategy}"
        assert np.array_equal(got.bitmap, want.bitmap)


def test_new_stores_are_checksummed(store):
    """... and bound to their run: format 5, the R-tree files' checksums seeded with the
    run's uid."""
    run = _run(store, "full:fullmany:backward")
    lin = ls.LineageStore(run.dir / "lineage", readonly=True, run_uid=run.row.uid)
    s = parse_one("full:fullmany:backward")
    meta = lin.reader("fan", s).meta
    lin.close()
    assert meta.checksummed and meta.version == metadata.BOUND_FORMAT and meta.run == run.row.uid
    (sp,) = meta.spaces
    dat, idx = _rtree_files(run)
    name = ls.db_name("fan", s)
    assert dict((e, (n, c)) for e, n, c in sp.files) == {
        "dat": integrity.file_digest(dat, metadata.rtree_seed(name, run.row.uid, "b", "dat")),
        "idx": integrity.file_digest(idx, metadata.rtree_seed(name, run.row.uid, "b", "idx"))}


def test_seal_round_trip_and_location():
    at = integrity.seed(b"db", b"key")
    v = integrity.seal(b"hello", at)
    assert bytes(integrity.unseal(v, at)) == b"hello"
    for bad in (v[:-1] + bytes([v[-1] ^ 1]), b"x" + v[1:], v[:3]):
        with pytest.raises(integrity.ChecksumMismatch):
            integrity.unseal(bad, at)
    with pytest.raises(integrity.ChecksumMismatch):
        integrity.unseal(v, integrity.seed(b"db", b"other"))


def test_damage_is_reported_once_per_run_and_the_copy_is_independent(store, tmp_path):
    """A strategy found damaged is not read again by later traces of the same run
    (one warning), and a store copied before the damage is unaffected."""
    strategy = "pay:payone:backward"
    run = _run(store, strategy)
    copy = tmp_path / "copy"
    shutil.copytree(store.path, copy)
    mdb = run.dir / "lineage" / "data.mdb"
    _flip_in_file(mdb, _values(run, strategy)[META])
    r = subzero.open_store(store.path).get(run.id)
    try:
        with pytest.warns(SubZeroWarning) as rec:
            for cells in (FEW, FEW, EVERY_CELL):
                r.trace("fan", cells, path=[("fan", 0)], prefer=strategy, record=False)
        assert len(rec) == 1
    finally:
        r.close()
    r = subzero.open_store(copy).get(run.id)
    try:
        assert r.trace("fan", FEW, path=[("fan", 0)], prefer=strategy,
                       record=False).steps[0].method == f"stored:{strategy}"
    finally:
        r.close()


@pytest.mark.parametrize("damage", ["meta pages zeroed", "deleted", "truncated"])
def test_an_unopenable_lineage_file_names_the_operator_and_the_file(store, damage):
    """LMDB's own meta pages damaged, or data.mdb gone: the step says which operator's
    lineage it could not read and where, and re-execution answers exactly."""
    strategy = "full:fullmany:backward"
    run = _run(store, strategy)
    mdb = run.dir / "lineage" / "data.mdb"
    if damage == "deleted":
        mdb.unlink()
    elif damage == "truncated":      # read-only maps past the end of the file: SIGBUS before
        size = mdb.stat().st_size
        with open(mdb, "r+b") as f:
            f.truncate(size - 4096)
    else:
        data = bytearray(mdb.read_bytes())
        data[:8192] = bytes(8192)
        mdb.write_bytes(bytes(data))
    match = {"truncated": r"lineage file .*data.mdb is damaged: truncated",
             "meta pages zeroed": r"lineage file .*data.mdb is damaged: MDB_INVALID"}.get(
        damage, r"lineage store .*lineage")
    _exact_with_warning(store, run, strategy, FEW, match)


def test_a_readers_precomputed_seed_is_the_same_seed():
    assert integrity.seed_in(integrity.seed(b"op|s", b""), b"b\x00R" + bytes(8)) == \
        integrity.seed(b"op|s", b"b\x00R" + bytes(8))


# -- an LMDB file truncated under a running trace (issue 28) ------------------------------------
TRACER = """
import sys, time, warnings
import subzero
warnings.simplefilter("ignore")
run = subzero.open_store(sys.argv[1], create=False).get(1)
want = [list(map(int, c)) for c in run.trace("stars", [(40, 70)], to="raw", record=False).cells]
step = sys.argv[2] == "step"
mdb = run.dir / "lineage" / "data.mdb"
print("ready", flush=True)
n, t0, cut = 0, time.monotonic(), False
while True:
    if step:                      # wait for the other process's turn
        sys.stdin.readline()
    run.executor().clear_cache()  # every trace reads LMDB again
    got = run.trace("stars", [(40, 70)], to="raw", record=False)
    assert [list(map(int, c)) for c in got.cells] == want, "a wrong answer"
    n += 1
    if step:
        print("traced", flush=True)
        if n == 2:
            break
    elif cut or time.monotonic() - t0 > 90:
        break                     # one trace ran after the cut (or it never came)
    else:
        cut = mdb.stat().st_size <= 8192
print("done", n, [s.method for s in got.steps], flush=True)
"""


def _lineage_run(tmp_path):
    from conftest import EXAMPLE
    with subzero.open_store(tmp_path / "s") as st:
        st.run(EXAMPLE, strategies={"clean": "full", "stars": "full"}, progress=False)
    return tmp_path / "s", tmp_path / "s" / "runs" / "1" / "lineage" / "data.mdb"


def test_lmdb_truncated_by_another_process_while_traces_run_is_no_sigbus(tmp_path):
    """Another process truncates data.mdb to its two meta pages while this one traces
    through it again and again.  Before, the next read past the new end of the file
    killed the tracer with SIGBUS; now the truncation waits for the read transaction
    to end (a lease), the next one finds the file short, and the trace is answered
    another way, exactly."""
    import subprocess
    import sys
    import time
    path, mdb = _lineage_run(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", TRACER, str(path), "loop"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)                                   # traces are running
    t0 = time.monotonic()
    truncator = subprocess.run([sys.executable, "-c",
                                f"import os; os.truncate({str(mdb)!r}, 8192)"], timeout=120)
    waited = time.monotonic() - t0
    out, err = p.communicate(timeout=120)
    assert truncator.returncode == 0 and mdb.stat().st_size == 8192
    assert p.returncode == 0, f"tracer ended with {p.returncode}: {err}"
    assert out.startswith("done") and "stored:" not in out.split("[", 1)[1], out
    assert waited < 30                                # a lease is held for one transaction only


READER = """
import sys, time
from pathlib import Path
from subzero.errors import CorruptLineage
from subzero.storage.mapped import open_mapped
from subzero.tuning import LMDB_MAX_DBS
env = open_mapped(Path(sys.argv[1]), max_dbs=LMDB_MAX_DBS)
with env.begin() as txn:
    names = [k for k, _ in txn.cursor()]
dbs = [env.open_db(n, create=False) for n in names]
print("ready", flush=True)
n, t0 = 0, time.monotonic()
try:
    while time.monotonic() - t0 < 5:
        with env.begin() as txn:          # nearly all of the time inside a transaction
            for db in dbs:
                for _, v in txn.cursor(db):
                    len(v)
        n += 1
except CorruptLineage as e:
    print("refused", n, e, flush=True)
    sys.exit(0)
print("never cut", n, flush=True)
"""


def test_a_slow_truncation_after_breaking_the_lease_is_still_no_sigbus(tmp_path):
    """The race behind a rare SIGBUS of the test above: a truncation takes write access
    to the file, breaks the reader's lease, and cuts the file only after the reader
    gave the lease back -- and, on a loaded machine, after the reader began its next
    transaction, which could not lease the file (it is open for writing) and so read
    it unleased.  Here the writer waits 0.3 s between the break and the cut, and the
    reader is inside a transaction nearly all the time, so that window is wide open:
    the reader must wait for its lease instead, then find the file short."""
    import subprocess
    import sys
    import time
    _, mdb = _lineage_run(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", READER, str(mdb)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)                                   # reads are running
    cut = ("import os, time\n"
           f"fd = os.open({str(mdb)!r}, os.O_WRONLY)\n"  # breaks the lease, waits for it
           "time.sleep(0.3)\n"
           "os.ftruncate(fd, 8192)\n"
           "os.close(fd)\n")
    truncator = subprocess.run([sys.executable, "-c", cut], timeout=120)
    out, err = p.communicate(timeout=120)
    assert truncator.returncode == 0 and mdb.stat().st_size == 8192
    assert p.returncode == 0, f"reader ended with {p.returncode}: {err}"
    assert out.startswith("refused") and "truncated to 8192" in out, out


def test_lmdb_truncated_where_no_lease_can_be_taken_is_refused(tmp_path):
    """The same when the file is open for writing elsewhere (no lease then): the size
    check before each read transaction refuses the short file."""
    import subprocess
    import sys
    path, mdb = _lineage_run(tmp_path)
    with open(mdb, "r+b") as writer:                  # held open for writing: no lease
        p = subprocess.Popen([sys.executable, "-c", TRACER, str(path), "step"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "traced"
        writer.truncate(8192)                         # between two traces of one process
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0, f"tracer ended with {p.returncode}: {err}"
    assert out.splitlines()[-1].startswith("done 2") and "stored:" not in out, out
