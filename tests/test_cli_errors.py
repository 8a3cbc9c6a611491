"""Every mistake and unusable environment a new user meets, through the real CLI:
one clear line on stderr naming the path or operator, exit 2 (``--debug``, before
or after the command, shows the traceback); read-only and archived stores can be
listed, shown and traced; a closed pipe ends the output quietly."""

import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE, subzero_exe

import subzero
from subzero.errors import StoreError
from subzero.storage.trust import CONFIG_ENV, key_path, load_key


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("subzero: error: "), err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


@pytest.fixture(scope="module")
def shared():
    """A folder every user may enter (pytest's own tmp folders are private to their
    owner, and the read-only tests run the CLI as another user when we are root)."""
    d = Path(tempfile.mkdtemp(prefix="subzero-clierr-"))
    d.chmod(0o755)
    yield d
    _unlock(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def made(shared):
    """A store with one complete run of the example workflow."""
    path = shared / "made"
    with subzero.open_store(path) as st:
        st.run(EXAMPLE, strategies={"stars": "full"})
    for p in [path, *path.rglob("*")]:     # readable by the other user of the read-only tests
        p.chmod(p.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if p.is_dir() else 0))
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


def _key_for_other_user(shared: Path) -> Path:
    """The other user's own config folder holding the session's signing key (as the
    same scientist's key copied to another account): the stores stay trusted, so the
    read-only tests test read-only stores, not trust; and the key stays private."""
    folder = shared / "config-other-user"
    if not folder.exists():
        folder.mkdir(mode=0o700)
        load_key(create=True)           # the session's key (the `made` store is signed by it)
        shutil.copy(key_path(), folder / "key")
        (folder / "key").chmod(0o600)
        for p in (folder, folder / "key"):
            os.chown(p, 65534, 65534)
    return folder


def _other_user() -> list[str]:
    """The command prefix that runs the CLI as a user for whom permissions count:
    nothing when we are not root; root ignores permissions, so then `setpriv` to
    nobody (skip where that is impossible)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permissions cannot be tested")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


def _cli(prefix: list[str], *args, cwd=None):
    env = dict(os.environ, SUBZERO_ENGINE="local")
    if prefix and cwd is not None:
        env[CONFIG_ENV] = str(_key_for_other_user(Path(cwd)))
    p = subprocess.run([*prefix, sys.executable, "-m", "subzero.cli", *map(str, args)],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


# -- --debug, --version ------------------------------------------------------------------

@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_before_or_after_the_command(cli, shell, tmp_path, where):
    missing = tmp_path / "nowhere"
    args = ["runs", "--store", missing]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    with pytest.raises(StoreError, match="no SubZero store"):
        cli(*args)
    code, _, err = shell(*args)
    assert code != 0 and "Traceback" in err and "StoreError: no SubZero store" in err
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
    assert out.startswith("run 1: workflow example")
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
    assert _digest(store) == before     # nothing written, not even the catalog's -wal/-shm


def test_read_only_store_lists_shows_and_traces(made, shared):
    prefix = _other_user()
    store = _copy(made, shared / "ro")
    _lock(store)
    try:
        _read_only_checks(prefix, store, cwd=shared)
    finally:
        _unlock(store)


def test_read_only_store_of_an_older_catalog_version(made, shared):
    """An archived store made by an older SubZero: its catalog is migrated in memory
    only (the file cannot, and must not, change)."""
    prefix = _other_user()
    store = _copy(made, shared / "ro_old")
    db = sqlite3.connect(store / "catalog.sqlite")
    db.execute("PRAGMA user_version = 1")
    db.close()
    _lock(store)
    try:
        _read_only_checks(prefix, store, cwd=shared)
    finally:
        _unlock(store)


def test_catalog_read_only_in_a_writable_folder(made, shared):
    prefix = _other_user()
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
    prefix = _other_user()
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
