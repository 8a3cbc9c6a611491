"""The confusing errors of the fault campaign (issue 28), each now one clear line on
stderr naming the thing, exit 2, through the real CLI and the API: overflowing and
negative numbers in ``--cells`` / ``--run`` / ``--tile``, malformed workload files, a
user's mapping function that raises, a NULL or malformed shape in the catalog, a
garbage FITS input, and a full disk (a real one: a small tmpfs)."""

import contextlib
import json
import shutil
import sqlite3
import subprocess
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE
from test_cli_errors import one_line

import subzero
from subzero.errors import (
    DiskFull,
    OperatorError,
    QueryError,
    SubZeroWarning,
    UsageError,
    WorkloadError,
)

HUGE = "99999999999999999999"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A store with one complete run of the example workflow (stars: 64 x 96)."""
    path = tmp_path_factory.mktemp("clear") / "made"
    with subzero.open_store(path) as st:
        st.run(EXAMPLE, strategies={"stars": "full"})
    return path


@contextlib.contextmanager
def shown_warnings():
    """SubZero's warnings printed as the CLI prints them (the suite makes them errors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("default", SubZeroWarning)
        yield


def _trace(cli, store, *more):
    return cli("trace", "--store", store, "--from", "stars", "--to", "raw", *more)


# -- numbers on the command line ------------------------------------------------------------

def test_overflowing_cells_run_and_tile_are_one_line(cli, made, tmp_path):
    code, _, err = _trace(cli, made, "--cells", f"{HUGE},5")
    assert code == 2 and f"cell ({HUGE}, 5) is outside stars (shape (64, 96))" in one_line(err)
    code, _, err = _trace(cli, made, "--cells", f"3:{HUGE},5")
    assert code == 2 and "outside stars" in one_line(err)
    code, _, err = _trace(cli, made, "--run", HUGE, "--cells", "1,1")
    assert code == 2 and f"unknown run '{HUGE}'" in one_line(err)
    code, _, err = cli("show", HUGE, "--store", made)
    assert code == 2 and f"unknown run '{HUGE}'" in one_line(err)
    with pytest.raises(SystemExit) as e:          # argparse's own one-line refusal
        cli("run", EXAMPLE, "--store", tmp_path / "st", "--tile", HUGE)
    assert e.value.code == 2
    with subzero.open_store(made) as st:
        with pytest.raises(QueryError, match="unknown run"):
            st.get(int(HUGE))
        with pytest.raises(QueryError, match="64 bits"):
            st.get(1).trace("stars", [(int(HUGE), 5)], to="raw")
        with pytest.raises(QueryError, match="must be integers"):
            st.get(1).trace("stars", [(1e300, 5)], to="raw")
    with subzero.open_store(tmp_path / "api") as st:
        with pytest.raises(UsageError, match="`tile` must be a whole number"):
            st.run(EXAMPLE, tile=int(HUGE))
        assert st.runs() == []          # refused before anything was recorded


NEGATIVE = "coordinates count from 0, and negative ones are not counted from the end"


@pytest.mark.parametrize("form", [["--cells", "-1,5"], ["--cells=-1,5"], ["--cells", "-1:3,5"]])
def test_negative_cells_are_refused_as_the_api_refuses_them(cli, made, form):
    """Negative coordinates are not Python-style indices, on the command line as in the
    API: refused with one line saying so (argparse no longer takes ``-1,5`` for an
    option)."""
    code, _, err = _trace(cli, made, *form)
    line = one_line(err)
    assert code == 2 and "outside stars" in line and "usage:" not in err
    if ":" in form[-1]:
        return
    with subzero.open_store(made) as st, pytest.raises(QueryError) as e:
        st.get(1).trace("stars", [(-1, 5)], to="raw")
    assert line == f"subzero: error: {e.value}"
    assert NEGATIVE in line and "cell (-1, 5) is outside stars (shape (64, 96))" in line


def test_negative_cells_through_the_console_script(shell, made):
    code, _, err = shell("trace", "--store", made, "--from", "stars", "--cells", "-1,5",
                         "--to", "raw")
    assert code == 2 and NEGATIVE in one_line(err)
    code, out, err = shell("trace", "--store", made, "--from", "stars", "--cells", "1,5",
                           "--to", "raw", "--json")
    assert code == 0, err
    assert json.loads(out)["cells_in"] == 1


# -- workload files -------------------------------------------------------------------------

