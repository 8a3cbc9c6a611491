"""Export of lineage to lab tools: labelled masks (xarray, Zarr, NetCDF), W3C PROV-JSON
and OpenLineage run events, from Python and from the CLI, and their error cases."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
import uuid
from pathlib import Path

import dask.array
import numpy as np
import pytest
import xarray as xr
from conftest import EXAMPLE
from openlineage.client.serde import Serde
from prov.model import ProvDocument

import subzero
from subzero import export
from subzero.errors import ExportError, InvalidEvent
from subzero.export import regions
from subzero.export.openlineage import schema_url, validate_event

H, W = 64, 96


def sky() -> xr.DataArray:
    """The example's sky as a labelled image: world coordinates and a FITS-like header."""
    from subzero.workflows.example import synthetic_sky
    y, x = np.arange(H), np.arange(W)
    return xr.DataArray(
        synthetic_sky(), dims=("y", "x"),
        coords={"y": 10.0 + 0.5 * y, "x": 200.0 + 0.25 * x,
                "dec": (("y", "x"), np.add.outer(0.01 * y, 0.0 * x) - 5.0)},
        attrs={"CTYPE1": "RA---TAN", "CRPIX1": 48.0, "SIMPLE": True, "BUNIT": "adu",
               "HISTORY": ["flat-fielded", "bias"]})


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A store with one complete run of the example workflow on the labelled sky."""
    path = tmp_path_factory.mktemp("export") / "store"
    with subzero.open_store(path) as st:
        st.run(EXAMPLE, inputs={"raw": sky()}, strategies={"stars": "full"}, engine="local",
               progress=False)
    return path


@pytest.fixture
def run(made):
    with subzero.open_store(made) as st:
        yield st.get()


@pytest.fixture
def back(run):
    return run.trace("stars", [(40, 70)], to="raw", record=False)


@pytest.fixture
def fwd(run):
    return run.trace("raw", [(40, 70), (41, 70), (12, 20)], to="stars", record=False)


# -- TraceResult.to_xarray -----------------------------------------------------------------

def test_to_xarray_is_a_labelled_mask_over_the_target(run, back):
    m = back.to_xarray()
    raw = run.array("raw")
    assert m.name == "raw_lineage" and m.dtype == bool and m.shape == (H, W)
    assert m.dims == ("y", "x")
    for c in ("y", "x", "dec"):
        np.testing.assert_array_equal(m[c].values, raw[c].values)
    np.testing.assert_array_equal(np.argwhere(m.values), back.cells)
    assert int(m.sum()) == len(back) > 1
    # the header's position keywords come along; the values' units do not
    assert m.attrs["CTYPE1"] == "RA---TAN" and m.attrs["CRPIX1"] == 48.0 and "BUNIT" not in m.attrs
    assert m.attrs["subzero_run"] == run.id and m.attrs["subzero_from"] == "stars"
    assert m.attrs["subzero_cells"] == "40,70" and m.attrs["subzero_start_count"] == 1
    assert m.attrs["subzero_to"] == "raw" and m.attrs["subzero_direction"] == "backward"
    assert m.attrs["subzero_count"] == len(back)
    assert [s.split()[0] for s in m.attrs["subzero_steps"].split("; ")] == ["stars:0", "clean:0", "calib:0"]
    # selecting by label works: the star's pixels, in world coordinates
    star = raw.where(m, drop=True)
    assert float(star.y.min()) == 10.0 + 0.5 * back.cells[:, 0].min()


def test_to_xarray_of_a_numpy_output_has_its_derived_labels(run, fwd):
    """``stars`` is an operator's numpy output: its mask gets the labels and WCS cards the
    operators derive from ``raw`` (as ``run.array("stars")`` does)."""
    m = fwd.to_xarray()
    stars = run.array("stars")
    assert m.name == "stars_lineage" and m.dims == stars.dims == ("y", "x")
    np.testing.assert_array_equal(m["x"].values, stars["x"].values)
    assert m.attrs["CTYPE1"] == "RA---TAN"
    np.testing.assert_array_equal(np.argwhere(m.values), fwd.cells)
    assert m.attrs["subzero_cells"] == "12,20;40,70;41,70"
    # "the entire array" (the all-to-all short-cut's symbol) becomes a full mask
    from subzero.model.cellset import CellSet
    from subzero.query.trace import TraceResult
    whole = TraceResult(run.id, "raw", "stars", "forward", CellSet.everything((H, W)), [], 0.0)
    assert bool(whole.to_xarray().all()) and whole.to_xarray().attrs["subzero_cells"] == "unknown"


# -- masks on disk ---------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_mask_file_opens_lazily_with_its_cells_and_labels(back, tmp_path, suffix):
    path = export.write_mask(back, tmp_path / f"star{suffix}")
    ds = xr.open_zarr(path) if suffix == ".zarr" else xr.open_dataset(path, chunks={})
    try:
        var = ds["raw_lineage"]
        assert isinstance(var.data, dask.array.Array)           # dask-backed, read lazily
        assert var.dtype == bool
        np.testing.assert_array_equal(np.argwhere(var.values), back.cells)
        np.testing.assert_array_equal(ds["y"].values, 10.0 + 0.5 * np.arange(H))
        assert var.attrs["subzero_count"] == len(back) and var.attrs["CTYPE1"] == "RA---TAN"
        assert json.loads(var.attrs["HISTORY"]) == ["flat-fielded", "bias"]   # kept as JSON text
    finally:
        ds.close()


def test_netcdf_mask_keeps_int64_coordinates_and_text(run, tmp_path, monkeypatch):
    """NetCDF4 holds what NetCDF3 cannot (int64 labels, non-ASCII header text); without
    h5netcdf, scipy's NetCDF3 writer still writes a mask xarray reads as booleans."""
    from subzero.export import mask
    from subzero.model.cellset import CellSet
    from subzero.query.trace import TraceResult
    labelled = xr.DataArray(np.zeros((3, 4)), dims=("t", "x"),
                            coords={"t": np.array([0, 1, 2], np.int64) * 10 ** 12},
                            attrs={"COMMENT": "5° field", "NESTED": {"a": 1}, "dtype": "float64"})
    cs = CellSet.of_ids(np.array([1, 6]), (3, 4))
    res = TraceResult(run.id, "a", "b", "forward", cs, [], 0.0, open_target=lambda: labelled.rename("b"))
    with xr.open_dataset(export.write_mask(res, tmp_path / "m.nc"), chunks={}) as ds:
        var = ds["b_lineage"]
        assert var.dtype == bool and isinstance(var.data, dask.array.Array)
        assert ds["t"].dtype == np.int64 and int(ds["t"][2]) == 2 * 10 ** 12
        assert var.attrs["COMMENT"] == "5° field" and json.loads(var.attrs["NESTED"]) == {"a": 1}
        np.testing.assert_array_equal(np.argwhere(var.values), cs.cells())
    monkeypatch.setattr(mask, "netcdf_engine", lambda: "scipy")
    with pytest.raises(ExportError, match="NetCDF .scipy.*install h5netcdf"):
        export.write_mask(res, tmp_path / "m3.nc")
    plain = TraceResult(run.id, "a", "b", "forward", cs, [], 0.0)
    with xr.open_dataset(export.write_mask(plain, tmp_path / "p3.nc"), chunks={}) as ds:
        assert ds["b_lineage"].dtype == bool
        np.testing.assert_array_equal(np.argwhere(ds["b_lineage"].values), cs.cells())
    assert not (tmp_path / "m3.nc").exists()


