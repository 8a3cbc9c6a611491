"""A query-time planner that cannot be fooled (issue 33): first-use costs are never
charged to a step or to the cost model, a stored read is given up only when switching
cannot cost more than staying, judged in the CPU time of its own work, and a switched
step teaches the model both ways.  Real LMDB lineage and a real calibration (conftest's
``calibration``); behaviour is checked, not timings."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import subzero
from subzero.model.strategy import parse_one
from subzero.optimizer import planner_for
from subzero.optimizer.costmodel import correction_key
from subzero.query.methods import Stored
from subzero.query.planner import ReadBudget, StepStat
from subzero.tuning import CORRECTION_RANGE

ROOT = Path(__file__).resolve().parent.parent
WF = str(ROOT / "workflows" / "genomics.py")
UDFS = ("extract", "model", "predict")
FORWARD = "full:fullone:forward"

#: a workflow file with one tile-parallel operator storing full lineage: planning a step
#: through it reads the run's tile (the chunk shape of its stored output), which is the
#: first use of the array store in a fresh process (the zarr import)
TILED = '''
import numpy as np
from subzero import ELEMENTWISE, Mode, Operator, Workflow
from subzero.model.cells import box


class Scale(Operator):
    """Elementwise: each cell depends on itself (stored as full pairs)."""

    tiling = ELEMENTWISE
    deterministic_lineage = True

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        if Mode.FULL in ctx.modes:
            c = box((0, 0), x.shape)
            ctx.lwrite(c, c, each=True)
        return 2.0 * x


def workflow():
    wf = Workflow("tiled")
    x = wf.input("x", default=np.arange(48 * 40, dtype=float).reshape(48, 40))
    wf.add("scale", Scale(), x)
    return wf
'''

#: a fresh process traces the tiled run with a planner that gives its read 50 ms of CPU
COLD = '''
import json, sys
import subzero
from subzero.query.methods import Stored

class Strict:
    """Stored lineage first, given up after 50 ms of its own CPU time; it asks the share
    of tiles a re-execution would run, as a planner pricing one does (worked out on
    demand: a planner that does not ask never imports the tile re-runs)."""
    def plan(self, step, methods):
        assert 0 < step.tiles <= 1
        return sorted(methods, key=lambda m: not isinstance(m, Stored)), 0.05
    def observe(self, stat):
        pass

store = subzero.open_store(sys.argv[1])
run = store.get(int(sys.argv[2]))
cold = "zarr" not in sys.modules and "subzero.query.tilerun" not in sys.modules
res = run.trace("scale", [(3, 4), (30, 20)], to="x", planner=Strict(), record=False)
s = res.steps[0]
firsts = sorted(str(k) for k in run.executor().warmup.made())
print(json.dumps({"cold": cold, "method": s.method, "note": s.note, "warmup": s.warmup,
                  "firsts": firsts,
                  "seconds": s.seconds, "cpu": s.cpu, "total": res.seconds,
                  "cells": res.cells.tolist()}))
store.close()
'''


@pytest.fixture(scope="module")
def cstore(tmp_path_factory, calibration):
    """A store calibrated for this host (the shared quick calibration)."""
    st = subzero.open_store(tmp_path_factory.mktemp("planner") / "store")
    st.catalog.add_calibration(os.uname().nodename, calibration["seconds"], calibration)
    yield st
    st.close()


def test_a_cold_process_does_not_charge_its_first_imports_to_the_first_step(cstore, tmp_path):
    """A real cold start: a fresh process whose first step imports the array store's
    backend and the tile re-runs while it plans (the run's tile, a re-execution's share
    of it) and opens the LMDB environment and the reader.  Its read has a 50 ms CPU
    budget, far less than the imports; the step stays on stored lineage, reports the
    first-use time apart, and its seconds leave it out."""
    wf = tmp_path / "tiled.py"
    wf.write_text(TILED)
    run = cstore.run(str(wf), strategies={"scale": "full:fullone:backward"}, tile=16,
                     progress=False)
    want = run.trace("scale", [(3, 4), (30, 20)], to="x", record=False)
    script = tmp_path / "cold.py"
    script.write_text(COLD)
    out = subprocess.run([sys.executable, str(script), str(cstore.path), str(run.id)],
                         capture_output=True, text=True, timeout=600, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["cold"], "the array store's backend or the tile re-runs were imported before the trace"
    # pricing a re-execution imports the tile re-runs: timed as a first use, not the step's
    assert "tilerun" in got["firsts"], got
    assert got["method"] == "stored:full:fullone:backward" and got["note"] == "", got
    assert got["warmup"] > 0 and got["seconds"] + got["warmup"] <= got["total"] + 1e-6, got
    assert got["cells"] == want.cells.tolist()


class Waiting:
    """A stored reader whose calls wait ``delay`` seconds first: what a machine busy
    with other work does to a read (it waits for a core), without the read doing more."""

    def __init__(self, reader, delay):
        self.reader, self.delay = reader, delay

    def __getattr__(self, name):
        fn = getattr(self.reader, name)

        def waited(*args, **kwargs):
            time.sleep(self.delay)
            return fn(*args, **kwargs)
        return waited


class Waits:
    """Stored lineage first, given up after 20 ms of the read's own CPU time."""

    def plan(self, step, methods):
        return sorted(methods, key=lambda m: not isinstance(m, Stored)), 0.02

    def observe(self, stat):
        pass


