"""A run, and optionally a trace's answer, as a W3C PROV document (the ``prov`` package).

* the run is an activity (``subzero:Run``) associated with SubZero (a software
  agent) and, when the store can tell, the user who ran it (a person);
* each operator is an activity (``subzero:Operator``) started by the run, that
  ``used`` its input arrays (``prov:role`` = its input index) and generated its
  output array; every array is an entity (``subzero:Array``) named by the Zarr
  folder the run keeps it in, so the workflow's DAG is the PROV graph;
* a trace adds its start region and its answer region as entities
  (``subzero:Region``: array, count, bounding box, cells as C-order runs, see
  :mod:`subzero.export.regions`) and a ``wasDerivedFrom`` between them, in the
  direction the data flowed: backward, the start cells were derived from the
  answer; forward, the answer from the start cells.

Only the catalog is read: no operator code is loaded, so untrusted runs export too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prov.constants import PROV
from prov.model import ProvDocument

from subzero.export import ids, regions
from subzero.export.output import write_text

if TYPE_CHECKING:
    from subzero.model.cellset import CellSet
    from subzero.query.trace import TraceResult
    from subzero.run import Run


def prov_document(run: Run, result: TraceResult | None = None) -> ProvDocument:
    """The run's provenance (and ``result``'s region lineage) as a ``prov.model.ProvDocument``."""
    if result is not None and result.run_id != run.id:
        raise ValueError(f"the trace result is of run {result.run_id}, not of run {run.id}")
    row, cat = run.row, run.store.catalog
    doc = ProvDocument()
    sz = doc.add_namespace("subzero", ids.VOCABULARY)
    doc.add_namespace("store", ids.store_uri(run))
    base = f"store:runs/{run.id}"

    def array_id(name: str) -> str:
        return f"{base}/arrays/{name}.zarr"

    act = doc.activity(base, ids.when(row.started), ids.when(row.ended), {
        "prov:type": sz["Run"], "prov:label": f"run {run.id} of workflow {row.workflow}",
        "subzero:workflow": row.workflow, "subzero:status": row.status,
        "subzero:engine": row.engine or "", "subzero:module": row.source or "",
        "subzero:params": json.dumps(row.params, sort_keys=True, default=str)})
    if row.error:
        act.add_attributes({"subzero:error": row.error})
    software = doc.agent(f"subzero:SubZero-{ids.version()}", {
        "prov:type": PROV["SoftwareAgent"], "prov:label": f"SubZero {ids.version()}"})
    doc.wasAssociatedWith(act, software)
    user = ids.user_of(run)
    if user is not None:
        person = doc.agent(f"store:users/{user}", {"prov:type": PROV["Person"], "prov:label": user})
        doc.wasAssociatedWith(act, person)
        doc.actedOnBehalfOf(software, person, act)

    digests = cat.input_digests(run.id)
    for name, info in cat.arrays(run.id).items():
        attrs: dict[str, Any] = {
            "prov:type": sz["Array"], "prov:label": name, "subzero:kind": info["kind"],
            "subzero:shape": json.dumps(list(info["shape"])), "subzero:dtype": info["dtype"],
            "prov:location": str(ids.array_path(run, name))}
        if name in row.inputs:
            attrs["subzero:source"] = str(row.inputs[name])
        doc.entity(array_id(name), attrs)
        src = ids.input_source(run, name)
        if src is not None:       # the file the run read: the store's copy's primary source
            doc.add_namespace("file", "file:///")
            given = str(row.inputs[name])
            sattrs: dict[str, Any] = {"prov:type": sz["SourceFile"], "prov:label": Path(src).name,
                                      "prov:location": src}
            if given != src:
                sattrs["subzero:variable"] = given[len(src):].lstrip("/:")
            digest = digests.get(name)
            if digest:
                sattrs["subzero:digest"] = digest
            sid = f"file:{src.lstrip('/')}"
            doc.entity(sid, sattrs)
            doc.hadPrimarySource(array_id(name), sid)
            doc.used(base, sid, None, None, {"prov:role": f"input {name}"})

    for op in cat.ops(run.id):
        oid = f"{base}/ops/{op['name']}"
        doc.activity(oid, None, None, {
            "prov:type": sz["Operator"], "prov:label": op["name"],
            "subzero:class": op["class"], "subzero:strategies": "+".join(op["strategies"]),
            "subzero:seconds": float(op["run_s"] or 0.0), "subzero:pairs": int(op["pairs"] or 0),
            "subzero:lineageBytes": int(op["lineage_bytes"] or 0)})
        doc.wasStartedBy(oid, None, base)
        for i, name in enumerate(op["inputs"]):
            doc.used(oid, array_id(name), None, None, {"prov:role": f"input {i}"})
        doc.wasGeneratedBy(array_id(op["name"]), oid)

    if result is not None:
        key = f"{base}/traces/{ids.trace_key(result)}"
        start = _region(doc, f"{key}/start", result.query, result.start, array_id(result.start))
        answer = _region(doc, f"{key}/answer", result.cellset, result.target, array_id(result.target))
        generated, used = (start, answer) if result.direction == "backward" else (answer, start)
        doc.wasDerivedFrom(generated, used, identifier=key, other_attributes={
            "prov:type": sz["RegionLineage"], "subzero:direction": str(result.direction),
            "subzero:steps": "; ".join(f"{s.op}:{s.input} {s.method}" for s in result.steps)})
    return doc


def _region(doc: ProvDocument, rid: str, cs: CellSet | None, array: str, array_id: str) -> str:
    attrs: dict[str, Any] = {"prov:type": doc.valid_qualified_name("subzero:Region"),
                             "subzero:array": doc.valid_qualified_name(array_id)}
    if cs is None:
        attrs["prov:label"] = f"cells of {array} (not recorded)"
    else:
        s = regions.summary(cs, array)
        attrs.update({
            "prov:label": f"{s['cells']} of {array}", "subzero:cells": s["cells"],
            "subzero:count": s["count"], "subzero:bbox": json.dumps(s["bbox"]),
            "subzero:encoding": s["encoding"], "subzero:runCount": s["runCount"],
            "subzero:truncated": s["truncated"]})
        if "runs" in s:
            attrs["subzero:runs"] = json.dumps(s["runs"], separators=(",", ":"))
    doc.entity(rid, attrs)
    return rid


def prov_json(run: Run, result: TraceResult | None = None) -> str:
    """The document as PROV-JSON text."""
    return str(prov_document(run, result).serialize(format="json", indent=2, sort_keys=True))


def write_prov(run: Run, path: str | os.PathLike, result: TraceResult | None = None,
               force: bool = False) -> Path:
    """Write the run's PROV-JSON document (with ``result``'s region lineage) to ``path``."""
    return write_text(path, prov_json(run, result) + "\n", force)