def test_big_mask_is_chunked_in_tiles(tmp_path):
    """A mask over a large array is written in tiles, so dask reads one tile at a time."""
    from subzero.model.cellset import CellSet
    from subzero.query.trace import TraceResult
    shape = (1200, 700)
    cs = CellSet.of_ids(np.array([0, 5, 700 * 1199 + 699]), shape)
    res = TraceResult(1, "a", "b", "forward", cs, [], 0.0)
    path = export.write_mask(res, tmp_path / "big.zarr")
    var = xr.open_zarr(path)["b_lineage"]
    assert var.data.chunksize == (512, 512) and var.dims == ("dim_0", "dim_1")
    np.testing.assert_array_equal(np.argwhere(var.values), cs.cells())


# -- PROV ----------------------------------------------------------------------------------------

def _records(doc: ProvDocument, kind: str) -> list:
    return [r for r in doc.get_records() if r.get_type().localpart == kind]


def test_prov_json_round_trips_and_holds_the_workflow_and_the_regions(run, back, tmp_path):
    doc = export.prov_document(run, back)
    text = doc.serialize(format="json")
    again = ProvDocument.deserialize(content=text, format="json")
    assert again == doc
    # the written file is the same document
    path = export.write_prov(run, tmp_path / "star.prov.json", back)
    assert ProvDocument.deserialize(source=str(path), format="json") == doc

    base = f"runs/{run.id}"
    ids = {str(r.identifier.localpart) for r in again.get_records() if r.identifier is not None}
    assert {base, *(f"{base}/ops/{o}" for o in ("calib", "smooth", "clean", "stars")),
            *(f"{base}/arrays/{a}.zarr" for a in ("raw", "flat", "calib", "smooth", "clean", "stars"))} <= ids
    used = {(str(r.args[0].localpart), str(r.args[1].localpart)) for r in _records(again, "Usage")}
    assert (f"{base}/ops/calib", f"{base}/arrays/raw.zarr") in used
    assert (f"{base}/ops/calib", f"{base}/arrays/flat.zarr") in used
    assert (f"{base}/ops/stars", f"{base}/arrays/clean.zarr") in used
    generated = {(str(r.args[0].localpart), str(r.args[1].localpart)) for r in _records(again, "Generation")}
    assert (f"{base}/arrays/stars.zarr", f"{base}/ops/stars") in generated
    assert len(_records(again, "Start")) == 4           # every operator started by the run
    agents = {str(r.identifier.localpart) for r in _records(again, "Agent")}
    assert any(a.startswith("SubZero-") for a in agents)

    # backward: the start cells (a star) were derived from the answer (raw pixels)
    (der,) = _records(again, "Derivation")
    gen, used_region = (str(a.localpart) for a in der.args[:2])
    assert gen.endswith("/start") and used_region.endswith("/answer")
    answer = again.get_record(der.args[1])[0]
    attrs = {str(k.localpart): v for k, v in answer.attributes}
    assert attrs["count"] == len(back) and attrs["truncated"] is False
    assert json.loads(attrs["bbox"]) == {"lo": [36, 66], "hi": [45, 75]}
    np.testing.assert_array_equal(regions.from_runs((H, W), json.loads(attrs["runs"])), back.cells)


