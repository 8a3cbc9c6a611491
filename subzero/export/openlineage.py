"""A run as an OpenLineage run event, built with the maintained client's typed classes.

One ``RunEvent`` per workflow run: ``COMPLETE`` (``FAIL`` for a failed run,
``ABORT`` for an interrupted one), ``eventTime`` when the run ended, ``runId``
a UUID derived from the store and the run id (the same on every export), the
job named by the store (namespace) and the workflow (name).  Inputs are the
workflow's input arrays, outputs the operators' arrays, each named by the Zarr
folder the run keeps it in (namespace ``file``, OpenLineage's naming for local
files).  Facets:

* job ``jobType`` (standard) and ``subzero_operatorGraph``: the operators, their
  classes, input arrays and lineage strategies — the workflow's DAG;
* run ``processing_engine`` (standard), ``errorMessage`` (standard, failed runs)
  and ``subzero_regionLineage``: per operator the lineage strategies, modes,
  pairs and bytes stored, and for an exported trace its start region, answer
  region (count, bounding box, cells as runs) and each step's method.

The custom facets' JSON Schemas ship in ``subzero/export/schemas/1-0-0``; their
``_schemaURL`` names them (:func:`schema_url`).  :func:`validate_event` checks an
event: the custom facets against those schemas, the whole event by rebuilding
it from the client's typed classes (whose validators check ``eventTime``,
``runId`` ...) and comparing it with the original, field by field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import attr
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    JobFacet,
    RunFacet,
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    processing_engine_run,
    symlinks_dataset,
)
from openlineage.client.serde import Serde

from subzero.errors import InvalidEvent
from subzero.export import ids, regions
from subzero.export.output import write_text

if TYPE_CHECKING:
    from subzero.query.trace import TraceResult
    from subzero.run import Run as SubZeroRun

SCHEMA_VERSION = "1-0-0"
SCHEMA_DIR = Path(__file__).parent / "schemas" / SCHEMA_VERSION
#: where the custom facets' schemas are published (the folder this package ships)
SCHEMA_BASE = f"{ids.PROJECT_URL}/blob/main/subzero/export/schemas/{SCHEMA_VERSION}"
#: OpenLineage's naming of datasets that are local files
FILE_NAMESPACE = "file"

_STATES = {"complete": RunState.COMPLETE, "failed": RunState.FAIL, "interrupted": RunState.ABORT,
           "running": RunState.RUNNING}


def schema_url(facet: str) -> str:
    """The ``_schemaURL`` of a custom facet: its schema file, and the definition in it."""
    return f"{SCHEMA_BASE}/{facet}.json#/$defs/{facet}"


@attr.define
class SubzeroOperatorGraphJobFacet(JobFacet):
    """The workflow's operators and the arrays between them (see the schema)."""

    workflow: str
    inputs: list[str]
    operators: list[dict[str, Any]]
    module: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return schema_url("SubzeroOperatorGraphJobFacet")


@attr.define
class SubzeroRegionLineageRunFacet(RunFacet):
    """Region lineage stored per operator, and exported traces (see the schema)."""

    store: str
    run: int
    status: str
    lineageBytes: int  # noqa: N815 (OpenLineage's camelCase)
    operators: list[dict[str, Any]]
    traces: list[dict[str, Any]] | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return schema_url("SubzeroRegionLineageRunFacet")


#: facet key -> class, for the facets this module writes (and :func:`validate_event` rebuilds)
RUN_FACETS: dict[str, type] = {
    "subzero_regionLineage": SubzeroRegionLineageRunFacet,
    "processing_engine": processing_engine_run.ProcessingEngineRunFacet,
    "errorMessage": error_message_run.ErrorMessageRunFacet}
JOB_FACETS: dict[str, type] = {
    "subzero_operatorGraph": SubzeroOperatorGraphJobFacet,
    "jobType": job_type_job.JobTypeJobFacet}
CUSTOM_FACETS = ("SubzeroOperatorGraphJobFacet", "SubzeroRegionLineageRunFacet")


def trace_summary(result: TraceResult) -> dict[str, Any]:
    """A trace as the region lineage facet carries it."""
    out: dict[str, Any] = {
        "key": ids.trace_key(result), "from": result.start, "to": result.target,
        "direction": str(result.direction), "count": int(len(result)),
        "answer": regions.summary(result.cellset, result.target),
        "steps": [{"operator": s.op, "input": int(s.input), "direction": str(s.direction),
                   "method": s.method, "cellsIn": int(s.cells_in), "cellsOut": int(s.cells_out)}
                  for s in result.steps]}
    if result.query is not None:
        out["start"] = regions.summary(result.query, result.start)
    return out


