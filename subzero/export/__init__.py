"""Export lineage to lab tools (see the README's "Exporting lineage").

* :func:`write_mask` — a trace's answer as a labelled boolean mask (Zarr or NetCDF)
  that xarray and dask open directly (``TraceResult.to_xarray()`` in memory);
* :func:`prov_document` / :func:`write_prov` — a run, and a trace's region lineage,
  as W3C PROV (PROV-JSON), with the ``prov`` package;
* :func:`openlineage_event` / :func:`write_openlineage` — a run as an OpenLineage run
  event with its operator graph and region lineage facets, with ``openlineage-python``;
* :func:`export` — any of them, chosen by the path's suffix (what ``subzero trace
  --export`` and ``subzero export`` call).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from subzero.errors import ExportError
from subzero.export.mask import MASK_SUFFIXES, write_mask

if TYPE_CHECKING:
    from subzero.query.trace import TraceResult
    from subzero.run import Run

#: an impact answer and the store it came from (:class:`subzero.impact.Impact`,
#: :class:`subzero.store.Store`): the layers above call these writers, so this
#: package does not import them back
Impact = Any
Store = Any

#: what a path's suffix exports
FORMATS = {".zarr": "mask", ".nc": "mask", ".prov.json": "prov",
           ".openlineage.json": "openlineage", ".ol.json": "openlineage"}


def format_of(path: str | os.PathLike) -> str:
    """``"mask"``, ``"prov"`` or ``"openlineage"``, by the path's suffix."""
    name = Path(path).name.lower()
    for suffix, fmt in sorted(FORMATS.items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix) and len(name) > len(suffix):
            return fmt
    raise ExportError(f"cannot tell what to export to {path}: end its name in .zarr or .nc (a "
                      f"mask), .prov.json (PROV-JSON) or .openlineage.json / .ol.json "
                      f"(an OpenLineage event)")


def prov_document(run: Run, result: TraceResult | None = None):
    """The run (and ``result``'s region lineage) as a ``prov.model.ProvDocument``."""
    from subzero.export.prov import prov_document as build
    return build(run, result)


def write_prov(run: Run, path: str | os.PathLike, result: TraceResult | None = None,
               force: bool = False) -> Path:
    """Write the run's PROV-JSON (with ``result``'s region lineage) to ``path``."""
    from subzero.export.prov import write_prov as write
    return write(run, path, result, force)


def openlineage_event(run: Run, result: TraceResult | None = None):
    """The run as an ``openlineage.client.event_v2.RunEvent``."""
    from subzero.export.openlineage import openlineage_event as build
    return build(run, result)


def write_openlineage(run: Run, path: str | os.PathLike, result: TraceResult | None = None,
                      force: bool = False) -> Path:
    """Write the run's OpenLineage event (with ``result``'s region lineage) to ``path``."""
    from subzero.export.openlineage import write_openlineage as write
    return write(run, path, result, force)


def write_impact_prov(store: Store, imp: Impact, path: str | os.PathLike, force: bool = False) -> Path:
    """Write an impact's PROV-JSON (the input by content, an activity per run) to ``path``."""
    from subzero.export.impact import write_prov as write
    return write(store, imp, path, force)


def write_impact_openlineage(store: Store, imp: Impact, path: str | os.PathLike,
                             force: bool = False) -> Path:
    """Write an impact's OpenLineage events (one per run, JSON Lines) to ``path``."""
    from subzero.export.impact import write_openlineage as write
    return write(store, imp, path, force)


def export(path: str | os.PathLike, run: Run | None = None, result: TraceResult | None = None,
           force: bool = False) -> Path:
    """Export to ``path`` in the format its suffix names (see :data:`FORMATS`): a mask
    needs ``result``; PROV and OpenLineage need ``run`` (and include ``result``)."""
    fmt = format_of(path)
    if fmt == "mask":
        if result is None:
            raise ExportError(f"{path}: a mask ({', '.join(MASK_SUFFIXES)}) is a trace's answer; "
                              f"export it from `subzero trace ... --export {path}`")
        return write_mask(result, path, force)
    if run is None:
        raise ExportError(f"{path}: exporting {fmt} needs the run")
    if fmt == "prov":
        return write_prov(run, path, result, force)
    return write_openlineage(run, path, result, force)


__all__ = ["ExportError", "FORMATS", "export", "format_of", "openlineage_event", "prov_document",
           "write_impact_openlineage", "write_impact_prov", "write_mask", "write_openlineage", "write_prov"]
