"""Smoke test of the optimizer scale sweep (``benchmarks/optimizer_scale.py``) at a tiny
size: genomics at 1x, in-process and through the script's command line with ``--add``.
It checks what the sweep reports, not how fast anything is."""

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from subzero.query.workload import load_workload, select_cells

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("optimizer_scale",
                                                  ROOT / "benchmarks" / "optimizer_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def measured(sweep, calibration, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    r = sweep.measure("genomics", 1, folder, calibration, repeats=1, query_seconds=0.01)
    r.update(took_s=1.0, flow="genomics", size=1.0)
    return r, folder


def test_one_size_reports_every_query_under_every_strategy(sweep, measured):
    r, _ = measured
    names = [q.name for q in load_workload(sweep.bench.FLOWS["genomics"]["workload"])]
    assert list(r["queries"]) == names
    for q in r["queries"].values():
        for kind in sweep.KINDS:
            assert q[kind]["s"] > 0 and q[kind]["methods"]
        assert q["cells_out"] > 0
    # BlackBox re-executes: none of its steps reads stored lineage; the plan stores some
    assert not any(m.startswith("stored") for q in r["queries"].values() for m in q["blackbox"]["methods"])
    assert r["disk"]["plan"] > 0 and r["plan"]["disk"] > 0
    assert set(r["plan"]["queries"]) == set(names)
    assert r["optimize_s"] > r["reoptimize_s"] > 0         # the first one profiled the workflow
    s = sweep.summarise(r)
    assert s["cost"]["plan"] == pytest.approx(sum(q["plan"]["s"] for q in r["queries"].values()))
    assert all(math.isfinite(v) and v >= 0 for v in s["query_error"].values())
    assert s["end_to_end"] > s["plan_run_ratio"] > 0


def test_targets_and_report(sweep, measured, tmp_path):
    r, _ = measured
    t = sweep.targets(r)
    assert len(t) == 6 and all(isinstance(ok, bool) for _, _, ok in t)
    big = dict(r, size=float(sweep.BIG_GENOMICS))     # the 10,000x-only targets join in
    assert [w for w, _, _ in sweep.targets(big)][6:] == [
        "FQ0 under 10 ms", "no query slower under the plan than under the defaults"]
    results = {sweep.key("genomics", 1): r, "genomics:2": {"error": "MemoryError", "took_s": 3}}
    lines, met, total = sweep.target_table(results)
    assert total == 6 and 0 <= met <= 6 and len(lines) == 2 + 6
    text = "\n".join(sweep.tables(results))
    assert "genomics 1x" in text and "failed: MemoryError" in text
    for q in r["queries"]:
        assert f"| genomics 1x | {q} |" in text
    sweep.plot(results, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_a_plan_that_answers_differently_is_refused(sweep, measured):
    """The check the sweep applies to every query: the plan's cells against the defaults'
    and BlackBox's.  Real answers of the tiny run; the plan's loses one cell."""
    import subzero
    r, folder = measured
    st = subzero.open_store(folder / "store")
    try:
        run = st.get("latest")
        q = load_workload(sweep.bench.FLOWS["genomics"]["workload"])[2]           # BQ0
        right = run.trace(q.start, select_cells(run, q), to=q.to, record=False).cellset
        sweep.same_answers("genomics 1x", q.name, {"blackbox": right, "defaults": right, "plan": right})
        from subzero.model.cellset import CellSet
        wrong = CellSet(right.shape, ids=right.ids()[1:])
        with pytest.raises(sweep.Mismatch, match="genomics 1x, BQ0: plan answers"):
            sweep.same_answers("genomics 1x", q.name, {"blackbox": right, "defaults": right, "plan": wrong})
    finally:
        st.close()


def test_command_line_merges_sizes_with_add(sweep, measured, calibration, tmp_path, capsys):
    """``--add`` keeps the sizes measured before and the saved calibration; the new size
    is measured in a child process."""
    r, _ = measured
    (tmp_path / "optimizer_scale-calibration.json").write_text(json.dumps(calibration, default=float))
    earlier = dict(r, size=3.0)
    (tmp_path / "optimizer_scale.json").write_text(json.dumps({"sizes": {"genomics:3": earlier}},
                                                              default=float))
    sweep.main(["--genomics", "1", "--astronomy", "none", "--add", "--no-write", "--work", str(tmp_path),
                "--repeats", "1", "--query-seconds", "0.01"])
    got = json.loads((tmp_path / "optimizer_scale.json").read_text())["sizes"]
    assert list(got) == ["genomics:1", "genomics:3"]
    assert "error" not in got["genomics:1"], got["genomics:1"].get("error")
    assert got["genomics:1"]["calibration_s"] == pytest.approx(calibration["seconds"])
    out = capsys.readouterr().out
    assert "genomics 1x" in out and "genomics 3x" in out and "targets met:" in out


def test_sizes_from_the_command_line(sweep):
    import argparse

    def sizes(**kw):
        a = argparse.Namespace(**{"genomics": None, "astronomy": None, "quick": False, **kw})
        return sweep.sizes_of(a)
    assert sizes() == {"genomics": [100, 1000, 10000], "astronomy": [1, 16]}
    assert sizes(quick=True) == {"genomics": [100, 1000], "astronomy": [1]}
    assert sizes(genomics="10000") == {"genomics": [10000.0], "astronomy": []}
    assert sizes(astronomy="1,16", genomics="none") == {"genomics": [], "astronomy": [1.0, 16.0]}
    assert sweep.params_of("genomics", 100.0) == {"replicate": 100}
    assert sweep.params_of("astronomy", 16.0) == {"megapixels": 16.0}
    assert os.path.basename(sweep.bench.FLOWS["astronomy"]["wf"]) == "astronomy.py"
