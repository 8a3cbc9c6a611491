"""The lineage relation a run stores, as plain sets: what two runs must agree on
whatever their layout (one LMDB store, or shards written by Spark tasks)."""

import numpy as np

from subzero.model.strategy import parse_one
from subzero.storage.lineage import LineageStore


def space_edges(reader, space: str, payload: bool) -> set:
    """(key cell, value) for every pair of one key space: value cells, or payload bytes
    (payload pairs keyed by output cells; keyed by input cells, their values are cells)."""
    payload = payload and space == "b"
    pids = reader.all_pairs(space)
    if pids.size == 0:
        return set()
    keys, koff = reader.scan_keys(space, pids)
    field = "pay" if payload else ("v0" if space == "b" else "v")
    ids, vals = reader.records(space, pids, [field])[field]
    out = set()
    for j in range(len(pids)):
        ks = keys[koff[j]:koff[j + 1]].tolist()
        vs = [bytes(vals[ids[j]])] if payload else ids[vals[j]:vals[j + 1]].tolist()
        out.update((k, v) for k in ks for v in vs)
    return out


def stored_relation(run) -> dict:
    """Per (operator, strategy) stored by ``run``: its spaces' edges and covered cells."""
    lin = LineageStore(run.dir / "lineage", readonly=True, run_uid=run.row.uid)
    try:
        out = {}
        for op in run.ops():
            for text in op["strategies"]:
                s = parse_one(text)
                if not s.stored:
                    continue
                r = lin.reader(op["name"], s)
                rel = {sp: space_edges(r, sp, s.payload) for sp in r.spaces()}
                if s.mode.value == "comp":
                    rel["covered"] = set(np.asarray(r.covered()).tolist())
                out[(op["name"], text)] = rel
        return out
    finally:
        lin.close()


def same(a, b):
    """Two runs agree on every array, bit for bit, and on the lineage relation they store."""
    assert sorted(a.array_names()) == sorted(b.array_names())
    for n in b.array_names():
        sl = tuple(slice(0, s) for s in b.shapes()[n])
        va, vb = a.read_region(n, sl), b.read_region(n, sl)
        assert va.dtype == vb.dtype and va.shape == vb.shape, n
        assert va.tobytes() == vb.tobytes(), f"array {n} differs"
    assert stored_relation(a) == stored_relation(b)


def spoil_lineage(run, op: str) -> int:
    """Flip the first byte of every stored value (not metadata) of ``op``'s lineage in
    ``run``'s LMDB, in place; returns how many were spoiled."""
    import lmdb
    env = lmdb.open(str(run.dir / "lineage"), max_dbs=64, subdir=True)
    with env.begin(write=True) as txn:
        names = [k for k, _ in txn.cursor()]
    spoiled = 0
    for name in names:
        if op.encode() not in name:
            continue
        db = env.open_db(name)
        with env.begin(write=True, db=db) as txn:
            for k, v in list(txn.cursor()):
                if len(v) > 16 and not k.startswith(b"__meta"):
                    txn.put(k, bytes([v[0] ^ 0xFF]) + v[1:])
                    spoiled += 1
    env.close()
    return spoiled