def test_a_read_that_waits_for_a_busy_machine_is_not_given_up(cstore):
    """A read that waits (here 60 ms per call on the real LMDB reader) takes far longer
    than its 20 ms budget in wall time, but its own work costs a fraction of it: the
    budget counts CPU time, so the step stays on stored lineage."""
    run = cstore.run(WF, strategies={u: FORWARD for u in UDFS}, progress=False)
    ex = run.executor()
    strategy = parse_one(FORWARD)
    ex._readers[("model", strategy)] = Waiting(ex._reader("model", strategy), 0.06)
    res = run.trace("transpose", [(0, 3)], to="model", planner=Waits(), record=False)
    st = next(s for s in res.steps if s.op == "model")
    assert st.method == f"stored:{FORWARD}" and st.note == "", st
    assert st.seconds > 0.06 > st.cpu, st


def test_the_read_budget_never_makes_switching_worse_than_staying():
    """Within its pessimistic price a read is left alone; half done, it is finished; past
    its price it switches once its own time makes a switch cost at most 1.2x staying
    whatever is left, or once its progress says the rest costs twice re-execution."""
    b = ReadBudget(after=0.010, reexec=0.100)
    assert not b.switch(0.009, None) and not b.switch(0.009, 0.001)   # within its price
    assert not b.switch(0.400, None)            # (0.4 + 0.1) / 0.4 = 1.25x staying at worst
    assert b.switch(0.500, None)                # 1.2x at worst
    assert not b.switch(10.0, 0.5)              # half done: what is left costs no more
    assert not b.switch(0.020, 0.1)             # 0.18 s left < 2 x 0.1 s
    assert b.switch(0.020, 0.05)                # 0.38 s left >= 0.2 s
    assert ReadBudget(after=0.0).switch(0.0, None)      # a bare number: no time at all


def _planner(run):
    p = planner_for(run)
    assert p is not None
    return p


def _stat(op, method, cells_in, cells_out, cpu, **kw):
    return StepStat(op, 0, "backward", method, cells_in, cells_out, cpu, cpu=cpu, **kw)


def test_abandoned_reads_and_slow_reexecutions_teach_the_planner_both_ways(cstore):
    """Within one trace: a read given up when nearly done (it would have been cheap)
    moves its correction down from what made it look slow; a re-execution that proved
    slow moves its own correction up, so the next step of the kind reads stored lineage
    and would give it up only for a re-execution priced that slow."""
    run = cstore.run(WF, strategies={u: FORWARD for u in UDFS}, progress=False)
    planner = _planner(run)
    model = planner.model
    read = ("model", 0, correction_key(parse_one(FORWARD), True))
    reexec = ("model", 0, "reexec")
    n_out = model.predict_out("model", 0, True, 1)
    base = model.cost("model", parse_one(FORWARD), 0, True, 1, n_out, loaded=True)
    lo, hi = CORRECTION_RANGE
    model.corrections[read] = hi                      # a model that thinks the read is slow
    planner.observe(_stat("model", "reexec:full", 1, int(n_out), 0.002,
                          abandoned=f"stored:{FORWARD}", abandoned_s=base, done=0.9))
    assert model.corrections[read] < hi               # it would have cost ~1.1x predicted
    model.corrections[read], model.corrections[reexec] = 1.0, lo
    price = model.cost("model", "reexec", 0, True, 1, n_out)
    for _ in range(8):                             # re-execution that takes 5 s each time
        planner.observe(_stat("model", "reexec:full", 1, int(n_out), 5.0))
    assert model.corrections[reexec] > 4.0
    assert model.cost("model", "reexec", 0, True, 1, n_out) > price
    # priced and timed however cheap the read: a read priced under the floor runs
    # untimed (tests/test_optimizer.py), and on some machines this one is
    planner.floor_s = 0.0
    order, budget = planner.plan(_info(1), run.executor().methods("model", True, None))
    assert isinstance(order[0], Stored) and budget is not None
    assert budget.reexec >= model.cost("model", "reexec", 0, True, 1, n_out)  # priced that slow