def test_prov_forward_derivation_and_a_changed_document_differs(run, fwd):
    doc = export.prov_document(run, fwd)
    (der,) = _records(doc, "Derivation")
    assert str(der.args[0].localpart).endswith("/answer")     # forward: answer from start
    d = json.loads(doc.serialize(format="json"))
    region = next(k for k in d["entity"] if k.endswith("/answer"))
    d["entity"][region]["subzero:count"]["$"] = str(len(fwd) + 1)
    assert ProvDocument.deserialize(content=json.dumps(d), format="json") != doc


def test_region_summary_of_big_answers_keeps_count_and_box():
    from subzero.model.cellset import CellSet
    ids = np.arange(0, 4000, 2)                            # 2,000 runs of one cell
    s = regions.summary(CellSet.of_ids(ids, (40, 100)), "a", max_runs=100)
    assert s["truncated"] and "runs" not in s and s["runCount"] == 2000 and s["count"] == 2000
    assert s["bbox"] == {"lo": [0, 0], "hi": [40, 99]} and s["cells"] == "2000 cells in box 0:40,0:99"
    box = regions.summary(CellSet.of_ids(np.arange(100, 300), (40, 100)), "a")
    assert box["cells"] == "1:3,0:100" and box["runs"] == [[100, 200]]


# -- OpenLineage -------------------------------------------------------------------------------

