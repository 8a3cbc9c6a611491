"""Lineage encoded ahead (``storage.lineage.prepare_strategy``), in a child of a run made
from its profiling run (``runs.ahead``): stored byte for byte as the pairs encoded in
the run's own process, and never another answer when the child fails, dies, stalls or
hands over something else -- the run then encodes those strategies itself."""

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from relations import same
from test_shards import IN_SHAPE, SHAPE, tile_pairs

import subzero
from subzero.forked import cores
from subzero.model.strategy import parse_one
from subzero.optimizer.profile import profile_workflow
from subzero.runs import ahead, planned
from subzero.runs.options import RunOptions
from subzero.storage.lineage import LineageStore, prepare_strategy

ROOT = Path(__file__).resolve().parent.parent
WF = str(ROOT / "workflows" / "genomics.py")

UID = "00112233445566778899aabbccddeeff"
AHEAD = ["full:fullone:backward", "full:fullone:forward", "pay:payone:backward",
         "full:fullmany:backward", "full:fullmany:forward", "pay:paymany:backward"]
NOT_AHEAD = ["comp:payone:backward", "comp:paymany:backward"]

#: six strategies the profiling run (it stores each operator's default, FullOne
#: backward) did not store, all of them encodable ahead (two Pay keyed forward: map_p)
PLAN = {"name": "ahead", "workflow": "genomics",
        "strategies": {"extract": "full:fullone:forward+pay:payone:backward",
                       "model": "full:fullone:forward+pay:payone:forward",
                       "predict": "full:fullone:forward+pay:payone:forward"}}
#: Many encodings: the child builds their R-tree files, the run moves them into place
MANY = {"name": "many", "workflow": "genomics",
        "strategies": {"extract": "full:fullmany:forward+pay:paymany:backward",
                       "model": "full:fullone:backward+pay:paymany:forward",
                       "predict": "full:fullmany:backward+full:fullmany:forward"}}
#: only Pay keyed forward beside the defaults: the child's are encoded with map_p
PAY_FORWARD = {"name": "pay-forward", "workflow": "genomics",
               "strategies": {op: "full:fullone:backward+pay:payone:forward"
                              for op in ("extract", "model", "predict")}}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strategy=hst.sampled_from(AHEAD), seed=hst.integers(0, 2**31))
def test_a_strategy_encoded_ahead_is_stored_byte_for_byte_as_one_encoded_here(
        tmp_path_factory, strategy, seed):
    s = parse_one(strategy)
    pairs = tile_pairs(np.random.default_rng(seed), range(SHAPE[0]), s.payload)
    root = tmp_path_factory.mktemp("ahead")

    def ahead_of(where: str):            # a Many encoding's R-tree files go with it
        return prepare_strategy(s, pairs, SHAPE, [IN_SHAPE], rtree_dir=root / where)
    done = ahead_of("a")
    assert done is not None and done.pairs == pairs.n
    assert _stored(root / "here", s, pairs) == _stored(root / "there", s, pairs, done)
    # handed over for other pairs (another count), it is not used: those are encoded
    fewer = tile_pairs(np.random.default_rng(seed + 1), range(SHAPE[0]), s.payload)
    if fewer.n != pairs.n:
        assert _stored(root / "other", s, fewer, ahead_of("b")) == _stored(root / "again", s, fewer)
    # nor for the same pairs in other shapes (a grid their cells were not packed in):
    # encode_strategy then encodes them (returns the spaces it made), as without one
    from subzero.storage.lineage import _MemoryTxn, encode_strategy
    wide = (SHAPE[0], SHAPE[1] + 1)
    for shape, used in ((SHAPE, True), (wide, False)):
        made = encode_strategy(_MemoryTxn(), b"op", s, pairs, shape, [IN_SHAPE], None,
                               lambda space, w=shape[1]: root / f"c{w}" / space, "a test", UID, None,
                               ahead_of(f"d{shape[1]}"))
        assert (made == []) == used


def _stored(path, s, pairs, prepared=None) -> dict:
    """Every key and value of ``s`` stored from ``pairs`` (``prepared``: handed over)."""
    lineage = LineageStore(path, run_uid=UID)
    try:
        lineage.write("op", s, pairs, SHAPE, [IN_SHAPE], prepared=prepared)
        name = lineage.db_name("op", s)
        with lineage.env.begin(db=lineage.database(name)) as txn:
            entries = dict(txn.cursor())
        rtrees = {f.relative_to(path).as_posix(): f.read_bytes() for f in sorted(Path(path).rglob("*"))
                  if f.is_file() and f.suffix in (".idx", ".dat")}
        assert bool(rtrees) == (s.many and pairs.n > 0)
        return {"entries": entries, "rtrees": rtrees}
    finally:
        lineage.close()


