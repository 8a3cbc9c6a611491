"""`subzero gc` and tags: runs deleted by policy, never what a kept run needs, each
run at once or not at all (a kill at every step of a deletion), safe beside a trace
or a run going on, refused by read-only stores."""

import contextlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import ROOT, subzero_exe
from test_rerun import TILE, data, mixed, same

import subzero
from subzero.errors import QueryError, SubZeroError, UsageError


@pytest.fixture
def wfdir(tmp_path):
    shutil.copy(ROOT / "tests" / "gated_workflow.py", tmp_path / "gatewf.py")
    np.save(tmp_path / "a.npy", np.random.default_rng(1).random((40, 36)))
    np.save(tmp_path / "b.npy", np.random.default_rng(2).random((40, 36)))
    return tmp_path


def cli(wfdir, *args):
    p = subprocess.run([subzero_exe(), *map(str, args), "--store", "s"], cwd=wfdir,
                       capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def runs(wfdir, n, inp="a.npy", workflow="gatewf.py"):
    """``n`` runs made by `subzero run`, in this process (the runs a test begins with; what
    it tests -- gc, tags, traces -- goes through the installed command, ``cli``): a
    subprocess would pay the interpreter's start and the imports once per run."""
    from subzero.cli import main
    with contextlib.chdir(wfdir), contextlib.redirect_stdout(io.StringIO()):
        for _ in range(n):
            code = main(["run", workflow, "--input", f"a={inp}", "-q", "--engine", "local",
                         "--store", "s"])
            assert code == 0


def statuses(store_dir):
    with subzero.open_store(store_dir, create=False) as st:
        return {r.id: r.status for r in st.runs()}


def age(store_dir, run_id, days):
    """Make a run look ``days`` old (its start time; nothing else reads it)."""
    db = sqlite3.connect(store_dir / "catalog.sqlite")
    db.execute("UPDATE runs SET started=? WHERE id=?", (time.time() - days * 86400, run_id))
    db.commit()
    db.close()


def answer(run):
    return sorted(map(tuple, run.trace("scaled", [[3, 4], [20, 30]], to="a").cells.tolist()))


# -- policies -----------------------------------------------------------------------------

def test_keep_last_and_older_than_choose_per_workflow(wfdir):
    runs(wfdir, 4)
    store_dir = wfdir / "s"
    for rid, days in ((1, 40), (2, 35), (3, 2)):
        age(store_dir, rid, days)
    code, out, err = cli(wfdir, "gc", "--older-than", "30d", "--keep-last", "1", "--dry-run", "--json")
    assert code == 0, err
    chosen = {i["run"]: i["action"] for i in json.loads(out)["items"] if i["run"] is not None}
    assert chosen == {1: "delete", 2: "delete"}       # 3 is newer than 30 days, 4 the newest
    assert statuses(store_dir) == {1: "complete", 2: "complete", 3: "complete", 4: "complete"}
    code, out, err = cli(wfdir, "gc", "--keep-last", "2")
    assert code == 0, err
    assert "deleted 2 run(s)" in out
    assert statuses(store_dir) == {1: "deleted", 2: "deleted", 3: "complete", 4: "complete"}
    assert sorted(os.listdir(store_dir / "runs")) == ["3", "4"]
    code, out, _ = cli(wfdir, "runs")
    assert "deleted" not in out.split("\n", 1)[1].split("(")[0] and "--all" in out
    code, out, _ = cli(wfdir, "runs", "--all", "--json")
    assert [r["status"] for r in json.loads(out)] == ["deleted", "deleted", "complete", "complete"]


def test_tagged_runs_are_kept_and_tags_name_runs(wfdir):
    runs(wfdir, 3)
    code, out, err = cli(wfdir, "tag", "1", "golden")
    assert code == 0 and "run 1 is tagged 'golden'" in out, err
    code, out, err = cli(wfdir, "show", "golden", "--json")
    assert code == 0 and json.loads(out)["run_id"] == 1 and json.loads(out)["tags"] == ["golden"]
    code, out, err = cli(wfdir, "trace", "--run", "golden", "--from", "scaled", "--cells", "3,4",
                         "--to", "a", "--json")
    assert code == 0, err
    code, out, err = cli(wfdir, "gc", "--keep-last", "0")
    assert code == 0, err
    assert "kept run 1" in out and "tagged golden" in out
    assert statuses(wfdir / "s") == {1: "complete", 2: "deleted", 3: "deleted"}
    code, out, err = cli(wfdir, "gc", "golden")
    assert code == 0 and statuses(wfdir / "s")[1] == "complete"
    code, out, err = cli(wfdir, "gc", "golden", "--no-keep-tagged")
    assert code == 0, err
    assert statuses(wfdir / "s")[1] == "deleted"
    code, out, err = cli(wfdir, "tag")
    assert "no tags yet" in out            # a deleted run's tags go with it


def test_tag_mistakes_are_one_line(wfdir):
    runs(wfdir, 2)
    for args, words in ((("tag", "1", "7up"), "not a valid name"),
                        (("tag", "1", "latest"), "not a valid name"),
                        (("tag", "9", "x"), "unknown run"),
                        (("tag", "--delete", "nope"), "no tag 'nope'"),
                        (("gc",), "say which runs to delete"),
                        (("gc", "--older-than", "3 fortnights"), "--older-than"),
                        (("gc", "1", "--keep-last", "1"), "not both"),
                        (("show", "nope"), "unknown run 'nope'")):
        code, out, err = cli(wfdir, *args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, (args, err)
    assert cli(wfdir, "tag", "1", "x")[0] == 0
    code, _, err = cli(wfdir, "tag", "2", "x")
    assert code == 2 and "names run 1 already" in err and "--force" in err
    code, out, err = cli(wfdir, "tag", "2", "x", "--force")
    assert code == 0 and cli(wfdir, "tag", "--json")[1].strip() == '{"x": 2}'
    code, out, err = cli(wfdir, "gc", "1")
    assert code == 0
    code, _, err = cli(wfdir, "tag", "1", "y")
    assert code == 2 and "deleted" in err
    code, _, err = cli(wfdir, "trace", "--run", "1", "--from", "scaled", "--cells", "3,4")
    assert code == 2 and "run 1 was deleted by subzero gc" in err


def test_a_dry_run_changes_nothing(wfdir):
    runs(wfdir, 2)
    before = {p: p.stat().st_mtime_ns for p in (wfdir / "s").rglob("*") if p.is_file()}
    code, out, err = cli(wfdir, "gc", "--keep-last", "0", "--dry-run")
    assert code == 0 and "would delete 2 run(s)" in out, err
    assert {p: p.stat().st_mtime_ns for p in (wfdir / "s").rglob("*") if p.is_file()
            and not p.name.startswith("catalog.sqlite-")} == \
        {p: t for p, t in before.items() if not p.name.startswith("catalog.sqlite-")}
    assert set(statuses(wfdir / "s").values()) == {"complete"}


# -- what kept runs need ------------------------------------------------------------------

def test_an_input_stored_once_stays_while_a_kept_run_reads_it(wfdir):
    runs(wfdir, 2, "a.npy")
    runs(wfdir, 1, "b.npy")
    copies = lambda: sorted(p.name for p in (wfdir / "s" / "inputs").glob("*.zarr"))  # noqa: E731
    assert len(copies()) == 2
    with subzero.open_store(wfdir / "s", create=False) as st:
        want = answer(st.get(2))
    assert cli(wfdir, "gc", "1")[0] == 0
    assert len(copies()) == 2                       # run 2 reads a.npy's copy
    with subzero.open_store(wfdir / "s", create=False) as st:
        assert answer(st.get(2)) == want
        assert st.get(2).array("a").values.tobytes() == np.load(wfdir / "a.npy").tobytes()
    code, out, err = cli(wfdir, "gc", "2")
    assert code == 0 and "input copy" in out, out
    assert len(copies()) == 1                       # b.npy's: run 3 reads it
    code, out, err = cli(wfdir, "fsck", "--deep")
    assert code == 0, out + err


def test_a_rerun_keeps_its_shared_chunks_when_its_parent_goes(store):
    x, y = data()
    parent = store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, progress=False, keep="all")
    new = x.copy()
    new[0, 0] += 1
    re = store.rerun(parent.id, {"x": new}, progress=False)
    full = store.run(mixed(), inputs={"x": new, "y": y}, tile=TILE, progress=False)
    usage = store.run_usage(parent.id).total          # what `subzero du` says of it
    items = store.gc([parent.id])
    freed = next(i["bytes"] for i in items if i["run"] == parent.id)
    assert 0 < freed == usage.own < usage.bytes         # the chunks the re-run links stay
    re = store.get(re.id)
    same(re, full)                   # every array bit for bit and the stored lineage
    assert store.catalog.rerun_of(re.id)["parent"] == parent.id
    with pytest.raises(QueryError, match=f"run {parent.id} was deleted"):
        store.get(parent.id)
    with pytest.raises(QueryError, match="deleted"):
        store.rerun(parent.id, {"x": x})


def test_the_parent_of_a_running_rerun_is_kept(wfdir):
    runs(wfdir, 1)
    gate = wfdir / "gate"                  # run 2 passes its gate (no file); its re-run waits
    code, _, err = cli(wfdir, "run", "gatewf.py", "--input", "a=a.npy", "--param", f"gate={gate}",
                       "-q", "--engine", "local")
    assert code == 0, err
    np.save(wfdir / "a2.npy", np.load(wfdir / "a.npy") + 1)
    gate.write_text("")
    p = subprocess.Popen([subzero_exe(), "rerun", "2", "--input", "a=a2.npy", "--store", "s"],
                         cwd=wfdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not (wfdir / "gate.reached").exists():
            assert p.poll() is None and time.time() < deadline, p.communicate()
            time.sleep(0.1)
        code, out, err = cli(wfdir, "gc", "--keep-last", "0", "--json")
        assert code == 0, err
        why = {i["run"]: (i["action"], i["why"]) for i in json.loads(out)["items"] if i["run"]}
        assert why[2][0] == "keep" and "running re-run 3" in why[2][1], why
        assert why[1][0] == "delete"
    finally:
        gate.unlink(missing_ok=True)
        _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert statuses(wfdir / "s") == {1: "deleted", 2: "complete", 3: "complete"}


# -- crashes and company ------------------------------------------------------------------

#: (function, which call, whether the run is deleted once the store is settled)
GC_POINTS = [
    ("subzero.runs.gc:_fsync_dir", 1, False),            # renamed, catalog says complete
    ("subzero.storage.catalog:Catalog.mark_deleted", 1, False),
    ("subzero.runs.gc:_remove", 1, True),                # committed, folder still there
]


@pytest.mark.parametrize("point,nth,deleted", GC_POINTS, ids=[p.split(":")[1] for p, _, _ in GC_POINTS])
def test_a_kill_at_any_step_of_a_deletion_leaves_the_run_whole_or_gone(wfdir, point, nth, deleted):
    runs(wfdir, 2)
    with subzero.open_store(wfdir / "s", create=False) as st:
        want = answer(st.get(1))
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "crashpoint.py"), point, str(nth), "--",
                        "gc", "1", "--store", "s"], cwd=wfdir, capture_output=True, text=True,
                       timeout=600, start_new_session=True)
    assert p.returncode == -9, f"the crash point was not reached: {p.returncode} {p.stderr}"
    twin = wfdir.parent / f"{wfdir.name}-twin"
    shutil.copytree(wfdir, twin, symlinks=True)
    for where, how in ((wfdir, ("clean",)), (twin, ("gc", "--keep-last", "5"))):
        code, out, err = cli(where, *how)            # either settles what the kill left
        assert code == 0, err
        assert sorted(os.listdir(where / "s" / "runs")) == (["2"] if deleted else ["1", "2"])
        assert statuses(where / "s")[1] == ("deleted" if deleted else "complete")
        if not deleted:
            with subzero.open_store(where / "s", create=False) as st:
                assert answer(st.get(1)) == want
        code, out, err = cli(where, "fsck", "--deep")
        assert code == 0, out + err
        assert not (where / "s" / "quarantine").exists()


