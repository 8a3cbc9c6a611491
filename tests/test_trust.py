"""Signed runs: opening a store never runs code its user did not trust.

Every run is signed at commit with the user's key (the tests' key lives in a
per-session folder, see conftest.py); a run whose signature does not verify is
data: listed, shown, its arrays read and traced where stored lineage answers
without the operator's code, and a step that needs the code stops with one line
naming `subzero trust`.
"""

import json
import os
import pickle
import sqlite3
import stat
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import EXAMPLE, subzero_exe

import subzero
from subzero.errors import StoreError, SubZeroWarning, UntrustedRun
from subzero.storage.pickles import Global, pickle_code, risky
from subzero.storage.trust import (
    CONFIG_ENV,
    MODIFIED,
    OTHER_KEY,
    SIGNATURE_FILE,
    TRUSTED,
    UNSIGNED,
    key_path,
    load_key,
)

STRATEGIES = {"clean": "full", "stars": "full"}


class Command:
    """Unpickling this runs a shell command that creates ``marker``: what a store from
    a stranger may hold in its workflow.pkl."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def make_store(path, strategies=None):
    """A store with one run of the example workflow; returns (store path, answers of the
    traces the tests ask, computed while the run is trusted)."""
    with subzero.open_store(path) as st:
        run = st.run(EXAMPLE, strategies=strategies or STRATEGIES, progress=False)
        answers = {
            "stars->calib": run.trace("stars", [(40, 70)], to="calib").cells.tolist(),
            "stars->raw": run.trace("stars", [(40, 70)], to="raw").cells.tolist(),
            "clean->stars": run.trace("clean", [(40, 70)], path=[("stars", 0)]).cells.tolist(),
        }
    return path, answers


@pytest.fixture
def other_user(tmp_path, monkeypatch):
    """Switch to another user's key (a config folder of their own)."""
    def switch(name="other"):
        monkeypatch.setenv(CONFIG_ENV, str(tmp_path / f"config-{name}"))
    return switch


# -- the key and the signature ------------------------------------------------------------------
def test_key_is_made_on_first_use_private_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "cfg"))
    assert load_key() is None                      # reading never makes one
    key = load_key(create=True)
    assert key is not None and len(key) == 32 and load_key() == key
    assert stat.S_IMODE(os.stat(key_path()).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(key_path().parent).st_mode) == 0o700
    monkeypatch.delenv(CONFIG_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert key_path() == tmp_path / "xdg" / "subzero" / "key"


def test_a_malformed_or_open_key_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path))
    (tmp_path / "key").write_text("not hex\n")
    with pytest.raises(StoreError, match="malformed; delete it"):
        load_key()
    (tmp_path / "key").write_text("ab" * 32 + "\n")
    os.chmod(tmp_path / "key", 0o644)
    with pytest.warns(SubZeroWarning, match="can be read by other users"):
        assert load_key() == bytes.fromhex("ab" * 32)


def test_every_run_is_signed_at_commit(tmp_path):
    path, _ = make_store(tmp_path / "s")
    with subzero.open_store(path) as st:
        assert (st.run_dir(1) / SIGNATURE_FILE).is_file()
        assert st.verdict(1).state == TRUSTED and st.get(1).trusted


EDITS = [("runs", "source", "/elsewhere/evil.py"), ("runs", "params", '{"threshold": 1}'),
         ("ops", "strategies", '["blackbox"]'), ("ops", "cls", "Evil"), ("ops", "inputs", '["raw"]'),
         ("arrays", "shape", "[2, 2]"), ("runs", "uid", "00" * 16)]


def _edit(db, table, column, value):
    """Set one catalog field of run 1; returns how to put it back."""
    old = db.execute(f"SELECT rowid, {column} FROM {table} WHERE run_id=1" if table != "runs"
                     else f"SELECT rowid, {column} FROM runs WHERE id=1").fetchone()
    with db:
        db.execute(f"UPDATE {table} SET {column}=? WHERE rowid=?", (value, old[0]))

    def undo():
        with db:
            db.execute(f"UPDATE {table} SET {column}=? WHERE rowid=?", (old[1], old[0]))
    return undo