BAD_SELECTORS = [
    ({"where": "stars > 0", "n": -3}, '"n" (cells to pick) must be a whole number of 1 or more, not -3'),
    ({"where": "stars > 0", "n": 0}, '"n" (cells to pick) must be a whole number of 1 or more'),
    ({"where": "stars > 0", "seed": "abc"}, '"seed" must be a whole number of 0 or more, not "abc"'),
    ({"where": "stars > 0", "seed": -1}, '"seed" must be a whole number of 0 or more, not -1'),
    ({"where": "stars > 0", "n": float("nan")}, "not NaN"),
    ({"where": "stars > 0", "distinct": "yes"}, '"distinct" must be true or false'),
    ([[1.5, 2]], '"cells" coordinate must be a whole number, not 1.5'),
    ([[float("nan"), 2]], '"cells" coordinate must be a whole number, not NaN'),
    ([[1, "2"]], '"cells" coordinate must be a whole number, not "2"'),
    ([[1, 2], [3]], '"cells" must be a list of cells of equal length'),
    ([[1, 2, 3]], "its cells have 3 coordinates, but stars has 2 dimensions"),
    ([[int(HUGE), 1]], f"cell ({HUGE}, 1) is outside stars"),
    ([[-1, 1]], NEGATIVE),
    ({"box": [[0, 0], [float("inf"), 5]]}, '"box" coordinate must be a whole number, not Infinity'),
    ({"box": [[0, 0], [10**9, 10**9]]}, "is not a non-empty box inside stars"),
    ({"box": [[5, 5], [5, 9]]}, "is not a non-empty box inside stars"),
]


def _workload(tmp_path, cells, **extra) -> Path:
    p = tmp_path / "w.json"
    p.write_text(json.dumps({"queries": [{"name": "Q", "from": "stars", "to": "raw",
                                          "cells": cells, **extra}]}))
    return p


@pytest.mark.parametrize("cells,msg", BAD_SELECTORS)
def test_malformed_workload_queries_are_one_line(cli, made, tmp_path, cells, msg):
    w = _workload(tmp_path, cells)
    code, _, err = cli("trace", "--store", made, "--workload", w)
    line = one_line(err)
    assert code == 2 and msg in line and "'Q'" in line, line
    from subzero.query.workload import load_workload, select_cells
    with subzero.open_store(made) as st, pytest.raises((WorkloadError, QueryError), match="'Q'"):
        select_cells(st.get(1), load_workload(w)[0])


@pytest.mark.parametrize("size,msg", [(-4, "not -4"), (float("inf"), "not Infinity"),
                                      ("ten", 'not "ten"'), (2.5, "not 2.5")])
def test_optimize_workload_size_is_checked_before_any_work(cli, tmp_path, size, msg):
    p = tmp_path / "w.json"
    p.write_text(json.dumps({"queries": [{"name": "S", "from": "stars", "to": "raw",
                                          "size": size}]}))
    code, _, err = cli("optimize", EXAMPLE, "--store", tmp_path / "st", "--workload", p,
                       "--max-disk", "1MB")
    line = one_line(err)
    assert code == 2 and '"size" (cells to pick) must be a whole number of 1 or more' in line
    assert msg in line


def test_optimize_workload_selector_is_checked(cli, tmp_path):
    w = _workload(tmp_path, {"where": "stars > 0", "seed": "abc"})
    code, _, err = cli("optimize", EXAMPLE, "--store", tmp_path / "st", "--workload", w,
                       "--max-disk", "1MB")
    assert code == 2 and '"seed" must be a whole number' in one_line(err)


# -- a user's mapping function that raises ----------------------------------------------------

RAISING = textwrap.dedent('''
    import numpy as np
    from subzero import Mode, Operator, Workflow

    class Boom(Operator):
        def supported_modes(self):
            return {Mode.MAP, Mode.PAY, Mode.BLACKBOX}

        def run(self, ctx, a):
            if Mode.PAY in ctx.modes:
                ctx.lwrite(np.argwhere(a > -1), payload=b"x", each=True)
            return a + 1

        def map_b(self, cells, i, ctx):
            raise ZeroDivisionError("boom in map_b")

        def map_f(self, cells, i, ctx):
            return {}["nokey"]

        def map_p(self, cells, payload, i, ctx):
            raise ValueError("bad payload")

    def workflow():
        wf = Workflow("raising")
        wf.add("boom", Boom(), wf.input("a", default=np.zeros((8, 8))))
        return wf
''')


