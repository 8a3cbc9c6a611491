"""`--keep`: a run that does not keep its intermediate arrays answers exactly as one
that keeps them all (values, backward and forward traces, re-execution through a
dropped array, both engines), and never gives other values: a damaged kept ancestor,
values made again differently, tampered checksums and a kill while dropping are each
a clear error or a run that resumes whole."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT
from test_gc import cli  # the CLI on the store `s` in the workflow's folder

import subzero
from subzero.errors import CorruptArray, StoreError, UsageError

#: flip re-executes at query time, so it reads its input (smooth) when traced
STRATEGIES = {"flip": "blackbox"}


@pytest.fixture
def wfdir(tmp_path):
    shutil.copy(ROOT / "tests" / "gated_workflow.py", tmp_path / "gatewf.py")
    np.save(tmp_path / "a.npy", np.random.default_rng(3).random((40, 36)))
    return tmp_path


def cells(res):
    return sorted(map(tuple, res.cells.tolist()))


def queries(run):
    """Backward and forward traces, along every path, from a few random cells."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(3):
        c = [[int(rng.integers(40)), int(rng.integers(36))]]
        out.append(cells(run.trace("scaled", c, to="a", record=False)))
        out.append(cells(run.trace("a", c, to="scaled", record=False)))
        out.append(cells(run.trace("gate", c, to="smooth", record=False)))
    return out


def kept(run):
    return {n: run._arrays.kept(n) for n in run.array_names()}


def big(wfdir):
    """An input whose arrays are worth dropping (`auto` keeps an array that would free
    less than KEEP_MIN_SAVING: the 40 x 36 ones would all be kept)."""
    np.save(wfdir / "big.npy", np.random.default_rng(4).random((300, 280)))
    return wfdir / "big.npy"


def test_policies_keep_what_they_say(wfdir):
    with subzero.open_store(wfdir / "s") as st:
        runs = {k: st.run(wfdir / "gatewf.py", inputs={"a": big(wfdir)}, keep=k,
                          strategies=STRATEGIES, progress=False) for k in ("all", "outputs", "auto")}
        pinned = st.run(wfdir / "gatewf.py", inputs={"a": big(wfdir)}, keep="outputs",
                        pins=["gate"], strategies=STRATEGIES, progress=False)
        small = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="auto",
                       strategies=STRATEGIES, progress=False)
        assert all(kept(small).values())             # nothing worth dropping
        assert all(kept(runs["all"]).values())
        assert kept(runs["outputs"]) == {"a": True, "smooth": False, "bright": False,
                                         "flip": False, "gate": False, "scaled": True}
        # auto: also what a trace reads (flip re-executes: its input smooth)
        # (and bright, a threshold mask that compresses to little: dropping frees nothing)
        assert kept(runs["auto"]) == {**kept(runs["outputs"]), "smooth": True, "bright": True}
        assert kept(pinned) == {**kept(runs["outputs"]), "gate": True}
        usage = {k: st.run_usage(r.id) for k, r in runs.items()}
        assert usage["outputs"].kinds["arrays"].bytes < usage["auto"].kinds["arrays"].bytes \
            < usage["all"].kinds["arrays"].bytes
        assert sorted(usage["outputs"].not_kept) == ["bright", "flip", "gate", "smooth"]
        with pytest.raises(UsageError, match="`keep` must be one of"):
            st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="some")
        with pytest.raises(UsageError, match="names no array of workflow 'gated': 'nosuch'"):
            st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, pins=["nosuch"])
        assert len(st.runs()) == 5                    # the refused ones left nothing


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_every_answer_is_the_same_whatever_is_kept(wfdir, engine, request):
    if engine == "spark":
        request.getfixturevalue("spark")
    with subzero.open_store(wfdir / "s") as st:
        runs = {k: st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep=k,
                          strategies=STRATEGIES, engine=engine, progress=False)
                for k in ("all", "outputs", "auto")}
        want = {n: runs["all"].array(n) for n in runs["all"].array_names()}
        answers = queries(runs["all"])
        for k in ("outputs", "auto"):
            fresh = st.get(runs[k].id)               # nothing made again yet
            assert queries(fresh) == answers, k
            for n, v in want.items():
                got = fresh.array(n)
                assert got.dtype == v.dtype and got.dims == v.dims
                np.testing.assert_array_equal(got.values, v.values)
                region = (slice(5, 17), slice(30, 36))
                np.testing.assert_array_equal(fresh.read_region(n, region), v.values[region])