def test_the_signature_covers_the_pickle_and_the_record(tmp_path):
    path, answers = make_store(tmp_path / "s")
    run_dir = path / "runs" / "1"
    pkl, rec = run_dir / "workflow.pkl", run_dir / "run.json"
    data, record = pkl.read_bytes(), rec.read_bytes()

    def state():
        with subzero.open_store(path) as st:
            return st.verdict(1).state

    pkl.write_bytes(data[:-2] + bytes([data[-2] ^ 1]) + data[-1:])      # one bit of the pickle
    assert state() == MODIFIED
    pkl.write_bytes(data)
    assert state() == TRUSTED
    rec.write_bytes(record.replace(b'"shape":[64,96]', b'"shape":[2,2]', 1))   # the record
    assert state() == MODIFIED
    with subzero.open_store(path) as st, pytest.raises(StoreError, match="record.*changed"):
        st.get(1).trace("stars", [(40, 70)], to="calib")
    rec.write_bytes(record)
    assert state() == TRUSTED
    pkl.unlink()                                  # no pickle is not the signed pickle either
    assert state() == MODIFIED
    pkl.write_bytes(data)
    (run_dir / SIGNATURE_FILE).unlink()           # as a store of an older SubZero
    assert state() == UNSIGNED


def test_edited_catalog_rows_steer_nothing(tmp_path, cli):
    """The campaign's case: an edited arrays.shape or ops.inputs row made `runs` say
    modified, yet traces used the edit (25 cells instead of 49).  A signed run's traces
    and code loads take what steers them from its record; the catalog's difference is
    shown, and `fsck` repairs it."""
    path, answers = make_store(tmp_path / "s")
    db = sqlite3.connect(path / "catalog.sqlite")
    for table, column, value in EDITS:
        undo = _edit(db, table, column, value)
        with subzero.open_store(path) as st:
            run = st.get(1)
            assert st.verdict(1).state == TRUSTED, (table, column)
            assert run.trace("stars", [(40, 70)], to="calib").cells.tolist() == answers["stars->calib"]
            assert run.trace("stars", [(40, 70)], to="raw").cells.tolist() == answers["stars->raw"]
            assert run.workflow.source != "/elsewhere/evil.py"
        code, out, err = cli("show", "1", "--store", path)
        assert code == 0 and "the catalog differs from the run's signed record" in out, out
        undo()
    db.close()


def test_catalog_rows_of_an_old_run_are_covered_by_its_signature(tmp_path):
    """A run signed before records existed (format 1, over its catalog rows)."""
    from subzero.storage.trust import sign_run
    path, answers = make_store(tmp_path / "s")
    with subzero.open_store(path) as st:
        (st.run_dir(1) / "run.json").unlink()
        sign_run(st.catalog, 1, st.run_dir(1))
        assert st.verdict(1).state == TRUSTED
    db = sqlite3.connect(path / "catalog.sqlite")
    for table, column, value in EDITS[:-1]:
        undo = _edit(db, table, column, value)
        with subzero.open_store(path) as st:
            assert st.verdict(1).state == MODIFIED, (table, column)
        undo()
        with subzero.open_store(path) as st:
            assert st.verdict(1).state == TRUSTED
    db.close()


def test_a_run_signed_with_another_key_is_not_trusted(tmp_path, other_user):
    path, _ = make_store(tmp_path / "s")
    other_user()
    with subzero.open_store(path) as st:
        assert st.verdict(1).state == OTHER_KEY and not st.get(1).trusted
        with pytest.raises(UntrustedRun, match=r"another user's key.*subzero trust"):
            st.workflow_of(st.get(1).row)


