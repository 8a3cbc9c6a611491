"""A run's operators, kept as ``workflow.pkl`` so traces can re-run them later,
even from another process.

Operators defined in workflow files loaded by path live in made-up modules
(``subzero_wf_*``) that another process cannot import, so those modules are
pickled by value.  Runs written before SubZero had one import namespace name
their classes ``subzero.cells``, ``operators.elementwise`` and so on; reading
maps those names to where the classes live now.
"""

from __future__ import annotations

import io
import pickle
import sys
from pathlib import Path

import cloudpickle

FILE = "workflow.pkl"

#: modules of the core that moved into subpackages (old name -> new name); the
#: top-level packages operators, optimizer and workflows moved under ``subzero.``
_RENAMED = {
    "subzero.modes": "subzero.model.modes", "subzero.strategy": "subzero.model.strategy",
    "subzero.cells": "subzero.model.cells", "subzero.operator": "subzero.model.operator",
    "subzero.workflow": "subzero.model.workflow", "subzero.context": "subzero.capture.context",
    "subzero.capture": "subzero.capture.buffer", "subzero.tiles": "subzero.capture.tiles",
    "subzero.codec": "subzero.storage.codec", "subzero.encodings": "subzero.storage.encodings",
    "subzero.lineagestore": "subzero.storage.lineage", "subzero.arraystore": "subzero.storage.arrays",
    "subzero.catalog": "subzero.storage.catalog", "subzero.inputs": "subzero.storage.inputs",
    "subzero.engine": "subzero.engines.local", "subzero.spark_engine": "subzero.engines.spark",
    "subzero.spark": "subzero.engines.session", "subzero.instances": "subzero.engines.instances",
    "subzero.executor": "subzero.query.executor", "subzero.relation": "subzero.query.relation",
    "subzero.reexec": "subzero.query.reexec", "subzero.workload": "subzero.query.workload",
}


def current_module(name: str) -> str:
    """Where a module of an older layout lives now (``name`` itself if it did not move)."""
    if name in _RENAMED:
        return _RENAMED[name]
    head, _, tail = name.partition(".")
    if head in ("operators", "optimizer", "workflows"):
        return f"subzero.{name}"
    return name


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        return super().find_class(current_module(module), name)


def save_workflow(wf, run_dir: Path) -> bool:
    """Write ``workflow.pkl``; False when the operators cannot be pickled (traces
    then reload the workflow from its source file)."""
    mods = [m for n, m in list(sys.modules.items()) if n.startswith("subzero_wf_")]
    registered = []
    for m in mods:
        try:
            cloudpickle.register_pickle_by_value(m)
            registered.append(m)
        except Exception:
            pass
    try:
        (Path(run_dir) / FILE).write_bytes(cloudpickle.dumps(wf))
        return True
    except Exception:
        return False
    finally:
        for m in registered:
            try:
                cloudpickle.unregister_pickle_by_value(m)
            except Exception:
                pass


def load_workflow_pickle(data: bytes):
    """The workflow of a ``workflow.pkl`` (cloudpickle's format is pickle's)."""
    return _Unpickler(io.BytesIO(data)).load()
