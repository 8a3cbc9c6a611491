"""Resume and clean-up: a run whose driver is killed mid-run (SIGKILL, no chance to
clean up) is ``interrupted``; ``subzero run --resume`` finishes it with the arrays and
lineage answers of an uninterrupted run; ``subzero clean`` removes what abandoned runs
left.  The driver is really killed, in a subprocess, while an operator waits on a gate
file; faults (half-written arrays and lineage, a torn journal, a heartbeat from
another host) are injected into the killed run's folder."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, java_ok, stored_path, subzero_exe
from test_store_files import plant

import subzero
from subzero.capture.buffer import Pairs
from subzero.errors import StoreError, WorkflowError
from subzero.model.strategy import parse
from subzero.storage.chunks import sums_file
from subzero.storage.lineage import LineageStore
from subzero.tuning import HEARTBEAT_STALE_S

STRATS = ["smooth=full", "flip=full", "scaled=full"]
ARRAYS = ["a", "smooth", "bright", "flip", "gate", "scaled"]


@pytest.fixture
def wfdir(tmp_path):
    shutil.copy(ROOT / "tests" / "gated_workflow.py", tmp_path / "gatewf.py")
    np.save(tmp_path / "a.npy", np.random.default_rng(1).random((40, 36)))
    return tmp_path


def start_killed_run(wfdir: Path, store: str = "s", *extra: str) -> int:
    """Start `subzero run` with the gate closed, SIGKILL it once it waits there; its id."""
    gate = wfdir / "gate"
    gate.touch()
    p = subprocess.Popen([subzero_exe(), "run", "gatewf.py", "--store", store, "--input", "a=a.npy",
                          "--param", f"gate={gate}", "--tile", "16",
                          *[x for s in STRATS for x in ("--strategy", s)], *extra],
                         start_new_session=True,     # its Spark JVM and workers die with it
                         cwd=wfdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    reached = Path(str(gate) + ".reached")
    try:
        deadline = time.monotonic() + 240
        while not reached.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reached.exists(), p.stderr.read() if p.poll() is not None else "gate not reached"  # type: ignore[union-attr]
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        gate.unlink()
        reached.unlink(missing_ok=True)
    rows = subzero.open_store(wfdir / store, create=False).runs()
    assert rows[-1].status == "interrupted"
    return rows[-1].id


def reference(wfdir: Path):
    st = subzero.open_store(wfdir / "ref")
    return st.run(str(wfdir / "gatewf.py"), inputs={"a": str(wfdir / "a.npy")},
                  strategies=dict(s.split("=") for s in STRATS), tile=16)


def assert_same_run(run, ref) -> None:
    """Every array equal; backward and forward answers between every array and the input
    equal (stored lineage where kept, else mapping functions or re-execution)."""
    assert run.row.status == "complete"
    for name in ARRAYS:
        np.testing.assert_array_equal(run.array(name).values, ref.array(name).values, err_msg=name)
        side = json.loads(sums_file(stored_path(run.dir, name)).read_text())
        owner = run.row.uid if side.get("owner", "run") == "run" else \
            run.store.catalog.meta("store_uid")          # an input: the store's copy
        assert side["run"] == owner and side["chunks"], name      # bound, before or after
    cells = [(0, 0), (17, 5), (39, 35)]
    for name in ARRAYS[1:]:
        back, rback = run.trace(name, cells, to="a"), ref.trace(name, cells, to="a")
        np.testing.assert_array_equal(back.cells, rback.cells, err_msg=name)
        fwd, rfwd = run.trace("a", cells, to=name), ref.trace("a", cells, to=name)
        np.testing.assert_array_equal(fwd.cells, rfwd.cells, err_msg=name)
    assert [o["name"] for o in run.ops()] == [o["name"] for o in ref.ops()]


def test_killed_driver_is_interrupted_and_resume_finishes_it(wfdir, shell):
    rid = start_killed_run(wfdir)
    code, out, err = shell("runs", "--store", "s", cwd=wfdir)
    assert code == 0 and "interrupted" in out and f"subzero run --resume {rid}" in out
    code, out, err = shell("show", rid, "--store", "s", cwd=wfdir)
    assert code == 0 and "interrupted" in out and f"subzero run --resume {rid}" in out
    journal = (wfdir / "s" / "runs" / f"{rid}.partial" / "journal.jsonl").read_text().splitlines()
    assert [json.loads(x)["event"] for x in journal] == ["begin", "inputs", "op", "op", "op"]
    code, out, err = shell("run", "--resume", rid, "--store", "s", cwd=wfdir)
    assert code == 0, err
    assert out.splitlines()[0] == f"resuming run {rid} (gated): 3 of 5 operators were done; engine: local"
    assert "complete (resumed)" in out
    st = subzero.open_store(wfdir / "s", create=False)
    assert_same_run(st.get(rid), reference(wfdir))
    assert sorted(p.name for p in (wfdir / "s" / "runs").iterdir()) == [str(rid)]
    assert st.verdict(rid).trusted        # signed by the resuming driver


def test_resume_discards_what_the_lost_operator_half_wrote(wfdir):
    """Faults injected where the driver died: the unfinished operator's array exists (a
    copy of another), its lineage holds wrong pairs, a task attempt's folder is left, and
    the journal's last line is torn.  Resume must redo the operator, not trust any of it."""
    rid = start_killed_run(wfdir)
    folder = wfdir / "s" / "runs" / f"{rid}.partial"
    shutil.copytree(folder / "arrays" / "flip.zarr", folder / "arrays" / "gate.zarr")
    shutil.copytree(folder / "arrays" / "flip.zarr", folder / "arrays" / ".gate.attempt-7.zarr")
    # 'scaled' (not run yet) already holds a wrong pair: cell 0 from cells 5 and 7;
    # lineage writes append, so a resume that kept it would answer wrongly
    one, off = np.array([0], np.int64), np.array([0, 1], np.int64)
    wrong = Pairs(one, off, [np.array([5], np.int64), np.array([7], np.int64)], [off, off])
    ls = LineageStore(folder / "lineage")
    ls.write("scaled", parse("full")[0], wrong, (40, 36), [(40, 36), (40, 36)])
    ls.close()
    with open(folder / "journal.jsonl", "a") as f:
        f.write('{"event": "op", "stats": {"name": "gate"')         # torn mid-line
    st = subzero.open_store(wfdir / "s", create=False)
    run = st.resume(rid)
    assert_same_run(run, reference(wfdir))
    assert not list((st.run_dir(rid) / "arrays").glob(".gate.attempt-*"))