# -- an untrusted store is data -----------------------------------------------------------------
def test_a_pickle_that_runs_a_command_is_never_loaded(tmp_path, cli):
    """The issue's test: a workflow.pkl replaced by a payload that would create a file
    when unpickled.  Listing, showing, reading arrays and tracing through stored lineage
    work and are exact; a step that needs the code stops with one line; the file is
    never created — `subzero trust` lists the command without running it."""
    path, answers = make_store(tmp_path / "s")
    marker = tmp_path / "pwned"
    (path / "runs" / "1" / "workflow.pkl").write_bytes(pickle.dumps(Command(marker)))

    code, out, err = cli("runs", "--store", path)
    assert code == 0 and "modified" in out.splitlines()[1] and "subzero trust" in out
    code, out, err = cli("show", "1", "--store", path)
    assert code == 0 and "NOT trusted" in out and f"subzero trust {path} --run 1" in out
    code, out, err = cli("show", "1", "--store", path, "--json")
    assert code == 0 and json.loads(out)["trust"] == MODIFIED

    code, out, err = cli("trace", "--store", path, "--from", "stars", "--cells", "40,70",
                         "--to", "calib", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["cells"] == answers["stars->calib"]
    assert {s["method"] for s in res["steps"]} == {"stored:full:fullone:backward"}

    code, out, err = cli("trace", "--store", path, "--from", "stars", "--cells", "40,70",
                         "--to", "raw")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "operator 'calib' needs its code" in err and f"subzero trust {path} --run 1" in err

    with subzero.open_store(path) as st:
        run = st.get(1)
        assert run.array("stars").shape == (64, 96)            # arrays read as data
        with pytest.raises(UntrustedRun, match="not trusted"):
            st.workflow_of(run.row)
        with pytest.raises(UntrustedRun, match="operator 'calib'"):
            run.trace("stars", [(40, 70)], to="raw")

    code, out, err = cli("trust", path)                          # no terminal, no --yes
    assert code == 2 and "--yes" in err
    assert "posix: system" in out and "can run commands" in out
    with subzero.open_store(path) as st:
        assert st.verdict(1).state == MODIFIED                   # nothing was signed
    assert not marker.exists()


def test_a_store_from_another_user_works_once_trusted(tmp_path, cli, shell, other_user):
    path, answers = make_store(tmp_path / "s")
    other_user()
    code, out, err = cli("trace", "--store", path, "--from", "stars", "--cells", "40,70",
                         "--to", "raw")
    assert code == 2 and "signed with another user's key" in err
    code, out, err = cli("trust", path, "--json", "--yes")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["trusted"] == [1]
    listed = shown["runs"][0]
    assert listed["trust"] == OTHER_KEY
    assert {"HotPixels", "Stars"} <= set(listed["classes"])          # defined in example.py
    assert "subzero.model.workflow" in listed["modules"]
    assert [o["class"] for o in listed["operators"]] == ["Divide", "BoxBlur", "HotPixels", "Stars"]
    code, out, err = shell("trace", "--store", path, "--from", "stars", "--cells", "40,70",
                           "--to", "raw", "--json")
    assert code == 0, err
    assert json.loads(out)["cells"] == answers["stars->raw"]
    code, out, err = cli("trust", "--store", path)
    assert code == 0 and "trusted already" in out


def test_trusting_from_python_refreshes_open_runs(tmp_path, other_user):
    path, answers = make_store(tmp_path / "s")
    other_user()
    with subzero.open_store(path) as st:
        run = st.get(1)
        with pytest.raises(UntrustedRun):
            run.trace("stars", [(40, 70)], to="raw")
        code = st.code_of(1)
        with pytest.raises(StoreError, match="changed after it was shown"):
            st.trust(1, payloads={1: "0" * 64})
        assert st.trust(payloads={1: code["payload_sha256"]}) == [1]
        assert run.trace("stars", [(40, 70)], to="raw").cells.tolist() == answers["stars->raw"]
        assert st.trust() == []                                  # nothing left to trust


def test_the_workflow_module_is_not_reimported_for_an_untrusted_run(tmp_path, other_user):
    """Without a loadable pickle a trace re-imports the workflow's module: that is code
    from the store's catalog too, so only for a trusted run."""
    imports = tmp_path / "imports.log"
    wf = tmp_path / "flow.py"
    wf.write_text(
        "from pathlib import Path\n"
        f"with open({str(imports)!r}, 'a') as f:\n    f.write('imported\\n')\n"
        "import subzero\n"
        "from subzero.operators import MeanFilter\n"
        "def workflow():\n"
        "    wf = subzero.Workflow('flow')\n"
        "    wf.add('smooth', MeanFilter(3), wf.input('x'))\n"
        "    return wf\n")
    x = np.arange(30.0).reshape(5, 6)
    with subzero.open_store(tmp_path / "s") as st:
        run = st.run(str(wf), inputs={"x": x}, strategies={"smooth": "map"}, progress=False)
        want = run.trace("smooth", [(2, 2)], to="x").cells.tolist()
        (run.dir / "workflow.pkl").unlink()
    loaded = imports.read_text().count("imported")
    other_user()
    with subzero.open_store(tmp_path / "s") as st:
        with pytest.raises(UntrustedRun, match="operator 'smooth'"):
            st.get(1).trace("smooth", [(2, 2)], to="x")
        assert imports.read_text().count("imported") == loaded
        st.trust(1)
        assert st.get(1).trace("smooth", [(2, 2)], to="x").cells.tolist() == want
        assert imports.read_text().count("imported") == loaded + 1


@pytest.mark.parametrize("spec,needs_code", [
    ("full:fullone:backward", False), ("full:fullmany:backward", False),
    ("full:fullone:forward", False), ("full:fullmany:forward", False),
    ("pay:payone:forward", False), ("pay:paymany:forward", False),
    ("pay:payone:backward", True), ("blackbox", True)])
def test_which_stored_steps_answer_without_code(tmp_path, other_user, spec, needs_code):
    """Full pairs and payloads expanded at capture time are data; payloads keyed by output
    cells need map_p and black-box steps re-run the operator."""
    path, answers = make_store(tmp_path / "s", {"clean": "full", "stars": spec})
    other_user()
    with subzero.open_store(path) as st:
        run = st.get(1)
        for start, cells, kw, key in [("stars", [(40, 70)], {"to": "calib"}, "stars->calib"),
                                      ("clean", [(40, 70)], {"path": [("stars", 0)]}, "clean->stars")]:
            if needs_code:
                with pytest.raises(UntrustedRun, match="operator 'stars' needs its code"):
                    run.trace(start, cells, **kw)
            else:
                res = run.trace(start, cells, **kw)
                assert res.cells.tolist() == answers[key]
                assert all(s.method.startswith("stored:") for s in res.steps if s.op == "stars")


def test_composite_lineage_needs_the_code(tmp_path, other_user):
    path, answers = make_store(tmp_path / "s", {"clean": "comp", "stars": "full"})
    other_user()
    with subzero.open_store(path) as st:
        run = st.get(1)
        assert run.trace("clean", [(40, 70)], path=[("stars", 0)]).cells.tolist() == \
            answers["clean->stars"]
        with pytest.raises(UntrustedRun, match="operator 'clean'"):
            run.trace("stars", [(40, 70)], to="calib")


# -- reading a pickle's code without loading it ------------------------------------------------
@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_pickle_code_names_what_unpickling_would_call(tmp_path, protocol):
    data = pickle.dumps(Command(tmp_path / "never"), protocol=protocol)
    code = pickle_code(data)
    assert code.globals == [Global("posix", "system")] and not code.unreadable
    assert risky("posix", "system") and risky("builtins", "eval")
    assert not risky("numpy", "dtype") and not risky("builtins", "type")
    assert not (tmp_path / "never").exists()
    assert pickle_code(data[:-3]).unreadable                      # truncated: said, not hidden


def test_instance_runs_are_signed_by_the_driver(spark, tmp_path):
    """Instance runs are written on executors; the driver signs each at commit."""
    from subzero.workflows.example import flat_field, synthetic_sky
    np.save(tmp_path / "raw.npy", synthetic_sky(seed=3))
    np.save(tmp_path / "flat.npy", flat_field())
    (tmp_path / "night.csv").write_text("raw,flat\nraw.npy,flat.npy\nraw.npy,flat.npy\n")
    with subzero.open_store(tmp_path / "s") as st:
        results = st.run_many(EXAMPLE, tmp_path / "night.csv", strategies=STRATEGIES, spark=spark,
                              progress=False)
        assert [r.ok for r in results] == [True, True]
    with subzero.open_store(tmp_path / "s") as st:
        assert [st.verdict(r.run_id).state for r in results] == [TRUSTED, TRUSTED]
        assert len(st.get(results[0].run_id).trace("stars", [(40, 70)], to="raw")) > 0


# -- nothing a store names runs before trust (issue 28) -------------------------------------------
PLANTED = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\n"


def test_no_command_loads_code_a_store_from_elsewhere_names(tmp_path, cli, other_user, calibration):
    """Another user's store whose run names a workflow module that is now a planted one
    (importing it writes a marker) and whose workflow.pkl runs a command when unpickled.
    Every command that reads the store -- runs, show, trace (stored and code-needing), a
    workload, export, optimize on the store, the explorer -- loads neither."""
    flow = tmp_path / "flow.py"
    flow.write_text(open(EXAMPLE).read())
    path = tmp_path / "s"
    with subzero.open_store(path) as st:
        run = st.run(str(flow), strategies=STRATEGIES, progress=False)
        run.trace("stars", [(40, 70)], to="raw")          # the trace log: optimize's workload
        st.catalog.add_calibration(os.uname().nodename, calibration["seconds"], calibration)
    imported, unpickled = tmp_path / "imported", tmp_path / "unpickled"
    flow.write_text(PLANTED.format(marker=str(imported)))
    (path / "runs" / "1" / "workflow.pkl").write_bytes(pickle.dumps(Command(unpickled)))
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({"queries": [{"from": "stars", "cells": [[40, 70]], "to": "raw"}]}))
    other_user()
    trace = ("trace", "--from", "stars", "--cells", "40,70")
    for args in [("runs",), ("runs", "--json"), ("show", "1"), ("show", "1", "--json"),
                 (*trace, "--to", "calib"), (*trace, "--to", "raw"), ("trace", "--workload", workload),
                 ("export", "--prov", tmp_path / "p.json", "--openlineage", tmp_path / "o.json"),
                 ("optimize", EXAMPLE, "--max-disk", "1MB", "--json"), ("trust", path)]:
        code, out, err = cli(*args, "--store", path)
        assert code in (0, 2) and len(err.strip().splitlines()) <= 1, (args, err)
        assert not imported.exists() and not unpickled.exists(), args
    explorer = subprocess.Popen([subzero_exe(), "explore", "--store", str(path), "--port", "0",
                                 "--no-browser", "--json"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        url = json.loads(explorer.stdout.readline())["url"]
        for direction in ("backward", "forward"):
            body = json.dumps({"array": "stars" if direction == "backward" else "raw",
                               "box": [[40, 41], [70, 71]], "direction": direction, "views": {}})
            req = urllib.request.Request(url.rstrip("/") + "/api/trace", body.encode(),
                                         {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=60).read()
            except urllib.error.HTTPError as e:        # a step that needs the code: refused
                assert e.code in (400, 403, 409), e
    finally:
        explorer.terminate()
        explorer.wait(30)
    assert not imported.exists() and not unpickled.exists()
