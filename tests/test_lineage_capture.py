"""lwrite forms, encodings round trips, damaged stores."""

import numpy as np
import pytest
from conftest import EXAMPLE, unbound_runs
from hypothesis import given, settings
from hypothesis import strategies as st

import subzero
from subzero import LineageError, Mode, Operator, Workflow
from subzero.capture.buffer import LineageBuffer
from subzero.capture.context import Context
from subzero.errors import SubZeroWarning
from subzero.storage.codec import pack_arrays, pack_bytes, unpack_arrays, unpack_bytes, unpack_concat
from subzero.storage.encodings import (
    KEY_BITS,
    decode_key_block,
    decode_key_blocks,
    decode_record_blocks,
    encode_key_block,
    key_blocks,
    merge_key_blocks,
)


class FullOp(Operator):
    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, a, b):
        return a


def ctx_for(op=None, modes=(Mode.FULL,), in_shapes=((4, 5), (3,)), out_shape=(4, 5)):
    op = op or FullOp()
    buf = LineageBuffer("op", len(in_shapes), len(out_shape), [len(s) for s in in_shapes])
    return Context("op", op, set(modes), in_shapes, out_shape, buf), buf


def test_lwrite_forms_equivalent():
    ctx, buf = ctx_for()
    ctx.lwrite((1, 2), [(0, 0), (1, 1)], [(2,)])                          # one pair, tuple cell
    ctx.lwrite(np.array([[0, 0], [3, 4]]), np.array([[0, 1], [3, 3]]), np.array([[0], [1]]),
               each=True)                                                 # (N, ndim) per row
    ctx.lwrite(np.array([[2, 2]]), [np.array([[2, 2], [2, 3]])], [np.zeros((0, 1), int)], each=True)
    ctx.lwrite_groups(np.array([[1, 1], [1, 0], [0, 4]]), [7, 7, 9],
                      (np.array([[3, 3], [0, 4]]), [7, 9]), (np.array([[2]]), [9]))
    full, pay = buf.finish((4, 5), [(4, 5), (3,)])
    assert pay is None and full.n == 1 + 2 + 1 + 2
    outs = np.split(full.out, full.out_off[1:-1])
    in0 = np.split(full.ins[0], full.in_offs[0][1:-1])
    in1 = np.split(full.ins[1], full.in_offs[1][1:-1])
    assert [o.tolist() for o in outs] == [[7], [0], [19], [12], [6, 5], [4]]
    assert [x.tolist() for x in in0] == [[0, 6], [1], [18], [12, 13], [18], [4]]
    assert [x.tolist() for x in in1] == [[2], [0], [1], [], [], [2]]


def test_lwrite_errors():
    ctx, _ = ctx_for()
    with pytest.raises(LineageError, match="got 1 input cell sets, but the operator has 2"):
        ctx.lwrite((0, 0), [(0, 0)])
    with pytest.raises(LineageError, match="input cells or a payload, not both"):
        ctx.lwrite((0, 0), [(0, 0)], [(0,)], payload=b"x")
    with pytest.raises(LineageError, match="supports neither Mode.PAY nor Mode.COMP"):
        ctx.lwrite((0, 0), payload=b"x")
    with pytest.raises(LineageError, match="has 3 rows, expected 2"):
        ctx.lwrite(np.zeros((2, 2), int), np.zeros((3, 2), int), np.zeros((2, 1), int), each=True)
    with pytest.raises(LineageError, match="bad output cells"):
        ctx.lwrite([(0.5, 1)], [(0, 0)], [(0,)])

    class PayOnly(Operator):
        def supported_modes(self):
            return {Mode.PAY, Mode.BLACKBOX}

    ctx2, _ = ctx_for(PayOnly(), modes=(Mode.PAY,))
    with pytest.raises(LineageError, match="does not list Mode.FULL"):
        ctx2.lwrite((0, 0), [(0, 0)], [(0,)])
    with pytest.raises(LineageError, match="got 2 payloads for 1 output cells"):
        ctx2.lwrite([(0, 0)], payload=[b"a", b"b"], each=True)
    # a payload that is not bytes is the operator's lineage error in every form (it was a
    # bare TypeError, reported as the operator failing, with each=True and in groups)
    for call in (lambda: ctx2.lwrite([(0, 0)], payload="text"),
                 lambda: ctx2.lwrite([(0, 0)], payload=["text"], each=True),
                 lambda: ctx2.lwrite([(0, 0)], payload=7, each=True),
                 lambda: ctx2.lwrite_groups([(0, 0)], [3], payload=["text"]),
                 lambda: ctx2.lwrite_groups([(0, 0)], [3], payload={3: 1.5})):
        with pytest.raises(LineageError, match="operator 'op'"):
            call()
    with pytest.raises(LineageError, match="no payload for group 3"):
        ctx2.lwrite_groups([(0, 0)], [3], payload={4: b"x"})