def test_openlineage_event_validates_and_describes_the_run(run, back, tmp_path):
    event = export.openlineage_event(run, back)
    doc = json.loads(Serde.to_json(event))
    rebuilt = validate_event(doc)
    assert Serde.to_dict(rebuilt)["run"]["runId"] == doc["run"]["runId"]
    assert doc["eventType"] == "COMPLETE"
    assert doc["run"]["runId"] == str(uuid.uuid5(uuid.NAMESPACE_URL, f"{run.store.path.as_uri()}/runs/{run.id}"))
    assert doc["job"] == {**doc["job"], "namespace": f"subzero:{run.store.path}", "name": "example"}
    arrays = run.dir / "arrays"
    assert [d["name"] for d in doc["inputs"]] == [str(arrays / "raw.zarr"), str(arrays / "flat.zarr")]
    ops = ("calib", "smooth", "clean", "stars")
    assert {d["name"] for d in doc["outputs"]} == {str(arrays / f"{o}.zarr") for o in ops}
    assert {d["namespace"] for d in doc["inputs"] + doc["outputs"]} == {"file"}
    graph = doc["job"]["facets"]["subzero_operatorGraph"]
    assert {o["name"]: o["inputs"] for o in graph["operators"]}["calib"] == ["raw", "flat"]
    lin = doc["run"]["facets"]["subzero_regionLineage"]
    assert lin["_schemaURL"] == schema_url("SubzeroRegionLineageRunFacet")
    assert {o["name"]: o["modes"] for o in lin["operators"]}["stars"] == ["full"]
    (trace,) = lin["traces"]
    assert trace["count"] == len(back) and trace["start"]["cells"] == "40,70"
    assert trace["answer"]["bbox"] == {"lo": [36, 66], "hi": [45, 75]}
    for facets in (doc["run"]["facets"], doc["job"]["facets"]):
        for f in facets.values():
            assert f["_producer"].startswith("https://") and f["_schemaURL"].startswith("https://")
    # the shipped schema files are where the URLs say, inside the package
    for name in ("SubzeroRegionLineageRunFacet", "SubzeroOperatorGraphJobFacet"):
        url = schema_url(name).split("#")[0]
        local = Path(export.__file__).parent / "schemas" / url.split("/schemas/")[1]
        assert json.loads(local.read_text())["$id"] == url
    # the same run exports the same event
    path = export.write_openlineage(run, tmp_path / "run.openlineage.json", back)
    assert json.loads(path.read_text()) == doc


def _corrupt(doc: dict, where: str, value) -> dict:
    d = json.loads(json.dumps(doc))
    *keys, last = where.split(".")
    node = d
    for k in keys:
        node = node[int(k)] if isinstance(node, list) else node[k]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return d


@pytest.mark.parametrize("where, value, says", [
    ("eventTime", "yesterday", "valid run event"),
    ("eventTime", "2026-01-01", "time"),
    ("run.runId", "run-1", "UUID"),
    ("producer", KeyError, "no producer"),
    ("producer", "subzero", "absolute URI"),
    ("schemaURL", "https://openlineage.io/spec/1-0-0/OpenLineage.json#/$defs/RunEvent", "schemaURL"),
    ("eventType", "DONE", "valid run event"),
    ("run.facets.subzero_regionLineage._schemaURL", KeyError, "no _schemaURL"),
    ("run.facets.subzero_regionLineage.lineageBytes", "8 KB", "not of type 'integer'"),
    ("run.facets.subzero_regionLineage.traces.0.count", -1, "minimum"),
    ("run.facets.subzero_regionLineage.traces.0.answer.encoding", "bitmap", "c-order-runs"),
    ("run.facets.subzero_regionLineage.surprise", 1, "Additional properties"),
    ("run.facets.subzero_regionLineage._schemaURL", "https://example.org/x.json#/$defs/X", "expected"),
    ("run.facets.subzero_regionLineage._schemaURL", schema_url("Nope"), "no schema SubZero ships"),
    ("job.facets.subzero_operatorGraph.operators.0.inputs", "raw", "not of type 'array'"),
    ("job.facets.jobType.processingTyp", "BATCH", "jobType"),
    ("job.name", 3, "job.name"),
    ("outputs.0.name", None, "outputs"),
])
def test_a_corrupted_event_fails_validation(run, back, where, value, says):
    doc = json.loads(Serde.to_json(export.openlineage_event(run, back)))
    validate_event(doc)
    with pytest.raises(InvalidEvent, match=says):
        validate_event(_corrupt(doc, where, value))


# -- the CLI ---------------------------------------------------------------------------------