def test_resume_refuses_what_it_cannot_continue_correctly(wfdir, cli):
    rid = start_killed_run(wfdir)
    # the workflow's code changed since the run began
    src = wfdir / "gatewf.py"
    text = src.read_text()
    src.write_text(text.replace("x[::-1, ::-1]", "x[::-1, :]"))
    code, out, err = cli("run", "--resume", rid, "--store", wfdir / "s")
    assert code == 2 and "changed since run" in err and "gated" in err
    src.write_text(text)
    # what a resumed run keeps cannot be given again
    code, out, err = cli("run", "--resume", rid, "--store", wfdir / "s", "--tile", "8")
    assert code == 2 and "--tile cannot be combined with --resume" in err
    # a run that is complete, or unknown, or still running is not resumed
    done = reference(wfdir)
    with pytest.raises(StoreError, match="cannot be resumed: it is complete"):
        subzero.open_store(wfdir / "ref").resume(done.id)
    code, out, err = cli("run", "--resume", "99", "--store", wfdir / "s")
    assert code == 2 and "unknown run '99'" in err
    st = subzero.open_store(wfdir / "s", create=False)
    db = sqlite3.connect(wfdir / "s" / "catalog.sqlite")
    db.execute("UPDATE runs SET pid=? WHERE id=?", (os.getpid(), rid))   # a live driver here
    db.commit()
    with pytest.raises(StoreError, match="still running"):
        st.resume(rid)
    db.close()


def test_a_workflow_made_in_python_is_passed_again(tmp_path):
    """A run of a Workflow object (no module to load it from) resumes when given it again."""
    gate = tmp_path / "gate"
    gate.touch()
    code = f"""
import sys, numpy as np, subzero
sys.path.insert(0, {str(ROOT / "tests")!r})
import gated_workflow
wf = gated_workflow.workflow({str(gate)!r})
subzero.open_store({str(tmp_path / "s")!r}).run(wf, inputs={{"a": np.arange(400.0).reshape(20, 20)}},
                                               strategies={{"flip": "full"}})
"""
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    reached = Path(str(gate) + ".reached")
    deadline = time.monotonic() + 120
    while not reached.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    gate.unlink()
    assert reached.exists()
    st = subzero.open_store(tmp_path / "s", create=False)
    with pytest.raises(WorkflowError, match=r"made in Python; pass it: store.resume\(1, workflow=wf\)"):
        st.resume(1)
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import gated_workflow
    finally:
        sys.path.pop(0)
    run = st.resume(1, workflow=gated_workflow.workflow(str(gate)))
    x = np.arange(400.0).reshape(20, 20)
    ref = subzero.open_store(tmp_path / "ref").run(gated_workflow.workflow(""), inputs={"a": x},
                                                   strategies={"flip": "full"})
    for name in ARRAYS:
        np.testing.assert_array_equal(run.array(name).values, ref.array(name).values)
    np.testing.assert_array_equal(run.trace("scaled", [(3, 4)], to="a").cells,
                                  ref.trace("scaled", [(3, 4)], to="a").cells)