def test_a_damaged_kept_ancestor_is_a_clear_error(wfdir):
    with subzero.open_store(wfdir / "s") as st:
        rid = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="outputs",
                     progress=False).id
        chunk = st.get(rid)._arrays.path("a") / "data" / "c" / "0" / "0"
        raw = bytearray(chunk.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        chunk.write_bytes(bytes(raw))
        with pytest.raises(CorruptArray, match="input 'a'|array 'a'"):
            st.get(rid).array("gate")
    # the trace prints values of smooth, not kept: made again from the damaged input
    code, out, err = cli(wfdir, "trace", "--run", str(rid), "--from", "gate", "--cells", "3,4",
                         "--to", "smooth")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "'a'" in err, err


def test_values_made_again_differently_are_refused(wfdir):
    with subzero.open_store(wfdir / "s") as st:
        rid = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="outputs",
                     progress=False).id
        run = st.get(rid)
        right = run.recompute

        def drifting(name):            # an operator that is not deterministic after all
            v = right(name).copy()
            if name == "flip":          # its input, smooth, is made again right first
                v[39, 35] = np.nextafter(v[39, 35], np.inf)
            return v
        run._arrays.recompute = drifting
        with pytest.raises(StoreError, match=r"array 'flip' of run \d+ was not kept, and making "
                                             r"it again gave other values in its chunk \[0:40, 0:36\]"):
            run.array("flip")
        run._arrays.recompute = None
        with pytest.raises(StoreError, match="was not kept"):
            run._arrays.read_region("flip", (slice(0, 2), slice(0, 2)))


def test_tampered_checksums_of_an_array_not_kept(wfdir):
    with subzero.open_store(wfdir / "s") as st:
        rid = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="outputs",
                     progress=False).id
        sums = st.run_dir(rid) / "arrays" / "gate.sums.json"
        body = json.loads(sums.read_text())
        body["dropped"]["data"] = "00" * 32
        sums.write_text(json.dumps(body))
        with pytest.raises(CorruptArray, match="checksum file"):
            st.get(rid).array("gate")
        code, out, err = cli(wfdir, "fsck")
        assert code != 0 and "gate" in out + err


def test_cli_keep_pin_du_and_mistakes(wfdir):
    code, out, err = cli(wfdir, "run", "gatewf.py", "--input", "a=a.npy", "--keep", "outputs",
                         "--pin", "flip", "--strategy", "flip=blackbox", "-q", "--engine", "local")
    assert code == 0, err
    assert "3 intermediate array(s) not kept" in out
    code, out, err = cli(wfdir, "du", "1")
    assert code == 0 and "not kept (--keep; made again, checked, when read): bright, gate, smooth" in out
    code, out, err = cli(wfdir, "trace", "--run", "1", "--from", "scaled", "--cells", "3,4",
                         "--to", "a", "--json")
    assert code == 0, err
    assert json.loads(out)["count"] > 0
    code, out, err = cli(wfdir, "trace", "--run", "1", "--from", "gate", "--cells", "3,4",
                         "--to", "smooth")
    assert code == 0, err
    with subzero.open_store(wfdir / "s", create=False) as st:
        value = st.get(1).array("smooth").values[36, 31]
    assert f"(36, 31)={value:.4g}" in out, out
    code, out, err = cli(wfdir, "fsck", "--deep")
    assert code == 0, out + err
    for args, said in ((("--keep", "some"), "--keep"), (("--pin", "nosuch"), "--pin")):
        code, out, err = cli(wfdir, "run", "gatewf.py", "--input", "a=a.npy", *args)
        assert code == 2 and said in err.strip().splitlines()[-1], err
    code, out, err = cli(wfdir, "run", "--resume", "1", "--keep", "all")
    assert code == 2 and "--keep cannot be combined with --resume" in err