def test_trace_export_writes_every_format_by_suffix(cli, made, tmp_path):
    out = {s: tmp_path / f"star{s}" for s in (".zarr", ".nc", ".prov.json", ".openlineage.json", ".ol.json")}
    args = ["trace", "--store", made, "--from", "stars", "--cells", "40,70", "--to", "raw"]
    exports = [x for p in out.values() for x in ("--export", p)]
    code, stdout, err = cli(*args, *exports)
    assert code == 0, err
    assert f"mask written to {out['.zarr']}" in stdout and "PROV-JSON written to" in stdout
    assert xr.open_zarr(out[".zarr"])["raw_lineage"].sum().compute() == 61
    validate_event(out[".ol.json"].read_text())
    assert json.loads(out[".ol.json"].read_text()) == json.loads(out[".openlineage.json"].read_text())
    ProvDocument.deserialize(source=str(out[".prov.json"]), format="json")
    # --json stays one JSON document on stdout
    code, stdout, err = cli(*args, "--json", "--export", tmp_path / "j.zarr")
    assert code == 0 and json.loads(stdout)["count"] == 61, err

    # existing outputs: refused, one line, before the trace; --force replaces them
    before = out[".prov.json"].read_text()
    code, stdout, err = cli(*args, "--export", out[".prov.json"])
    assert code == 2 and stdout == "" and "already exists" in _one_line(err) and "--force" in err
    code, _, err = cli(*args, "--export", out[".zarr"], "--force")
    assert code == 0, err
    assert out[".prov.json"].read_text() == before
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]     # no temporary left


@pytest.mark.parametrize("name, says", [
    ("star.txt", "cannot tell what to export"),
    (".zarr", "cannot tell what to export"),
    ("missing/star.nc", "does not exist"),
    ("afile/star.nc", "is not a folder"),
])
def test_trace_export_errors_are_one_line(cli, made, tmp_path, name, says):
    (tmp_path / "afile").write_text("x")
    code, stdout, err = cli("trace", "--store", made, "--from", "stars", "--cells", "40,70", "--to",
                            "raw", "--export", tmp_path / name)
    assert code == 2 and stdout == "" and says in _one_line(err)


def test_trace_export_does_not_go_with_a_workload(cli, made, tmp_path):
    wl = tmp_path / "w.json"
    wl.write_text(json.dumps({"queries": [{"name": "q", "from": "stars", "to": "raw", "cells": [[40, 70]]}]}))
    code, _, err = cli("trace", "--store", made, "--workload", wl, "--export", tmp_path / "x.zarr")
    assert code == 2 and "--workload" in _one_line(err)


def test_export_command_writes_the_run(cli, made, tmp_path):
    p, o = tmp_path / "run.prov.json", tmp_path / "run.ol.json"
    code, stdout, err = cli("export", "--store", made, "--prov", p, "--openlineage", o, "--json")
    assert code == 0, err
    assert json.loads(stdout) == {"run_id": 1, "written": [{"path": str(p), "format": "prov"},
                                                           {"path": str(o), "format": "openlineage"}]}
    event = json.loads(o.read_text())
    validate_event(event)
    assert "traces" not in event["run"]["facets"]["subzero_regionLineage"]
    doc = ProvDocument.deserialize(source=str(p), format="json")
    assert not _records(doc, "Derivation")
    code, _, err = cli("export", "1", "--store", made, "--prov", p)
    assert code == 2 and "already exists" in _one_line(err)
    code, _, err = cli("export", "--store", made)
    assert code == 2 and "--prov" in _one_line(err)
    code, _, err = cli("export", "9", "--store", made, "--prov", tmp_path / "nine.prov.json")
    assert code == 2 and "unknown run" in _one_line(err)


FAILS = """
from subzero import Workflow, Operator
class Bad(Operator):
    def run(self, ctx, x):
        raise RuntimeError("detector saturated")
def workflow():
    wf = Workflow('bad'); a = wf.input('a')
    wf.add('explode', Bad(), a)
    return wf
"""


def test_a_failed_run_exports_as_a_fail_event(cli, tmp_path):
    (tmp_path / "bad.py").write_text(textwrap.dedent(FAILS))
    store = tmp_path / "st"
    with subzero.open_store(store) as st, pytest.raises(subzero.SubZeroError):
        st.run(tmp_path / "bad.py", inputs={"a": np.zeros((4, 4))}, engine="local", progress=False)
    o = tmp_path / "bad.ol.json"
    code, _, err = cli("export", "1", "--store", store, "--openlineage", o, "--prov", tmp_path / "bad.prov.json")
    assert code == 0, err
    event = json.loads(o.read_text())
    validate_event(event)
    assert event["eventType"] == "FAIL"
    assert "detector saturated" in event["run"]["facets"]["errorMessage"]["message"]


