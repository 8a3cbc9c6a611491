import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "workflows" / "example.py")


@pytest.fixture(scope="session", autouse=True)
def signing_key_dir(tmp_path_factory):
    """Tests sign their runs with a key of their own, never the real user's
    (``~/.config/subzero/key``): $SUBZERO_CONFIG_DIR points at a folder made for this
    session (subprocesses such as the `shell` fixture's inherit it)."""
    from subzero.storage.trust import CONFIG_ENV
    folder = tmp_path_factory.mktemp("subzero-config")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CONFIG_ENV, str(folder))
        yield folder


@pytest.fixture
def store(tmp_path):
    import subzero
    st = subzero.open_store(tmp_path / "store")
    yield st
    st.close()


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from subzero.cli import main

    def run(*args):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def subzero_exe() -> str:
    exe = Path(sys.executable).with_name("subzero")
    return str(exe) if exe.exists() else shutil.which("subzero")


@pytest.fixture
def shell(tmp_path):
    """Run the installed `subzero` console script in a subprocess."""
    def run(*args, cwd=None):
        p = subprocess.run([subzero_exe(), *map(str, args)], capture_output=True, text=True,
                           cwd=cwd or tmp_path, timeout=300)
        return p.returncode, p.stdout, p.stderr
    return run


# The CLI's default engine is Spark; tests of everything else run the
# in-process engine (the Spark tests ask for Spark explicitly).
os.environ.setdefault("SUBZERO_ENGINE", "local")


def java_ok() -> bool:
    from subzero.engines.spark.session import java_version
    v = java_version()
    return v is not None and v >= 17


@pytest.fixture(scope="session")
def calibration(tmp_path_factory):
    """One real calibration of the optimizer's cost model (quick: one repeat), shared by
    every test that optimizes or plans (it takes tens of seconds): under xdist, by
    every worker of this session too (the first makes it, under a lock, in the
    session's own temporary folder; the others read it), as the catalog keeps it (JSON)."""
    import fcntl
    import json

    from subzero.optimizer.calibration import calibrate
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return json.loads(json.dumps(calibrate(repeats=1)))
    shared = tmp_path_factory.getbasetemp().parent      # this session's, all workers'
    made = shared / "calibration.json"
    with open(shared / "calibration.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if made.exists():
            return json.loads(made.read_text())
        cal = calibrate(repeats=1)
        made.write_text(json.dumps(cal))
        return cal


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for the whole test session (local mode, task retries on)."""
    if not java_ok():
        pytest.skip("Java 17+ is not installed: the Spark engine cannot run (install "
                    "openjdk-17-jre-headless)")
    from subzero.engines.spark.session import session
    s = session("local[2,2]")
    yield s


from subzero import Operator  # noqa: E402


class Ident(Operator):
    """The identity operator with mapping functions, shared by the tests."""

    def run(self, ctx, x):
        return x

    def map_b(self, cells, i, ctx):
        return cells

    def map_f(self, cells, i, ctx):
        return cells


def unbound_runs(monkeypatch):
    """Runs begun from now on are made as before runs had uids (issue 28): no uid, so
    their arrays and lineage are written unbound (checksum sidecars of format 1,
    lineage in ``metadata.WRITE_FORMAT``) and read as such."""
    import subzero.runs.transaction as transaction
    monkeypatch.setattr(transaction, "new_uid", lambda: None)


#: the test files that take longest (a minute or more on 2 cores, Spark and subprocess
#: heavy), run first: `make test` hands whole files to two workers in collection order,
#: and a long file started last would leave one core idle at the end
LONG_FILES = ("test_commit_crash.py", "test_spark_cluster.py", "test_spark.py", "test_oracle_property.py",
              "test_components.py", "test_faults.py", "test_astronomy.py", "test_resume.py",
              "test_binding.py", "test_bench_optimizer_scale.py", "test_cli_errors.py",
              "test_integrity.py", "test_stages.py", "test_statistic.py", "test_spark_failures.py",
              "test_shards.py", "test_explore.py", "test_optimizer.py", "test_rerun.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONG_FILES)}
    items.sort(key=lambda it: rank.get(it.path.name, len(LONG_FILES)))      # stable within a file


def copied_store(src: Path, dest: Path):
    """A copy of a store built once for a module (``src``), opened at ``dest``, for one
    test to change; closed after it (``yield from copied_store(...)`` in a fixture)."""
    import subzero
    shutil.copytree(src, dest)
    st = subzero.open_store(dest)
    yield st
    st.close()


def stored_path(run_dir, name: str) -> Path:
    """Where a run keeps array ``name``: its own folder, or the store's copy of an input it
    shares with other runs (``runs/<id>/arrays/<name>.input.json`` names it)."""
    from subzero.storage import shared
    run_dir = Path(run_dir)
    ref = shared.read_ref(run_dir / "arrays" / f"{name}{shared.REF}", name)
    if ref is None:
        return run_dir / "arrays" / f"{name}.zarr"
    return run_dir.parent.parent / shared.INPUTS / f"{ref.key}.zarr"
