"""The Python API: open a store, run workflows, trace lineage, read arrays.

    import subzero
    store = subzero.open_store(".subzero")
    run = store.run("workflows/example.py", strategies={"smooth": "full"})
    res = run.trace("stars", [(12, 40)], to="raw")
    res.cells, res.values
    run.array("smooth")            # xarray.DataArray

The names live in :mod:`subzero.store` (:class:`Store`, :func:`open_store`),
:mod:`subzero.run` (:class:`Run`) and :mod:`subzero.runs.options`
(:class:`RunOptions`); this module gathers them.  ``import subzero`` takes each
from its own module instead, so that ``subzero.open_store`` does not import the
run side (options, fsck) before a run asks for it.
"""

from subzero.query.tracelog import trace_signature
from subzero.run import Run
from subzero.runs.fsck import fsck
from subzero.runs.options import RunOptions
from subzero.store import DEFAULT_STORE, Store, open_store

__all__ = ["DEFAULT_STORE", "Run", "RunOptions", "Store", "fsck", "open_store", "trace_signature"]