@pytest.mark.parametrize("point,nth", [("subzero.storage.chunks:remove_chunks", 1),
                                       ("subzero.storage.chunks:drop", 2)])
def test_a_kill_while_dropping_resumes_whole(wfdir, point, nth):
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "crashpoint.py"), point, str(nth), "--",
                        "run", "gatewf.py", "--input", "a=a.npy", "--keep", "outputs",
                        "--engine", "local", "--store", "s"], cwd=wfdir, capture_output=True,
                       text=True, timeout=600, start_new_session=True)
    assert p.returncode == -9, f"the crash point was not reached: {p.returncode} {p.stderr}"
    code, out, err = cli(wfdir, "run", "--resume", "1")
    assert code == 0, err
    code, out, err = cli(wfdir, "run", "gatewf.py", "--input", "a=a.npy", "--keep", "all",
                         "--engine", "local")
    assert code == 0, err
    with subzero.open_store(wfdir / "s", create=False) as st:
        resumed, whole = st.get(1), st.get(2)
        assert not any(kept(resumed)[n] for n in ("smooth", "bright", "flip", "gate"))
        for n in whole.array_names():
            np.testing.assert_array_equal(resumed.array(n).values, whole.array(n).values)
        assert queries(resumed) == queries(whole)
    code, out, err = cli(wfdir, "fsck", "--deep")
    assert code == 0, out + err


def test_a_rerun_of_a_run_that_kept_only_outputs_is_the_full_run(wfdir):
    b = np.load(wfdir / "a.npy")
    b[:5, :5] += 1
    np.save(wfdir / "b.npy", b)
    with subzero.open_store(wfdir / "s") as st:
        parent = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="outputs",
                        progress=False)
        again = st.rerun(parent.id, inputs={"a": wfdir / "b.npy"})
        full = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "b.npy"}, keep="all",
                      progress=False)
        for n in full.array_names():
            np.testing.assert_array_equal(again.array(n).values, full.array(n).values)
        assert queries(again) == queries(full)


def test_an_untrusted_run_does_not_make_its_arrays_again(wfdir, monkeypatch):
    """Making an array again runs the run's code: another user's run refuses, in one
    line, until they trust it; its kept arrays read as before."""
    from subzero.errors import UntrustedRun
    from subzero.storage.trust import CONFIG_ENV
    with subzero.open_store(wfdir / "s") as st:
        rid = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="outputs",
                     progress=False).id
        want = st.get(rid).array("gate").values
    monkeypatch.setenv(CONFIG_ENV, str(wfdir / "another-user"))
    with subzero.open_store(wfdir / "s", create=False) as st:
        run = st.get(rid)
        assert run.array("scaled").shape == (40, 36)          # kept: read as before
        with pytest.raises(UntrustedRun, match=r"array 'gate' of run \d+ was not kept"):
            run.array("gate")
        st.trust(rid)
        np.testing.assert_array_equal(st.get(rid).array("gate").values, want)


class ReexecFirst:
    """A query-time planner (the executor's Planner interface) that always puts
    re-execution first, as a model that prices it cheap would."""

    def __init__(self):
        self.steps = []

    def plan(self, step, methods):
        from subzero.query.methods import Reexec
        return [m for m in methods if isinstance(m, Reexec)] + \
            [m for m in methods if not isinstance(m, Reexec)], None

    def observe(self, stat):
        self.steps.append((stat.op, stat.method))


