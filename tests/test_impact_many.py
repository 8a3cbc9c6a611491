"""An impact query over many runs (issue 29, "a night, not a run"): runs answered
in parallel -- a pool of this process's forks, or a Spark job over runs -- with
the same answers as one after another; its outputs (table, plot, PROV,
OpenLineage); the labels of affected objects; untrusted runs named, never
skipped."""

import json
import shutil

import numpy as np
import pytest
from conftest import EXAMPLE

import subzero
from subzero import parallel as many
from subzero.workflows.example import flat_field, synthetic_sky

BAD_COLUMN = "0:64,37"


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """Five runs sharing one flat, on five skies."""
    d = tmp_path_factory.mktemp("night")
    flat = flat_field()
    np.save(d / "flat.npy", flat)
    with subzero.open_store(d / "store") as st:
        for k in range(5):
            sky = np.roll(synthetic_sky(), (k, 2 * k), axis=(0, 1))
            st.run(EXAMPLE, inputs={"raw": sky, "flat": d / "flat.npy"}, tile=32, progress=False)
    return d, flat


@pytest.fixture
def store(night, tmp_path):
    d, _ = night
    shutil.copytree(d / "store", tmp_path / "store")
    st = subzero.open_store(tmp_path / "store")
    yield st
    st.close()


def answers(imp):
    """An impact as plain data, without the timings."""
    got = imp.as_dict()
    for r in got["runs"]:
        r.pop("seconds")
    return got


def one_by_one(st, flat, cells, to=None):
    """The oracle: each run's own forward traces."""
    out = {}
    for rid, inp in st.runs_using(flat):
        with st.get(rid) as run:
            for t in to or ["smooth", "stars"]:
                out[rid, t] = run.trace(inp, cells, to=t, record=False).cells
    return out


def test_a_pool_of_workers_answers_as_one_process_does(night, store, monkeypatch):
    _, flat = night
    alone = store.impact(flat, BAD_COLUMN, engine="local", progress=False)
    monkeypatch.setattr(many, "IMPACT_RUNS_PER_WORKER", 1)       # five runs: two workers
    pooled = store.impact(flat, BAD_COLUMN, engine="local", progress=False)
    assert answers(pooled) == answers(alone)
    want = one_by_one(store, flat, BAD_COLUMN)
    for r in pooled.runs:
        for t in r.targets:
            assert np.array_equal(t.cells, want[r.run_id, t.array])


def test_spark_answers_as_in_process(night, store, spark):
    _, flat = night
    local = store.impact(flat, BAD_COLUMN, to=["clean", "stars"], engine="local", progress=False)
    on_spark = store.impact(flat, BAD_COLUMN, to=["clean", "stars"], engine="spark", spark=spark,
                            progress=False)
    assert [r.run_id for r in on_spark.runs] == [1, 2, 3, 4, 5]
    assert answers(on_spark) == answers(local)
    want = one_by_one(store, flat, BAD_COLUMN, to=["clean", "stars"])
    for r in on_spark.runs:
        assert r.error is None
        for t in r.targets:
            assert np.array_equal(t.cells, want[r.run_id, t.array])


def test_the_engine_is_chosen_by_the_number_of_runs():
    from subzero.engines.choice import EngineRequest, impact_engine
    from subzero.tuning import SPARK_PAYS_RUNS
    assert impact_engine(None, 5).engine == "local"
    assert impact_engine("auto", SPARK_PAYS_RUNS, java_version=lambda: 17).engine == "spark"
    assert impact_engine("auto", SPARK_PAYS_RUNS, java_version=lambda: None).engine == "local"
    assert impact_engine("local", 10 * SPARK_PAYS_RUNS).engine == "local"
    assert impact_engine(EngineRequest(None, "spark://head:7077"), 2).engine == "spark"
    with pytest.raises(subzero.SubZeroError, match="unknown engine 'gpu'"):
        impact_engine("gpu", 3)


def test_progress_counts_the_runs(night, store):
    from subzero.engines.progress import Progress
    _, flat = night

    class Seen(Progress):
        def __init__(self):
            self.events = []

        def begin(self, total, desc, unit="op"):
            self.events.append(("begin", total, unit))

        def finished(self, name):
            self.events.append(("finished", name))

    seen = Seen()
    store.impact(flat, BAD_COLUMN, progress=seen)
    assert seen.events[0] == ("begin", 5, "run")
    assert [e[1] for e in seen.events[1:]] == [f"run {k}" for k in range(1, 6)]


def test_impact_from_the_command_line_on_both_engines(night, store, shell):
    d, _ = night
    got = {}
    for engine in ("local", "spark"):
        code, out, err = shell("impact", "--input", d / "flat.npy", "--cells", BAD_COLUMN, "--to", "stars",
                               "--engine", engine, "--store", store.path, "--json")
        assert code == 0, err
        got[engine] = json.loads(out)
        for r in got[engine]["runs"]:
            r.pop("seconds")
    assert got["spark"] == got["local"]


