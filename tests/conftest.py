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


@pytest.fixture(scope="session", autouse=True)
def user_cache_dir(tmp_path_factory):
    """Nor the real user's cache (``~/.cache/subzero``, where a calibration made on a
    quiet machine is kept for the user's other stores): $SUBZERO_CACHE_DIR points at a
    folder of this session's."""
    folder = tmp_path_factory.mktemp("subzero-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SUBZERO_CACHE_DIR", str(folder))     # optimizer.calibration.CACHE_ENV
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


#: the long end-to-end sweeps, marked ``slow``: `make test` leaves them out so that a
#: developer's run takes minutes, `make test-slow` runs them, and CI runs both (every
#: test).  Each took 15 s or more in a timed run of the whole suite (`--durations`, 2
#: cores), or 12 s or more on a slower machine (November 2026): whole workflows on
#: Spark, real exposures, fault campaigns, the widest property sweeps, the longest
#: guide pages (the README's and the tutorial's too, 17-22 s each of CPU: each runs the
#: LSST workflow and traces it as a user does, which quicker tests of the same commands
#: cover block by block; CI still runs every block).  The suite's core oracle
#: (test_oracle_property.py's single operators) stays quick however long it takes.  A
#: whole file is named by its name, a test by FILE::FUNCTION (every parameter of it),
#: one parameter of it by FILE::FUNCTION[ID].
SLOW = frozenset({
    "test_astronomy.py", "test_spark_cluster.py",
    "test_array_integrity.py::test_spark_region_written_array_is_checksummed",
    "test_bench_optimizer_scale.py::test_one_size_reports_every_query_under_every_strategy",
    "test_binding.py::test_random_swaps_between_two_runs_never_change_an_answer_silently",
    "test_binding.py::test_spark_writes_bound_arrays_and_shards",
    "test_commit_crash.py::test_a_kill_at_any_point_of_the_commit_loses_nothing",
    "test_commit_crash.py::test_spark_kill_at_the_commit_loses_nothing",
    "test_components.py::test_spark_labels_and_lineage_equal_in_process",
    "test_docs.py::test_page_blocks_run_with_the_slow_ones",
    "test_docs_pages.py::test_long_page_blocks_run",
    "test_cellset.py::test_a_small_forward_trace_through_r_trees_on_a_large_image_costs_its_answer",
    "test_statistic.py::test_cosmic_rays_per_tile_under_the_halo_equal_the_whole_image",
    "test_components.py::test_star_finding_on_a_real_exposure_per_tile",
    "test_coords.py::test_inputs_and_derived_arrays_carry_the_files_wcs",
    "test_equivalence.py::test_all_strategies_agree_on_example",
    "test_explore.py::test_click_star_peak_highlights_exactly_its_raw_pixels",
    "test_explore.py::test_go_to_a_sky_position_traces_the_cells_it_names",
    "test_export.py::test_read_only_store_exports",
    "test_faults.py::test_damaged_stores_answer_exactly_or_with_a_clear_error",
    "test_impact_many.py::test_impact_from_the_command_line_on_both_engines",
    "test_integrity.py::test_every_damaged_value_is_noticed_and_answered_exactly",
    "test_lineage_capture.py::test_key_block_size_of_an_older_store_is_kept",
    "test_optimizer.py::test_budget_sweep_fits_and_cost_falls",
    "test_oracle_property.py::test_many_traced_runs_in_one_process",
    "test_oracle_property.py::test_multi_step_traces_match_composed_oracle",
    "test_oracle_property.py::test_single_operator_matches_oracle_more",
    "test_rerun.py::test_a_flat_fix_on_the_real_exposures_recomputes_a_few_tiles",
    "test_rerun.py::test_a_rerun_is_a_full_run_on_the_new_inputs",
    "test_rerun.py::test_a_rerun_killed_midway_resumes_or_cleans_and_its_parent_stays_whole",
    "test_rerun.py::test_a_rerun_of_a_spark_run_equals_a_full_spark_run",
    "test_rerun.py::test_cosmic_rays_rerun_where_the_sky_median_reaches",
    "test_rerun.py::test_many_reruns_as_a_spark_job_equal_reruns_in_process",
    "test_resume.py::test_spark_driver_killed_then_resumed",
    "test_shared_inputs.py::test_a_kill_while_publishing_an_input_loses_nothing",
    "test_spark.py::test_a_spark_session_writes_and_prunes_only_its_own_log_folder",
    "test_spark.py::test_an_operator_that_ends_the_process_is_an_operator_error",
    "test_spark.py::test_cli_engine_flags",
    "test_spark.py::test_ctrl_c_during_a_spark_run_is_one_line_and_marks_the_run",
    "test_spark.py::test_example_identical_to_local",
    "test_spark.py::test_operator_failure_names_operator_and_tile",
    "test_spark.py::test_ready_workflows_identical_on_spark",
    "test_spark.py::test_reductions_run_as_spark_aggregations",
    "test_spark.py::test_spark_scratch_files_stay_in_subzeros_folder",
    "test_statistic.py::test_a_wrong_fill_value_changes_the_cleaned_image",
    "test_statistic.py::test_real_exposure_per_tile_in_process",
    "test_statistic.py::test_spark_cosmic_rays_per_tile_equal_in_process",
    "test_tile_reexec.py::test_spark_run_traces_through_tiles",
    "test_keep.py::test_every_answer_is_the_same_whatever_is_kept[spark]",
    "test_keep.py::test_cli_plan_says_which_arrays_it_keeps",
    "test_reach_property.py::test_forward_traces_with_a_declared_reach_match_the_oracle",
    "test_limited_reexec.py::test_backward_on_random_boxes",
    "test_lineage_determinism.py::test_reexecution_answers_deterministic_lineage_and_refuses_random_lineage",
    "test_chunkwrite.py::test_chunks_written_directly_are_the_files_zarr_writes",
    "test_input_regions.py::test_spark_executors_read_the_inputs",
    "test_docs.py::test_page_blocks_run[docs/guide/explore.md]",
    "test_docs.py::test_page_blocks_run[docs/guide/tracing.md]",
    "test_docs_pages.py::test_page_blocks_run[README.md]",
    "test_docs_pages.py::test_page_blocks_run[docs/tutorial.md]",
})