def test_a_planner_does_not_reexecute_onto_arrays_not_kept(wfdir):
    """Re-executing an operator whose input the run did not keep makes that input
    again first, which no model prices: stored lineage answers instead, the same cells."""
    with subzero.open_store(wfdir / "s") as st:
        rid = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="outputs",
                     strategies={"flip": "full", "scaled": "full"}, progress=False).id
        full = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="all",
                      strategies={"flip": "full", "scaled": "full"}, progress=False).id
        for run_id, reexec_scaled in ((rid, False), (full, True)):
            p = ReexecFirst()
            got = cells(st.get(run_id).trace("scaled", [[3, 4]], to="a", planner=p, record=False))
            want = cells(st.get(full).trace("scaled", [[3, 4]], to="a", record=False))
            assert got == want
            reexecuted = {op for op, m in p.steps if m.startswith("reexec")}
            assert ("scaled" in reexecuted) is reexec_scaled, p.steps
            assert ("flip" in reexecuted) is reexec_scaled, p.steps   # its input smooth too


class ReadThenSwitch:
    """A planner that reads stored lineage first under a budget already spent: every
    read it starts would be given up for re-execution at its first check."""

    def __init__(self):
        self.steps = []

    def plan(self, step, methods):
        from subzero.query.methods import Reexec
        from subzero.query.planner import ReadBudget
        return [m for m in methods if not isinstance(m, Reexec)] + \
            [m for m in methods if isinstance(m, Reexec)], ReadBudget(after=0.0, reexec=0.0)

    def observe(self, stat):
        self.steps.append((stat.op, stat.method, stat.note))


def test_a_read_is_not_given_up_for_reexecution_onto_arrays_not_kept(wfdir):
    """A read over its budget switches to re-execution only when re-executing reads
    inputs the run kept (asked when the switch would happen): otherwise it reads on."""
    with subzero.open_store(wfdir / "s") as st:
        rid = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="outputs",
                     strategies={"flip": "full", "scaled": "full"}, progress=False).id
        full = st.run(wfdir / "gatewf.py", inputs={"a": wfdir / "a.npy"}, keep="all",
                      strategies={"flip": "full", "scaled": "full"}, progress=False).id
        want = cells(st.get(full).trace("scaled", [[3, 4]], to="a", record=False))
        for run_id, switches in ((rid, False), (full, True)):
            p = ReadThenSwitch()
            got = cells(st.get(run_id).trace("scaled", [[3, 4]], to="a", planner=p, record=False))
            assert got == want
            by_op = {op: (m, note) for op, m, note in p.steps}
            assert by_op["scaled"][0].startswith("reexec" if switches else "stored:"), p.steps
            assert ("switched to re-execution" in by_op["scaled"][1]) is switches, p.steps


def test_auto_keeps_what_the_workload_reads(wfdir):
    """The workload file beside the module and the traces logged on earlier runs name
    the arrays a trace prints values of: `auto` keeps them, `outputs` does not."""
    (wfdir / "gatewf_workload.json").write_text(json.dumps({"queries": [
        {"name": "q", "from": "gate", "to": "smooth", "cells": {"where": "bright > 0", "n": 2}},
        {"name": "p", "from": "scaled", "path": [["scaled", 0], ["gate", 0]],
         "cells": {"box": [[0, 0], [2, 2]]}}]}))
    a = big(wfdir)
    with subzero.open_store(wfdir / "s") as st:
        first = st.run(wfdir / "gatewf.py", inputs={"a": a}, keep="auto", progress=False)
        assert {n for n, k in kept(first).items() if k} == {"a", "scaled", "gate", "smooth",
                                                           "bright", "flip"}
        (wfdir / "gatewf_workload.json").write_text("{not json")   # unreadable: counts for nothing
        second = st.run(wfdir / "gatewf.py", inputs={"a": a}, keep="auto", progress=False)
        assert {n for n, k in kept(second).items() if k} == {"a", "scaled", "bright"}  # cheap
        second.trace("flip", [[1, 1]], to="smooth")              # logged
        third = st.run(wfdir / "gatewf.py", inputs={"a": a}, keep="auto", progress=False)
        assert {n for n, k in kept(third).items() if k} == {"a", "scaled", "bright", "flip",
                                                           "smooth"}
        outputs = st.run(wfdir / "gatewf.py", inputs={"a": a}, keep="outputs", progress=False)
        assert {n for n, k in kept(outputs).items() if k} == {"a", "scaled"}


