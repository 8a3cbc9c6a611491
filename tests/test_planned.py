"""A budget run made from the profiling run its plan was chosen on
(:mod:`subzero.runs.planned`): the run a full run with the plan makes, every
array bit for bit and the lineage relation it stores, whichever way each
operator's lineage comes -- read back from the profiling run, the profiler's own
pairs of a mode that run did not store, or the operator run again."""

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs
from relations import same, spoil_lineage

import subzero
from subzero import Mode, Operator, Workflow
from subzero.model.strategy import parse_one
from subzero.optimizer.profile import profile_workflow
from subzero.query.workload import load_workload, select_cells
from subzero.runs import planned
from subzero.runs.options import RunOptions
from subzero.storage.lineage import CorruptLineage, LineageStore

ROOT = Path(__file__).resolve().parent.parent
WF = str(ROOT / "workflows" / "genomics.py")
WORKLOAD = str(ROOT / "workflows" / "genomics_workload.json")


def _store(path, calibration=None):
    st = subzero.open_store(path)
    if calibration is not None:
        st.catalog.add_calibration(os.uname().nodename, calibration["seconds"], calibration)
    return st


def _answers(run):
    return {q.name: run.trace(q.start, select_cells(run, q), to=q.to, path=q.path,
                              record=False).bitmap.tobytes()
            for q in load_workload(WORKLOAD)}


def _count_model_runs(parent, monkeypatch) -> dict:
    """``{"model": n}``, n counting the runs of ``model``'s operator class (as ``parent``
    loaded it) from now on."""
    runs = {"model": 0}
    model = type(parent.workflow.steps["model"].operator)
    real = model.run

    def counted(self, *a, **k):
        runs["model"] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(model, "run", counted)
    return runs


PLANS = {
    # Pay pairs the profiling run (it stores the defaults, Full) did not keep; Full
    # read back from its backward index, into forward and many-encoded strategies
    "mixed": {"extract": "pay:payone:backward", "model": "pay:paymany:forward+full:fullone:forward",
              "predict": "full:fullmany:forward"},
    "pay": {"extract": "pay:paymany:forward", "model": "pay:payone:backward",
            "predict": "pay:payone:forward+pay:paymany:backward"},
    "map-and-blackbox": {"extract": "blackbox", "model": "full:fullone:forward",
                         "predict": "blackbox"},
}


KEEPS_DEFAULTS = {"extract": "full:fullone:backward+pay:payone:forward",
                  "model": "full:fullone:backward+full:fullone:forward",
                  "predict": "full:fullone:backward"}
DEFAULT = "full:fullone:backward"          # what the profiling run stores of all three


def _write_s(run) -> dict:
    """(operator, strategy) -> the write seconds ``run``'s signed record gives."""
    return {(o["name"], ps["strategy"]): ps["write_s"] for o in run.steering().record["ops"]
            for ps in o["per_strategy"]}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A store with a profiling run of genomics (3 replicas) and its profiler's pairs."""
    st = _store(tmp_path_factory.mktemp("planned") / "store")
    got = profile_workflow(st, WF, params={"replicate": 3}, progress=False, keep_pairs=True)
    yield st, got
    st.close()


@pytest.mark.parametrize("side", [True, False], ids=["profiler-pairs", "run-again"])
@pytest.mark.parametrize("name", sorted(PLANS))
def test_made_from_profiling_run_is_the_full_run(profiled, name, side, monkeypatch):
    st, got = profiled
    plan = {"name": name, "workflow": "genomics", "strategies": PLANS[name]}
    parent = st.get(got["run_id"])
    runs = _count_model_runs(parent, monkeypatch)
    pairs = got["pairs"] if side else {}
    opts = RunOptions.of(params={"replicate": 3}, plan=plan, progress=False)
    run_id, _ = planned.make_from(st.catalog, st.runs_dir, parent, opts, pairs,
                                  got["sums"] if side else None)
    made = st.get(run_id)
    ran = runs["model"]
    full = st.run(WF, params={"replicate": 3}, plan=plan, progress=False)
    same(made, full)
    assert _answers(made) == _answers(full)
    assert [o["strategies"] for o in made.ops()] == [o["strategies"] for o in full.ops()]
    # model's plan needs Pay pairs the profiling run did not store: its profiler's pairs
    # stand for a run of it; without them it runs again
    needs_pay = "pay:" in PLANS[name]["model"]
    assert ran == (1 if needs_pay and not side else 0)
    # an operator taken over keeps its real run time in the record (what re-executing
    # it costs), not the milliseconds taking it over took
    if ran == 0:
        took = {o["name"]: o["run_s"] for o in parent.ops()}["model"]
        assert {o["name"]: o["run_s"] for o in made.ops()}["model"] == took > 0



