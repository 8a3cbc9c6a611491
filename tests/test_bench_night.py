"""Smoke test of ``benchmarks/night.py`` at its smallest: a genomics night of two runs
and two unrelated runs, in-process.  It checks what the benchmark reports (runs found
and touched, answers equal to per-run traces, input bytes in both store layouts), not
how fast anything is."""

import argparse
import importlib.util
import json
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
        for row in r["queries"].values():          # the default engine, and each one named
            assert row["runs"] == 2 and row["touched"] == 2 and row["errors"] == 0
            assert row["cells_in"] == 56 * 3 and row["affected"] > 0
    assert results[0]["queries"]["3 patients' values"]["same_as_traces"]


def test_section_and_record_render(night, measured):
    results, _ = measured
    body = night.section(json.loads(json.dumps(results, default=float)))
    assert "genomics 1x" in body and "| 2 |" in body


def test_input_bytes_count_a_shared_input_once(night, measured):
    """Each distinct input is stored once under ``inputs/``: the night's shared table is
    one copy on disk against one copy per run."""
    _, work = measured
    st = subzero.open_store(work / "genomics-1x" / "store")
    night_runs = sorted({rid for rid, _ in st.runs_using(str(night.GENOMICS_MATRIX))})
    got = night.input_bytes(st, night_runs)
    assert len(night_runs) == 2 and got["shared_distinct"] == 1
    assert got["shared_ratio"] == pytest.approx(0.5)
    hexd = st.input_digests(night_runs[0])["matrix"].split(":")[1]
    copy = [p for p in (Path(st.path) / "inputs").iterdir() if p.name.startswith(hexd)]
    assert len(copy) == 2                                   # the copy and its checksum file
    assert got["shared_on_disk"] == sum(p.stat().st_size if p.is_file() else sum(
        f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in copy)