@pytest.mark.filterwarnings("ignore::subzero.errors.SubZeroWarning")    # "answering another way"
def test_a_trace_beside_a_gc_is_right_or_a_clear_error(wfdir):
    """Traces on a run opened before the gc, and on the run opened afresh each time,
    while another process deletes it: the exact cells or a SubZero error naming it."""
    runs(wfdir, 2)
    outcomes, ready, stop = [], threading.Event(), threading.Event()

    def trace_on():
        with subzero.open_store(wfdir / "s", create=False) as st:
            want = answer(st.get(1))
            run = st.get(1)
            ready.set()
            while not stop.is_set():
                for get in (lambda: run, lambda: st.get(1)):
                    try:
                        outcomes.append(answer(get()) == want)
                    except SubZeroError as e:        # a clear error, never a wrong answer
                        outcomes.append(str(e))

    t = threading.Thread(target=trace_on)
    t.start()
    assert ready.wait(120)
    time.sleep(0.3)
    code, out, err = cli(wfdir, "gc", "1")
    time.sleep(0.5)
    stop.set()
    t.join(timeout=120)
    assert code == 0, err
    assert outcomes and False not in outcomes
    assert any(o is True for o in outcomes)
    errors = [o for o in outcomes if isinstance(o, str)]
    assert errors and all("run 1" in e for e in errors), errors[:3]


