"""The calibration's observations are made by observer processes side by side (issue 33):
every task answered once, by the same methods the calibration's own process would
take, whichever observer made it, and nothing lost when an observer crashes, lies or
falls silent (what it had left is observed in the calibration's own process).  Real
LMDB, real traces; the faults are real processes that abort, print something else or
hang."""

import numpy as np
import pytest

import subzero
from subzero.model.modes import Mode
from subzero.model.strategy import DIRECTIONS, ENCODINGS, Strategy
from subzero.optimizer import calibration as cal
from subzero.optimizer import observers

#: the observations' identity: what a method was asked and what it answered
KEY = ("op", "method", "direction", "cells_in", "cells_out", "blocks_in", "runs_in")


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """The calibration's two storing runs of its small tier (every stored strategy, then
    Comp and the mapping functions), and a dozen of its tasks on them."""
    tmp = tmp_path_factory.mktemp("observers")
    rng = np.random.default_rng(3)
    wf = cal.calibration_workflow(huge=False)
    inputs = {"small": rng.random((128, 128)), "big": rng.random((128, 128))}
    full_pay = [Strategy(m, e, d) for m in (Mode.FULL, Mode.PAY) for e in ENCODINGS[m]
                for d in DIRECTIONS]
    comp = [Strategy(Mode.COMP, e, d) for e in ENCODINGS[Mode.COMP] for d in DIRECTIONS]
    store = subzero.open_store(tmp / "store")
    runs = [(store.run(wf, inputs=inputs, progress=False,
                       strategies={o: tuple(g) for o in wf.steps}), g)
            for g in (full_pay, comp + [Strategy(Mode.MAP)])]
    tasks, queries = cal._observation_tasks(wf, runs, rng)
    pick = [k for k, t in enumerate(tasks) if len(queries[k]) <= 64 and t["op"] != "p32"][:12]
    tasks = [{**tasks[k], "i": j} for j, k in enumerate(pick)]
    queries = [queries[k] for k in pick]
    yield store, [r for r, _ in runs], tasks, queries, tmp
    store.close()


def _observe(setting, monkeypatch=None, code=None):
    store, runs, tasks, queries, tmp = setting
    if code is not None:
        monkeypatch.setattr(observers, "_OBSERVER_CODE", code)
    done = []
    got = observers.observe_all(store, runs, tasks, queries, 1, tmp, done.append, cal.WARM_OP)
    assert sorted(done) == sorted(t["weight"] for t in tasks)         # every task's share, once
    return got


def _keys(obs):
    return [tuple(o[k] for k in KEY) for o in obs]


@pytest.fixture(scope="module")
def in_process(setting):
    """The same tasks observed in the test's own process, one after another."""
    _, runs, tasks, queries, _ = setting
    return [o for t in tasks for o in observers.observe_task(runs, t, queries[t["i"]], 1)
            if o is not None]


def test_observers_answer_every_task_as_this_process_would(setting, in_process):
    got = _observe(setting)
    assert _keys(got) == _keys(in_process)
    assert len(got) >= len(setting[2])
    assert all(o["seconds"] > 0 for o in got)


@pytest.mark.parametrize("code", [
    "import os\nos.abort()\n",                                          # crashes at once
    # answers its first task, then crashes (a native library's fault)
    "import sys, ctypes\nprint('ready', flush=True)\nsys.stdin.readline()\n"
    "print('{\"i\": 0, \"obs\": []}', flush=True)\nctypes.string_at(0)\n",
    # lies: wrong indices, wrong counts, not JSON, a task it was not given
    "import sys\nprint('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    print('{\"i\": 999, \"obs\": []}')\n    print('not json')\n"
    "    print('{\"i\": ' + line.strip() + ', \"obs\": [1, 2]}')\n"
    "    print('{\"i\": ' + line.strip() + ', \"obs\": [{\"seconds\": \"x\"}]}', flush=True)\n",
    "import sys\nsys.exit(3)\n",                                          # exits, says nothing
], ids=["abort", "crash-after-one", "lies", "exits"])
def test_a_failed_observer_loses_no_task(setting, in_process, monkeypatch, code):
    """What an observer did not answer in full is observed here: the same observations."""
    got = _observe(setting, monkeypatch, code)
    assert _keys(got) == _keys(in_process)


def test_a_silent_observer_is_stopped_and_its_tasks_observed_here(setting, in_process,
                                                                   monkeypatch):
    monkeypatch.setattr(observers, "OBSERVER_SILENCE_S", 1.0)
    code = "import sys, time\nprint('ready', flush=True)\ntime.sleep(600)\n"
    got = _observe(setting, monkeypatch, code)
    assert _keys(got) == _keys(in_process)


def test_the_observers_take_the_tasks_at_any_share(setting, in_process, monkeypatch):
    """One observer, or more than there are tasks: the same observations."""
    for n in (1, 64):
        monkeypatch.setattr(observers, "CALIBRATION_OBSERVERS", n)
        monkeypatch.setattr(observers.os, "cpu_count", lambda: 64)
        assert _keys(_observe(setting)) == _keys(in_process)
