"""How exported records name SubZero things: stable, unique, the same on every export.

A run is named by its store's location and its id, an array by the Zarr folder
the run keeps it in, a trace by what it asked (run, start array and cells,
target).  Exporting the same run or trace twice gives the same names, so a
catalog that ingests both merges them instead of counting two runs.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from subzero.query.trace import TraceResult
    from subzero.run import Run

#: SubZero's home: the producer of OpenLineage events, the base of its vocabulary and of
#: the URLs of the custom facets' JSON Schemas (shipped in ``subzero/export/schemas``)
PROJECT_URL = "https://github.com/subzero-lineage/subzero"
#: the PROV namespace of SubZero's types and attributes (``subzero:Array`` ...)
VOCABULARY = f"{PROJECT_URL}/ns/"


def version() -> str:
    """The installed SubZero's version (the source tree's when not installed)."""
    from subzero.version import installed_version
    return installed_version()


def producer() -> str:
    """The OpenLineage ``producer`` URI: this SubZero's source at its version."""
    return f"{PROJECT_URL}/tree/v{version()}"


def store_uri(run: Run) -> str:
    """The run's store as a ``file://`` URI ending in ``/``."""
    return Path(run.store.path).as_uri() + "/"


def array_path(run: Run, name: str) -> Path:
    """Where the run keeps array ``name`` (a Zarr folder xarray opens)."""
    return Path(run.dir) / "arrays" / f"{name}.zarr"


def input_source(run: Run, name: str) -> str | None:
    """The file input ``name`` was read from, as the run recorded it (an absolute path;
    the file of a ``FILE:VARIABLE``); None for an array given in memory or a workflow's
    default array."""
    src = run.row.inputs.get(name)
    if not (isinstance(src, str) and os.path.isabs(src) and not src.startswith("<")):
        return None
    from subzero.storage.inputs import split_variable
    return str(split_variable(src)[0])          # cube.nc:temp was read from cube.nc


def run_uuid(run: Run) -> str:
    """A UUID for the run, derived from its store and id (UUID version 5)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{store_uri(run)}runs/{run.id}"))


def trace_key(result: TraceResult) -> str:
    """12 hex digits naming a trace by its question: the same query, the same key."""
    h = hashlib.sha1(f"{result.run_id}|{result.start}|{result.target}|{result.direction}".encode())
    if result.query is not None:
        h.update(str(result.query.shape).encode())
        h.update(result.query.ids().tobytes() if not result.query.is_entire else b"entire")
    return h.hexdigest()[:12]


def when(epoch: float | None) -> datetime | None:
    """A catalog time (seconds since the epoch) as an aware UTC datetime."""
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def user_of(run: Run) -> str | None:
    """Who ran it, as far as the store can tell: the owner of the run's folder."""
    try:
        import pwd
        return pwd.getpwuid(os.stat(run.dir).st_uid).pw_name
    except (ImportError, KeyError, OSError):
        return None