@pytest.mark.parametrize("side", [True, False], ids=["profiler-pairs", "run-again"])
def test_made_run_reads_back_only_what_an_operator_that_runs_reads(profiled, side, monkeypatch):
    """The arrays a made run takes from its profiling run are read back only for an
    operator that runs again (for Pay pairs the profiler did not give, all three of
    this plan's): with the profiler's pairs none runs, and none is read."""
    from subzero.engines.incremental import IncrementalEngine
    st, got = profiled
    plan = {"name": "pay", "workflow": "genomics", "strategies": PLANS["pay"]}
    parent = st.get(got["run_id"])
    runs = _count_model_runs(parent, monkeypatch)
    read: list[str] = []
    real = IncrementalEngine._value

    def value(self, name):
        read.append(name)
        return real(self, name)

    monkeypatch.setattr(IncrementalEngine, "_value", value)
    opts = RunOptions.of(params={"replicate": 3}, plan=plan, progress=False)
    run_id, _ = planned.make_from(st.catalog, st.runs_dir, parent, opts,
                                  got["pairs"] if side else {}, got["sums"] if side else None)
    assert runs["model"] == (0 if side else 1)
    if side:
        assert read == []
    else:      # the operators that run again read their inputs and compare their outputs
        ran = {"extract", "model", "predict"}
        steps = parent.workflow.steps
        assert read and set(read) <= ran | {a for op in ran for a in steps[op].inputs}
    full = st.run(WF, params={"replicate": 3}, plan=plan, progress=False)
    same(st.get(run_id), full)

STORED = [f"{m}:{e}:{d}" for m, encs in (("full", ("fullone", "fullmany")),
                                          ("pay", ("payone", "paymany")))
          for e in encs for d in ("backward", "forward")]
UDF_PLANS = hs.lists(hs.sampled_from(STORED), min_size=1, max_size=2, unique=True).map("+".join) \
    | hs.just("blackbox")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hs.fixed_dictionaries({op: UDF_PLANS for op in ("extract", "model", "predict")}),
       hs.booleans(), hs.booleans())
def test_any_plan_made_from_profiling_run_is_the_full_run(profiled, strategies, side, child):
    """The oracle: whatever each data-dependent operator's plan stores, in whichever mix
    of modes, the run made from the profiling run stores the relation a full run with
    that plan stores and answers every workload query alike -- with part of its lineage
    encoded ahead in a child (``child``: whatever its size) or all in the run."""
    from subzero.errors import StrategyError
    from subzero.runs import ahead
    st, got = profiled
    plan = {"name": "drawn", "workflow": "genomics", "strategies": strategies}
    parent = st.get(got["run_id"])
    opts = RunOptions.of(params={"replicate": 3}, plan=plan, progress=False)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ahead, "AHEAD_MIN_CELLS", 0 if child else 2**62)
            run_id, _ = planned.make_from(st.catalog, st.runs_dir, parent, opts,
                                          got["pairs"] if side else {},
                                          got["sums"] if side else None)
    except StrategyError:
        assume(False)                   # not a plan a run could store either
    full = st.run(WF, params={"replicate": 3}, plan=plan, progress=False)
    made = st.get(run_id)
    same(made, full)
    assert _answers(made) == _answers(full)