def test_unrequested_modes_are_dropped():
    ctx, buf = ctx_for(modes=())
    ctx.lwrite((1, 2), [(0, 0)], [(2,)])
    assert buf.finish((4, 5), [(4, 5), (3,)]) == (None, None)


def test_payload_dedup_and_each():
    class P(Operator):
        def supported_modes(self):
            return {Mode.PAY, Mode.BLACKBOX}

    ctx, buf = ctx_for(P(), modes=(Mode.PAY,))
    ctx.lwrite(np.array([[0, 0], [1, 1], [2, 2]]), payload=b"r3", each=True)
    ctx.lwrite(np.array([[3, 3], [3, 4]]), payload=[b"a", b"r3"], each=True)
    ctx.lwrite(np.array([[0, 1], [0, 2]]), payload=b"group")
    _, pay = buf.finish((4, 5), [(4, 5), (3,)])
    assert pay.n == 6 and pay.payloads == [b"r3", b"a", b"group"]
    assert pay.pay_ids.tolist() == [0, 0, 0, 1, 0, 2]


def test_codec_roundtrip():
    rng = np.random.default_rng(0)
    arrays = [np.array([], np.int64), np.arange(1000), rng.integers(-2**40, 2**40, 500),
              np.sort(rng.integers(0, 10**6, 300))]
    back = unpack_arrays(pack_arrays(*arrays))
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)
    for items in ([b"", b"\x00\x01", b"hello" * 100], [b""], [b"", b""], []):
        assert unpack_bytes(pack_bytes(items)) == items     # empty payloads too (regression)


def test_many_blobs_decode_together_as_each_alone():
    """``unpack_concat`` lays many blobs' arrays end to end: the same values as decoding
    each blob alone, and as were packed, whatever type each blob narrowed an array to,
    empty ones too, and values whose deltas wrap around int64 (both decoders sum in
    place)."""
    rng = np.random.default_rng(3)
    for _ in range(80):
        blobs, want, packed = [], [[], [], []], [[], [], []]
        for _b in range(int(rng.integers(1, 7))):
            arrays = []
            for _j in range(3):
                n = int(rng.integers(0, 9))
                if rng.random() < 0.15:          # the whole int64 range: deltas wrap
                    a = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n,
                                     dtype=np.int64, endpoint=True)
                else:
                    scale = int(rng.choice([1, 100, 30000, 2**40]))
                    a = rng.integers(-scale, scale + 1, n)
                arrays.append(np.sort(a) if rng.random() < 0.5 else a)
            blobs.append(pack_arrays(*arrays))
            for j, a in enumerate(unpack_arrays(blobs[-1])):
                want[j].append(a)
                packed[j].append(arrays[j])
        got, lens = unpack_concat(blobs)
        for j in range(3):
            np.testing.assert_array_equal(got[j], np.concatenate(want[j]))
            np.testing.assert_array_equal(got[j], np.concatenate(packed[j]))
            assert lens[j].tolist() == [len(a) for a in want[j]]


def test_blocks_decoded_together_refuse_one_that_would_shift_the_others():
    """Laid end to end, a block whose counts do not add up to its pair ids (or whose
    lengths do not add up to its cells) would shift every block after it: refused, which
    a reader reports as damaged lineage, never as other cells."""
    good = encode_key_block(np.array([5, 5, 9]), np.array([0, 1, 2]))
    bad = pack_arrays(np.array([5, 9]), np.array([2, 2]), np.array([0, 1, 2]))
    assert [c.tolist() for c, _, _ in decode_key_blocks([good, good])] == [[5, 9], [5, 9]]
    with pytest.raises(ValueError, match="add up"):
        decode_key_blocks([bad, good])
    rec = pack_arrays(np.array([2, 1]), np.array([4, 5, 6]))
    short = pack_arrays(np.array([2, 1]), np.array([4, 5]))
    blocks = decode_record_blocks([rec, rec], ["v0"])
    assert [b.n for b in blocks] == [2, 2] and blocks[1].cells("v0").tolist() == [4, 5, 6]
    with pytest.raises(ValueError, match="add up"):
        decode_record_blocks([rec, short], ["v0"])