@pytest.hookimpl(tryfirst=True)          # before -m deselects by the marks set here
def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONG_FILES)}
    items.sort(key=lambda it: rank.get(it.path.name, len(LONG_FILES)))      # stable within a file
    named = set()
    for it in items:
        keys = (it.path.name, f"{it.path.name}::{getattr(it, 'originalname', it.name)}",
                f"{it.path.name}::{it.name}")
        hit = next((k for k in keys if k in SLOW), None)
        if hit is not None:
            it.add_marker(pytest.mark.slow)
            named.add(hit)
    # a renamed or removed test must leave this list too, or it would silently run fast
    stale = {k for k in SLOW if k.split("::")[0] in {it.path.name for it in items}} - named
    if stale and not config.getoption("keyword"):
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that do not exist: {sorted(stale)}")


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


#: where older sessions' temporary folders wait for their removal in the background
TRASH = ".subzero-trash-"


def pytest_sessionstart(session):
    """Older sessions' temporary folders are removed in the background while this one
    runs, not at its end: pytest keeps the last three sessions' and removes the one
    before when a session ends, and a session's stores are some 55,000 files and 1.6 GB
    (40 s of `make test`'s end on a developer's machine; a fresh clone's first sessions,
    as CI makes them, have none).  The very folders pytest would remove (numbered at
    least ``tmp_path_retention_count`` below this session's, and not locked by a session
    still running) are renamed out of its way at once and removed by a low-priority
    ``rm`` this session does not wait for; what one leaves is swept by the next."""
    import re
    import uuid
    config = session.config
    factory = getattr(config, "_tmp_path_factory", None)
    if (os.environ.get("PYTEST_XDIST_WORKER") or config.option.basetemp or factory is None
            or not shutil.which("rm") or not shutil.which("nice")):
        return
    base = factory.getbasetemp()
    number = re.fullmatch(r"pytest-(\d+)", base.name)
    if number is None:
        return
    last = int(number.group(1)) - int(config.getini("tmp_path_retention_count"))
    trash = [p for p in base.parent.glob(TRASH + "*") if p.is_dir() and not p.is_symlink()]
    for p in base.parent.glob("pytest-*"):
        old = re.fullmatch(r"pytest-(\d+)", p.name)
        if (old is None or int(old.group(1)) > last or p.is_symlink() or not p.is_dir()
                or (p / ".lock").exists()):
            continue
        moved = base.parent / f"{TRASH}{uuid.uuid4().hex}"
        try:
            p.rename(moved)
        except OSError:
            continue
        trash.append(moved)
    if trash:
        subprocess.Popen(["nice", "-n", "19", "rm", "-rf", "--", *map(str, trash)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