# -- the labels of affected objects ----------------------------------------------------------
def test_the_stars_a_column_touches_are_listed_by_id(night, store):
    _, flat = night
    y, x = np.argwhere(np.asarray(store.get(1).array("stars")) > 0)[0]
    box = f"{max(0, y - 3)}:{y + 4},{max(0, x - 3)}:{x + 4}"      # around a star of run 1
    imp = store.impact(flat, box, to="stars", progress=False)
    assert imp.runs[0].targets[0].objects["ids"]
    for r in imp.runs:
        (t,) = r.targets
        stars = np.asarray(store.get(r.run_id).array("stars"))
        ids = np.unique(stars[tuple(t.cells.T)])
        assert t.objects.get("ids", []) == ids[ids != 0].tolist()
        assert r.as_dict()["targets"][0].get("objects", {}).get("ids", []) == t.objects.get("ids", [])


def test_labelled_axes_list_the_labels_of_the_cells_touched(tmp_path):
    import xarray as xr
    ys, xs = np.arange(64) * 0.5, np.arange(96) + 100.0
    sky = xr.DataArray(synthetic_sky(), dims=("y", "x"), coords={"y": ys, "x": xs})
    with subzero.open_store(tmp_path / "s") as st:
        st.run(EXAMPLE, inputs={"raw": sky}, tile=32, progress=False)
        imp = st.impact(sky, "10:12,40:42", to="smooth", progress=False)
        (t,) = imp.runs[0].targets
        assert t.objects == {"y": ys[9:13].tolist(), "x": xs[39:43].tolist()}
        assert t.where["labels"] == {"y": [ys[9], ys[12]], "x": [xs[39], xs[42]]}


# -- outputs ---------------------------------------------------------------------------------
def test_table_plot_prov_and_openlineage_from_the_command_line(night, store, shell, tmp_path):
    import pandas as pd
    from prov.model import ProvDocument

    from subzero.export.openlineage import validate_event
    d, flat = night
    files = {k: tmp_path / f"night.{k}" for k in ("csv", "parquet", "png")}
    files["prov"], files["ol"] = tmp_path / "night.prov.json", tmp_path / "night.ol.json"
    code, out, err = shell("impact", "--input", d / "flat.npy", "--cells", BAD_COLUMN, "--store", store.path,
                           "--table", files["csv"], "--plot", files["png"], "--prov", files["prov"],
                           "--openlineage", files["ol"], "--json")
    assert code == 0, err
    got = json.loads(out)
    assert {w["format"] for w in got["written"]} == {"table", "plot", "prov", "openlineage"}
    imp = store.impact(flat, BAD_COLUMN, progress=False)
    table = pd.read_csv(files["csv"])
    assert list(zip(table.run_id, table.array, table["count"])) == [
        (r.run_id, t.array, t.count) for r in imp.runs for t in r.targets]
    assert table.bounds[0] == ",".join(f"{lo}:{hi}" for lo, hi in zip(*imp.runs[0].targets[0].bounds))
    assert imp.to_table(files["parquet"]) == files["parquet"]
    assert pd.read_parquet(files["parquet"]).drop(columns=["labels", "objects", "error"]).equals(
        table.drop(columns=["labels", "objects", "error"]).astype(
            pd.read_parquet(files["parquet"]).drop(columns=["labels", "objects", "error"]).dtypes))
    assert files["png"].read_bytes()[:4] == b"\x89PNG"
    doc = ProvDocument.deserialize(files["prov"], format="json")
    runs = [r for r in doc.get_records() if "subzero:Run" in str(r.get_attribute("prov:type"))]
    assert len(runs) == 5
    events = [json.loads(line) for line in files["ol"].read_text().splitlines()]
    assert [e["run"]["facets"]["subzero_regionLineage"]["run"] for e in events] == [1, 2, 3, 4, 5]
    for e in events:
        validate_event(e)
        assert [t["count"] for t in e["run"]["facets"]["subzero_regionLineage"]["traces"]] == \
            [t.count for t in imp.runs[e["run"]["facets"]["subzero_regionLineage"]["run"] - 1].targets]