def test_sorted_cells_are_compact():
    blob = pack_arrays(np.arange(0, 10**6, 1))
    assert len(blob) < 1000      # a dense run costs almost nothing


def test_key_block_merge_is_union():
    far = (1 << KEY_BITS) + 4                     # a cell in the next key block
    key = np.array([5, 6, 6, far])
    off = np.array([0, 2, 4])                     # pair 0: {5, 6}; pair 1: {6, far}
    blocks = key_blocks(key, off, 0)
    assert set(blocks) == {0, 1}
    cells, o, p = decode_key_block(blocks[0])
    assert cells.tolist() == [5, 6] and np.split(p, o[1:-1])[1].tolist() == [0, 1]
    more = key_blocks(np.array([6, 7]), np.array([0, 2]), 256)
    merged = decode_key_block(merge_key_blocks(blocks[0], more[0]))
    assert merged[0].tolist() == [5, 6, 7]
    assert np.split(merged[2], merged[1][1:-1])[1].tolist() == [0, 1, 256]


def test_damaged_lmdb_falls_back_to_reexecution(store, capfd):
    run = store.run(EXAMPLE, strategies={"stars": "full", "clean": "comp"})
    ref = run.trace("stars", [(40, 70)], to="raw", prefer="reexec").bitmap
    store2 = subzero.open_store(store.path)
    data = run.dir / "lineage" / "data.mdb"
    raw = bytearray(data.read_bytes())
    for k in range(8192, len(raw), 97):           # scribble over everything after the meta pages
        raw[k] = (raw[k] * 7 + 13) % 256
    data.write_bytes(bytes(raw))
    with pytest.warns(SubZeroWarning, match="answering this step another way"):
        res = store2.get(run.id).trace("stars", [(40, 70)], to="raw")
    assert np.array_equal(res.bitmap, ref)
    assert all(not s.method.startswith("stored") for s in res.steps)


def test_missing_lineage_store_falls_back(store, capfd):
    import shutil
    run = store.run(EXAMPLE, strategies={"stars": "full"})
    ref = run.trace("stars", [(12, 20)], to="raw").bitmap
    shutil.rmtree(run.dir / "lineage")
    store2 = subzero.open_store(store.path)
    with pytest.warns(SubZeroWarning, match="missing"):
        res = store2.get(run.id).trace("stars", [(12, 20)], to="raw")
    assert np.array_equal(res.bitmap, ref)


def test_damaged_rtree_falls_back(store, capfd):
    run = store.run(EXAMPLE, strategies={"stars": "full:fullmany:backward"})
    ref = run.trace("stars", [(12, 20)], to="raw").bitmap
    for f in (run.dir / "lineage" / "rtree").iterdir():
        f.write_bytes(b"garbage")
    store2 = subzero.open_store(store.path)
    with pytest.warns(SubZeroWarning, match="answering this step another way"):
        res = store2.get(run.id).trace("stars", [(12, 20)], to="raw")
    assert np.array_equal(res.bitmap, ref)


@pytest.mark.parametrize("spec", ["full:fullmany:backward", "full:fullmany:forward",
                                  "full:fullone:backward", "full:fullone:forward"])
def test_empty_lineage_is_not_damage(store, capfd, spec):
    """An operator that writes no pairs: the stored (empty) lineage answers
    with no cells and no 'damaged' warning (regression: an empty *Many
    strategy had no R-tree and looked corrupt)."""
    class Silent(Operator):
        def supported_modes(self):
            return {Mode.FULL, Mode.BLACKBOX}

        def run(self, ctx, x):
            return x

    wf = Workflow("silent")
    wf.add("op", Silent(), wf.input("x"))
    run = store.run(wf, inputs={"x": np.arange(4.0)}, strategies={"op": spec})
    capfd.readouterr()
    for res in (run.trace("op", [(1,)], to="x"), run.trace("x", [(1,)], to="op")):
        assert len(res) == 0 and res.steps[0].method.startswith("stored:")
    assert "warning" not in capfd.readouterr().err