@pytest.mark.filterwarnings("ignore::subzero.errors.SubZeroWarning")    # "answering another way"
def test_a_run_opened_before_its_gc_says_it_was_deleted(wfdir):
    """A run opened, then deleted by another process before its first trace: the trace
    says the run was deleted (not which of its files is missing)."""
    runs(wfdir, 2)
    with subzero.open_store(wfdir / "s", create=False) as st:
        run = st.get(1)
        run.shapes()                           # its record read, nothing traced yet
        code, _, err = cli(wfdir, "gc", "1")
        assert code == 0, err
        with pytest.raises(QueryError, match=r"run 1 was deleted by subzero gc .* while this "
                                             r"trace read it"):
            answer(run)
        assert answer(st.get(2))               # the other run answers


def test_a_run_beside_a_gc_of_a_run_with_the_same_input(wfdir):
    runs(wfdir, 3)
    p = subprocess.Popen([subzero_exe(), "run", "gatewf.py", "--input", "a=a.npy", "-q",
                          "--engine", "local", "--store", "s"], cwd=wfdir, stderr=subprocess.PIPE,
                         text=True)
    code, out, err = cli(wfdir, "gc", "1", "2", "3")
    assert code == 0, err
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    with subzero.open_store(wfdir / "s", create=False) as st:
        assert st.get(4).array("a").values.tobytes() == np.load(wfdir / "a.npy").tobytes()
    code, out, err = cli(wfdir, "fsck", "--deep")
    assert code == 0, out + err


def test_api_policies_and_mistakes(store):
    x, y = data()
    for _ in range(2):
        store.run(mixed(), inputs={"x": x, "y": y}, tile=TILE, progress=False)
    with pytest.raises(UsageError, match="say which runs"):
        store.gc()
    with pytest.raises(UsageError, match="not an age"):
        store.gc(older_than="soon")
    assert store.tag("latest", "best") == 2
    assert store.get("best").id == 2
    gone = store.gc(keep_last=0, dry_run=True)
    assert [(i["run"], i["action"]) for i in gone if i["run"]] == [(1, "delete"), (2, "keep")]
    assert store.untag("best") == 2
    store.gc(older_than=0)
    assert [r.status for r in store.runs()] == ["deleted", "deleted"]