def test_heartbeat_tells_liveness_across_hosts(wfdir):
    rid = start_killed_run(wfdir)
    db = sqlite3.connect(wfdir / "s" / "catalog.sqlite")
    db.execute("UPDATE runs SET host='another-host' WHERE id=?", (rid,))   # its driver ran there
    db.commit()
    db.close()
    beat = wfdir / "s" / "runs" / f"{rid}.heartbeat"
    st = subzero.open_store(wfdir / "s", create=False)
    beat.touch()                                            # a fresh beat: running elsewhere
    assert st.runs()[-1].status == "running"
    with pytest.raises(StoreError, match="still running"):
        st.resume(rid)
    assert st.clean() == []                                 # nothing of a live run is touched
    old = time.time() - HEARTBEAT_STALE_S - 5
    os.utime(beat, (old, old))                              # its host went silent
    assert st.runs()[-1].status == "interrupted"
    assert_same_run(st.resume(rid), reference(wfdir))
    assert not beat.exists()


def test_clean_removes_abandoned_runs_only(wfdir, cli):
    done = start_killed_run(wfdir)
    runs = wfdir / "s" / "runs"
    st = subzero.open_store(wfdir / "s", create=False)
    st.resume(done)
    lost = start_killed_run(wfdir)
    (runs / "77.partial").mkdir()                           # a folder no run owns
    (runs / f"{done}.partial-a3").mkdir()                   # an instance attempt's leftover
    code, out, err = cli("clean", "--dry-run", "--store", wfdir / "s")
    assert code == 0 and "would remove 3 item(s)" in out and "1 would quarantine" in out, out
    assert (runs / f"{lost}.partial").is_dir()
    code, out, err = cli("clean", "--json", "--store", wfdir / "s")
    acted = json.loads(out)["removed"]
    assert sorted((Path(r["path"]).name, r["action"]) for r in acted) == sorted(
        [("77.partial", "quarantine"), (f"{done}.partial-a3", "remove"),
         (f"{lost}.partial", "remove"), (f"{lost}.heartbeat", "remove")])
    assert sorted(p.name for p in runs.iterdir()) == [str(done)]
    # what no run accounts for is moved aside, never deleted
    assert [p.name.split(".")[:2] for p in (wfdir / "s" / "quarantine").iterdir()] == [["77", "partial"]]
    row = st.catalog.get_run(lost)
    assert row.status == "failed" and "subzero clean" in row.error
    with pytest.raises(StoreError, match="cannot be resumed: it failed"):
        st.resume(lost)
    assert st.get(done).array("scaled").shape == (40, 36)    # the complete run is intact
    code, out, err = cli("clean", "--store", wfdir / "s")
    assert code == 0 and "nothing to clean" in out


@pytest.mark.skipif(not java_ok(), reason="Spark needs Java 17+")
def test_spark_driver_killed_then_resumed(wfdir, shell):
    """The same on Spark local[2]: the resumed run (a new SparkSession) equals an
    uninterrupted in-process run."""
    rid = start_killed_run(wfdir, "s", "--engine", "spark", "--master", "local[2]")
    code, out, err = shell("run", "--resume", rid, "--store", "s", "--master", "local[2]", cwd=wfdir)
    assert code == 0, err
    assert "engine: spark" in out.splitlines()[0]
    st = subzero.open_store(wfdir / "s", create=False)
    assert_same_run(st.get(rid), reference(wfdir))


def test_a_run_lost_before_its_inputs_were_stored_starts_over(wfdir):
    """The journal ends at its header (the driver died while storing inputs): resume
    reads the inputs again from their files and runs every operator."""
    rid = start_killed_run(wfdir)
    folder = wfdir / "s" / "runs" / f"{rid}.partial"
    journal = folder / "journal.jsonl"
    journal.write_text(journal.read_text().splitlines()[0] + "\n")
    st = subzero.open_store(wfdir / "s", create=False)
    run = st.resume(rid)
    assert_same_run(run, reference(wfdir))
    events = [json.loads(x)["event"] for x in (folder.parent / str(rid) / "journal.jsonl")
              .read_text().splitlines()]
    assert events == ["begin", "inputs"] + ["op"] * 5


def test_run_needs_a_workflow_or_resume(cli, tmp_path):
    code, out, err = cli("run", "--store", tmp_path / "s")
    assert code == 2 and err.strip() == ("subzero: error: subzero run needs a workflow (a .py file "
                                         "or module name), or --resume RUN")
    code, out, err = cli("clean", "--store", tmp_path / "nowhere")
    assert code == 2 and "no SubZero store at" in err


