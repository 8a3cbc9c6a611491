"""An impact query's answer (:class:`subzero.impact.Impact`) leaving SubZero: a
table (CSV or Parquet), a picture of every run's affected regions, W3C PROV and
OpenLineage.

* **table** -- one row per run and target array: ``run_id``, ``workflow``,
  ``input``, ``digest``, ``array``, ``count``, ``bounds`` (``--cells`` box
  syntax), the sky region's centre and RA/Dec ranges, the label region and the
  labels of affected objects (JSON text), and ``error`` for a run that could not
  be answered (one row, never left out); a run with nothing downstream is one
  row with no array;
* **plot** -- small multiples: a panel per run, grouped by workflow, each
  showing where the region went in the run's target arrays (1-D arrays as a
  strip, more dimensions as a projection onto the last two);
* **PROV** -- the input as an entity named by its content digest, the input
  region, and per run an activity (``subzero:Run``) that used it, with the region
  it affected in each array derived from the input region; a run that could not
  be answered carries its reason (``subzero:error``);
* **OpenLineage** -- one run event per run (as ``subzero export`` writes it) with
  each target's answer in the region lineage facet's ``traces``, one event per
  line (JSON Lines, as OpenLineage's file transport writes them).

Only the catalog and the answer are read: no operator code is loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from subzero.errors import ExportError
from subzero.export.output import check_target, write_atomic, write_text

#: an impact answer and its parts (:class:`subzero.impact.Impact`, ``RunImpact``,
#: ``TargetImpact``), read here as plain data: the query layer calls these writers
#: (``Impact.to_table``, ``Impact.plot``), so this module does not import it back
Impact = Any
RunImpact = Any
TargetImpact = Any

#: table formats, by suffix
TABLE_SUFFIXES = (".csv", ".parquet")
#: cells per axis of a plot panel (affected cells are pooled onto this grid)
PANEL_CELLS = 256


# -- table ---------------------------------------------------------------------------------
def table_rows(imp: Impact) -> list[dict[str, Any]]:
    """The answer as rows of plain values (see the module docstring)."""
    rows = []
    for r in imp.runs:
        base = {"run_id": r.run_id, "workflow": r.workflow, "input": r.input, "digest": imp.digest}
        if r.error is not None or not r.targets:
            rows.append({**base, **_target_columns(None), "error": r.error})
            continue
        for t in r.targets:
            rows.append({**base, **_target_columns(t), "error": None})
    return rows


def _target_columns(t: TargetImpact | None) -> dict[str, Any]:
    sky = (t.where.get("sky") or {}) if t is not None else {}
    none = [None, None]
    ra, dec, centre = sky.get("ra") or none, sky.get("dec") or none, sky.get("center") or none
    return {"array": None if t is None else t.array, "count": 0 if t is None else t.count,
            "bounds": None if t is None or t.bounds is None else
            ",".join(f"{lo}:{hi}" for lo, hi in zip(*t.bounds)),
            "sky_center_ra": centre[0], "sky_center_dec": centre[1],
            "sky_ra_min": ra[0], "sky_ra_max": ra[1], "sky_dec_min": dec[0], "sky_dec_max": dec[1],
            "labels": _json(t.where.get("labels")) if t is not None else None,
            "objects": _json(t.objects) if t is not None else None}


def _json(v: Any) -> str | None:
    return None if not v else json.dumps(v, default=str, separators=(",", ":"))


def table_format(path: str | os.PathLike) -> str:
    """``"csv"`` or ``"parquet"`` by the path's suffix, else one clear error."""
    suffix = Path(path).suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ExportError(f"cannot tell what table to write to {path}: end its name in .csv or "
                          f".parquet")
    return suffix[1:]


def check_table(path: str | os.PathLike, force: bool = False) -> Path:
    """The table's path checked before any work: its suffix, its folder, and for
    Parquet that pyarrow is installed."""
    if table_format(path) == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError as e:
            raise ExportError(f"writing {path} needs pyarrow, which is not installed: install it "
                              f"(pip install 'subzero-lineage[parquet]'), or write a .csv table") from e
    return check_target(path, force)


def write_table(imp: Impact, path: str | os.PathLike, force: bool = False) -> Path:
    """Write the answer's table to ``path`` (.csv or .parquet), atomically."""
    import pandas as pd
    fmt = table_format(path)
    check_table(path, force)
    cols = list(table_rows_columns())
    df = pd.DataFrame(table_rows(imp), columns=cols)
    df["count"] = df["count"].astype("int64")
    df["run_id"] = df["run_id"].astype("int64")
    if fmt == "csv":
        return write_atomic(path, lambda tmp: df.to_csv(tmp, index=False), force)
    return write_atomic(path, lambda tmp: df.to_parquet(tmp, index=False, engine="pyarrow"), force)