def _planned(st, wfdir, a, budget, pin, where=False):
    """A plan for the workload `gate -> a` (its re-execution of flip, when flip stores
    no lineage, reads smooth: no query starts or ends there) within ``budget``;
    ``where``: its cells picked by the values of smooth instead of by a box."""
    from subzero.optimizer import optimize
    wl = wfdir / "plan_workload.json"
    cells = {"where": "smooth > 0.5", "n": 4} if where else {"box": [[0, 0], [2, 2]]}
    wl.write_text(json.dumps({"queries": [{"name": "g", "from": "gate", "to": "a",
                                           "cells": cells}]}))
    return optimize(st, wfdir / "gatewf.py", inputs={"a": a}, max_disk=budget, workload=wl,
                    pins=[f"flip={pin}"], name=f"p-{pin}-{budget}-{where}", progress=False)


def test_the_plan_keeps_an_array_when_its_workload_reads_it(wfdir, calibration):
    """Under a disk budget the integer program chooses the arrays a run keeps, priced
    against the workload: smooth, read only by a re-execution of flip, is kept while
    flip stores no lineage and the budget has room for it, and dropped when flip's
    lineage answers or the budget is tight.  The run keeps what its plan kept, fits
    its budget, and answers as a run that keeps everything."""
    import os
    a = big(wfdir)
    with subzero.open_store(wfdir / "s") as st:
        st.catalog.add_calibration(os.uname().nodename, calibration["seconds"], calibration)
        full = st.run(wfdir / "gatewf.py", inputs={"a": a}, keep="all", progress=False)
        want = [cells(full.trace("gate", [[1, 2]], to="a", record=False)),
                cells(full.trace("scaled", [[5, 5]], to="a", record=False))]
        roomy = 20_000_000
        plans = {pin: _planned(st, wfdir, a, roomy, pin) for pin in ("blackbox", "full")}
        assert set(plans["blackbox"].arrays) == {"smooth", "bright", "flip", "gate"}
        assert "smooth" not in plans["blackbox"].drops        # flip re-executes onto it
        for p in plans.values():           # what a run over its budget gives up first
            assert set(p.spare) == set(p.arrays) - set(p.drops)
        assert "smooth" in plans["full"].drops                # flip's lineage answers
        # a trace picking cells by a box reads no values of its start (gate); one picking
        # them by smooth's values reads smooth
        assert "gate" in plans["full"].drops
        assert "smooth" not in _planned(st, wfdir, a, roomy, "full", where=True).drops
        # tight: room for the outputs, the lineage and less than smooth's chunks
        saves = plans["blackbox"].arrays["smooth"]["bytes"]
        tight_b = plans["blackbox"].arrays_reserve + int(plans["blackbox"].disk) + int(saves) // 2
        tight = _planned(st, wfdir, a, tight_b, "blackbox")
        assert "smooth" in tight.drops
        for plan in (*plans.values(), tight):
            run = st.run(wfdir / "gatewf.py", inputs={"a": a}, plan=plan.name, progress=False)
            assert {n for n, k in kept(run).items() if not k} == set(plan.drops), plan.name
            assert [cells(run.trace("gate", [[1, 2]], to="a", record=False)),
                    cells(run.trace("scaled", [[5, 5]], to="a", record=False))] == want
        from test_optimizer import _run_bytes
        assert _run_bytes(run) <= tight_b
        # a pinned array is kept whatever the plan says; `all` keeps everything
        pinned = st.run(wfdir / "gatewf.py", inputs={"a": a}, plan=plans["full"].name,
                        pins=["smooth"], progress=False)
        assert kept(pinned)["smooth"]
        every = st.run(wfdir / "gatewf.py", inputs={"a": a}, plan=plans["full"].name,
                       keep="all", progress=False)
        assert all(kept(every).values())