@pytest.mark.parametrize("plan_name", ["mixed", "keeps-defaults"])
@pytest.mark.parametrize("stored_pairs", [False, True], ids=["read-back", "kept"])
def test_damaged_profiling_lineage_is_computed_again_never_reused(tmp_path, monkeypatch,
                                                                  stored_pairs, plan_name):
    """The profiling run's stored lineage of ``model``, spoiled on disk: without the
    Full pairs its step captured (beyond ``PROFILE_KEEP_STORED_BYTES``), the run made
    from it runs ``model`` again (the Pay pairs the profiler kept are not enough for a
    plan that also stores Full, and the spoiled lineage cannot be read back); with them
    it reads nothing back and runs nothing.  A plan that keeps ``model``'s default
    (``keeps-defaults``) does not copy it (a value fails its check): it is encoded, and
    ``extract``'s undamaged default is copied.  Either way it is the full run."""
    st = _store(tmp_path / "store")
    got = profile_workflow(st, WF, progress=False, keep_pairs=True)
    assert ("model", "full") in got["pairs"]        # the mode its profiling run stored
    pairs = got["pairs"] if stored_pairs else \
        {k: v for k, v in got["pairs"].items() if k != ("model", "full")}
    parent = st.get(got["run_id"])
    assert spoil_lineage(parent, "model")
    runs = _count_model_runs(parent, monkeypatch)
    plan = {"name": plan_name, "workflow": "genomics",
            "strategies": PLANS["mixed"] if plan_name == "mixed" else KEEPS_DEFAULTS}
    run_id, _ = planned.make_from(st.catalog, st.runs_dir, parent, RunOptions.of(plan=plan,
                                  progress=False), pairs, got["sums"])
    assert runs["model"] == (0 if stored_pairs else 1)
    monkeypatch.undo()
    made = st.get(run_id)
    if plan_name == "keeps-defaults":
        was, now = _write_s(parent), _write_s(made)
        assert now[("model", DEFAULT)] != was[("model", DEFAULT)]        # encoded, not copied
        assert now[("extract", DEFAULT)] == was[("extract", DEFAULT)]    # undamaged: copied
    same(made, st.run(WF, plan=plan, progress=False))
    st.close()


def test_strategies_the_profiling_run_stored_are_copied_bound_to_the_made_run(profiled):
    """A strategy the plan shares with the profiling run is stored as a copy of that run's
    lineage, not decoded and encoded again: the made run's record gives the profiling
    run's write time for it (what storing it costs, for later plans), its record and
    values are sealed for the made run (the profiling run's uid reads none of them, the
    made run's reads all of them: ``same``), and the made run is the full run."""
    st, got = profiled
    plan = {"name": "keeps-defaults", "workflow": "genomics", "strategies": KEEPS_DEFAULTS}
    parent = st.get(got["run_id"])
    opts = RunOptions.of(params={"replicate": 3}, plan=plan, progress=False)
    run_id, _ = planned.make_from(st.catalog, st.runs_dir, parent, opts, got["pairs"], got["sums"])
    made = st.get(run_id)
    was, now = _write_s(parent), _write_s(made)
    for op in ("extract", "model", "predict"):
        assert now[(op, DEFAULT)] == was[(op, DEFAULT)]
    assert now[("model", "full:fullone:forward")] != was.get(("model", "full:fullone:forward"))
    theirs = LineageStore(made.dir / "lineage", readonly=True, run_uid=parent.row.uid)
    try:
        with pytest.raises(CorruptLineage, match="belongs to another run"):
            theirs.meta("extract", parse_one(DEFAULT))
    finally:
        theirs.close()
    full = st.run(WF, params={"replicate": 3}, plan=plan, progress=False)
    same(made, full)
    assert _answers(made) == _answers(full)
    assert {o["name"]: o["pairs"] for o in made.ops()} == {o["name"]: o["pairs"] for o in full.ops()}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=hs.sampled_from(["extract", "model", "predict"]), pick=hs.integers(0, 2**20),
       at=hs.integers(0, 2**20), kept=hs.booleans())