def table_rows_columns() -> tuple[str, ...]:
    return ("run_id", "workflow", "input", "digest", "array", "count", "bounds", "sky_center_ra",
            "sky_center_dec", "sky_ra_min", "sky_ra_max", "sky_dec_min", "sky_dec_max", "labels",
            "objects", "error")


# -- plot ----------------------------------------------------------------------------------
def check_plot(path: str | os.PathLike, force: bool = False) -> Path:
    if Path(path).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise ExportError(f"cannot tell what picture to write to {path}: end its name in .png, "
                          f".pdf or .svg")
    return check_target(path, force)


def pooled(t: TargetImpact, cells: int = PANEL_CELLS) -> np.ndarray:
    """A boolean picture of ``t``'s cells, at most ``cells`` per axis: 2-D as is, 1-D as
    a strip, more dimensions projected onto the last two; each pixel is set when any
    cell it covers is affected (vectorized, costs the cells, not the array)."""
    shape = tuple(int(n) for n in t.shape) or (1,)
    c = np.asarray(t.cells, np.int64).reshape(-1, len(shape))
    if len(shape) == 1:
        shape, c = (1, shape[0]), np.column_stack([np.zeros(len(c), np.int64), c[:, 0]])
    elif len(shape) > 2:
        shape, c = shape[-2:], c[:, -2:]
    h, w = (min(cells, n) for n in shape)
    img = np.zeros((max(h, 1), max(w, 1)), bool)
    if len(c):
        img[c[:, 0] * h // shape[0], c[:, 1] * w // shape[1]] = True
    return img


def write_plot(imp: Impact, path: str | os.PathLike, force: bool = False) -> Path:
    """Small multiples of the affected regions: a panel per run, grouped by workflow,
    each target array in its own colour; a run without an answer says why."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    check_plot(path, force)
    groups = imp.by_workflow()
    ncols = max(1, min(6, max((len(rs) for rs in groups.values()), default=1)))
    layout = []                                    # (workflow, runs of one row of panels)
    for wf, rs in groups.items():
        layout += [(wf, rs[k:k + ncols]) for k in range(0, len(rs), ncols)]
    names = list(dict.fromkeys(t.array for r in imp.runs for t in r.targets))
    colours = {n: plt.cm.tab10(k % 10) for k, n in enumerate(names)}
    fig, axes = plt.subplots(max(1, len(layout)), ncols, figsize=(2.4 * ncols, 2.4 * max(1, len(layout)) + 0.6),
                             squeeze=False)
    for row, (wf, rs) in enumerate(layout):
        for col in range(ncols):
            ax = axes[row][col]
            ax.set_xticks([])
            ax.set_yticks([])
            if col >= len(rs):
                ax.axis("off")
                continue
            _panel(ax, rs[col], colours)
            if col == 0:
                ax.set_ylabel(wf, fontsize=9)
    fig.suptitle(f"impact of {imp.cells_in} cells of {imp.digest[:20]}...: "
                 f"{len(imp.touched)} of {len(imp.runs)} runs affected", fontsize=10)
    if names:
        fig.legend(handles=[Patch(color=colours[n], label=n) for n in names], loc="lower center",
                   ncol=min(len(names), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05 if names else 0, 1, 0.95))

    def save(tmp: Path) -> None:
        fig.savefig(tmp, dpi=100, format=Path(path).suffix.lower()[1:])
    try:
        return write_atomic(path, save, force)
    finally:
        plt.close(fig)


def _panel(ax: Any, r: RunImpact, colours: dict[str, Any]) -> None:
    if r.error is not None:
        ax.text(0.5, 0.5, "cannot be answered", ha="center", va="center", fontsize=8, color="firebrick",
                transform=ax.transAxes)
        ax.set_title(f"run {r.run_id}", fontsize=8)
        return
    shown = [t for t in r.targets if t.count]
    if not shown:
        ax.text(0.5, 0.5, "not affected", ha="center", va="center", fontsize=8, transform=ax.transAxes)
    else:
        base = pooled(shown[0]).shape
        rgba = np.ones(base + (4,))
        for t in shown:                              # first target on top: drawn last
            img = pooled(t)
            if img.shape == base:
                rgba[img] = colours[t.array]
        ax.imshow(rgba, interpolation="nearest", aspect="auto")
    ax.set_title(f"run {r.run_id}: {r.count:,} cells", fontsize=8)


# -- PROV ----------------------------------------------------------------------------------
def impact_prov(store: Any, imp: Impact) -> Any:
    """The answer as a ``prov.model.ProvDocument`` (see the module docstring)."""
    from prov.model import ProvDocument

    from subzero.export import ids, regions
    from subzero.model.cellset import CellSet

    doc = ProvDocument()
    sz = doc.add_namespace("subzero", ids.VOCABULARY)
    doc.add_namespace("store", _store_uri(store))
    doc.add_namespace("content", f"{ids.VOCABULARY}content/")
    key = imp.digest.removeprefix("sz1:")
    content = doc.entity(f"content:{key}", {"prov:type": sz["Input"], "prov:label": f"input {imp.digest}",
                                            "subzero:digest": imp.digest,
                                            "subzero:shape": json.dumps(list(imp.shape))})
    start_cells = CellSet.of_ids(_ids(imp.cells, imp.shape), imp.shape)
    s = regions.summary(start_cells, "input")
    start = doc.entity(f"content:{key}/region", {
        "prov:type": sz["Region"], "prov:label": f"{s['cells']} of input {imp.digest[:20]}",
        "subzero:count": s["count"], "subzero:cells": s["cells"], "subzero:bbox": json.dumps(s["bbox"])})
    doc.specializationOf(start, content)
    for r in imp.runs:
        base = f"store:runs/{r.run_id}"
        attrs: dict[str, Any] = {"prov:type": sz["Run"], "prov:label": f"run {r.run_id} of workflow {r.workflow}",
                 "subzero:workflow": r.workflow, "subzero:input": r.input, "subzero:count": r.count}
        if r.error is not None:
            attrs["subzero:error"] = r.error
        act = doc.activity(base, None, None, attrs)
        doc.used(act, content, None, None, {"prov:role": r.input})
        for t in r.targets:
            cs = CellSet.of_ids(_ids(t.cells, t.shape), t.shape)
            a = regions.summary(cs, t.array)
            ent = doc.entity(f"{base}/impact/{key[:12]}/{t.array}", {
                "prov:type": sz["Region"], "prov:label": f"{a['cells']} of {t.array}",
                "subzero:array": doc.valid_qualified_name(f"{base}/arrays/{t.array}.zarr"),
                "subzero:count": a["count"], "subzero:cells": a["cells"], "subzero:bbox": json.dumps(a["bbox"]),
                **({"subzero:objects": json.dumps(t.objects, default=str)} if t.objects else {})})
            doc.wasGeneratedBy(ent, act)
            doc.wasDerivedFrom(ent, start, act, other_attributes={"prov:type": sz["RegionLineage"],
                                                                   "subzero:direction": "forward"})
    return doc


def write_prov(store: Any, imp: Impact, path: str | os.PathLike, force: bool = False) -> Path:
    """Write the answer's PROV-JSON to ``path`` (atomically; ``force`` to replace)."""
    check_target(path, force)
    text = str(impact_prov(store, imp).serialize(format="json", indent=2, sort_keys=True))
    return write_text(path, text + "\n", force)


def _ids(cells: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    c = np.asarray(cells, np.int64).reshape(-1, len(shape))
    if not len(c):
        return np.zeros(0, np.int64)
    return np.asarray(np.ravel_multi_index(tuple(c.T), shape), np.int64)


def _store_uri(store: Any) -> str:
    return Path(store.path).resolve().as_uri() + "/"


# -- OpenLineage ---------------------------------------------------------------------------
def impact_events(store: Any, imp: Impact) -> list[Any]:
    """One OpenLineage ``RunEvent`` per run of the answer, its targets' regions in the
    region lineage facet's ``traces`` (from the input's region, forward)."""
    from subzero.export import regions
    from subzero.export.openlineage import openlineage_event
    from subzero.model.cellset import CellSet

    start = regions.summary(CellSet.of_ids(_ids(imp.cells, imp.shape), imp.shape), "input")
    events = []
    for r in imp.runs:
        with store.get(r.run_id) as run:
            ev = openlineage_event(run)
        facets = ev.run.facets
        assert facets is not None
        facet: Any = facets["subzero_regionLineage"]
        traces = []
        for t in r.targets:
            cs = CellSet.of_ids(_ids(t.cells, t.shape), t.shape)
            traces.append({"key": f"impact-{imp.digest.removeprefix('sz1:')[:12]}-{t.array}",
                           "from": r.input, "to": t.array, "direction": "forward", "count": t.count,
                           "start": {**start, "array": r.input}, "answer": regions.summary(cs, t.array),
                           "steps": []})
        facet.traces = traces
        events.append(ev)
    return events


def write_openlineage(store: Any, imp: Impact, path: str | os.PathLike, force: bool = False) -> Path:
    """Write the answer's OpenLineage events to ``path``, one per line (atomically)."""
    from openlineage.client.serde import Serde
    check_target(path, force)
    text = "".join(Serde.to_json(ev) + "\n" for ev in impact_events(store, imp))
    return write_text(path, text, force)