def test_cli_plan_says_which_arrays_it_keeps(wfdir, calibration):
    import os
    a = big(wfdir)
    with subzero.open_store(wfdir / "s") as st:
        st.catalog.add_calibration(os.uname().nodename, calibration["seconds"], calibration)
    (wfdir / "gatewf_workload.json").write_text(json.dumps({"queries": [
        {"name": "g", "from": "gate", "to": "a", "cells": {"box": [[0, 0], [2, 2]]}}]}))
    code, out, err = cli(wfdir, "optimize", "gatewf.py", "--input", f"a={a}", "--max-disk",
                         "20MB", "--pin", "flip=full", "--name", "p")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("arrays:"))
    assert "smooth" in line.split("made again when read:")[1], line
    code, out, err = cli(wfdir, "run", "gatewf.py", "--input", f"a={a}", "--plan", "p")
    assert code == 0, err
    code, out, err = cli(wfdir, "du", "2")
    assert code == 0, err
    assert "smooth" in next(ln for ln in out.splitlines() if "not kept" in ln)


def test_a_resumed_run_drops_what_its_plan_chose(tmp_path):
    """The plan's choice of arrays is in the signed journal's budget, so a run resumed
    after its driver was lost drops what it began to drop, not what `auto` would."""
    from subzero.model.workflow import load_workflow
    from subzero.runs.journal import Journal, read_journal
    from subzero.storage.budget import DiskBudget
    shutil.copy(ROOT / "tests" / "gated_workflow.py", tmp_path / "gatewf.py")
    wf = load_workflow(str(tmp_path / "gatewf.py"), {})
    for drops in (("smooth", "gate"), (), None):
        folder = tmp_path / f"run{drops}"
        folder.mkdir()
        budget = DiskBudget(10**6, {("flip", "full"): 100}, arrays_reserve=5, drops=drops)
        Journal(folder).begin(1, wf, {}, "local", {}, True, 64, budget,
                              keep={"policy": "auto", "pins": []})
        got = read_journal(folder, 1).disk_budget()
        assert got is not None and got.drops == drops and got.arrays_reserve == 5


def test_a_plan_cannot_drop_what_no_policy_drops(wfdir):
    """A plan (saved in the catalog, or given as a dict) whose choice names the
    workflow's output, an input, a pinned array or no array at all drops only the
    intermediates it may: the rest is kept, and the answers are those of a full run."""
    a = big(wfdir)
    plan = {"name": "hand", "workflow": "gated", "strategies": {"flip": "blackbox"},
            "max_disk": 10**9, "drops": ["scaled", "a", "nosuch", "smooth", "gate", "bright"]}
    with subzero.open_store(wfdir / "s") as st:
        run = st.run(wfdir / "gatewf.py", inputs={"a": a}, plan=plan, pins=["bright"],
                     progress=False)
        assert {n for n, k in kept(run).items() if not k} == {"smooth", "gate"}
        full = st.run(wfdir / "gatewf.py", inputs={"a": a}, keep="all", progress=False)
        assert queries(run) == queries(full)
        assert np.array_equal(run.array("gate").values, full.array("gate").values)


def test_a_run_over_its_budget_drops_what_its_plan_values_least(wfdir):
    """A run whose arrays came out larger than its plan predicted drops, to fit, the
    arrays its plan said the workload would miss least per byte (``spare``) -- not the
    largest, and no more than it needs; the answers stay those of a full run."""
    from test_optimizer import _run_bytes
    a = big(wfdir)
    with subzero.open_store(wfdir / "s") as st:
        full = st.run(wfdir / "gatewf.py", inputs={"a": a}, keep="all",
                      strategies={"flip": "blackbox"}, progress=False)
        total = _run_bytes(full)
        for spare in (["smooth", "gate", "flip"], ["flip", "smooth", "gate"]):
            plan = {"name": "hand", "workflow": "gated", "strategies": {"flip": "blackbox"},
                    "max_disk": total - 300_000, "drops": [], "spare": spare}
            run = st.run(wfdir / "gatewf.py", inputs={"a": a}, plan=plan, progress=False)
            assert {n for n, k in kept(run).items() if not k} == {spare[0]}
            assert _run_bytes(run) <= total - 300_000
            assert queries(run) == queries(full)


