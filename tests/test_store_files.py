"""A store's files that are not what they claim to be (issue 28): a FIFO, a link to
/dev/zero, or a file far larger than SubZero ever writes there, in place of a run's
signature, workflow.pkl, array metadata or digest file, LMDB file or R-tree file, or
of the signing key.  Before, `subzero runs`, `show` and traces followed the link and
read without end (past 4 GB), or blocked on the FIFO forever.  Now no command hangs or
reads without bound: each is damage of that piece, said in one line naming the file
(an untrusted run, a damaged array, stored lineage answered another way).

Every command runs in a subprocess with a time limit and a 3 GB address-space limit,
so a hang or an unbounded read fails the test instead of the machine."""

import json
import os
import resource
import shutil
import subprocess

import pytest
from conftest import EXAMPLE, subzero_exe

import subzero

STRATEGIES = {"clean": "full:fullmany:backward", "stars": "full"}
FAULTS = ["fifo", "link", "huge"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One run of the example workflow (an R-tree for 'clean'), copied for each case,
    and the answers of the traces the cases ask."""
    path = tmp_path_factory.mktemp("pristine") / "s"
    with subzero.open_store(path) as st:
        run = st.run(EXAMPLE, strategies=STRATEGIES, progress=False)
        answers = {"stars->raw": run.trace("stars", [(40, 70)], to="raw").cells.tolist()}
    return path, answers


def plant(path, fault: str, huge: int) -> None:
    """Replace the file at ``path`` with the fault (``huge``: a sparse file of this size)."""
    path.unlink()
    if fault == "fifo":
        os.mkfifo(path)
    elif fault == "link":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate(huge)


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def sz(*args, env=None):
    p = subprocess.run([subzero_exe(), *map(str, args)], capture_output=True, text=True,
                       timeout=90, preexec_fn=limited, env=env)
    return p.returncode, p.stdout, p.stderr


def said(fault: str, size: int) -> str:
    """How the error goes on after naming the file."""
    return {"fifo": "is a FIFO (named pipe), not a regular file",
            "link": "is a symbolic link, not a regular file",
            "huge": f"holds {size} bytes, more than SubZero ever writes there"}[fault]


@pytest.fixture
def copy(pristine, tmp_path):
    path, answers = pristine
    dest = tmp_path / "s"
    shutil.copytree(path, dest, symlinks=True)
    return dest, answers


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name,what", [("signature", "the signature file"),
                                       ("workflow.pkl", "the workflow pickle")])
def test_a_signature_or_pickle_that_is_no_file_makes_the_run_untrusted(copy, fault, name, what):
    path, _ = copy
    target = path / "runs" / "1" / name
    plant(target, fault, 2 << 30)
    why = said(fault, 2 << 30)
    code, out, err = sz("runs", "--json", "--store", path)
    assert code == 0, err
    assert json.loads(out)[0]["trust"] == "damaged"
    code, out, err = sz("show", "1", "--store", path)
    assert code == 0, err
    assert f"NOT trusted: {what} {target} {why}" in out
    code, out, err = sz("trace", "--from", "stars", "--cells", "40,70", "--to", "raw", "--store", path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{what} {target} {why}" in err and "subzero trust" in err


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", ["stars.sums.json", "stars.zarr/zarr.json",
                                  "stars.zarr/data/zarr.json"])
def test_array_metadata_that_is_no_file_is_a_damaged_array(copy, fault, name):
    path, _ = copy
    target = path / "runs" / "1" / "arrays" / name
    plant(target, fault, 64 << 20)
    code, out, err = sz("trace", "--from", "raw", "--cells", "40,70", "--to", "stars", "--store", path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"subzero: error: array 'stars' of run 1 is damaged: metadata file "
                          f"{target} {said(fault, 64 << 20)}"), err


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", ["data.mdb", "rtree"])
def test_lineage_files_that_are_no_files_are_answered_another_way(copy, fault, name):
    path, answers = copy
    folder = path / "runs" / "1" / "lineage"
    target = folder / "data.mdb" if name == "data.mdb" else next((folder / "rtree").glob("*.idx"))
    plant(target, fault, 2 << 30)
    code, out, err = sz("trace", "--from", "stars", "--cells", "40,70", "--to", "raw", "--json",
                        "--store", path)
    assert code == 0, err
    assert json.loads(out)["cells"] == answers["stars->raw"]
    warned = [ln for ln in err.splitlines() if str(target) in ln or target.name in ln]
    assert warned and "answering this step another way" in warned[0], err
    assert ("not a regular file" in warned[0]) if fault != "huge" else True


@pytest.mark.parametrize("fault", ["fifo", "huge"])
def test_a_key_that_is_no_file_is_one_line(copy, fault, tmp_path):
    path, _ = copy
    from subzero.storage.trust import CONFIG_ENV, key_path
    key = key_path()
    config = tmp_path / "config"
    config.mkdir()
    shutil.copy(key, config / key.name)
    plant(config / key.name, fault, 1 << 30)
    code, out, err = sz("runs", "--store", path, env={**os.environ, CONFIG_ENV: str(config)})
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"the SubZero signing key {config / key.name} {said(fault, 1 << 30)}" in err