def test_two_handles_on_one_run_in_one_process(store, capfd):
    """Regression: LMDB allows one environment per path per process; a second
    Store/Run object on the same run must share it, not fall back."""
    run = store.run(EXAMPLE, strategies={"stars": "full"})
    a = run.trace("stars", [(40, 70)], path=[("stars", 0)])
    other = subzero.open_store(store.path).get(run.id)
    b = other.trace("stars", [(40, 70)], path=[("stars", 0)])
    assert np.array_equal(a.bitmap, b.bitmap)
    assert b.steps[0].method.startswith("stored:") and "warning" not in capfd.readouterr().err


def test_blocks_written_by_numcodecs_zstd_still_decode():
    """Stores made before the zstandard codec hold frames written by numcodecs."""
    from numcodecs import Zstd

    from subzero.storage.codec import _decompress
    raw = np.arange(5000, dtype=np.int16).tobytes()
    assert _decompress(bytes(Zstd(level=1).encode(raw))) == raw


class Fan(Operator):
    """Output cell (r, c) depends on input row r (a forward fan-out of a whole row)."""

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, a):
        out = np.argwhere(np.ones(a.shape, bool))
        cols = np.arange(a.shape[1])
        ins = [np.column_stack([np.full(a.shape[1], r), cols]) for r, _ in out]
        ctx.lwrite(out, ins, each=True)
        return a * 2


def _fan_workflow():
    wf = Workflow("fan")
    wf.add("fan", Fan(), wf.input("a"))
    return wf


def test_key_block_size_of_an_older_store_is_kept(store, monkeypatch):
    """A store written with 2**14-cell key blocks (no key_bits in its metadata) answers
    the same after the block size changed, and appends keep its block size."""
    import json

    import subzero.storage.lineage as ls
    import subzero.storage.metadata as metadata
    a = np.arange(150 * 150, dtype=float).reshape(150, 150)
    for strategy in ("full:fullone:backward", "full:fullone:forward"):
        monkeypatch.setattr(ls, "KEY_BITS", 14)
        monkeypatch.setattr(metadata, "WRITE_FORMAT", 2)        # before checksums (format 3)
        unbound_runs(monkeypatch)                               # ... and before run uids
        old = store.run(_fan_workflow(), inputs={"a": a}, strategies={"fan": strategy})
        monkeypatch.undo()
        lin = ls.LineageStore(old.dir / "lineage")
        db = lin.database(f"fan|{strategy}".encode(), create=False)
        with lin.env.begin(write=True, db=db) as txn:     # as an older version wrote it
            meta = json.loads(txn.get(ls.META))
            assert meta.pop("format") == 2                # format 1 had no number ...
            for sp in meta["spaces"].values():             # ... and no key_bits
                assert sp.pop("key_bits") == 14
            txn.put(ls.META, json.dumps(meta).encode())
        lin.close()
        reopened = subzero.open_store(store.path).get(old.id)
        for cells in ([(0, 0)], [(149, 149), (20, 37)], [(r, 3) for r in range(0, 150, 7)]):
            start = "fan" if strategy.endswith("backward") else "a"
            got = reopened.trace(start, cells, path=[("fan", 0)], prefer=strategy, record=False)
            want = reopened.trace(start, cells, path=[("fan", 0)], prefer="reexec", record=False)
            assert got.steps[0].method == f"stored:{strategy}"
            assert np.array_equal(got.bitmap, want.bitmap)
        reopened.close()


def test_high_fan_out_lookup_stops_early_with_the_same_answer(store):
    """A forward lookup whose first cells already reach the whole output stops there;
    one that never fills it reads every chunk."""
    a = np.zeros((40, 30))
    run = store.run(_fan_workflow(), inputs={"a": a}, strategies={"fan": "full:fullone:forward"})
    every_row = [(r, 0) for r in range(40)] + [(r, 5) for r in range(40)]
    few_rows = [(r, c) for r in range(0, 40, 3) for c in range(30)]
    for cells in (every_row, few_rows):
        got = run.trace("a", cells, path=[("fan", 0)], record=False)
        want = run.trace("a", cells, path=[("fan", 0)], prefer="reexec", record=False)
        assert got.steps[0].method == "stored:full:fullone:forward"
        assert np.array_equal(got.bitmap, want.bitmap)


