"""The explorer's web application (Starlette): a JSON API over a :class:`Session`,
the page, and plotly.js from the ``plotly`` package (nothing from the network).

Routes:

* ``GET /`` -- the page; ``GET /static/...`` -- its script and style;
  ``GET /static/plotly.min.js`` -- plotly.js as the installed ``plotly`` wheel ships it.
* ``GET /api/run`` -- the run and its workflow DAG (arrays, shapes, dtypes, dims,
  producing operators and their inputs).
* ``GET /api/image/{array}?region=r0,r1,c0,c1&size=h,w`` -- a grey PNG of a view
  region, pooled to at most ``size`` pixels; what was drawn in ``X-SubZero-*`` headers.
* ``GET /api/value/{array}?cell=r,c`` -- the value under the pointer.
* ``POST /api/trace`` -- ``{"array", "box": [[r0, r1], [c0, c1]] or "locate": "RA,Dec
  [radius]" or "name=label, ...", "direction",
  "views": {id: {"array", "region": [...], "size": [h, w]}}}``: traces to every
  array reachable in the direction; per array the count and bounding box, per view
  given (of an array reached) the overlay as a PNG data URL, and the steps with
  their methods and times.
* ``GET /api/overlay/{trace}/{array}?region=...&size=...`` -- a kept trace's overlay
  for another window (after a zoom).

Errors are JSON ``{"error": "..."}``: 404 for an unknown array or route, 400 for a
request SubZero refuses, 500 (with the exception's text) for a bug.  Trace and
image work runs in Starlette's thread pool, never on the event loop.
"""

from __future__ import annotations

import base64
import json
from importlib import resources
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from subzero.errors import SubZeroError, UnknownArray
from subzero.explore.session import Session

STATIC = Path(__file__).parent / "static"


def plotly_js() -> Path:
    """plotly.min.js as the ``plotly`` wheel ships it."""
    p = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    if not p.is_file():
        raise SubZeroError(f"plotly.js is missing from the installed plotly package ({p}); "
                           f"reinstall it: pip install --force-reinstall plotly")
    return p


def _ints(text: str | None, what: str, n: int) -> list[int] | None:
    if text is None or text == "":
        return None
    try:
        vals = [int(float(v)) for v in text.split(",")]
    except ValueError as err:
        raise SubZeroError(f"bad {what} {text!r}: give {n} comma-separated numbers") from err
    if len(vals) != n:
        raise SubZeroError(f"bad {what} {text!r}: give {n} comma-separated numbers")
    return vals


def _headers(info: dict) -> dict[str, str]:
    return {"X-SubZero-Window": json.dumps(info), "Cache-Control": "no-store",
            "Access-Control-Expose-Headers": "X-SubZero-Window"}


def build_app(session: Session) -> Starlette:
    """The ASGI application serving ``session``'s run."""
    plotly_path = plotly_js()

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def no_icon(request: Request) -> Response:
        return Response(status_code=204)

    async def plotly(request: Request) -> Response:
        return FileResponse(plotly_path, media_type="text/javascript")

    async def run_info(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(session.describe))

    async def image(request: Request) -> Response:
        name = request.path_params["array"]
        q = request.query_params
        region = _ints(q.get("region"), "region", 4)
        size = _ints(q.get("size"), "size", 2)
        png, info = await run_in_threadpool(session.image, name, region, size)
        return Response(png, media_type="image/png", headers=_headers(info))

    async def value(request: Request) -> Response:
        name = request.path_params["array"]
        cell = _ints(request.query_params.get("cell"), "cell", 2)
        if cell is None:
            raise SubZeroError("give the cell: ?cell=row,col")
        return JSONResponse(await run_in_threadpool(session.value, name, cell))

    async def trace(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError as err:
            raise SubZeroError("the trace request is not JSON") from err
        if not isinstance(body, dict):
            raise SubZeroError("the trace request must be a JSON object")
        direction = body.get("direction", "backward")
        if direction not in ("backward", "forward"):
            raise SubZeroError(f"direction must be backward or forward, not {direction!r}")
        name = str(body.get("array", ""))
        box, locate = body.get("box"), body.get("locate")
        if locate is not None:
            if not isinstance(locate, str) or box is not None:
                raise SubZeroError("give either a box or a locate text, not both")
        elif not (isinstance(box, list) and len(box) == 2
                  and all(isinstance(b, list) and len(b) == 2 for b in box)):
            raise SubZeroError("give the box as [[row0, row1], [col0, col1]] (half-open)")
        views = body.get("views") or {}
        return JSONResponse(await run_in_threadpool(_trace, name, box, direction, views, locate))

    def _trace(name: str, box, direction: str, views: dict, locate: str | None) -> dict:
        ans = session.trace(name, box, direction == "backward", locate)
        arrays = {a: session.summary(ans, a) for a in ans.sets}
        overlays = {}
        for vid, v in views.items():
            if isinstance(v, dict) and v.get("array") in ans.sets:
                png, win = session.overlay(ans, v["array"], v.get("region"), v.get("size"))
                overlays[vid] = {"png": "data:image/png;base64," + base64.b64encode(png).decode(),
                                 **win.as_json()}
        return {"id": ans.id, "start": ans.start, "direction": ans.direction,
                "cells_in": ans.cells_in, "seconds": ans.seconds, "arrays": arrays,
                "overlays": overlays,
                "steps": [{"op": s.op, "input": s.input, "direction": str(s.direction),
                           "method": s.method, "cells_in": s.cells_in, "cells_out": s.cells_out,
                           "seconds": s.seconds, "note": s.note} for s in ans.steps]}

    async def overlay(request: Request) -> Response:
        name = request.path_params["array"]
        q = request.query_params
        region = _ints(q.get("region"), "region", 4)
        size = _ints(q.get("size"), "size", 2)

        def draw():
            ans = session.answer(int(request.path_params["trace"]))
            return session.overlay(ans, name, region, size)
        png, win = await run_in_threadpool(draw)
        return Response(png, media_type="image/png", headers=_headers(win.as_json()))

    async def unknown_array(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=404)

    async def refused(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=400)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        detail = exc.detail if exc.status_code != 404 else f"no such page: {request.url.path}"
        return JSONResponse({"error": detail}, status_code=exc.status_code)

    async def bug(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"},
                            status_code=500)

    routes = [
        Route("/", page),
        Route("/favicon.ico", no_icon),
        Route("/static/plotly.min.js", plotly),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        Route("/api/run", run_info),
        Route("/api/image/{array}", image),
        Route("/api/value/{array}", value),
        Route("/api/trace", trace, methods=["POST"]),
        Route("/api/overlay/{trace:int}/{array}", overlay),
    ]
    return Starlette(routes=routes, exception_handlers={
        UnknownArray: unknown_array, SubZeroError: refused, HTTPException: http_error,
        Exception: bug})
