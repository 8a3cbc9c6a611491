"""``subzero explore``: a local web page over a run for exploring its lineage.

Pick an array, click a cell or brush a rectangle, and the backward or forward
lineage is highlighted on every other array of the workflow, with the trace's
time and each step's method.  ``serve(run)`` serves it until Ctrl-C;
``start(run)`` serves it in a background thread and returns its ``url`` and a
``stop()``::

    import subzero
    from subzero import explore
    run = subzero.open_store(".subzero").get("latest")
    with explore.start(run) as ex:
        print(ex.url)

The pieces: ``session`` (the run, its DAG and the traces, through the run's
executor), ``render`` (array views and overlays as PNG), ``app`` (the Starlette
routes) and ``server`` (uvicorn, the socket).
"""

from subzero.explore.server import DEFAULT_HOST, DEFAULT_PORT, Running, bind, serve, start
from subzero.explore.session import Session, trace_all

__all__ = ["serve", "start", "bind", "Running", "Session", "trace_all", "DEFAULT_HOST",
           "DEFAULT_PORT"]