def test_read_only_store_exports(made, monkeypatch):
    """An archived store (nothing may be written in it) traces and exports elsewhere, and
    exporting into it is one clear line."""
    from test_cli_errors import _cli, _digest, _lock, _unlock, _unprivileged
    prefix = _unprivileged()
    shared = Path(tempfile.mkdtemp(prefix="subzero-export-"))
    try:
        store = shared / "ro"
        shutil.copytree(made, store)
        out = shared / "out"
        out.mkdir()
        # a home of the CLI's own, not the real user's: astropy (the sky region of the
        # labelled sky) writes its config there
        home = shared / "home"
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        for p in [store, *store.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        _lock(store)
        before = _digest(store)
        code, stdout, err = _cli(prefix, "trace", "--store", store, "--from", "stars", "--cells", "40,70",
                                 "--to", "raw", "--export", out / "s.zarr", "--export", out / "s.ol.json",
                                 cwd=shared)
        assert code == 0, err
        assert (out / "s.zarr").is_dir() and validate_event((out / "s.ol.json").read_text())
        code, _, err = _cli(prefix, "export", "--store", store, "--prov", out / "r.prov.json", cwd=shared)
        assert code == 0, err
        if prefix or os.geteuid() != 0:
            code, _, err = _cli(prefix, "export", "--store", store, "--prov", store / "r.prov.json",
                                cwd=shared)
            assert code == 2 and "not writable" in _one_line(err)
        assert _digest(store) == before
    finally:
        _unlock(shared)
        shutil.rmtree(shared, ignore_errors=True)


def test_export_dispatch_needs_what_the_format_needs(run, back, tmp_path):
    with pytest.raises(ExportError, match="trace's answer"):
        export.export(tmp_path / "a.zarr", run=run)
    with pytest.raises(ExportError, match="needs the run"):
        export.export(tmp_path / "a.prov.json", result=back)
    assert export.format_of("x.PROV.json") == "prov" and export.format_of("x.ol.json") == "openlineage"


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("subzero: error: "), err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


def test_openlineage_names_the_files_a_run_read(tmp_path):
    """An input read from a file is named by that file (so Marquez links the job to
    whatever wrote it), with the store's copy as another name and its content digest
    as its version; an array given in memory keeps the store copy's name."""
    raw = tmp_path / "raw.npy"
    np.save(raw, sky().values)
    with subzero.open_store(tmp_path / "store") as st:
        run = st.run(EXAMPLE, inputs={"raw": str(raw)}, strategies={"stars": "full"},
                     engine="local", progress=False)
        doc = json.loads(Serde.to_json(export.openlineage_event(run)))
        validate_event(doc)
        by = {d["name"]: d for d in doc["inputs"]}
        assert str(raw.resolve()) in by, list(by)
        facets = by[str(raw.resolve())]["facets"]
        assert facets["symlinks"]["identifiers"] == [
            {"namespace": "file", "name": str(run.dir / "arrays" / "raw.zarr"),
             "type": "SUBZERO_STORE_COPY"}]
        assert facets["version"]["datasetVersion"] == st.input_digests(run.id)["raw"]
        other = [n for n in by if n != str(raw.resolve())]
        assert other == [str(run.dir / "arrays" / "flat.zarr")]      # the workflow's default
        # PROV: the file is an entity, the run used it, and it is the primary source of
        # the store's copy
        text = export.prov_document(run).serialize(format="json")
        doc = json.loads(text)
        assert ProvDocument.deserialize(content=text, format="json") is not None
        src = f"file:{str(raw.resolve()).lstrip('/')}"
        assert doc["entity"][src]["prov:location"] == str(raw.resolve())
        assert doc["entity"][src]["subzero:digest"] == st.input_digests(run.id)["raw"]
        derived = [d for d in doc["wasDerivedFrom"].values() if d["prov:usedEntity"] == src]
        assert len(derived) == 1 and derived[0]["prov:generatedEntity"].endswith("arrays/raw.zarr")
        assert derived[0]["prov:type"]["$"] == "prov:PrimarySource"
        assert any(u["prov:entity"] == src for u in doc["used"].values())