@pytest.mark.parametrize("strategy,frm,to,fn,cause", [
    ("map", "boom", "a", "map_b", "ZeroDivisionError: boom in map_b"),
    ("map", "a", "boom", "map_f", "KeyError: 'nokey'"),
    ("pay", "boom", "a", "map_p", "ValueError: bad payload"),
])
def test_a_raising_mapping_function_names_the_operator_and_function(cli, tmp_path, strategy, frm,
                                                                     to, fn, cause):
    wf = tmp_path / "raising.py"
    wf.write_text(RAISING)
    store = tmp_path / "st"
    code, _, err = cli("run", wf, "--store", store, "--strategy", f"boom={strategy}", "-q")
    assert code == 0, err
    code, _, err = cli("trace", "--store", store, "--from", frm, "--cells", "1,1", "--to", to)
    line = one_line(err)
    assert code == 2 and f"operator 'boom' (Boom): its {fn} raised {cause}" in line
    with subzero.open_store(store) as st, pytest.raises(OperatorError, match=f"its {fn} raised"):
        st.get(1).trace(frm, [(1, 1)], to=to)


def test_a_raising_map_p_at_capture_fails_the_run_in_one_line(cli, tmp_path):
    wf = tmp_path / "raising.py"
    wf.write_text(RAISING)
    code, _, err = cli("run", wf, "--store", tmp_path / "st", "--strategy",
                       "boom=pay:payone:forward")
    assert code == 2 and "operator 'boom' (Boom): its map_p raised ValueError" in one_line(err)


# -- the catalog's shapes ----------------------------------------------------------------------

@pytest.mark.parametrize("sql,what,shown", [
    ("UPDATE arrays SET shape=NULL WHERE name='stars'", "array 'stars'", "NULL"),
    ("UPDATE arrays SET shape='\"abc\"' WHERE name='stars'", "array 'stars'", "abc"),
    ("UPDATE arrays SET shape='[64, -3]' WHERE name='stars'", "array 'stars'", "[64, -3]"),
    ("UPDATE ops SET shape=NULL WHERE name='stars'", "operator 'stars'", "NULL"),
    ("UPDATE ops SET shape='[64, 1.5]' WHERE name='stars'", "operator 'stars'", "1.5"),
])
def test_a_null_or_malformed_shape_in_the_catalog_is_one_line(cli, made, tmp_path, sql, what,
                                                               shown):
    store = tmp_path / "st"
    shutil.copytree(made, store)
    cat = store / "catalog.sqlite"
    with subzero.open_store(store) as st:
        want = st.get(1).trace("stars", [(1, 1)], to="raw").cells.tolist()
    with contextlib.closing(sqlite3.connect(cat)) as db:
        db.execute(sql)
        db.commit()
    # a signed run is traced from its record: the edited row steers nothing, and show says so
    with subzero.open_store(store) as st:
        assert st.get(1).trace("stars", [(1, 1)], to="raw").cells.tolist() == want
    code, out, err = cli("show", "1", "--store", store)
    assert code == 0 and "the catalog differs from the run's signed record" in out, out + err
    # a run whose record is not signed with this key has only the catalog to go by
    (store / "runs" / "1" / "signature").unlink()
    for args in (["trace", "--from", "stars", "--cells", "1,1", "--to", "raw"], ["show", "1"]):
        code, _, err = cli(*args, "--store", store)
        line = one_line(err)
        assert code == 2, (args, err)
        assert "run 1" in line and what in line and str(cat) in line and shown in line, line
    with shown_warnings():                              # the others are still listed
        code, out, err = cli("runs", "--store", store)
    assert code == 0 and "damaged" in out and "subzero: warning: run 1: " in err and what in err
    with subzero.open_store(store) as st, pytest.raises(subzero.StoreError, match=what):
        st.get(1).trace("stars", [(1, 1)], to="raw")


# -- a garbage FITS input -----------------------------------------------------------------------