def _info(cells):
    from subzero.query.planner import StepInfo
    return StepInfo("model", 0, True, cells, 1, False, 1.0, 1)


def test_an_abandoned_read_with_no_measured_progress_only_raises_its_price(cstore):
    """A read given up before anything measured its progress teaches only that it cost
    at least what it ran: its correction never falls for it."""
    run = cstore.run(WF, strategies={u: FORWARD for u in UDFS}, progress=False)
    planner = _planner(run)
    model = planner.model
    read = ("model", 0, correction_key(parse_one(FORWARD), True))
    model.corrections[read] = 4.0
    planner.observe(_stat("model", "reexec:full", 1, 1, 0.001,
                          abandoned=f"stored:{FORWARD}", abandoned_s=1e-6, done=0.0))
    assert model.corrections[read] == 4.0
    del model.corrections[read]                    # none yet: it is not made cheaper either
    planner.observe(_stat("model", "reexec:full", 1, 1, 0.001,
                          abandoned=f"stored:{FORWARD}", abandoned_s=1e-6, done=0.0))
    assert model.corrections[read] == 1.0


def test_a_step_that_met_cold_caches_teaches_neither_the_planner_nor_the_log(cstore):
    """The first read of each strategy in a process opens its reader and meets pages and
    blocks never touched: marked cold, it is logged with its times, but neither the
    planner's corrections nor the trace log's learning take it.  The same read again,
    warm, is learnt from."""
    from subzero.optimizer.costmodel import CostModel
    from subzero.optimizer.stats import for_run
    run = cstore.run(WF, strategies={u: FORWARD for u in UDFS}, progress=False)
    fresh = cstore.get(run.id)
    planner = _planner(fresh)
    planner.model.corrections.clear()
    res = fresh.trace("transpose", [(0, 3)], to="model", planner=planner)
    stored = [s for s in res.steps if s.method.startswith("stored:")]
    assert stored and all(s.cold for s in stored)
    assert planner.model.corrections == {}              # nothing learnt from cold steps
    again = fresh.trace("transpose", [(0, 3)], to="model", planner=planner)
    assert not any(s.cold for s in again.steps)
    assert set(planner.model.corrections) == {
        (s.op, s.input, correction_key(s.method, False)) for s in again.steps
        if s.method.startswith("stored:")}
    logged = [s for s in cstore.catalog.trace_steps(run.id) if s["method"].startswith("stored:")]
    assert [bool(s["cold"]) for s in logged] == [True] * len(stored) + [False] * len(stored)
    model = CostModel(cstore.catalog.latest_calibration(os.uname().nodename), for_run(cstore, fresh))
    model.learn(logged, min_obs=1)                      # from the log: its warm steps only
    both = CostModel(cstore.catalog.latest_calibration(os.uname().nodename), for_run(cstore, fresh))
    both.learn([{**s, "cold": 0} for s in logged], min_obs=1)
    assert model.corrections and model.corrections != both.corrections


def test_first_use_costs_are_kept_out_of_the_steps_and_the_trace_log(cstore):
    """A fresh executor's first stored read opens the LMDB environment and its reader:
    reported as the step's warm-up, not in its seconds; the trace log keeps each step's
    own CPU time."""
    run = cstore.run(WF, strategies={u: FORWARD for u in UDFS}, progress=False)
    fresh = cstore.get(run.id)
    res = fresh.trace("transpose", [(0, 3)], to="model", planner=_planner(fresh))
    first = next(s for s in res.steps if s.method.startswith("stored:"))
    assert first.warmup > 0
    again = fresh.trace("transpose", [(0, 3)], to="model", planner=_planner(fresh))
    assert all(s.warmup == 0 for s in again.steps)
    logged = cstore.catalog.trace_steps(run.id)
    assert logged and all(s["cpu_s"] > 0 for s in logged if s["method"] not in ("empty",
                                                                              "all-to-all"))
    assert all(np.isfinite(s["seconds"]) for s in logged)