def openlineage_event(run: SubZeroRun, result: TraceResult | None = None) -> RunEvent:
    """The run's OpenLineage ``RunEvent`` (with ``result``'s region lineage in its facet)."""
    if result is not None and result.run_id != run.id:
        raise ValueError(f"the trace result is of run {result.run_id}, not of run {run.id}")
    row, cat = run.row, run.store.catalog
    producer = ids.producer()
    arrays = cat.arrays(run.id)
    ops = cat.ops(run.id)
    inputs = [n for n, a in arrays.items() if a["kind"] == "input"]

    def dataset(cls, name: str):
        return cls(namespace=FILE_NAMESPACE, name=str(ids.array_path(run, name)))

    digests = cat.input_digests(run.id)

    def source(name: str) -> InputDataset:
        """An input as the job read it: the file it came from (so a catalog links this
        job to whatever wrote that file), with the store's copy as another name of it
        and its content digest as its version; an array given in memory has only the
        store's copy."""
        src = ids.input_source(run, name)
        copy = str(ids.array_path(run, name))
        facets: dict[str, Any] = {}
        if digests.get(name):
            facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
                datasetVersion=str(digests[name]), producer=producer)
        if src is None:
            return InputDataset(namespace=FILE_NAMESPACE, name=copy, facets=facets)
        facets["symlinks"] = symlinks_dataset.SymlinksDatasetFacet(
            identifiers=[symlinks_dataset.Identifier(namespace=FILE_NAMESPACE, name=copy,
                                                     type="SUBZERO_STORE_COPY")],
            producer=producer)
        return InputDataset(namespace=FILE_NAMESPACE, name=src, facets=facets)

    graph = SubzeroOperatorGraphJobFacet(
        workflow=row.workflow, inputs=inputs, module=row.source,
        operators=[{"name": o["name"], "class": o["class"], "inputs": list(o["inputs"]),
                    "strategies": list(o["strategies"])} for o in ops], producer=producer)
    lineage = SubzeroRegionLineageRunFacet(
        store=ids.store_uri(run), run=int(run.id), status=row.status,
        lineageBytes=int(sum(int(o["lineage_bytes"] or 0) for o in ops)),
        operators=[{"name": o["name"], "strategies": list(o["strategies"]),
                    "modes": sorted({s.split(":")[0] for s in o["strategies"]}),
                    "lineageBytes": int(o["lineage_bytes"] or 0), "pairs": int(o["pairs"] or 0),
                    "seconds": float(o["run_s"] or 0.0)} for o in ops],
        traces=None if result is None else [trace_summary(result)], producer=producer)
    run_facets: dict[str, Any] = {
        "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
            version=ids.version(), name="SubZero", openlineageAdapterVersion=ids.version(),
            producer=producer),
        "subzero_regionLineage": lineage}
    if row.error:
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=row.error, programmingLanguage="python", producer=producer)
    job_facets: dict[str, Any] = {
        "jobType": job_type_job.JobTypeJobFacet(processingType="BATCH", integration="SUBZERO",
                                                jobType="WORKFLOW", producer=producer),
        "subzero_operatorGraph": graph}
    when = ids.when(row.ended if row.ended is not None else row.started)
    assert when is not None
    return RunEvent(
        eventType=_STATES.get(row.status, RunState.OTHER), eventTime=when.isoformat(),
        run=Run(runId=ids.run_uuid(run), facets=run_facets),
        job=Job(namespace=f"subzero:{run.store.path}", name=row.workflow, facets=job_facets),
        inputs=[source(n) for n in inputs],
        outputs=[dataset(OutputDataset, o["name"]) for o in ops if o["name"] in arrays],
        producer=producer)


def openlineage_json(run: SubZeroRun, result: TraceResult | None = None) -> str:
    """The event as JSON text, by the client's serializer."""
    return Serde.to_json(openlineage_event(run, result), indent=2)


def write_openlineage(run: SubZeroRun, path: str | os.PathLike, result: TraceResult | None = None,
                      force: bool = False) -> Path:
    """Write the run's OpenLineage event (with ``result``'s region lineage) to ``path``."""
    return write_text(path, openlineage_json(run, result) + "\n", force)


# -- validation ----------------------------------------------------------------------------
def facet_schema(url: str) -> dict[str, Any]:
    """The shipped JSON Schema a custom facet's ``_schemaURL`` names, narrowed to the
    facet's definition."""
    base, _, frag = url.partition("#/$defs/")
    name = base.rsplit("/", 1)[-1]
    if not base.startswith(SCHEMA_BASE + "/") or name[:-len(".json")] not in CUSTOM_FACETS or not frag:
        raise InvalidEvent(f"_schemaURL {url!r} names no schema SubZero ships")
    doc = json.loads((SCHEMA_DIR / name).read_text())
    return {"$ref": f"#/$defs/{frag}", "$defs": doc["$defs"]}


def _uri(value: Any, where: str) -> None:
    u = urlparse(value) if isinstance(value, str) else None
    if u is None or not u.scheme or not (u.netloc or u.path):
        raise InvalidEvent(f"{where} must be an absolute URI, not {value!r}")