@pytest.mark.parametrize("made, stored", [("float64", "float64"), ("int16", "int16"),
                                          ("bool", "bool"), ("float64", "float32"),
                                          ("int64", "int32")])
def test_a_drop_records_the_sums_a_read_back_gives(tmp_path, made, stored):
    """An array written whole (``fill``) is dropped with its chunks' sums taken from the
    values written, not read back; they are the sums a read back gives.  Values zarr
    cast to another dtype are read back."""
    from subzero.storage.arrays import ArrayStore
    from subzero.storage.chunks import chunk_sha
    values = (np.random.default_rng(5).random((70, 45)) * 90).astype(made)
    sums = {}
    for way in ("filled", "read"):
        arrays = ArrayStore(tmp_path / way, tile=16, run_uid=f"uid-{way}")
        arrays.create("x", values.shape, np.dtype(stored))
        arrays.fill("x", values)
        arrays.bind("x")
        _, nodes = arrays._open("x")
        node = nodes["data"]
        assert (arrays._written.get("x") is not None) == (made == stored)
        if way == "read":
            arrays._written.clear()
        back = b"".join(chunk_sha(arrays.read_region("x", node.chunk_slices(i)))
                        for i in node.chunks_all())
        arrays.drop("x")
        sums[way] = arrays._open("x")[1]["data"].dropped
        assert sums[way] == back
    assert sums["filled"] == sums["read"]


@pytest.mark.parametrize("vouched", ["all", "some", "none", "wrong"])
def test_linked_chunks_carry_the_sums_their_writer_vouched(tmp_path, monkeypatch, vouched):
    """Chunks shared from a run whose writer's sums came along (``vouch_sums``: a budget
    run's profiling run, written in this process) are dropped with those sums, without
    reading them back; with any chunk's sum missing they are read back.  Either way the
    sums are those a read back gives.  A wrong sum vouched for (injected) is never a
    wrong value: the array made again fails its check, naming the chunk."""
    from subzero.storage.arrays import ArrayStore
    from subzero.storage.chunks import chunk_sha
    values = np.random.default_rng(8).random((70, 45))
    src = ArrayStore(tmp_path / "src", tile=16, run_uid="uid-src")
    src.create("x", values.shape, values.dtype)
    src.fill("x", values)
    src.bind("x")
    sums = src.chunk_sums("x")
    node = src._open("x")[1]["data"]
    assert sums is not None and len(sums) == node.chunk_count()
    parent = ArrayStore(tmp_path / "src", tile=16, run_uid="uid-src")  # opened again
    if vouched == "some":
        sums.pop(node.chunk_count() - 1)
    if vouched == "wrong":
        sums[1] = bytes(32)
    if vouched != "none":
        parent.vouch_sums({"x": sums})
    dst = ArrayStore(tmp_path / "dst", tile=16, run_uid="uid-dst")
    dst.create_like("x", parent)
    for rows in (slice(0, 32), slice(32, 70)):       # two regions, whole chunks each
        dst.share_region("x", parent, (rows, slice(0, 45)))
    dst.bind("x")
    reads = []
    real = ArrayStore.read_region
    monkeypatch.setattr(ArrayStore, "read_region",
                        lambda self, *a, **k: reads.append(a) or real(self, *a, **k))
    dst.drop("x")
    monkeypatch.undo()
    assert (reads == []) == (vouched in ("all", "wrong"))
    back = b"".join(chunk_sha(values[node.chunk_slices(i)]) for i in node.chunks_all())
    if vouched == "wrong":
        from subzero.errors import StoreError
        again = ArrayStore(tmp_path / "dst", tile=16, run_uid="uid-dst",
                           recompute=lambda name: values)
        with pytest.raises(StoreError, match=r"other values in its chunk \[0:16, 16:32\]"):
            again.read_region("x", (slice(0, 70), slice(0, 45)))
        return
    assert dst._open("x")[1]["data"].dropped == back


