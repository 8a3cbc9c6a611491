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
request SubZero refuses, with the reason -- every number of a request is checked
before use (:func:`whole`: no NaN, infinity, ``1e400``, text or bool, nothing beyond
:data:`MAX_NUMBER`), a trace body is bounded in size and depth (:func:`_body`) -- and
500 (with the exception's text) only for a bug.  Trace and image work runs in
Starlette's thread pool, never on the event loop.
"""

from __future__ import annotations

import base64
import json
import math
from importlib import resources
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from subzero.errors import QueryError, SubZeroError, UnknownArray
from subzero.explore.session import Session

STATIC = Path(__file__).parent / "static"


def plotly_js() -> Path:
    """plotly.min.js as the ``plotly`` wheel ships it."""
    p = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    if not p.is_file():
        raise SubZeroError(f"plotly.js is missing from the installed plotly package ({p}); "
                           f"reinstall it: pip install --force-reinstall plotly")
    return p


#: the largest number a request may hold (a cell, a region bound, a pixel size): far
#: beyond any array's side, and small enough that sums of two stay 64-bit integers
MAX_NUMBER = 2**62
#: the largest trace request body: a click's box and one view per array of the
#: workflow take a few kilobytes
MAX_BODY = 1 << 20
#: views one trace request may ask overlays for (the page asks one per array)
MAX_VIEWS = 4096


def whole(value: object, what: str) -> int:
    """A number of a request as a whole number: an integer, or a finite decimal (the
    page's coordinates are whole; a fraction is cut off as ``int`` does), at most
    :data:`MAX_NUMBER` in size.  Anything else -- a text that is no number, a bool,
    NaN, infinity, ``1e400`` -- is a 400 naming ``what``."""
    x: int | None = None
    v = value
    if isinstance(v, str):
        try:
            x = int(v.strip())
        except ValueError:
            try:
                v = float(v.strip())
            except ValueError:
                pass
    if x is None and isinstance(v, int) and not isinstance(v, bool):
        x = v
    elif x is None and isinstance(v, float) and math.isfinite(v):
        x = int(v)
    if x is None:
        raise QueryError(f"bad {what}: {_shown(v)} is not a number")
    if abs(x) > MAX_NUMBER:
        raise QueryError(f"bad {what}: {x} is out of range")
    return x


def _shown(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (int, float, str, bool, type(None))) \
        else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _numbers(value: object, what: str, n: int) -> list[int]:
    """``n`` whole numbers, from a list or a comma-separated text."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) != n:
        raise QueryError(f"bad {what} {_shown(value)}: give {n} numbers")
    return [whole(v, what) for v in items]


def _ints(text: str | None, what: str, n: int) -> list[int] | None:
    if text is None or text == "":
        return None
    return _numbers(text, what, n)


def _body(raw: bytes) -> dict:
    """A trace request's JSON object: bounded in size and depth, numbers finite (JSON's
    ``NaN``, ``Infinity`` and ``1e400`` are refused)."""
    if len(raw) > MAX_BODY:
        raise QueryError(f"the trace request is too large ({len(raw)} bytes; at most {MAX_BODY})")

    def finite(text: str) -> float:
        v = float(text)
        if not math.isfinite(v):
            raise ValueError(f"{text} is not a finite number")
        return v

    def constant(name: str) -> float:
        raise ValueError(f"{name} is not a number JSON allows")
    try:
        body = json.loads(raw, parse_float=finite, parse_constant=constant)
    except RecursionError as err:
        raise QueryError("the trace request is nested too deeply") from err
    except ValueError as err:          # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise QueryError(f"the trace request is not JSON ({_first_line(err)})") from err
    if not isinstance(body, dict):
        raise QueryError("the trace request must be a JSON object")
    return body


def _first_line(err: Exception) -> str:
    return str(err).splitlines()[0][:120] if str(err) else type(err).__name__


def _box(box: object) -> list[list[int]]:
    if not (isinstance(box, list) and len(box) == 2 and all(isinstance(b, list) and len(b) == 2
                                                            for b in box)):
        raise QueryError("give the box as [[row0, row1], [col0, col1]] (half-open)")
    return [[whole(v, "box") for v in b] for b in box]


def _views(views: object) -> dict[str, dict]:
    """The views a trace request asks overlays for: ``{id: {"array", "region", "size"}}``,
    each checked (a view of an array the trace does not reach is skipped later)."""
    if views is None:
        return {}
    if not isinstance(views, dict) or len(views) > MAX_VIEWS:
        raise QueryError(f"\"views\" must be an object of at most {MAX_VIEWS} views")
    out = {}
    for vid, v in views.items():
        if not isinstance(v, dict) or not isinstance(v.get("array"), str):
            raise QueryError(f"view {_shown(vid)} must be an object with its \"array\" name")
        region, size = v.get("region"), v.get("size")
        out[str(vid)] = {"array": v["array"],
                         "region": None if region is None else _numbers(region, "region", 4),
                         "size": None if size is None else _numbers(size, "size", 2)}
    return out


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
            raise QueryError("give the cell: ?cell=row,col")
        return JSONResponse(await run_in_threadpool(session.value, name, cell))

    async def trace(request: Request) -> Response:
        body = _body(await request.body())
        direction = body.get("direction", "backward")
        if direction not in ("backward", "forward"):
            raise QueryError(f"direction must be backward or forward, not {_shown(direction)}")
        name = body.get("array")
        if not isinstance(name, str):
            raise QueryError(f"\"array\" must be the name of an array, not {_shown(name)}")
        box, locate = body.get("box"), body.get("locate")
        if locate is not None:
            if box is not None:
                raise QueryError("give either a box or a locate text, not both")
            if not isinstance(locate, str):
                raise QueryError(f"\"locate\" must be a text, not {_shown(locate)}")
        else:
            box = _box(box)
        views = _views(body.get("views"))
        return JSONResponse(await run_in_threadpool(_trace, name, box, direction, views, locate))

    def _trace(name: str, box, direction: str, views: dict, locate: str | None) -> dict:
        ans = session.trace(name, box, direction == "backward", locate)
        arrays = {a: session.summary(ans, a) for a in ans.sets}
        overlays = {}
        for vid, v in views.items():
            if v["array"] in ans.sets:
                png, win = session.overlay(ans, v["array"], v["region"], v["size"])
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