@pytest.mark.parametrize("strategy", NOT_AHEAD + ["full:fullmany:backward"])
def test_comp_and_many_without_a_folder_are_not_encoded_ahead(strategy, tmp_path):
    """Comp writes its covered cells with its blocks; Many's R-tree files need a folder."""
    s = parse_one(strategy)
    pairs = tile_pairs(np.random.default_rng(0), range(SHAPE[0]), s.payload)
    assert ahead.aheadable(s) == (s.mode.value != "comp")
    assert prepare_strategy(s, pairs, SHAPE, [IN_SHAPE]) is None
    if s.mode.value == "comp":
        assert prepare_strategy(s, pairs, SHAPE, [IN_SHAPE], rtree_dir=tmp_path) is None


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A store with a profiling run of genomics (3 replicas) and its profiler's pairs."""
    st = subzero.open_store(tmp_path_factory.mktemp("ahead-run") / "store")
    got = profile_workflow(st, WF, params={"replicate": 3}, progress=False, keep_pairs=True)
    yield st, got
    st.close()


def _made(st, got, monkeypatch, plan=PLAN) -> tuple[int, list]:
    """The run made from the profiling run with ``PLAN``, and per strategy of it what
    the child handed over (True) or not (False)."""
    taken: list = []
    real = ahead.EncodedAhead.__call__

    def call(self, op, s):
        got_one = real(self, op, s)
        taken.append(got_one is not None)
        return got_one
    monkeypatch.setattr(ahead.EncodedAhead, "__call__", call)
    opts = RunOptions.of(params={"replicate": 3}, plan=plan, progress=False)
    run_id, _ = planned.make_from(st.catalog, st.runs_dir, st.get(got["run_id"]), opts,
                                  got["pairs"], got["sums"])
    return run_id, taken


def _private_tmp(tmp_path, monkeypatch) -> Path:
    """A temporary folder of this test's own for the child's files (another test's in
    another worker may make one in the system's at any time)."""
    import tempfile
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.skipif(not hasattr(os, "fork") or cores() < 2,
                    reason="encoding ahead needs fork and two processors")
@pytest.mark.parametrize("plan", [PLAN, PAY_FORWARD, MANY], ids=["mixed", "pay-forward", "many"])
def test_a_made_run_takes_the_childs_encodings_and_is_the_full_run(profiled, monkeypatch, plan,
                                                                   tmp_path):
    st, got = profiled
    tmp = _private_tmp(tmp_path, monkeypatch)
    run_id, taken = _made(st, got, monkeypatch, plan)
    assert taken == []                     # too few cells to be worth a child
    monkeypatch.setattr(ahead, "AHEAD_MIN_CELLS", 0)
    run_id, taken = _made(st, got, monkeypatch, plan)
    assert any(taken)                      # the child's half, handed over
    monkeypatch.undo()
    made, full = st.get(run_id), st.run(WF, params={"replicate": 3}, plan=plan, progress=False)
    same(made, full)
    # the record's statistics of each strategy (map_p's expansions of those keyed
    # forward included): what the cost model learns from
    assert _spaces(made) == _spaces(full)
    assert list(tmp.iterdir()) == []


def _spaces(run) -> dict:
    return {(o["name"], ps["strategy"]): (ps["pairs"], ps["spaces"])
            for o in run.steering().record["ops"] for ps in o["per_strategy"]}


def _kill_self(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)


def _stall(*a, **k):
    time.sleep(3600)


@pytest.mark.skipif(not hasattr(os, "fork") or cores() < 2,
                    reason="encoding ahead needs fork and two processors")
@pytest.mark.parametrize("fault", ["dies", "stalls", "fails", "hands-over-another"])
def test_a_child_that_fails_leaves_the_run_encoding_its_lineage_itself(profiled, monkeypatch, fault,
                                                                       tmp_path):
    st, got = profiled
    tmp = _private_tmp(tmp_path, monkeypatch)
    monkeypatch.setattr(ahead, "AHEAD_MIN_CELLS", 0)
    real = ahead.prepare_strategy
    if fault == "dies":
        monkeypatch.setattr(ahead, "prepare_strategy", _kill_self)
    elif fault == "stalls":
        monkeypatch.setattr(ahead, "BESIDE_STALL_S", 0.5)
        monkeypatch.setattr(ahead, "prepare_strategy", _stall)
    elif fault == "fails":
        def fails(*a, **k):
            raise RuntimeError("no")
        monkeypatch.setattr(ahead, "prepare_strategy", fails)
    else:
        def another(s, pairs, out_shape, in_shapes, map_p_pairs=None):
            flipped = parse_one(str(s).replace("forward", "X").replace("backward", "forward")
                                .replace("X", "backward"))
            return real(flipped, pairs, out_shape, in_shapes)
        monkeypatch.setattr(ahead, "prepare_strategy", another)
    t0 = time.monotonic()
    run_id, taken = _made(st, got, monkeypatch)
    assert taken and not any(taken)        # nothing handed over: all encoded by the run
    assert time.monotonic() - t0 < 60
    monkeypatch.undo()
    same(st.get(run_id), st.run(WF, params={"replicate": 3}, plan=PLAN, progress=False))
    assert list(tmp.iterdir()) == []