def _patterns():
    """How an array's chunks get written, and whether a drop then has every chunk's
    sum from the values written (else it reads them back)."""
    def fill(a, v):
        a.fill("x", v)

    def tiles(a, v):
        w = a.tile_writer("x")
        for i in range(0, 40, 16):
            for j in range(0, 40, 16):
                w.add((slice(i, min(i + 16, 40)), slice(j, min(j + 16, 40))),
                      v[i:i + 16, j:j + 16])
        w.close()

    def patched(a, v):                          # whole chunks written again
        a.fill("x", np.zeros_like(v))
        a.write_region("x", (slice(16, 32), slice(32, 40)), v[16:32, 32:40])
        a.write_region("x", (slice(0, 40), slice(0, 40)), v)

    def off_grid(a, v):                         # a region across chunks
        a.fill("x", v)
        a.write_region("x", (slice(5, 9), slice(3, 20)), v[5:9, 3:20] + 1)

    def cast(a, v):                             # zarr casts the values
        a.fill("x", v.astype(np.float32))
    return [("fill", fill, True), ("tiles", tiles, True), ("patched", patched, True),
            ("off grid", off_grid, False), ("cast", cast, False)]


@pytest.mark.parametrize("how, write, from_memory", _patterns(), ids=[p[0] for p in _patterns()])
def test_a_drop_records_the_sums_of_the_values_written(tmp_path, how, write, from_memory):
    """However the chunks were written, a drop records the sums a read back gives:
    from the values written when it has every chunk's, else read back."""
    from subzero.storage.arrays import ArrayStore
    from subzero.storage.chunks import chunk_sha
    arrays = ArrayStore(tmp_path / "r", tile=16, run_uid="uid")
    arrays.create("x", (40, 40), np.dtype("float64"))
    write(arrays, np.random.default_rng(9).random((40, 40)))
    arrays.bind("x")
    node = arrays._open("x")[1]["data"]
    written = arrays._written.get("x")
    assert (written is not None and len(written) == node.chunk_count()) == from_memory
    back = b"".join(chunk_sha(arrays.read_region("x", node.chunk_slices(i)))
                    for i in node.chunks_all())
    arrays.drop("x")
    assert arrays._open("x")[1]["data"].dropped == back


def test_chunks_linked_from_another_run_are_read_back_for_a_drop(tmp_path):
    """A re-run's array: chunks written here and chunks linked from its parent (a
    chunk file is never linked over one written): the drop reads them back."""
    from subzero.storage.arrays import ArrayStore
    from subzero.storage.chunks import chunk_sha
    v = np.random.default_rng(2).random((40, 40))
    parent = ArrayStore(tmp_path / "p", tile=16, run_uid="p")
    parent.create("x", v.shape, v.dtype)
    parent.fill("x", v)
    parent.bind("x")
    child = ArrayStore(tmp_path / "c", tile=16, run_uid="c")
    child.create_like("x", parent)
    child.write_region("x", (slice(0, 16), slice(0, 40)), v[:16] * 2)   # some chunks here,
    again = ArrayStore(tmp_path / "p", tile=16, run_uid="p")   # opened as a re-run does
    child.share_region("x", again, (slice(16, 40), slice(0, 40)))      # the rest linked
    child.bind("x")
    assert child._written.get("x") is None
    node = child._open("x")[1]["data"]
    back = b"".join(chunk_sha(child.read_region("x", node.chunk_slices(i)))
                    for i in node.chunks_all())
    child.drop("x")
    assert child._open("x")[1]["data"].dropped == back