def test_cells_are_sorted_within_each_pair_whatever_their_range_or_order():
    """Record blocks store each pair's cells sorted: cells already in order come back
    as they are (the same array), others sorted within their pair only, also when the
    (pair, cell) key does not fit one int64 (cells near 2**62); empty pairs anywhere."""
    from subzero.model.cells import csr_rows
    from subzero.storage.encodings import sort_within_pairs
    rng = np.random.default_rng(5)
    for _ in range(300):
        lens = rng.integers(0, 8, int(rng.integers(1, 30)))
        off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        hi = 2**62 if rng.random() < 0.2 else 1000
        cells = rng.integers(0, hi, int(off[-1])).astype(np.int64)
        ordered = rng.random() < 0.3
        if ordered:
            cells = np.sort(cells)
        rows = csr_rows(off)
        want = cells[np.lexsort((cells, rows))] if cells.size else cells
        got = sort_within_pairs(cells, off)
        np.testing.assert_array_equal(got, want)
        if ordered:
            assert got is cells


def test_key_index_blocks_sort_cells_then_pairs_whatever_their_range():
    """The key index's (cell, pair) rows, sorted by one packed sort where the pair fits
    beside the cell and by a lexsort where not (cells near 2**62), encode the same
    blocks as sorting by (cell, pair) with a lexsort does."""
    from subzero.model.cells import csr_rows
    from subzero.storage import encodings as enc
    rng = np.random.default_rng(6)
    for _ in range(200):
        lens = rng.integers(0, 8, int(rng.integers(1, 40)))
        off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        hi = 2**62 if rng.random() < 0.2 else int(rng.choice([50, 10**6]))
        key = rng.integers(0, hi, int(off[-1])).astype(np.int64)
        first = int(rng.choice([0, 1024]))
        got = enc.key_blocks(key, off, first)
        if key.size == 0:
            assert got == {}
            continue
        pid = csr_rows(off) + first
        order = np.lexsort((pid, key))
        k, p = key[order], pid[order]
        keep = np.ones(len(k), bool)
        keep[1:] = (k[1:] != k[:-1]) | (p[1:] != p[:-1])
        assert got == enc._encode_sorted_index(k[keep], p[keep], enc.KEY_BITS)


def test_a_stable_order_of_small_keys_is_numpy_s_stable_argsort():
    """``stable_order`` sorts keys spanning fewer than 2**8 or 2**16 values through a
    narrow type (a radix sort) and others as they are, with their bound given or found:
    the same order as a stable argsort, ties in place."""
    from subzero.model.cells import stable_order
    rng = np.random.default_rng(7)
    for bound in (1, 2, 200, 256, 257, 60000, 65536, 65537, 10**7):
        keys = rng.integers(0, bound, int(rng.integers(0, 3000)))
        np.testing.assert_array_equal(stable_order(keys, bound), np.argsort(keys, kind="stable"))
        shifted = keys - bound // 2               # no bound given: found, negative keys too
        np.testing.assert_array_equal(stable_order(shifted), np.argsort(shifted, kind="stable"))


