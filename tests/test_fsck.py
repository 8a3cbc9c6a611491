"""A store that lost or mixed up its catalog, or holds folders it cannot account for,
never loses a run: commands refuse to take it for a new store, `subzero clean`
recovers or quarantines instead of deleting, and `subzero fsck` rebuilds and repairs
what the runs' signed records prove, reporting the rest (exit 2)."""

import json
import shutil
import sqlite3

import numpy as np
import pytest
from conftest import EXAMPLE

import subzero

STRATS = {"clean": "full", "stars": "full"}


def _run(path, seed=0):
    from subzero.workflows.example import flat_field, synthetic_sky
    with subzero.open_store(path) as st:
        run = st.run(EXAMPLE, inputs={"raw": synthetic_sky(seed=seed), "flat": flat_field()},
                     strategies=STRATS, progress=False)
        return run.id, run.trace("stars", [(40, 70)], to="raw").cells.tolist()


@pytest.fixture
def two_runs(tmp_path):
    path = tmp_path / "s"
    ids, answers = zip(*[_run(path, seed) for seed in (0, 1)])
    return path, list(ids), list(answers)


def _traces(path, ids):
    with subzero.open_store(path, create=False) as st:
        return [st.get(i).trace("stars", [(40, 70)], to="raw").cells.tolist() for i in ids]


def test_a_deleted_catalog_is_named_and_rebuilt(two_runs, cli):
    path, ids, answers = two_runs
    (path / "catalog.sqlite").unlink()
    for args in (("runs",), ("clean",), ("run", EXAMPLE), ("show", "1")):
        code, out, err = cli(*args, "--store", path)
        assert code == 2 and "catalog" in err and "missing" in err and "subzero fsck" in err, (args, err)
    assert sorted(p.name for p in (path / "runs").iterdir()) == ["1", "2"]     # nothing deleted
    code, out, err = cli("fsck", "--store", path, "--dry-run")
    assert code == 2 and "the catalog is missing" in out and not (path / "catalog.sqlite").exists()
    code, out, err = cli("fsck", "--store", path)
    assert code == 0, out + err
    assert "rebuilt" in out and out.count("adopted") == 2
    assert _traces(path, ids) == answers
    with subzero.open_store(path, create=False) as st:
        assert [r.status for r in st.runs()] == ["complete", "complete"]
        assert all(st.verdict(r).trusted for r in st.runs())
    _run(path, 2)                                    # the next run gets a new id
    with subzero.open_store(path, create=False) as st:
        assert [r.id for r in st.runs()] == [1, 2, 3]


def test_an_older_catalog_adds_runs_back_never_deletes_them(tmp_path, cli):
    """The campaign's case: a catalog restored from an older copy made `clean` delete
    the newer runs, and the next `run` failed on "Directory not empty"."""
    path = tmp_path / "s"
    first = _run(path, 0)
    backup = sqlite3.connect(tmp_path / "backup.sqlite")      # a consistent copy, as after run 1
    with sqlite3.connect(path / "catalog.sqlite") as live:
        live.backup(backup)
    live.close()
    backup.close()
    second = _run(path, 1)
    for ext in ("", "-wal", "-shm"):                           # restore the backup
        (path / f"catalog.sqlite{ext}").unlink(missing_ok=True)
    shutil.copy(tmp_path / "backup.sqlite", path / "catalog.sqlite")
    code, out, err = cli("run", EXAMPLE, "--store", path)
    assert code == 2 and "older than the store's runs folder" in err and "subzero fsck" in err, err
    assert (path / "runs" / "2" / "run.json").is_file()        # not touched
    code, out, err = cli("clean", "--store", path, "--json")
    assert code == 0
    acted = json.loads(out)["removed"]
    assert [(a["run"], a["action"]) for a in acted if a["run"] == 2] == [(2, "adopt")], acted
    assert _traces(path, [1, 2]) == [first[1], second[1]]
    code, out, err = cli("run", EXAMPLE, "--store", path)       # the next id is free again
    assert code == 0, err


def test_catalog_rows_differing_from_a_signed_record_are_repaired(two_runs, cli):
    path, ids, answers = two_runs
    with sqlite3.connect(path / "catalog.sqlite") as db:
        db.execute("UPDATE arrays SET shape='[2, 2]' WHERE run_id=1 AND name='raw'")
        db.execute("UPDATE ops SET inputs='[\"raw\"]' WHERE run_id=2 AND name='stars'")
    db.close()
    code, out, err = cli("fsck", "--store", path)
    assert code == 0 and out.count("[repaired]") == 2, out
    code, out, err = cli("fsck", "--store", path)
    assert code == 0 and "sound" in out, out
    with subzero.open_store(path, create=False) as st:
        assert st.catalog.arrays(1)["raw"]["shape"] == (64, 96)