def test_one_damaged_byte_of_a_shared_strategy_is_never_copied(profiled, tmp_path_factory, op, pick,
                                                               at, kept):
    """Fault injection: one byte of one stored value (its record included) of a strategy
    the plan shares with the profiling run, flipped on disk.  Whichever it is, the made
    run is the full run: the copy is refused, and the pairs come from memory or, without
    them, the operator runs again (the damaged lineage cannot be read back either)."""
    import shutil

    import lmdb
    st, got = profiled
    folder = tmp_path_factory.mktemp("damaged") / "store"
    shutil.copytree(st.path, folder)
    copy = subzero.open_store(folder)
    try:
        parent = copy.get(got["run_id"])
        env = lmdb.open(str(parent.dir / "lineage"), max_dbs=64, subdir=True)
        try:
            db = env.open_db(LineageStore.db_name(op, parse_one(DEFAULT)), create=False)
            with env.begin(write=True, db=db) as txn:
                items = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
                key, value = items[pick % len(items)]
                b = at % len(value)
                txn.put(key, value[:b] + bytes([value[b] ^ 0x5A]) + value[b + 1:])
        finally:
            env.close()
        pairs = got["pairs"] if kept else {k: v for k, v in got["pairs"].items() if k[0] != op}
        plan = {"name": "keeps-defaults", "workflow": "genomics", "strategies": KEEPS_DEFAULTS}
        run_id, _ = planned.make_from(copy.catalog, copy.runs_dir, parent,
                                      RunOptions.of(params={"replicate": 3}, plan=plan, progress=False),
                                      pairs, got["sums"])
        made = copy.get(run_id)
        assert _write_s(made)[(op, DEFAULT)] != _write_s(parent)[(op, DEFAULT)]   # not copied
        same(made, copy.run(WF, params={"replicate": 3}, plan=plan, progress=False))
    finally:
        copy.close()


def test_profiler_keeps_stored_pairs_within_their_own_bytes(tmp_path, monkeypatch):
    """The pairs of modes the profiling run stored are kept within
    ``PROFILE_KEEP_STORED_BYTES``, apart from those of modes it did not store: with no
    room for the first, the second are all still kept."""
    from subzero.optimizer import profile as profmod
    st = _store(tmp_path / "store")
    everything = profile_workflow(st, WF, progress=False, keep_pairs=True)["pairs"]
    monkeypatch.setattr(profmod, "PROFILE_KEEP_STORED_BYTES", 0)
    unstored = profile_workflow(st, WF, progress=False, keep_pairs=True)["pairs"]
    st.close()
    stored = {k for k in everything if k[1] == "full"}     # genomics' defaults store Full
    assert stored and set(unstored) == set(everything) - stored