def test_payload_ids_in_one_batch_are_the_ids_one_at_a_time():
    """A batch of payloads gets the ids one batch per payload would give: equal payloads
    (bytes, bytearray or memoryview alike) share one, new ones are numbered in the order
    first seen, across batches; a payload that is not bytes is refused before any id is
    handed out."""
    rng = np.random.default_rng(3)
    pool = [bytes(rng.integers(0, 256, rng.integers(0, 5), dtype=np.uint8)) for _ in range(12)]
    batches = [[pool[k] for k in rng.integers(0, len(pool), n)] for n in (0, 1, 40, 200)]
    batches[2][::5] = [bytearray(p) for p in batches[2][::5]]
    batches[3][::7] = [memoryview(p) for p in batches[3][::7]]
    one, many = LineageBuffer("op", 1, 2, [2]), LineageBuffer("op", 1, 2, [2])
    seen: dict[bytes, int] = {}                  # the rule, spelled out
    for batch in batches:
        want = [seen.setdefault(bytes(p), len(seen)) for p in batch]
        assert [int(one.payload_ids([p])[0]) for p in batch] == want
        got = many.payload_ids(batch)
        assert got.dtype == np.int64 and got.tolist() == want
    assert many.payloads == one.payloads and len(set(many.payloads)) == len(many.payloads)
    kept = list(many.payloads)
    with pytest.raises(TypeError, match="payload must be bytes, got str"):
        many.payload_ids([b"new", "text"])
    assert many.payloads == kept


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_lwrite_groups_is_one_pair_per_group_of_output_cells(data):
    """``lwrite_groups`` makes the pairs a loop over its groups would: one per distinct
    output group in sorted order, its output cells and each input's cells in the order
    given, input cells of groups without output cells dropped.  Groups drawn consecutive
    (found by subtraction) and spread out (by binary search), negative ones too, with
    input labels that are no group, or none at all."""
    step = data.draw(st.sampled_from([1, 1, 2, 5]), label="step")
    base = data.draw(st.sampled_from([-4, -1, 0, 3, 2**62, -(2**62)]), label="base")
    pool = [base + step * k for k in range(5)]
    strays = [base - 1, base + step * 5 + 1,             # never an output group
              2**63 - 1, -(2**63)]                   # nor the ends of int64 (no wrap-around)
    n_out = data.draw(st.integers(0, 10), label="n_out")
    out_g = data.draw(st.lists(st.sampled_from(pool), min_size=n_out, max_size=n_out), label="out_g")
    cell2 = st.tuples(st.integers(0, 3), st.integers(0, 4))
    outs = data.draw(st.lists(cell2, min_size=n_out, max_size=n_out), label="outs")
    n0 = data.draw(st.integers(0, 14), label="n0")
    in0 = data.draw(st.lists(cell2, min_size=n0, max_size=n0), label="in0")
    g0 = data.draw(st.lists(st.sampled_from(pool + strays), min_size=n0, max_size=n0), label="g0")
    n1 = data.draw(st.integers(0, 6), label="n1")
    in1 = data.draw(st.lists(st.tuples(st.integers(0, 2)), min_size=n1, max_size=n1), label="in1")
    g1 = data.draw(st.lists(st.sampled_from(pool), min_size=n1, max_size=n1), label="g1")
    ctx, buf = ctx_for()
    as2 = lambda cells, d: np.array(cells, np.int64).reshape(-1, d)       # noqa: E731
    ctx.lwrite_groups(as2(outs, 2), out_g, (as2(in0, 2), g0), (as2(in1, 1), g1))
    full, _ = buf.finish((4, 5), [(4, 5), (3,)])
    groups = sorted(set(out_g))
    if not groups:
        assert full is None or full.n == 0
        return
    want_out = [[r * 5 + c for (r, c), g in zip(outs, out_g) if g == k] for k in groups]
    want0 = [[r * 5 + c for (r, c), g in zip(in0, g0) if g == k] for k in groups]
    want1 = [[x for (x,), g in zip(in1, g1) if g == k] for k in groups]
    split = lambda v, off: [x.tolist() for x in np.split(v, off[1:-1])]    # noqa: E731
    assert full.n == len(groups)
    assert split(full.out, full.out_off) == want_out
    assert split(full.ins[0], full.in_offs[0]) == want0
    assert split(full.ins[1], full.in_offs[1]) == want1


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=1, max_size=3),
       rows=st.lists(st.lists(st.integers(-2, 8), min_size=3, max_size=3), max_size=12))
def test_the_first_cell_out_of_bounds_is_the_first_row_with_a_coordinate_outside(shape, rows):
    """``first_out_of_bounds`` (each coordinate's least and greatest first, then the rows)
    names the first row with a coordinate below 0 or at or past its side, or None."""
    from subzero.model.cells import first_out_of_bounds
    cells = np.array([r[:len(shape)] for r in rows], np.int64).reshape(-1, len(shape))
    want = next((k for k, r in enumerate(cells.tolist())
                 if any(c < 0 or c >= n for c, n in zip(r, shape))), None)
    assert first_out_of_bounds(cells, tuple(shape)) == want