def _facets(facets: Any, known: dict[str, type], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check every facet's base fields and custom facets' schemas; rebuild the known ones.
    Returns (rebuilt facets, their JSON)."""
    import jsonschema
    if facets is None:
        return {}, {}
    if not isinstance(facets, dict):
        raise InvalidEvent(f"{where} must be an object")
    rebuilt, seen = {}, {}
    for key, f in facets.items():
        if not isinstance(f, dict):
            raise InvalidEvent(f"{where}.{key} must be an object")
        for base in ("_producer", "_schemaURL"):
            if base not in f:
                raise InvalidEvent(f"{where}.{key} has no {base}")
            _uri(f[base], f"{where}.{key}.{base}")
        if f["_schemaURL"].startswith(SCHEMA_BASE):
            try:
                jsonschema.validate(f, facet_schema(f["_schemaURL"]))
            except jsonschema.ValidationError as e:
                path = "".join(f"[{p!r}]" for p in e.absolute_path)
                raise InvalidEvent(f"{where}.{key}{path}: {e.message}") from e
        cls = known.get(key)
        if cls is None:
            continue                    # another producer's facet: base fields checked
        fields = {k: v for k, v in f.items() if not k.startswith("_")}
        try:
            obj = cls(**fields, producer=f["_producer"])
        except (TypeError, ValueError) as e:
            raise InvalidEvent(f"{where}.{key}: {e}") from e
        if obj._schemaURL != f["_schemaURL"]:
            raise InvalidEvent(f"{where}.{key}._schemaURL is {f['_schemaURL']!r}, expected "
                               f"{obj._schemaURL!r}")
        rebuilt[key], seen[key] = obj, f
    return rebuilt, seen


def validate_event(event: dict[str, Any] | str) -> RunEvent:
    """Validate an OpenLineage run event (a dict, or JSON text) and return it rebuilt as
    the client's ``RunEvent``; raise :class:`InvalidEvent` naming the first problem.

    Checks: the required fields and their types; ``eventTime`` ISO 8601 with a time,
    ``run.runId`` a UUID (the client's validators); ``producer``, ``schemaURL`` and every
    facet's ``_producer`` / ``_schemaURL`` absolute URIs; SubZero's facets against the
    JSON Schemas shipped with it; and that the rebuilt event serializes back to exactly
    the given one (no field lost, misspelt or of another type).  Needs ``jsonschema``."""
    doc = json.loads(event) if isinstance(event, str) else event
    if not isinstance(doc, dict):
        raise InvalidEvent("an OpenLineage event is a JSON object")
    for key in ("eventTime", "producer", "schemaURL", "run", "job"):
        if key not in doc:
            raise InvalidEvent(f"the event has no {key}")
    _uri(doc["producer"], "producer")
    _uri(doc["schemaURL"], "schemaURL")
    run, job = doc["run"], doc["job"]
    if not isinstance(run, dict) or "runId" not in run:
        raise InvalidEvent("run.runId is missing")
    if not isinstance(job, dict) or not isinstance(job.get("namespace"), str) or not isinstance(
            job.get("name"), str):
        raise InvalidEvent("job.namespace and job.name must be strings")
    run_facets, run_seen = _facets(run.get("facets"), RUN_FACETS, "run.facets")
    job_facets, job_seen = _facets(job.get("facets"), JOB_FACETS, "job.facets")

    def datasets(cls, key: str) -> list:
        items = doc.get(key) or []
        if not isinstance(items, list) or not all(
                isinstance(d, dict) and isinstance(d.get("namespace"), str) and isinstance(d.get("name"), str)
                for d in items):
            raise InvalidEvent(f"{key} must be a list of datasets with a namespace and a name")
        for i, d in enumerate(items):       # other producers' dataset facets: base fields
            for group in ("facets", "inputFacets", "outputFacets"):
                _facets(d.get(group), {}, f"{key}[{i}].{group}")
        return [cls(namespace=d["namespace"], name=d["name"]) for d in items]

    try:
        rebuilt = RunEvent(
            eventType=RunState(doc["eventType"]) if "eventType" in doc else None,
            eventTime=doc["eventTime"], producer=doc["producer"],
            run=Run(runId=run["runId"], facets=run_facets),
            job=Job(namespace=job["namespace"], name=job["name"], facets=job_facets),
            inputs=datasets(InputDataset, "inputs"), outputs=datasets(OutputDataset, "outputs"))
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidEvent(f"not a valid run event: {e}") from e
    if rebuilt.schemaURL != doc["schemaURL"]:
        raise InvalidEvent(f"schemaURL is {doc['schemaURL']!r}; this client writes run events of "
                           f"{rebuilt.schemaURL!r}")
    # what the rebuilt event must serialize to: the event, less the facets it does not model
    expected = {**doc, "run": {**run, "facets": run_seen}, "job": {**job, "facets": job_seen},
                **{k: [{"namespace": d["namespace"], "name": d["name"]} for d in doc.get(k) or []]
                   for k in ("inputs", "outputs")}}
    got, want = _lean(Serde.to_dict(rebuilt)), _lean(expected)
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise InvalidEvent(f"the event does not match the OpenLineage model at {', '.join(diff)}")
    return rebuilt


def _lean(x: Any) -> Any:
    """``x`` without empty objects and nulls (the serializer writes some, omits others)."""
    if isinstance(x, dict):
        out = {k: _lean(v) for k, v in x.items()}
        return {k: v for k, v in out.items() if v is not None and v != {}}
    if isinstance(x, list):
        return [_lean(v) for v in x]
    return x
