"""What the optimizer trusts (issue 33): a calibration that knows when the machine
was busy, an operator's own lineage sample read back and compared with the
calibrated prediction, and a plan that keeps an operator's defaults where the
model cannot vouch for its choice.  Behaviour, not timings: real GLPK, real
LMDB, the real profiler on genomics 1x."""

import copy
import json
import multiprocessing as mp
import os

import pytest
from test_optimizer import UDFS, WF, WORKLOAD, _store

import subzero
from subzero.model.strategy import default_for
from subzero.optimizer import busy, optimize
from subzero.optimizer.costmodel import STORED_FAMILIES, CostModel
from subzero.optimizer.stats import collect


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, calibration):
    st = _store(tmp_path_factory.mktemp("trust") / "store", calibration)
    optimize(st, WF, workload=WORKLOAD, save=False)            # profiles genomics 1x once
    yield st
    st.close()


def _spin():
    while True:
        pass


def test_calibration_under_a_synthetic_load_says_the_machine_is_busy():
    """Four busy loops on the probe's own core: the probe gets a fraction of it, the
    load is called busy, and the user gets one line saying so."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs CPU affinity (Linux) to put the load on the probe's core")
    core = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_spin, daemon=True) for _ in range(4)]
    try:
        for p in procs:
            p.start()
            os.sched_setaffinity(p.pid, {core})
        os.sched_setaffinity(0, {core})
        load = busy.summarise([busy.probe(), busy.probe()])
    finally:
        os.sched_setaffinity(0, before)
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()
    assert load["busy"] and load["cpu_share"] < 0.6
    line = busy.warning(load)
    assert line is not None and "\n" not in line and "busy" in line and "--recalibrate" in line


def test_a_quiet_load_has_no_warning():
    assert busy.warning({"cpu_share": 0.97, "load_per_core": 0.1, "busy": False}) is None


def test_calibration_records_its_load(calibration):
    load = calibration["load"]
    assert 0.0 < load["cpu_share"] <= 1.0 and isinstance(load["busy"], bool)


def test_the_profile_reads_each_strategy_s_own_sample(profiled, calibration):
    """Every stored strategy the profile priced for the UDFs was read back through its
    index and by a scan, and the model compares both with its own prediction."""
    stats = collect(profiled, "genomics", {})
    model = CostModel(calibration, stats)
    for op in UDFS:
        info = stats.ops[op]
        assert info.strategies
        for name, si in info.strategies.items():
            reads = si.sample["reads"]
            assert {r["backward"] for r in reads} == {True, False}
            assert all(r["seconds"] > 0 for r in reads)
            s = info.candidates()[list(info.strategies).index(name)]
            assert model.sample_ratio(op, s, True) > 0 and model.sample_ratio(op, s, False) > 0


def test_a_run_s_planner_keeps_the_profile_s_samples_of_what_the_run_stored(profiled,
                                                                          calibration):
    """The query-time planner prices a run's own strategies with their measured sizes
    and the profile's timed reads of their samples (the operator's decode rate), also
    when another run (here the profiling run itself) stored the same strategies.
    Dropping what other runs measured dropped the samples with it, and genomics'
    extract scans at 1,000x were priced 4-14x too cheap and chosen over its index."""
    from subzero.optimizer.stats import for_run
    stats = collect(profiled, "genomics", {})
    run = profiled.get(stats.profile_run)
    profiled.run(WF, progress=False)                      # stores the same defaults
    mine = for_run(profiled, run)
    stored = {(r["op"], r["strategy"]) for r in profiled.catalog.strategy_stats(run.id)}
    model = CostModel(calibration, mine)
    checked = 0
    for op in UDFS:
        for name, si in mine.ops[op].strategies.items():
            if (op, name) not in stored:
                continue
            prof = stats.ops[op].strategies[name]
            assert si.measured and si.sample == prof.sample and si.sample is not None
            assert si.sample_frac == prof.sample_frac
            s = mine.ops[op].candidates()[list(mine.ops[op].strategies).index(name)]
            assert model.sample_ratio(op, s, True) is not None
            checked += 1
    assert checked >= len(UDFS)


def _quiet(calibration) -> dict:
    """The session's calibration as one made on a quiet machine (it may have been made
    beside another test worker) for this machine."""
    from subzero.optimizer.calibration import machine
    return {**copy.deepcopy(calibration), "machine": machine(),
            "load": {**calibration["load"], "busy": False}}


def test_a_new_store_starts_from_this_machine_s_cached_calibration(tmp_path, calibration,
                                                                    cli, monkeypatch):
    """A calibration made on a quiet machine is kept in the user's cache; `subzero
    optimize` in a fresh store on the same machine starts from it (the benchmark does
    not run again) and stores it in its own catalog."""
    from subzero.optimizer import calibration as cal_mod
    monkeypatch.setenv(cal_mod.CACHE_ENV, str(tmp_path / "cache"))
    made = cal_mod.keep_for_host(_quiet(calibration))
    assert made is not None and made.parent == tmp_path / "cache"

    def never(*a, **k):
        raise AssertionError("calibrated again, with a calibration of this machine cached")
    monkeypatch.setattr(cal_mod, "calibrate", never)
    store = tmp_path / "store"
    code, out, err = cli("optimize", WF, "--store", store, "--max-disk", "30KB", "--workload",
                         WORKLOAD)
    assert code == 0, err
    with subzero.open_store(store) as st:
        got = st.catalog.latest_calibration(os.uname().nodename)
    assert got["coef"] == calibration["coef"] and got["machine"] == cal_mod.machine()


def test_a_cached_calibration_is_used_only_when_it_is_sound(tmp_path, calibration, monkeypatch):
    """Not one made on a busy machine, for another machine or cost model, damaged,
    reached through a symbolic link, or a FIFO (which a read must not block on): each
    is refused, and the next store calibrates."""
    from subzero.optimizer import calibration as cal_mod
    monkeypatch.setenv(cal_mod.CACHE_ENV, str(tmp_path / "cache"))
    good = _quiet(calibration)
    assert cal_mod.keep_for_host({**good, "load": {**good["load"], "busy": True}}) is None
    assert cal_mod.cached_calibration() is None
    path = cal_mod.keep_for_host(good)
    assert path is not None and cal_mod.cached_calibration()["coef"] == good["coef"]
    text = path.read_text()
    bad_coef = {**good, "coef": {**good["coef"], "map": good["coef"]["map"][:-1]}}
    variants = {
        "truncated": text[: len(text) // 2],
        "another machine": json.dumps({**good, "machine": {**good["machine"], "cores": 999}}),
        "another cost model": json.dumps({**good, "version": -1}),
        "a coefficient short": json.dumps(bad_coef),
        "not a number": json.dumps({**good, "seconds": "x"}),
    }
    for what, body in variants.items():
        path.write_text(body)
        assert cal_mod.cached_calibration() is None, what
    real = tmp_path / "elsewhere.json"
    real.write_text(text)
    path.unlink()
    path.symlink_to(real)
    assert cal_mod.cached_calibration() is None
    path.unlink()
    os.mkfifo(path)
    assert cal_mod.cached_calibration() is None       # returns at once: never blocks
    path.unlink()
    path.write_text(text)
    assert cal_mod.cached_calibration() is not None   # the same bytes, as a file: used


def _fooled(calibration, factor: float) -> dict:
    """A calibration whose stored-read coefficients are ``factor`` times too low: its
    model prices every stored read that much too fast, as a calibration on other
    lineage (or a machine mid-spike) can."""
    cal = copy.deepcopy(calibration)
    for fam in STORED_FAMILIES:
        cal["coef"][fam] = [c / factor for c in cal["coef"][fam]]
    return cal


def test_own_sample_corrects_a_model_that_is_far_off(profiled, calibration):
    stats = collect(profiled, "genomics", {})
    right, wrong = CostModel(calibration, stats), CostModel(_fooled(calibration, 100.0), stats)
    s = stats.ops["extract"].candidates()[0]
    args = ("extract", s, 0, s.backward, 10, 10)
    assert wrong.own_factor("extract", s, s.backward) > 10 * right.own_factor("extract", s, s.backward)
    # corrected by its own sample, the fooled model prices the step within the clamp's
    # reach of the right one, instead of 100x too fast
    assert wrong.cost(*args) > right.cost(*args) / 5
    assert not wrong.vouched("extract", s)[0]


def test_a_plan_the_model_cannot_vouch_for_keeps_the_defaults(tmp_path, profiled, calibration):
    """A model whose stored-read prices are 100x off its operators' own samples: the
    plan still stores every UDF's default strategies, and says why."""
    st = _store(tmp_path / "store", _fooled(calibration, 100.0))
    try:
        optimize(st, WF, workload=WORKLOAD, save=False)      # profile in this store
        plan = optimize(st, WF, workload=WORKLOAD, max_disk="100MB", save=False)
    finally:
        st.close()
    steps = subzero.load_workflow(WF, {}).steps
    for op in UDFS:
        mine = set(plan.strategies[op].split("+"))
        assert {str(s) for s in default_for(steps[op].operator) if s.stored} <= mine, op
    kept = [n for n in plan.notes if n.startswith("kept ")]
    assert kept and all("calibrated prediction" in n for n in kept)


def _in_a_fresh_process(store, calibration, body: str) -> list:
    """What ``body`` prints (a JSON list, its last line) run in a fresh Python process
    with ``m``, a cost model of ``calibration`` and the genomics profile of ``store``
    (``st``): a command-line trace is such a process."""
    import json
    import subprocess
    import sys
    code = ("import json, sys\n"
            "import subzero\n"
            "from subzero.optimizer.costmodel import CostModel\n"
            "from subzero.optimizer.stats import collect\n"
            "st = subzero.open_store(sys.argv[1], create=False)\n"
            "m = CostModel(json.loads(sys.argv[2]), collect(st, 'genomics', {}))\n" + body)
    p = subprocess.run([sys.executable, "-c", code, str(store.path), json.dumps(calibration)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_fresh_process_prices_its_first_re_execution_with_the_array_imports(profiled, calibration):
    """A command-line trace is a fresh process: its first re-execution pays the array
    store's imports, and the model says so until an array was read."""
    assert calibration["reexec_cold_s"] > 0
    loaded, cold, warm = _in_a_fresh_process(profiled, calibration, (
        "before = 'zarr' in sys.modules, m.cost('extract', 'reexec', 0, True, 10, 10)\n"
        "run = st.get('latest')\n"
        "run.trace('extract', [[0, 0]], path=[('extract', 0)], prefer='reexec', record=False)\n"
        "after = m.cost('extract', 'reexec', 0, True, 10, 10)\n"
        "print(json.dumps([before[0], before[1], after]))\n"))
    assert not loaded
    assert cold == pytest.approx(warm + calibration["reexec_cold_s"], rel=1e-6)


def test_a_fresh_process_prices_its_first_r_tree_read_with_the_library_import(profiled,
                                                                             calibration):
    """The R-tree library's import is tens of milliseconds, more than a small query: a
    fresh process's query-time planner prices an R-tree read with it until the library
    is loaded; a plan's prices and what the model learns leave it out (``fresh=False``)."""
    assert calibration["rtree_cold_s"] > 0
    loaded, cold, plan, one_cold, one_plan, warm = _in_a_fresh_process(profiled, calibration, (
        "args = ('extract', 'stored:full:fullmany:forward', 0, True, 10, 10)\n"
        "one = ('extract', 'stored:full:fullone:forward', 0, True, 10, 10)\n"
        "before = ['rtree' in sys.modules, m.cost(*args), m.cost(*args, fresh=False),\n"
        "          m.cost(*one), m.cost(*one, fresh=False)]\n"
        "from rtree import index\n"
        "print(json.dumps(before + [m.cost(*args)]))\n"))
    assert not loaded
    assert cold == pytest.approx(warm + calibration["rtree_cold_s"], rel=1e-6)
    assert plan == pytest.approx(warm, rel=1e-6) and one_cold == one_plan


def test_the_calibration_measures_a_fresh_trace_process(calibration):
    """A child process traced the calibration's own lineage, and its first pass cost
    more than its later ones: the first uses (lineage store, readers) and each step's
    first runs.  A child that failed would leave both at zero."""
    assert calibration["trace_first_s"] > 0
    assert calibration["fresh_step_s"] >= 0.0
    # the store is opened again before each trace, and the answer logged: never free
    assert calibration["trace_query_s"] > 0
    from subzero.optimizer.calibration import well_formed
    assert well_formed(calibration)
    assert not well_formed({**calibration, "fresh_step_s": float("nan")})
    assert not well_formed({**calibration, "trace_query_s": float("nan")})


def test_a_plan_reports_steps_as_a_fresh_process_pays_them_and_chooses_alike(profiled,
                                                                            calibration):
    """The plan's per-query prices add what a fresh process pays for each stored read
    and around each trace, and report the trace's first uses beside them (the
    workflow's own load among them, measured for it); what it chooses does not change."""
    warm = {**copy.deepcopy(calibration), "fresh_step_s": 0.0, "trace_first_s": 0.0,
            "trace_query_s": 0.0}
    fresh = {**copy.deepcopy(calibration), "fresh_step_s": 1e-5, "trace_first_s": 0.03,
             "trace_query_s": 2e-3}
    plans, host = [], os.uname().nodename
    try:
        for cal in (warm, fresh):
            profiled.catalog.add_calibration(host, cal["seconds"], cal)
            plans.append(optimize(profiled, WF, workload=WORKLOAD, max_disk="100MB", save=False))
    finally:                                  # the module's other tests see the real one
        profiled.catalog.add_calibration(host, calibration["seconds"], calibration)
    a, b = plans
    assert a.strategies == b.strategies
    # genomics' operators come from modules a trace process has not imported
    assert a.workflow_load_s > 0 and b.workflow_load_s > 0
    assert a.first_use_s == a.workflow_load_s
    assert b.first_use_s - b.workflow_load_s == pytest.approx(0.03)
    assert "ms of it loading the operators" in a.table()
    assert set(a.queries) == set(b.queries)
    reads = {}                 # per query, its stored reads: what it pays 10 us more for
    for name, s in a.queries.items():
        k = (b.queries[name] - s - 2e-3) / 1e-5
        assert k == pytest.approx(round(k), abs=1e-3) and 0 <= round(k) <= 4, (name, k)
        reads[name] = round(k)
    assert sum(reads.values()) >= len(reads)        # every genomics query reads lineage
    assert b.query_s > a.query_s and b.priced_s >= b.query_s
    assert b.priced_s - a.priced_s >= 2e-3 * len(b.queries) - 1e-9



def test_a_fresh_process_that_fails_leaves_the_calibration_without_fresh_costs(tmp_path):
    """The child cannot open the store it is given (here: none there): the calibration
    goes on with no fresh-process costs, never a crash or a made-up figure."""
    import numpy as np

    from subzero.optimizer.calibration import _fresh_child, _fresh_costs, calibration_workflow
    wf = calibration_workflow()

    class Run:
        id = 1

        @staticmethod
        def shapes():
            return {"p4": (384, 384), "big": (384, 384)}

    class Gone:
        path = tmp_path / "no-store"
    child = _fresh_child(Gone(), [Run(), Run()], wf, np.random.default_rng(0))
    assert child.json() is None and _fresh_costs(child.json()) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("printed", [[[1], [2]], [[1, 2], [3]], [[[1, "a"]]], "x", [[[0.1, 0.1]] * 6]],
                         ids=["flat", "ragged", "not-numbers", "text", "one-pass"])
def test_a_fresh_process_that_prints_something_else_leaves_no_fresh_costs(printed):
    """What the child printed is not one pass per row of steps: the calibration goes on
    with no fresh-process costs rather than ending in an IndexError."""
    from subzero.optimizer.calibration import _fresh_costs
    assert _fresh_costs(printed) == (0.0, 0.0, 0.0)


def test_fresh_costs_of_several_children_are_the_least_of_those_that_measured():
    """Each figure is the least among the children that measured anything: one child's
    interrupted first pass does not inflate the calibration, and a child that failed
    (it printed nothing usable) neither drags a figure to zero nor counts."""
    from subzero.optimizer.calibration import FRESH_PASSES, FRESH_STEPS, _least_fresh_costs

    def printed(first_extra: float, step_extra: float, around: float) -> list:
        """Passes of (whole trace, step) CPU seconds: the first pass costs more."""
        later = [[0.002 + around, 0.002] for _ in FRESH_STEPS]
        first = [[0.002 + around + first_extra / len(FRESH_STEPS) + step_extra,
                  0.002 + step_extra] for _ in FRESH_STEPS]
        return [first] + [later] * (FRESH_PASSES - 1)

    quiet, slow = printed(0.002, 1e-4, 0.0008), printed(0.006, 9e-4, 0.0012)
    got = _least_fresh_costs([slow, quiet])
    assert got == pytest.approx((0.002, 1e-4, 0.0008))
    assert _least_fresh_costs([None, quiet, "x"]) == pytest.approx((0.002, 1e-4, 0.0008))
    assert _least_fresh_costs([None, [[1]]]) == (0.0, 0.0, 0.0)