@pytest.mark.parametrize("flag, path, says", [
    ("--table", "out.xlsx", "end its name in .csv or .parquet"),
    ("--plot", "out.gif", "end its name in .png, .pdf or .svg"),
    ("--prov", "missing/out.prov.json", "does not exist"),
    ("--openlineage", "exists.ol.json", "already exists"),
])
def test_a_wrong_output_is_one_line_before_the_query(night, store, shell, tmp_path, flag, path, says):
    d, _ = night
    (tmp_path / "exists.ol.json").write_text("{}")
    code, out, err = shell("impact", "--input", d / "flat.npy", "--cells", BAD_COLUMN, "--store", store.path,
                           flag, tmp_path / path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert err.startswith("subzero: error: ") and out == ""


def test_parquet_without_pyarrow_is_one_clear_error(night, store, monkeypatch, tmp_path):
    import builtins
    real = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name == "pyarrow":
            raise ImportError("no pyarrow")
        return real(name, *args, **kwargs)
    _, flat = night
    imp = store.impact(flat, BAD_COLUMN, progress=False)
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(subzero.SubZeroError, match=r"needs pyarrow.*or write a \.csv table"):
        imp.to_table(tmp_path / "t.parquet")


# -- untrusted runs --------------------------------------------------------------------------
def test_untrusted_runs_are_answered_from_stored_lineage_or_named(night, tmp_path, monkeypatch, shell):
    """Runs signed with another key: one whose lineage is all stored is answered
    without its code, one whose lineage needs mapping functions is listed with the
    reason -- in the answer, --json and the table -- never skipped."""
    import pandas as pd

    from subzero.storage.trust import CONFIG_ENV
    from subzero.workflows.example import Stars
    d, flat = night
    wf = subzero.Workflow("patches")          # the flat's bright patches, labelled
    wf.add("patches", Stars(threshold=1.0), wf.input("flat"))
    with subzero.open_store(tmp_path / "s") as st:
        for spec in ("full:fullone:forward", "pay:payone:backward"):     # data / needs map_p
            st.run(wf, inputs={"flat": flat}, strategies={"patches": spec}, tile=32, progress=False)
        trusted = st.impact(flat, BAD_COLUMN, progress=False)
    assert all(r.error is None for r in trusted.runs)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "someone-else"))
    with subzero.open_store(tmp_path / "s") as st:
        imp = st.impact(flat, BAD_COLUMN, progress=False)
        assert [r.run_id for r in imp.runs] == [1, 2]
        first, second = imp.runs
        assert first.error is None
        want = answers(trusted)["runs"][0]["targets"]
        for t in want:
            t.pop("objects", None)      # the ids of a label image need its operator's code
        assert answers(imp)["runs"][0]["targets"] == want and want[0]["count"] >= 64
        assert "not trusted" in second.error and "subzero trust" in second.error and not second.targets
        imp.to_table(tmp_path / "t.csv")
    table = pd.read_csv(tmp_path / "t.csv")
    assert table.run_id.tolist().count(2) == 1 and "not trusted" in table.error[table.run_id == 2].item()
    assert table.error[table.run_id == 1].isna().all()
    code, out, err = shell("impact", "--input", d / "flat.npy", "--cells", BAD_COLUMN, "--store", tmp_path / "s",
                           "--json")
    assert code == 0, err
    got = json.loads(out)
    assert [(r["run_id"], r["error"] is None) for r in got["runs"]] == [(1, True), (2, False)]


def test_unrelated_runs_are_never_opened(night, store, monkeypatch):
    """The runs that read the input come from the catalog's index; runs that did not
    read it cost nothing (none of them is opened or verified)."""
    from subzero.store import Store
    _, flat = night
    store.run(EXAMPLE, inputs={"raw": synthetic_sky(), "flat": flat * 2}, tile=32, progress=False)
    opened, verified = [], []
    real_get, real_verdict = Store.get, Store.verdict
    monkeypatch.setattr(Store, "get", lambda self, ref="latest": opened.append(ref) or real_get(self, ref))
    monkeypatch.setattr(Store, "verdict", lambda self, run="latest": verified.append(
        getattr(run, "id", run)) or real_verdict(self, run))
    imp = store.impact(flat, BAD_COLUMN, engine="local", progress=False)
    assert [r.run_id for r in imp.runs] == [1, 2, 3, 4, 5]
    assert 6 not in opened and 6 not in verified


# -- trust checks shared by a query's runs ---------------------------------------------------
def test_shared_checks_still_catch_a_changed_pickle_or_record(store):
    """Within one query the runs share the key and the pickles verified, but a run whose
    pickle differs from the one its record names is still refused; an executor's
    voucher stands for the signature of the record the driver read, and no other."""
    from subzero.storage.trust import MODIFIED, PICKLE_CHANGED, RECORD_CHANGED, TRUSTED
    pkl = store.run_dir(2) / "workflow.pkl"
    vouchers = store.vouchers([1, 2, 3])
    with store.checks_shared():
        assert store.verdict(1).state == TRUSTED
        pkl.write_bytes(pkl.read_bytes() + b"\0")
        v = store.verdict(2)
        assert v.state == MODIFIED and v.detail == PICKLE_CHANGED
    rec = store.run_dir(3) / "run.json"
    rec.write_bytes(rec.read_bytes().replace(b'"example"', b'"exampel"', 1))
    with store.checks_shared(vouchers):         # as a Spark task sees them, without the key
        assert store.verdict(1).state == TRUSTED
        assert store.verdict(2).detail == PICKLE_CHANGED
        assert store.verdict(3).state == MODIFIED and store.verdict(3).detail == RECORD_CHANGED
        assert store.verdict(4).detail == "its signature was not checked by the query's driver"


def test_a_small_file_read_with_its_size_expected_is_still_read_to_the_limit(tmp_path):
    import os

    from subzero.storage.files import read_fd
    p = tmp_path / "f"
    p.write_bytes(b"x" * 1000)              # grew since its size was taken (10)
    for limit, want in ((10_000, 1000), (100, 101)):
        fd = os.open(p, os.O_RDONLY)
        try:
            assert len(read_fd(fd, limit, expect=10)) == want
        finally:
            os.close(fd)