@pytest.mark.parametrize("content", [
    lambda: np.random.default_rng(3).integers(0, 256, 5000, dtype=np.uint8).tobytes(),
    lambda: b"SIMPLE  =                    T".ljust(80),
    lambda: b"".join(c.ljust(80) for c in (b"SIMPLE  =                    T",
                                            b"BITPIX  =                   16", b"NAXIS   =  2",
                                            b"NAXIS1  =                  100",
                                            b"NAXIS2  =                  100", b"END")),
], ids=["random", "one-card", "header-only"])
def test_a_garbage_fits_input_is_one_line_without_astropy_chatter(shell, tmp_path, content):
    bad = tmp_path / "bad.fits"
    bad.write_bytes(content())
    code, out, err = shell("run", EXAMPLE, "--engine", "local", "--store", tmp_path / "st",
                           "--input", f"raw={bad}")
    line = one_line(err)            # astropy's own warnings (several lines) are silenced
    assert code == 2 and "input 'raw'" in line and str(bad) in line
    assert "is not a readable FITS file" in line and "WARNING" not in err
    with subzero.open_store(tmp_path / "api") as st, \
            pytest.raises(subzero.SubZeroError, match="is not a readable FITS file"):
        st.run(EXAMPLE, inputs={"raw": str(bad)})


# -- a full disk ----------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A folder on a tmpfs of its own, remounted to the size a test asks for; skipped where
    this process may not mount (not root, or no mount namespace)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount(8)")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({p.stderr.strip()})")

    def resize(size: str) -> Path:
        for child in disk.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)
        return disk
    yield resize
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_while_writing_a_run_says_so_naming_the_folder(cli, small_disk):
    """At every size, from too small for the inputs to too small for the R-trees of
    the lineage, the run either completes or fails in one line saying the disk is full
    (never an RTreeError, an LMDB DiskError or a damaged catalog)."""
    kinds = set()
    for size in ("200k", "400k", "600k", "800k", "1m", "1200k", "3m"):
        disk = small_disk(size)
        store = disk / "st"
        code, out, err = cli("run", EXAMPLE, "--engine", "local", "--store", store,
                             "--strategy", "stars=full:fullmany:backward",
                             "--strategy", "clean=full:fullmany:forward", "-q")
        if code == 0:
            kinds.add("complete")
            continue
        line = one_line(err)
        assert code == 2 and line.startswith("subzero: error: the disk is full: "), (size, err)
        assert str(store) in line, line
        kinds.add("lineage" if "the lineage of operator" in line else "run")
    assert {"lineage", "run", "complete"} <= kinds, kinds


def test_a_full_disk_under_the_api_is_disk_full_whichever_library_hit_it(small_disk):
    """The same through the API: DiskFull every time, its cause the library's own error
    (the R-tree's "corrupted data file", LMDB's DiskError, an OSError from Zarr)."""
    causes = set()
    for size in ("200k", "600k", "800k", "1m"):
        disk = small_disk(size)
        with subzero.open_store(disk / "st") as st, pytest.raises(DiskFull) as e:
            st.run(EXAMPLE, strategies={"stars": "full:fullmany:backward",
                                        "clean": "full:fullmany:forward"}, progress=False)
        assert str(e.value).startswith("the disk is full: ") and str(disk / "st") in str(e.value)
        causes.add(type(e.value.__cause__).__name__)
    assert causes & {"RTreeError", "DiskError"} and "OSError" in causes, causes


def test_a_store_on_a_full_disk_is_read_and_refuses_runs_in_one_line(cli, small_disk):
    disk = small_disk("1500k")
    store = disk / "st"
    code, _, err = cli("run", EXAMPLE, "--engine", "local", "--store", store, "-q")
    assert code == 0, err
    with open(disk / "fill", "wb", buffering=0) as f:      # 0 bytes left (unbuffered: no flush at close)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    for side in ("-wal", "-shm"):       # what SQLite must make again before it may write
        Path(str(store / "catalog.sqlite") + side).unlink(missing_ok=True)
    code, out, err = cli("runs", "--store", store)
    assert code == 0 and "complete" in out and "damaged" not in out + err, err
    with shown_warnings():
        code, out, err = cli("trace", "--store", store, "--from", "stars", "--cells", "3,3",
                             "--to", "raw")
    assert code == 0 and "1 cell(s) in" in out and "damaged" not in err
    assert f"subzero: warning: the disk of store {store} is full: this trace is not added" in err
    code, _, err = cli("run", EXAMPLE, "--engine", "local", "--store", store)
    line = one_line(err)
    assert code == 2 and "the disk is full" in line and str(store) in line
    assert "damaged" not in line
    with subzero.open_store(store) as st, pytest.raises(DiskFull, match="the disk is full"):
        st.run(EXAMPLE)