# -- nothing runs before trust (issue 28) -------------------------------------------------
PLANTED = """import pathlib
pathlib.Path({marker!r}).write_text("imported")
def workflow(gate=""):
    raise SystemExit("the planted module ran")
"""


def resume_as(wfdir: Path, rid: int, config: Path) -> subprocess.CompletedProcess:
    """`subzero run --resume` by a user whose key lives in ``config``."""
    env = {**os.environ, "SUBZERO_CONFIG_DIR": str(config)}
    return subprocess.run([subzero_exe(), "run", "--resume", str(rid), "--store", "s"], cwd=wfdir,
                          env=env, capture_output=True, text=True, timeout=300)


def test_resume_loads_no_code_of_a_run_another_user_began(wfdir, tmp_path_factory):
    """A store from elsewhere: its interrupted run names a workflow module that is now a
    planted one (it writes a marker when imported).  Resuming with this user's key must
    refuse before importing anything, in one line naming the run and why."""
    rid = start_killed_run(wfdir)
    marker = wfdir / "imported"
    (wfdir / "gatewf.py").write_text(PLANTED.format(marker=str(marker)))
    p = resume_as(wfdir, rid, tmp_path_factory.mktemp("another-user"))
    assert p.returncode == 2 and not marker.exists(), (p.stdout, p.stderr)
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith(f"subzero: error: run {rid} cannot be resumed: SubZero will not load "
                           f"the workflow it names ({wfdir / 'gatewf.py'}) because it was begun "
                           f"with another user's key")
    assert "`subzero trust` does not apply to an unfinished run" in line
    st = subzero.open_store(wfdir / "s", create=False)
    assert st.catalog.get_run(rid).status == "interrupted"          # refused, not failed
    assert (wfdir / "s" / "runs" / f"{rid}.partial").is_dir()       # nothing deleted


def test_resume_refuses_a_catalog_or_journal_changed_since_the_run_began(wfdir, cli):
    """This user's own run, but its catalog row now names a planted module, or its journal
    was edited, or is another run's: refused before any import, the run left as it was."""
    rid = start_killed_run(wfdir)
    marker = wfdir / "imported"
    planted = wfdir / "planted.py"
    planted.write_text(PLANTED.format(marker=str(marker)))
    db = sqlite3.connect(wfdir / "s" / "catalog.sqlite")
    db.execute("UPDATE runs SET source=? WHERE id=?", (str(planted), rid))
    db.commit()
    code, out, err = cli("run", "--resume", rid, "--store", wfdir / "s")
    assert code == 2 and not marker.exists()
    assert (f"run {rid} cannot be resumed: SubZero will not load the workflow it names "
            f"({planted}) because its catalog entry changed since the run began (its source "
            f"is not what the run's signed journal says)") in err
    db.execute("UPDATE runs SET source=? WHERE id=?", (str(wfdir / "gatewf.py"), rid))
    db.commit()
    db.close()
    journal = wfdir / "s" / "runs" / f"{rid}.partial" / "journal.jsonl"
    good = journal.read_text()
    begin = json.loads(good.splitlines()[0])
    journal.write_text(good.replace(json.dumps(begin["source"]), json.dumps(str(planted)), 1))
    code, out, err = cli("run", "--resume", rid, "--store", wfdir / "s")
    assert code == 2 and "its journal" in err and "changed since the run began" in err
    unsigned = {k: v for k, v in begin.items() if k not in ("signature", "key_id")}
    journal.write_text("\n".join([json.dumps(unsigned), *good.splitlines()[1:]]) + "\n")
    code, out, err = cli("run", "--resume", rid, "--store", wfdir / "s")
    assert code == 2 and "is not signed" in err
    journal.write_text(good)
    assert not marker.exists()
    st = subzero.open_store(wfdir / "s", create=False)
    assert_same_run(st.resume(rid), reference(wfdir))         # the genuine journal resumes


@pytest.mark.parametrize("fault", ["fifo", "link", "huge"])
def test_a_journal_that_is_no_file_is_refused_without_waiting(wfdir, fault):
    """A FIFO (a reader blocks on it forever), a link to /dev/zero (endless) or a file
    far larger than any journal in place of the journal: one line naming it."""
    rid = start_killed_run(wfdir)
    journal = wfdir / "s" / "runs" / f"{rid}.partial" / "journal.jsonl"
    plant(journal, fault, 1 << 30)
    p = resume_as(wfdir, rid, Path(os.environ["SUBZERO_CONFIG_DIR"]))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    why = {"fifo": "is a FIFO (named pipe), not a regular file",
           "link": "is a symbolic link, not a regular file",
           "huge": f"holds {1 << 30} bytes, more than SubZero ever writes there"}[fault]
    assert f"run {rid} cannot be resumed: its journal {journal} {why}" in p.stderr