def test_folders_that_prove_nothing_are_quarantined(two_runs, tmp_path, cli):
    path, ids, answers = two_runs
    other = tmp_path / "other"
    _run(other, 5)
    shutil.copytree(other / "runs" / "1", path / "runs" / "9")       # another store's run
    (path / "runs" / "junk").mkdir()
    code, out, err = cli("clean", "--store", path, "--dry-run")
    assert code == 0 and "would quarantine" in out and (path / "runs" / "9").is_dir()
    code, out, err = cli("fsck", "--store", path)
    assert code == 0 and out.count("quarantined") == 2, out
    assert sorted(p.name for p in (path / "runs").iterdir()) == ["1", "2"]
    kept = sorted(p.name.split(".")[0] for p in (path / "quarantine").iterdir())
    assert kept == ["9", "junk"]                                      # moved aside, not deleted
    assert (path / "quarantine").joinpath(next((path / "quarantine").glob("9.*")).name, "run.json").is_file()


def test_what_cannot_be_repaired_is_reported(two_runs, cli):
    path, ids, answers = two_runs
    shutil.rmtree(path / "runs" / "2")
    chunk = next((path / "runs" / "1" / "arrays" / "stars.zarr" / "data").rglob("c/*/*"))
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    code, out, err = cli("fsck", "--store", path)
    assert code == 2 and "run 2" in out and "folder is missing" in out and "NOT REPAIRED" in out
    assert "stars" not in out                      # a quick check reads no chunk
    code, out, err = cli("fsck", "--store", path, "--deep", "--json")
    assert code == 2
    found = json.loads(out)["findings"]
    assert any(f["run"] == 1 and "stars" in f["problem"] and f["unresolved"] for f in found), found


def test_fsck_from_python(two_runs):
    path, ids, answers = two_runs
    assert subzero.fsck(path) == []
    (path / "catalog.sqlite").unlink()
    found = subzero.fsck(path, dry_run=True)
    assert found[0].unresolved and "missing" in found[0].problem
    assert [f.action for f in subzero.fsck(path)] == ["rebuilt", "adopted", "adopted"]
    assert np.array_equal(_traces(path, ids), answers)


# -- found by the fault campaign (issue 28, item 9) --------------------------------------------
def test_another_stores_catalog_moves_nothing(two_runs, tmp_path, cli):
    """A catalog copied (or linked) from another store names other runs: fsck says so and
    stops, instead of quarantining this store's runs as "runs of another store" or
    rewriting the other catalog's rows (before, run 2 went to quarantine/)."""
    path, ids, answers = two_runs
    other = tmp_path / "other"
    _run(other, 5)
    shutil.copyfile(other / "catalog.sqlite", path / "catalog.sqlite")
    before = sorted(p.name for p in (path / "runs").iterdir())
    found = subzero.fsck(path)
    assert len(found) == 1 and found[0].unresolved and "belongs to another store" in found[0].problem
    assert sorted(p.name for p in (path / "runs").iterdir()) == before == ["1", "2"]
    assert not (path / "quarantine").exists()
    code, out, err = cli("fsck", "--store", path)
    assert code == 2 and "belongs to another store" in out
    with sqlite3.connect(path / "catalog.sqlite") as con:       # the other catalog is untouched
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1


@pytest.mark.parametrize("fault", ["fifo", "missing link", "dev-zero link"])
def test_a_checksum_file_that_is_no_file_is_a_finding(two_runs, fault):
    """fsck reads each array's checksum file as every metadata file is read: a FIFO does
    not block it, a link is not followed (before: FileNotFoundError, or a read without
    end)."""
    import os
    path, ids, answers = two_runs
    side = path / "runs" / "1" / "arrays" / "stars.sums.json"
    side.unlink()
    if fault == "fifo":
        os.mkfifo(side)
    else:
        side.symlink_to("/dev/zero" if fault == "dev-zero link" else path / "nowhere")
    found = subzero.fsck(path)
    assert [f.unresolved for f in found] == [True], found
    assert "the checksum file of array 'stars' cannot be read" in found[0].problem
    assert str(side) in found[0].problem and "\n" not in found[0].problem
