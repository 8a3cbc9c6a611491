"""Every mistake and unusable environment a new user meets, through the real CLI:
one clear line on stderr naming the path or operator, exit 2 (``--debug``, before
or after the command, shows the traceback); read-only and archived stores can be
listed, shown and traced; a closed pipe ends the output quietly."""

import functools
import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE, subzero_exe

import subzero


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("subzero: error: "), err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


@pytest.fixture(scope="module")
def shared():
    """A folder for the stores of this module's read-only tests (unlocked before it
    is removed)."""
    d = Path(tempfile.mkdtemp(prefix="subzero-clierr-"))
    yield d
    _unlock(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def made(shared):
    """A store with one complete run of the example workflow."""
    path = shared / "made"
    with subzero.open_store(path) as st:
        st.run(EXAMPLE, strategies={"stars": "full"})
    return path


def _copy(made: Path, to: Path) -> Path:
    shutil.copytree(made, to)
    return to


def _lock(path: Path) -> None:
    """Take away every write permission in the store (files 0444, folders 0555)."""
    for p in [path, *path.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)


def _unlock(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        try:
            p.chmod(0o755 if p.is_dir() else 0o644)
        except OSError:
            pass


def _digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@functools.cache
def _unprivileged_prefix() -> tuple[str, ...]:
    """The command prefix that runs the CLI where file permissions count: nothing when
    we are not root.  Root ignores permissions through its capabilities, so then
    `setpriv` keeps uid 0 (the process still reaches this checkout, its .venv and the
    session's private key, all root's own, even from a 0700 folder) and drops every
    capability from the bounding and inheritable sets: a 0444 file or a 0555 folder
    cannot be written.  A probe checks that once; skip where it is impossible."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: root's capabilities cannot be "
                    "dropped, so file permissions cannot be tested")
    prefix = (setpriv, "--inh-caps=-all", "--bounding-set=-all", "--")
    with tempfile.TemporaryDirectory() as d:
        probe = Path(d) / "ro" / "file"
        probe.parent.mkdir()
        probe.write_text("x")
        probe.chmod(0o444)
        probe.parent.chmod(0o555)
        try:
            p = subprocess.run(
                [*prefix, sys.executable, "-c",
                 "import sys, subzero\n"
                 "for write in (lambda: open(sys.argv[1], 'a'),\n"
                 "              lambda: open(sys.argv[1] + '.new', 'x')):\n"
                 "    try:\n"
                 "        write()\n"
                 "    except PermissionError:\n"
                 "        continue\n"
                 "    sys.exit('written')\n", str(probe)],
                capture_output=True, text=True, timeout=60)
        finally:
            probe.parent.chmod(0o755)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        pytest.skip(f"running as root and `setpriv {' '.join(prefix[1:-1])}` does not make "
                    f"a process that imports subzero and is denied a 0444 file and a 0555 "
                    f"folder, so file permissions cannot be tested: "
                    f"{why}")
    return prefix


def _unprivileged() -> list[str]:
    """The command prefix for a process that file permissions hold back (root without
    its capabilities, see `_unprivileged_prefix`); nothing when we are not root."""
    return list(_unprivileged_prefix())


def _cli(prefix: list[str], *args, cwd=None):
    env = dict(os.environ, SUBZERO_ENGINE="local")
    p = subprocess.run([*prefix, sys.executable, "-m", "subzero.cli", *map(str, args)],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


# -- --debug, --version ------------------------------------------------------------------

@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_before_or_after_the_command(cli, shell, tmp_path, where):
    missing = tmp_path / "nowhere"
    args = ["runs", "--store", missing]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    code, _, err = cli(*args)
    assert code == 2 and "Traceback" in err and "StoreError: no SubZero store" in err
    code, _, err = shell(*args)         # the traceback, then the same line and exit status
    assert code == 2 and "Traceback" in err and "StoreError: no SubZero store" in err
    assert err.rstrip().splitlines()[-1].startswith("subzero: error: ") and str(missing) in err
    code, _, err = shell(*args[:3] if where == "after" else args[1:])   # without: one line
    assert code == 2 and str(missing) in one_line(err)


def test_version(shell):
    code, out, err = shell("--version")
    assert code == 0, err
    assert out.strip() == f"subzero {version('subzero-lineage')}"


def test_tile_must_be_positive(cli):
    with pytest.raises(SystemExit) as e:
        cli("run", EXAMPLE, "--tile", "-3")
    assert e.value.code == 2


# -- a closed pipe ------------------------------------------------------------------------

def test_closed_pipe_ends_quietly(made):
    """`subzero trace ... | head`: the reader goes away; no BrokenPipeError,
    nothing on stderr, and the status of a process ended by SIGPIPE (141)."""
    with subzero.open_store(made) as st:
        h, w = st.get().shapes()["stars"]
    p = subprocess.Popen([subzero_exe(), "trace", "--store", made, "--from", "stars", "--cells",
                          f"0:{h},0:{w}", "--to", "raw", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, SUBZERO_ENGINE="local"))
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()        # gone before the answer is written: deterministic EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert err == ""


# -- read-only and archived stores --------------------------------------------------------

def _read_only_checks(prefix: list[str], store: Path, cwd: Path) -> None:
    before = _digest(store)
    code, out, err = _cli(prefix, "runs", "--store", store, cwd=cwd)
    assert code == 0 and err == "", err
    assert "complete" in out and "example" in out
    code, out, err = _cli(prefix, "show", "1", "--store", store, cwd=cwd)
    assert code == 0 and err == "", err
    assert out.startswith("run 1: workflow example") and "content sz1:" in out
    # inputs by content: an older catalog has no digests; they are computed, not written
    code, out, err = _cli(prefix, "inputs", "--store", store, cwd=cwd)
    assert code == 0 and err == "", err
    assert "raw (runs 1)" in out and "flat (runs 1)" in out
    # where the bytes go: read, never written
    for args in ((), ("--run", "1")):
        code, out, err = _cli(prefix, "du", *args, "--store", store, cwd=cwd)
        assert code == 0 and err == "", err
        assert "on disk" in out or "array stars" in out
    code, out, err = _cli(prefix, "trace", "--store", store, "--from", "stars", "--cells", "40,70",
                          "--to", "raw", "--json", cwd=cwd)
    assert code == 0, err
    assert '"count": ' in out and '"cells": [[' in out
    # the trace log is skipped, with one line that says so
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("subzero: warning: ") \
        and "read-only" in lines[0] and "trace log" in lines[0], err
    # a run needs to write: one line naming the store
    code, out, err = _cli(prefix, "run", EXAMPLE, "--engine", "local", "--store", store, cwd=cwd)
    assert code == 2 and str(store) in one_line(err) and "read-only" in err
    code, out, err = _cli(prefix, "optimize", EXAMPLE, "--max-disk", "10KB", "--store", store,
                          cwd=cwd)
    assert code == 2 and "read-only" in one_line(err)
    # deleting runs and tagging them write; a dry run of gc reads only
    code, out, err = _cli(prefix, "gc", "--keep-last", "0", "--store", store, cwd=cwd)
    assert code == 2 and "read-only" in one_line(err)
    code, out, err = _cli(prefix, "gc", "--keep-last", "0", "--dry-run", "--store", store, cwd=cwd)
    assert code == 0 and "would delete 1 run(s)" in out, err
    code, out, err = _cli(prefix, "tag", "1", "kept", "--store", store, cwd=cwd)
    assert code == 2 and "read-only" in one_line(err)
    assert _digest(store) == before     # nothing written, not even the catalog's -wal/-shm


def test_read_only_store_lists_shows_and_traces(made, shared):
    prefix = _unprivileged()
    store = _copy(made, shared / "ro")
    _lock(store)
    try:
        _read_only_checks(prefix, store, cwd=shared)
    finally:
        _unlock(store)


def test_read_only_store_of_an_older_catalog_version(made, shared):
    """An archived store made by an older SubZero: its catalog is migrated in memory
    only (the file cannot, and must not, change)."""
    prefix = _unprivileged()
    store = _copy(made, shared / "ro_old")
    db = sqlite3.connect(store / "catalog.sqlite")
    db.execute("UPDATE arrays SET digest=NULL")          # made before inputs had digests
    db.commit()
    db.execute("PRAGMA user_version = 1")
    db.close()
    _lock(store)
    try:
        _read_only_checks(prefix, store, cwd=shared)
    finally:
        _unlock(store)


def test_catalog_read_only_in_a_writable_folder(made, shared):
    prefix = _unprivileged()
    store = _copy(made, shared / "ro_file")
    _lock(store)
    store.chmod(0o777)          # the folder is anyone's; the files are not
    try:
        code, out, err = _cli(prefix, "runs", "--store", store, cwd=shared)
        assert code == 0 and "complete" in out, err
        code, out, err = _cli(prefix, "run", EXAMPLE, "--store", store, cwd=shared)
        assert code == 2 and "read-only" in one_line(err)
    finally:
        _unlock(store)


@pytest.fixture
def immutable(made, shared):
    """A store folder with the immutable attribute (what even root cannot write)."""
    store = _copy(made, shared / "imm")
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(store)], capture_output=True).returncode != 0:
        shutil.rmtree(store)
        pytest.skip("chattr +i is not available here (needs root and a supporting file system)")
    yield store
    subprocess.run(["chattr", "-i", str(store)], check=True)
    shutil.rmtree(store)


def test_immutable_store_traces_and_refuses_runs(immutable, shared):
    _read_only_checks([], immutable, cwd=shared)
    code, _, err = _cli([], "run", EXAMPLE, "--store", immutable / "inner", cwd=shared)
    assert code == 2 and str(immutable / "inner") in one_line(err)


# -- store paths that cannot be used -------------------------------------------------------

def test_store_under_a_regular_file(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    code, _, err = cli("run", EXAMPLE, "--engine", "local", "--store", tmp_path / "afile" / "st")
    assert code == 2 and str(tmp_path / "afile" / "st") in one_line(err)
    code, _, err = cli("runs", "--store", tmp_path / "afile")
    assert code == 2 and "not a directory" in one_line(err)


def test_store_in_a_folder_without_write_permission(shared):
    prefix = _unprivileged()
    locked = shared / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    code, _, err = _cli(prefix, "run", EXAMPLE, "--engine", "local", "--store", locked / "st",
                        cwd=shared)
    line = one_line(err)
    assert code == 2 and str(locked / "st") in line and "Permission denied" in line


@pytest.mark.parametrize("where", ["whole", "header", "pages", "schema text"])
def test_damaged_catalog_is_one_line_naming_it(cli, made, tmp_path, where):
    store = _copy(made, tmp_path / "st")
    cat = store / "catalog.sqlite"
    for side in ("-wal", "-shm"):
        Path(str(cat) + side).unlink(missing_ok=True)
    data = bytearray(cat.read_bytes())
    rng = np.random.default_rng(7)
    if where == "whole":
        data = bytearray(rng.integers(0, 256, 8192, dtype=np.uint8).tobytes())
    elif where == "header":
        data[:100] = rng.integers(0, 256, 100, dtype=np.uint8).tobytes()
    elif where == "schema text":   # SQLite's error quotes it: not UTF-8 (fault case 189)
        at = bytes(data).index(b"CREATE TABLE") + 20
        data[at:at + 5] = b"\xa4\xf5\xa4\xf5\xa4"
    else:                       # every page after the first overwritten: the schema survives
        data[4096:] = rng.integers(0, 256, len(data) - 4096, dtype=np.uint8).tobytes()
    cat.write_bytes(bytes(data))
    for args in (["runs"], ["show", "1"],
                 ["trace", "--from", "stars", "--cells", "40,70", "--to", "raw"]):
        code, out, err = cli(*args, "--store", store)
        assert code == 2, (args, out, err)
        assert str(cat) in one_line(err), (args, err)


# -- inputs ------------------------------------------------------------------------------

def test_text_file_named_npy(cli, tmp_path):
    bad = tmp_path / "image.npy"
    bad.write_text("1 2 3\n4 5 6\n")
    code, _, err = cli("run", EXAMPLE, "--engine", "local", "--store", tmp_path / "st",
                       "--input", f"raw={bad}")
    line = one_line(err)
    assert code == 2 and str(bad) in line and "not a NumPy .npy file" in line
    assert "pickle" not in line


def test_object_array_npy(cli, tmp_path):
    obj = tmp_path / "objects.npy"
    np.save(obj, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    code, _, err = cli("run", EXAMPLE, "--engine", "local", "--store", tmp_path / "st",
                       "--input", f"raw={obj}")
    line = one_line(err)
    assert code == 2 and str(obj) in line and "object" in line


# -- cell selections deduplicated as they are expanded (issue 28) --------------------------------
def test_a_cells_spec_that_repeats_the_array_costs_what_the_array_costs(tmp_path):
    """30,000 repeats of `:,:` were expanded one by one before duplicates were removed
    (16 bytes a cell per repeat: ~3 GB for the example's 64x96 arrays, more with the
    expansion's temporaries).  Under a 2 GB address-space limit the trace now answers
    exactly what one `:,:` answers, from the CLI and from Python."""
    import json as _json
    import resource
    with subzero.open_store(tmp_path / "s") as st:
        run = st.run(EXAMPLE, strategies={"clean": "full", "stars": "full"}, progress=False)
        want = run.trace("stars", ":,:", to="calib", record=False).cells.tolist()
        assert run.trace("stars", ";".join([":,:"] * 30000), to="calib",
                         record=False).cells.tolist() == want
        assert run.trace("stars", "40,70;40,70;40:41,70", to="calib",
                         record=False).query.ids().tolist() == [40 * 96 + 70]

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    p = subprocess.run([subzero_exe(), "trace", "--store", tmp_path / "s", "--from", "stars",
                        "--cells", ";".join([":,:"] * 30000), "--to", "calib", "--json"],
                       capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert p.returncode == 0, p.stderr
    got = _json.loads(p.stdout)
    assert got["cells_in"] == 64 * 96 and got["cells"] == want


def test_a_cells_spec_over_the_limit_is_one_line():
    from subzero.errors import QueryError
    from subzero.model.cells import parse_spec, union_of_boxes
    from subzero.tuning import MAX_SPEC_CELLS
    spec = ";".join(f"{i}:{i + 20000},:" for i in range(0, 80000, 40))    # distinct, overlapping
    with pytest.raises(QueryError, match=rf"number \d+ box by box, more than the limit of "
                                         rf"{MAX_SPEC_CELLS} \(MAX_SPEC_CELLS in subzero.tuning\)"):
        parse_spec(spec, (100000, 100000), "raw")
    # boxes inside another and repeats are not counted: this is the one big box
    cells = union_of_boxes([((0, 0), (4, 4)), ((1, 1), (3, 3)), ((0, 0), (4, 4)), ((2, 2), (3, 3))],
                           (5, 5), limit=16)
    assert cells.tolist() == [[r, c] for r in range(4) for c in range(4)]
    with pytest.raises(QueryError, match="limit of 15"):
        union_of_boxes([((0, 0), (4, 4))], (5, 5), limit=15)


# -- one CLI: the same words for the same things ------------------------------------------

def test_a_plot_that_cannot_be_written_is_refused_before_the_trace(cli, made, monkeypatch):
    import subzero.run as run_mod
    traced = []
    monkeypatch.setattr(run_mod.Run, "trace", lambda *a, **k: traced.append(1))
    code, _, err = cli("trace", "--store", made, "--from", "stars", "--cells", "40,70", "--to",
                       "raw", "--plot", "/nonexistent/q.png")
    assert code == 2 and "/nonexistent" in one_line(err) and "does not exist" in err
    assert traced == []


@pytest.mark.parametrize("spec,words", [("1,,x", "an empty coordinate"),
                                        ("40,x", "'x', which is not a number or a range"),
                                        ("1:2:3,4", "'1:2:3'")])
def test_a_malformed_cells_spec_says_what_is_wrong(cli, made, spec, words):
    code, _, err = cli("trace", "--store", made, "--from", "stars", "--cells", spec, "--to", "raw")
    assert code == 2 and words in one_line(err) and "coordinates but" not in err


def test_show_and_export_take_the_run_as_every_command_does(cli, made, tmp_path):
    code, out, err = cli("show", "--run", "1", "--store", made)
    assert code == 0 and out.startswith("run 1:"), err
    code, out, err = cli("show", "1", "--run", "latest", "--store", made)
    assert code == 2 and "two runs given" in one_line(err)
    code, out, err = cli("export", "--run", "1", "--prov", tmp_path / "p.json", "--store", made)
    assert code == 0 and (tmp_path / "p.json").is_file(), err