def test_profiler_keeps_no_pairs_beyond_its_share_of_the_memory_available(tmp_path, monkeypatch):
    """Each kept pairs' bytes are at most a ``PROFILE_KEEP_MEMORY_SHARE``-th of the memory
    the machine has available: with little available only the small ones are kept, with
    none (or where /proc cannot say) none."""
    from subzero.optimizer import profile as profmod
    st = _store(tmp_path / "store")
    everything = profile_workflow(st, WF, progress=False, keep_pairs=True)["pairs"]
    sizes = {k: profmod._pairs_bytes(p) + sum(len(b) for b in (p.payloads or ()))
             for k, p in everything.items()}
    cut = sorted(sizes.values())[len(sizes) // 2]
    monkeypatch.setattr(profmod, "_available", lambda: cut * profmod.PROFILE_KEEP_MEMORY_SHARE)
    some = profile_workflow(st, WF, progress=False, keep_pairs=True)["pairs"]
    assert set(some) == {k for k, b in sizes.items() if b <= cut}
    assert 0 < len(some) < len(everything)
    monkeypatch.setattr(profmod, "_available", lambda: None)
    assert profile_workflow(st, WF, progress=False, keep_pairs=True)["pairs"] == {}
    st.close()


class Flaky(Operator):
    """Lineage not the same on every run (declared): its pairs from a re-run would
    describe another run's output."""

    deterministic_lineage = False

    def supported_modes(self):
        return {Mode.FULL, Mode.PAY, Mode.BLACKBOX}

    def run(self, ctx, x):
        out = np.asarray(x, float) * 2.0
        cells = np.indices(out.shape).reshape(out.ndim, -1).T
        if Mode.PAY in ctx.modes:
            ctx.lwrite(cells, payload=b"\x00", each=True)
        if Mode.FULL in ctx.modes:
            ctx.lwrite(cells, cells, each=True)
        return out

    def map_p(self, cells, payload, i, ctx):
        return cells


def test_pairs_of_lineage_that_differs_per_run_are_not_kept(tmp_path):
    wf = Workflow("flaky")
    x = wf.input("x")
    wf.add("f", Flaky(), x)
    st = _store(tmp_path / "store")
    got = profile_workflow(st, wf, inputs={"x": np.arange(12.0).reshape(3, 4)}, progress=False,
                           keep_pairs=True, beside=False)
    # its Pay pairs came from a re-run: not kept; its Full pairs are its own step's
    # (what the run stored, describing the run's own output): kept
    assert set(got["pairs"]) == {("f", "full")}
    st.close()


def test_budget_run_cli_is_made_from_its_profiling_run(tmp_path, calibration, cli):
    """``run --max-disk`` in a store without a profile: the profiling run, then the run
    made from it (one line says so), the same as ``run --plan`` of the plan it saved; a
    later budget run (profiled already) runs in full."""
    store = tmp_path / "store"
    _store(store, calibration).close()
    code, out, err = cli("run", WF, "--store", store, "--max-disk", "2MB", "--workload", WORKLOAD)
    assert code == 0, err
    assert "making the run from profiling run 1" in out and "run id: 2" in out, out
    code, out, err = cli("run", WF, "--store", store, "--plan", "genomics-2.00MB")
    assert code == 0, err
    code, out2, err = cli("run", WF, "--store", store, "--max-disk", "2MB", "--workload", WORKLOAD)
    assert code == 0, err
    assert "making the run" not in out2 and "run id: 4" in out2, out2
    st = subzero.open_store(store)
    assert [(r.id, r.status) for r in st.runs()] == [(i, "complete") for i in (1, 2, 3, 4)]
    same(st.get(2), st.get(3))
    assert _answers(st.get(2)) == _answers(st.get(3))
    st.close()


def test_made_run_killed_resumes_as_a_run(tmp_path, calibration, cli):
    """Killed while it is made from its profiling run, the run resumes like any run and
    comes out as a full run with its plan would."""
    import subprocess
    import sys
    store = tmp_path / "store"
    _store(store, calibration).close()
    kill = [sys.executable, str(Path(__file__).parent / "crashpoint.py"),
            "subzero.engines.incremental:IncrementalEngine._keep_whole", "5", "--",
            "run", WF, "--store", str(store), "--max-disk", "2MB", "--workload", WORKLOAD]
    p = subprocess.run(kill, capture_output=True, text=True, timeout=600)
    assert p.returncode == -9, p.stdout + p.stderr
    assert "making the run from profiling run 1" in p.stdout
    code, out, err = cli("run", "--resume", "2", "--store", store)
    assert code == 0, err
    st = subzero.open_store(store)
    name = st.catalog.plan_names()[0]
    full = st.run(WF, plan=name, progress=False)
    assert [(r.id, r.status) for r in st.runs()] == [(1, "complete"), (2, "complete"),
                                                      (3, "complete")]
    same(st.get(2), full)
    st.close()


def test_a_profiling_run_it_cannot_trust_is_not_made_from(tmp_path, calibration, monkeypatch):
    """A profiling run that does not verify (here: its verdict says untrusted) is not read:
    the budget run runs the plan in full, as it did before runs were made from it."""
    from subzero.run import Run
    st = _store(tmp_path / "store", calibration)
    monkeypatch.setattr(Run, "trusted", property(lambda self: False))
    said: list[str] = []
    run = st.run(WF, max_disk="2MB", workload=WORKLOAD, progress=False, announce=said.append)
    assert run.id == 2 and not any("making the run" in line for line in said), said
    monkeypatch.undo()
    full = st.run(WF, plan=st.catalog.plan_names()[0], progress=False)
    same(run, full)
    st.close()


def test_budget_run_api_on_spark_settings_is_not_made_from_it():
    """Asked for Spark, or other tiles, a budget run runs in full as asked."""
    assert planned.can_make_from(RunOptions.of(max_disk="1MB"))
    assert not planned.can_make_from(RunOptions.of(max_disk="1MB", engine="spark"))
    assert not planned.can_make_from(RunOptions.of(max_disk="1MB", master="spark://h:7077"))
    assert not planned.can_make_from(RunOptions.of(max_disk="1MB", tile=64))
    assert not planned.can_make_from(RunOptions.of(max_disk="1MB", capture=False))
