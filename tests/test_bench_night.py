"""Smoke test of ``benchmarks/night.py`` at its smallest: a genomics night of two runs
and two unrelated runs, in-process.  It checks what the benchmark reports (runs found
and touched, answers equal to per-run traces, input bytes in both store layouts), not
how fast anything is."""

import argparse
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

import subzero

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def night():
    spec = importlib.util.spec_from_file_location("night", ROOT / "benchmarks" / "night.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def measured(night, tmp_path_factory):
    work = tmp_path_factory.mktemp("night")
    a = argparse.Namespace(workdir=str(work), jobs=1, unrelated=1, repeats=1, cli_every=False,
                           no_cli=True, cli_repeats=1, column=200, command="test",
                           paired_only=False)
    results: list[dict] = []
    night.workload("genomics", 1, [2], a, results)
    return results, work


def test_impact_reaches_every_night_run_and_matches_traces(measured):
    results, _ = measured
    assert [(r["n"], r["unrelated"], r["phase"]) for r in results] == [
        (2, 0, "night"), (2, 2, "unrelated"), (2, 2, "paired")]
    (p,) = results[2]["paired"].values()
    assert p["runs"] == [2] and p["ratio"] > 0
    for r in results[:2]:
        (row,) = r["queries"].values()
        assert row["runs"] == 2 and row["touched"] == 2 and row["errors"] == 0
        assert row["cells_in"] == 56 * 3 and row["affected"] > 0
    assert results[0]["queries"]["3 patients' values"]["same_as_traces"]


def test_section_and_record_render(night, measured):
    results, _ = measured
    body = night.section(json.loads(json.dumps(results, default=float)))
    assert "genomics 1x" in body and "| 2 |" in body


def test_input_bytes_count_a_shared_inputs_folder_once(night, measured):
    """With each distinct input stored once under ``inputs/`` and runs holding a
    reference, on disk is one copy; copies stay one per run."""
    _, work = measured
    st = subzero.open_store(work / "genomics-1x" / "store")
    night_runs = sorted({rid for rid, _ in st.runs_using(str(night.GENOMICS_MATRIX))})
    before = night.input_bytes(st, night_runs)
    assert before["shared_distinct"] == 1 and before["shared_ratio"] == pytest.approx(1.0)
    digest = st.input_digests(night_runs[0])["matrix"]
    shared = Path(st.path) / "inputs"
    shared.mkdir()
    for k, rid in enumerate(night_runs):            # the layout another branch is adding
        arrays = st.run_dir(rid) / "arrays"
        if k == 0:
            shutil.copytree(arrays / "matrix.zarr", shared / f"{digest.split(':')[1]}.zarr")
        shutil.move(arrays / "matrix.zarr", work / f"moved-{rid}.zarr")
        (arrays / "matrix.sums.json").rename(work / f"moved-{rid}.sums.json")
        (arrays / "matrix.input.json").write_text(json.dumps({"digest": digest}))
    after = night.input_bytes(st, night_runs)
    assert after["shared_copies"] == pytest.approx(before["shared_copies"], rel=0.3)   # a sidecar or not
    assert after["shared_on_disk"] < 0.75 * before["shared_on_disk"]
    assert "its inputs/ entry" in after["copy_size_from"]
