"""`subzero explore`: the lineage explorer, tested as a person uses it -- a real
server on 127.0.0.1 over the astronomy demo run, the system's Chromium driven by
Playwright, real mouse clicks and drags -- and what the page drew compared with
`run.trace`.

The browser is Debian's ``chromium`` (``scripts/setup.sh`` installs it as root);
without it these tests fail and say how to install it.  A screenshot of the page
is saved to ``tests/artifacts/explore.png``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import subzero
from subzero import explore
from subzero.errors import QueryError
from subzero.explore.render import View, overlay_mask, window
from subzero.model.cells import pack
from subzero.model.cellset import CellSet

ROOT = Path(__file__).resolve().parent.parent
WF = str(ROOT / "workflows" / "astronomy.py")
ARTIFACTS = Path(os.environ.get("SUBZERO_ARTIFACTS", ROOT / "tests" / "artifacts"))
CHROMIUM = os.environ.get("SUBZERO_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def astro(tmp_path_factory):
    """The astronomy demo run (two real LSST exposures, default strategies), in-process."""
    st = subzero.open_store(tmp_path_factory.mktemp("explore") / "store")
    run = st.run(WF, progress=False, engine="local")
    yield run
    st.close()


@pytest.fixture(scope="module")
def peak(astro):
    """The brightest star's peak pixel: the maximum of the cleaned image over star pixels."""
    stars = astro.array("stars").values
    image = astro.array("rmcr").values
    return tuple(int(v) for v in np.unravel_index(np.argmax(np.where(stars > 0, image, -np.inf)),
                                                   stars.shape))


@pytest.fixture(scope="module")
def server(astro):
    with explore.start(astro) as ex:
        yield ex


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium from the system's packages, a fresh profile, no network but ours."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"the explorer's browser tests need Chromium at {CHROMIUM}: install Debian's "
                    f"package (apt-get install chromium; scripts/setup.sh does it when run as "
                    f"root) or point $SUBZERO_CHROMIUM at a Chromium binary")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the explorer's browser tests need Playwright: pip install -e '.[test]' "
                    "(its browser download is not needed: the system's Chromium is used)")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM,
            headless=True, args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        yield ctx
        ctx.close()


@pytest.fixture
def page(browser, server):
    page = browser.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    # nothing leaves this machine: every request goes to the explorer's own server
    page.on("request", lambda r: r.url.startswith((server.url, "data:", "blob:"))
            or problems.append(f"request outside the explorer: {r.url}"))
    page.goto(server.url + "?array=stars")
    page.wait_for_function("window.explorer && window.explorer.ready", timeout=60_000)
    assert page.evaluate("window.explorer.ready") is True, page.inner_text("#error")
    yield page
    page.close()
    assert not problems, problems


# -- helpers ----------------------------------------------------------------------------------
DECODE = """async (id) => {
  const v = explorer.views[id];
  const ov = v.overlay;
  if (!ov) return null;
  const shown = !v.clip.hidden && v.img.getAttribute("src") === ov.src && v.img.complete;
  const img = new Image();
  img.src = ov.src;
  await img.decode();
  const c = document.createElement("canvas");
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext("2d");
  g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const cells = [];
  for (let i = 0; i < c.width * c.height; i++)
    if (d[4 * i + 3] > 0) cells.push([ov.win.rows[0] + Math.floor(i / c.width), ov.win.cols[0] + (i % c.width)]);
  return { cells, win: ov.win, width: c.width, height: c.height, shown, trace: ov.trace };
}"""


def highlighted(page, view_id: str) -> set[tuple[int, int]]:
    """The cells the page highlights on a view, decoded from the overlay image it drew
    (which must be drawn at one pixel per cell, and be the one plotly shows)."""
    got = page.evaluate(DECODE, view_id)
    assert got is not None, f"no overlay drawn on {view_id}"
    assert got["shown"], f"the overlay of {view_id} is not the image the page shows"
    win = got["win"]
    assert got["height"] == win["rows"][1] - win["rows"][0], win
    assert got["width"] == win["cols"][1] - win["cols"][0], win
    return {tuple(c) for c in got["cells"]}


def as_set(cells: np.ndarray) -> set[tuple[int, int]]:
    return {(int(r), int(c)) for r, c in cells}


def traces_done(page, n: int) -> None:
    page.wait_for_function(f"explorer.traces >= {n} && !explorer.busy", timeout=60_000)
    err = page.inner_text("#error") if page.is_visible("#error") else ""
    assert not err, err


def click_cell(page, view_id: str, row: int, col: int) -> None:
    pos = page.evaluate("([id, r, c]) => explorer.screenPos(id, r, c)", [view_id, row, col])
    page.mouse.click(pos["x"], pos["y"])


def zoom(page, view_id: str, region) -> None:
    page.evaluate("([id, region]) => explorer.zoom(id, region)", [view_id, list(region)])


# -- the browser tests ----------------------------------------------------------------------
def test_click_star_peak_highlights_exactly_its_raw_pixels(page, astro, peak):
    r, c = peak
    page.check("#exact")                                   # overlays at one pixel per cell
    zoom(page, "@main", (r - 20, r + 20, c - 20, c + 20))
    click_cell(page, "@main", r, c)
    traces_done(page, 1)
    q = page.evaluate("explorer.lastQuery")
    assert q == {"array": "stars", "box": [[r, r + 1], [c, c + 1]], "direction": "backward"}
    want = astro.trace("stars", [peak], to="raw_1", record=False)
    got = highlighted(page, "raw_1")
    assert len(want) > 100 and got == as_set(want.cells)
    assert highlighted(page, "@main") & {peak} == {peak}
    # the panel: trace time, each step's method, counts
    summary = page.inner_text("#summary")
    assert "backward trace from stars" in summary and "ms on the server" in summary
    methods = page.eval_on_selector_all("#steps tbody tr td:nth-child(2)", "tds => tds.map(t => t.textContent)")
    assert any(m.startswith("stored:") for m in methods) and "map" in methods
    title = page.inner_text("[data-view=raw_1] .title")
    assert f"{len(want):,} cells" in title
    # how the answer came, as `subzero trace` says it: the cells only an all-to-all step
    # brought in (the overscan strip)
    only = len(want) - len(want.direct if want.direct is not None else want.cellset)
    assert only > 0 and f"({only:,} only through all-to-all steps)" in title, title
    # a screenshot of the answer, zoomed to it, for people (and the README)
    page.uncheck("#exact")
    page.wait_for_function("!explorer.busy")
    page.click("#zoom-answer")
    page.wait_for_timeout(1500)
    page.mouse.move(*[page.evaluate("([id, r, c]) => explorer.screenPos(id, r, c)", ["@main", r, c])[k]
                      for k in ("x", "y")])
    page.wait_for_function("document.querySelector('#hover').textContent.includes('stars[')")
    # the pointer's sky position, as the run's WCS places that pixel
    page.wait_for_function("document.querySelector('#hover').textContent.includes('(ICRS)')")
    hover = page.inner_text("#hover")
    from subzero.coords import footprint
    sky = footprint(astro.grid("stars"), peak, (peak[0] + 1, peak[1] + 1), "stars")["center_hmsdms"]
    assert f"stars[{r}, {c}]" in hover and sky in hover
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explore.png"), full_page=True)


def test_a_wrong_click_gives_other_cells(page, astro, peak):
    """The comparison above can fail: a pixel beside the star is another answer."""
    r, c = peak[0] + 15, peak[1] + 15
    page.check("#exact")
    zoom(page, "@main", (peak[0] - 20, peak[0] + 20, peak[1] - 20, peak[1] + 20))
    click_cell(page, "@main", r, c)
    traces_done(page, 1)
    got = highlighted(page, "raw_1")
    star = as_set(astro.trace("stars", [peak], to="raw_1", record=False).cells)
    assert got != star
    assert got == as_set(astro.trace("stars", [(r, c)], to="raw_1", record=False).cells)


def test_brush_forward_on_raw_highlights_its_stars(page, astro, peak):
    page.select_option("#array", "raw_1")
    page.wait_for_function("explorer.views['@main'].name === 'raw_1' && explorer.views['@main'].base")
    page.check("input[name=direction][value=forward]")
    page.check("#exact")
    r, c = peak
    zoom(page, "@main", (r - 25, r + 25, c - 25, c + 25))
    a = page.evaluate("([id, r, c]) => explorer.screenPos(id, r, c)", ["@main", r - 8, c - 6])
    b = page.evaluate("([id, r, c]) => explorer.screenPos(id, r, c)", ["@main", r + 5, c + 9])
    page.mouse.move(a["x"], a["y"])
    page.mouse.down()
    page.mouse.move((a["x"] + b["x"]) / 2, (a["y"] + b["y"]) / 2, steps=4)
    page.mouse.move(b["x"], b["y"], steps=4)
    page.mouse.up()
    traces_done(page, 1)
    box = [[r - 8, r + 6], [c - 6, c + 10]]
    assert page.evaluate("explorer.lastQuery") == {"array": "raw_1", "box": box, "direction": "forward"}
    cells = np.array([(y, x) for y in range(*box[0]) for x in range(*box[1])])
    for target in ("stars", "rmcr"):
        want = astro.trace("raw_1", cells, to=target, record=False)
        assert len(want) > 0
        assert highlighted(page, target) == as_set(want.cells), target
    # arrays upstream of raw_1's consumers are not reached forward
    assert page.evaluate("explorer.trace.arrays.raw_2") is None


def test_go_to_a_sky_position_traces_the_cells_it_names(page, astro, peak):
    """Typing RA,Dec and a radius traces exactly what `trace --sky --radius` traces, and
    zooms the main view to it; an outside position is the CLI's error, in the page."""
    from subzero.coords import footprint
    sky = footprint(astro.grid("stars"), peak, (peak[0] + 1, peak[1] + 1), "stars")["center"]
    text = f"{sky[0]:.7f},{sky[1]:.7f} 0.6arcsec"
    page.check("#exact")
    page.fill("#locate", text)
    page.press("#locate", "Enter")
    traces_done(page, 1)
    page.wait_for_function("(() => { const w = explorer.views['@main'].base.win;"
                           " return w.rows[1] - w.rows[0] < 100; })()", timeout=30_000)
    assert page.evaluate("explorer.lastQuery") == {"array": "stars", "locate": text,
                                                   "direction": "backward"}
    named = astro.cells_at("stars", sky=f"{sky[0]:.7f},{sky[1]:.7f}", radius="0.6arcsec")
    assert len(named) > 1 and tuple(peak) in as_set(named)
    want = astro.trace("stars", named, to="raw_1", record=False)
    assert highlighted(page, "raw_1") == as_set(want.cells)
    assert highlighted(page, "@main") == as_set(named)          # the named cells themselves
    page.fill("#locate", "10,10")
    page.press("#locate", "Enter")
    page.wait_for_selector("#error:not([hidden])")
    assert "outside array 'stars'" in page.inner_text("#error")


def test_go_to_text_reads_like_the_cli():
    from subzero.explore.session import locate_query
    assert locate_query(" 357.3,-2.7 ") == {"sky": "357.3,-2.7"}
    assert locate_query("23:49:21.56, -2:44:58.9 2arcsec") == {"sky": "23:49:21.56,-2:44:58.9",
                                                               "radius": "2arcsec"}
    assert locate_query("time=2020-01-03T12:00, lat=10:20") == {
        "sel": {"time": "2020-01-03T12:00", "lat": slice("10", "20")}}
    with pytest.raises(QueryError, match="type a sky position"):
        locate_query("  ")


def test_wheel_zoom_requests_the_visible_window_at_screen_resolution(page, peak):
    r, c = peak
    pos = page.evaluate("([id, r, c]) => explorer.screenPos(id, r, c)", ["@main", r, c])
    page.mouse.move(pos["x"], pos["y"])
    whole = page.evaluate("explorer.views['@main'].base.win")
    assert whole["rows"] == [0, 2001] and whole["height"] < 2001      # pooled to the screen
    for _ in range(12):
        page.mouse.wheel(0, -100)
        page.wait_for_timeout(30)
    page.wait_for_function("(() => { const w = explorer.views['@main'].base.win;"
                           " return w.rows[1] - w.rows[0] < 400; })()", timeout=30_000)
    win = page.evaluate("explorer.views['@main'].base.win")
    assert win["rows"][0] <= r < win["rows"][1] and win["cols"][0] <= c < win["cols"][1]
    assert win["height"] == win["rows"][1] - win["rows"][0]            # one pixel per cell now
    page.dblclick("[data-view='@main'] .plot", position={"x": 100, "y": 300})
    page.wait_for_function("explorer.views['@main'].base.win.rows[1] === 2001", timeout=30_000)


def test_api_errors_are_shown_in_the_page(page, server):
    page.goto(server.url + "?array=nope")
    page.wait_for_selector("#error:not([hidden])")
    assert "unknown array 'nope'" in page.inner_text("#error")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "api/value/nope?cell=0,0")
    assert e.value.code == 404 and "unknown array 'nope'" in json.load(e.value)["error"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url + "api/value/stars?cell=5000,0")
    assert e.value.code == 400 and "outside 'stars'" in json.load(e.value)["error"]


# -- without a browser ------------------------------------------------------------------------
def test_trace_all_equals_run_trace_for_every_array(astro, peak):
    for start, cells, backward in (("stars", [peak], True), ("raw_1", [(1160, 110), (5, 3)], False)):
        direct: dict = {}
        sets, steps, _ = explore.trace_all(astro, start, np.array(cells), backward, direct=direct)
        assert steps and start in sets and set(direct) == set(sets)
        for name, cs in sets.items():
            if name == start:
                continue
            want = astro.trace(start, cells, to=name, record=False)
            assert cs == want.cellset, (start, name)
            # the cells reached without all-to-all steps: as each trace's own walk says
            assert direct[name] == (want.direct if want.direct is not None else want.cellset), name


def test_overlay_is_the_pooled_bitmap_in_every_form():
    rng = np.random.default_rng(3)
    shape = (97, 61)
    for n in (0, 5, 400, 4000):
        bm = np.zeros(shape, bool)
        bm.flat[rng.choice(bm.size, n, replace=False)] = True
        sparse = CellSet.of_ids(pack(np.argwhere(bm), shape), shape)
        dense = CellSet.of_bitmap(bm)
        view = View(shape)
        for region, size in ((None, None), ((10, 90, 5, 60), (23, 17)), ((0, 97, 0, 61), (7, 7))):
            win = window(view, region, size, "a")
            want = np.zeros((win.height, win.width), bool)
            rs, cs = win.starts()
            sub = bm[win.rows[0]:win.rows[1], win.cols[0]:win.cols[1]]
            for i in range(win.height):
                for j in range(win.width):
                    r1 = rs[i + 1] if i + 1 < win.height else sub.shape[0]
                    c1 = cs[j + 1] if j + 1 < win.width else sub.shape[1]
                    want[i, j] = sub[rs[i]:r1, cs[j]:c1].any()
            assert np.array_equal(overlay_mask(sparse, view, win), want)
            assert np.array_equal(overlay_mask(dense, view, win), want)
    whole = window(View(shape), None, (10, 10), "a")
    assert overlay_mask(CellSet.everything(shape), View(shape), whole).all()


def test_trace_all_through_re_execution(tmp_path):
    """A black-box operator is re-run by the explorer's walk as by run.trace."""
    with subzero.open_store(tmp_path / "s") as st:
        run = st.run(str(ROOT / "workflows" / "example.py"), progress=False,
                     strategies={"clean": "blackbox"})
        last = "stars"
        shape = run.shapes()[last]
        cell = [tuple(s // 2 for s in shape)]
        sets, steps, _ = explore.trace_all(run, last, np.array(cell), True)
        assert any(s.method.startswith("reexec") for s in steps), [s.method for s in steps]
        for name, cs in sets.items():
            if name != last:
                assert cs == run.trace(last, cell, to=name, record=False).cellset, name


# -- the command line -------------------------------------------------------------------------
def test_cli_port_in_use_is_one_line_exit_2(cli, astro):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, out, err = cli("explore", "--store", astro.store.path, "--port", port, "--no-browser")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "already in use" in err and "--port" in err
    code, out, err = cli("explore", "--store", astro.store.path, "--host", "no-such-host.invalid",
                         "--no-browser")
    assert code == 2 and err.startswith("subzero: error: cannot listen on host") and err.count("\n") == 1


def test_cli_serves_until_interrupted(astro):
    from conftest import subzero_exe
    p = subprocess.Popen([subzero_exe(), "explore", "--store", str(astro.store.path), "--port", "0",
                          "--no-browser", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        first = json.loads(p.stdout.readline())
        assert first["url"].startswith("http://127.0.0.1:") and first["run_id"] == astro.id
        info = json.load(urllib.request.urlopen(first["url"] + "api/run", timeout=30))
        assert info["run_id"] == astro.id and len(info["arrays"]) == 31
        stars = next(a for a in info["arrays"] if a["name"] == "stars")
        assert stars["operator"] == "DetectStars" and stars["inputs"] == ["rmcr"]
        js = urllib.request.urlopen(first["url"] + "static/plotly.min.js", timeout=30).read(200)
        assert b"plotly" in js.lower()
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err


def test_views_of_other_ranks():
    """1-D arrays are strips, 3-D arrays a projection over the leading axis (any cell)."""
    from subzero.explore.render import image_png
    cube = np.zeros((3, 20, 15))
    cube[2, 4, 5] = 9.0
    view = View(cube.shape)
    assert view.size == (20, 15) and "axes 0" in (view.projection or "")
    assert len(view.cells_of_box((4, 5), (5, 6))) == 3          # every cell under the pixel
    cs = CellSet.of_ids(pack(np.array([[2, 4, 5], [0, 4, 5], [1, 10, 0]]), cube.shape), cube.shape)
    win = window(view, None, None, "cube")
    mask = overlay_mask(cs, view, win)
    assert {tuple(c) for c in np.argwhere(mask)} == {(4, 5), (10, 0)}
    png, info = image_png(lambda region: cube[region], view, win)
    assert png.startswith(b"\x89PNG") and info["pool"] == [1, 1]
    strip = View((40,))
    assert strip.size == (1, 40) and strip.array_region((0, 1), (3, 9)) == (slice(3, 9),)
    sw = window(strip, None, (5, 10), "strip")
    assert (sw.height, sw.width) == (1, 10)
    assert overlay_mask(CellSet.of_ids(np.array([0, 39]), (40,)), strip, sw).tolist() == \
        [[True] + [False] * 8 + [True]]


# -- malformed requests: a reason and 400 (404 for an unknown array), never a 500 -----------------
def _trace_body(**fields) -> str:
    return json.dumps({"array": "rmcr", "box": [[1150, 1152], [110, 112]], **fields})


DEEP = "[" * 100_000 + "]" * 100_000
INF_VIEW = {"v": {"array": "raw_1", "region": [0, 5, 0, 5], "size": [float("inf"), 3]}}
#: (method, path, body or None, status, a phrase of the reason)
MALFORMED = [
    ("POST", "/api/trace", '{"array": "rmcr", "box": [[0, Infinity], [0, 5]]}', 400, "Infinity"),
    ("POST", "/api/trace", '{"array": "rmcr", "box": [[0, NaN], [0, 5]]}', 400, "NaN"),
    ("POST", "/api/trace", '{"array": "rmcr", "box": [[0, 1e400], [0, 5]]}', 400, "1e400"),
    ("POST", "/api/trace", '{"array": "rmcr", "box": [[0, 1e300], [0, 5]]}', 400, "out of range"),
    ("POST", "/api/trace", _trace_body(box=[["a", "b"], [0, 5]]), 400, "bad box"),
    ("POST", "/api/trace", _trace_body(box=[[0, True], [0, 5]]), 400, "bad box"),
    ("POST", "/api/trace", _trace_body(box=[[-5, 3], [0, 5]]), 400, "not inside 'rmcr'"),
    ("POST", "/api/trace", _trace_body(box=[[0, 10**30], [0, 5]]), 400, "out of range"),
    ("POST", "/api/trace", _trace_body(box=[[0, 5000], [0, 5]]), 400, "not inside 'rmcr'"),
    ("POST", "/api/trace", _trace_body(box=[[0, 1]]), 400, "give the box"),
    ("POST", "/api/trace", _trace_body(box="0,1,0,1"), 400, "give the box"),
    ("POST", "/api/trace", _trace_body(views="x"), 400, '"views" must be an object'),
    ("POST", "/api/trace", _trace_body(views={"v": 3}), 400, "view \"v\""),
    ("POST", "/api/trace", _trace_body(views={"v": {"array": "raw_1", "region": "zz"}}), 400,
     "bad region"),
    ("POST", "/api/trace", json.dumps({"array": "rmcr", "box": [[1, 2], [1, 2]],
                                       "views": INF_VIEW}), 400, "Infinity"),
    ("POST", "/api/trace", _trace_body(array=["x"]), 400, '"array" must be the name'),
    ("POST", "/api/trace", _trace_body(array="nope"), 404, "unknown array 'nope'"),
    ("POST", "/api/trace", json.dumps({"array": "rmcr", "locate": 5}), 400, '"locate" must be'),
    ("POST", "/api/trace", json.dumps({"array": "rmcr", "locate": "1e400,5"}), 400, "finite"),
    ("POST", "/api/trace", json.dumps({"array": "rmcr", "locate": "nan,-2.75"}), 400, "finite"),
    ("POST", "/api/trace", json.dumps({"array": "rmcr", "locate": "357.34,-2.75 nanarcsec"}), 400,
     "radius"),
    ("POST", "/api/trace", _trace_body(direction=["b"]), 400, "direction"),
    ("POST", "/api/trace", DEEP, 400, "nested too deeply"),
    ("POST", "/api/trace", "not json", 400, "not JSON"),
    ("POST", "/api/trace", b"\xff\xfe\x00", 400, "not JSON"),
    ("POST", "/api/trace", "[1, 2]", 400, "JSON object"),
    ("POST", "/api/trace", " " * (2 << 20), 400, "too large"),
    ("GET", "/api/image/rmcr?region=0,inf,0,5", None, 400, "bad region"),
    ("GET", "/api/image/rmcr?region=0,nan,0,5", None, 400, "bad region"),
    ("GET", "/api/image/rmcr?region=0,1e400,0,5", None, 400, "bad region"),
    ("GET", "/api/image/rmcr?region=0,99999999999999999999999,0,5", None, 400, "out of range"),
    ("GET", "/api/image/rmcr?region=a,b,c,d", None, 400, "bad region"),
    ("GET", "/api/image/rmcr?region=0,5,0", None, 400, "give 4 numbers"),
    ("GET", "/api/image/rmcr?region=-9,-1,0,5", None, 400, "is empty"),
    ("GET", "/api/image/rmcr?size=1e400,3", None, 400, "bad size"),
    ("GET", "/api/image/rmcr?size=-1,3", None, 400, "bad size"),
    ("GET", "/api/image/nope?size=3,3", None, 404, "unknown array 'nope'"),
    ("GET", "/api/value/rmcr?cell=inf,3", None, 400, "bad cell"),
    ("GET", "/api/value/rmcr?cell=nan,3", None, 400, "bad cell"),
    ("GET", "/api/value/rmcr?cell=-1,3", None, 400, "outside 'rmcr'"),
    ("GET", "/api/value/rmcr?cell=99999999999999999999999,3", None, 400, "out of range"),
    ("GET", "/api/value/rmcr?cell=x", None, 400, "give 2 numbers"),
    ("GET", "/api/value/rmcr", None, 400, "give the cell"),
    ("GET", "/api/value/nope?cell=1,3", None, 404, "unknown array 'nope'"),
    ("GET", "/api/overlay/99999999999999999999999/rmcr", None, 400, "no longer kept"),
    ("GET", "/api/overlay/1/rmcr?region=0,inf,0,5", None, 400, "bad region"),
]


@pytest.fixture(scope="module")
def client(astro):
    """The explorer's application over the demo run, in-process (Starlette's TestClient
    raises any error the application lets through, which a server would log)."""
    from starlette.testclient import TestClient

    from subzero.explore.app import build_app
    from subzero.explore.server import session_of
    session = session_of(astro)
    with TestClient(build_app(session)) as c:
        yield c
    session.close()


@pytest.mark.parametrize("method,path,body,status,reason", MALFORMED,
                         ids=[f"{m[0]}-{m[1][:40]}-{str(m[2])[:30]}" for m in MALFORMED])
def test_a_malformed_request_is_refused_with_its_reason(client, method, path, body, status, reason):
    r = client.request(method, path, content=body)
    assert r.status_code == status, r.text[:300]
    assert reason in r.json()["error"], r.json()


def test_malformed_requests_leave_no_traceback_in_the_server_log(server):
    """The same requests to the real server (uvicorn): every answer a 400 or 404, and
    nothing logged (a 500 would log the exception's traceback)."""
    import logging
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)
    keep = Keep(logging.WARNING)
    log = logging.getLogger("uvicorn.error")
    log.addHandler(keep)
    try:
        for method, path, body, status, _ in MALFORMED:
            data = body.encode() if isinstance(body, str) else body
            req = urllib.request.Request(server.url + path.lstrip("/"), data=data, method=method)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=60)
            assert e.value.code == status, (path, str(body)[:60], e.value.read()[:200])
    finally:
        log.removeHandler(keep)
    assert not records, [r.getMessage() for r in records]


# -- labelled inputs: any dims, any kind of label -------------------------------------------------
def _labelled(kind: str):
    """A DataArray of the given shape of labels: 2-D float, 3-D with datetime, string labels."""
    import pandas as pd
    import xarray as xr
    rng = np.random.default_rng(4)
    if kind == "2d-float":
        return xr.DataArray(rng.random((30, 24)), dims=("lat", "lon"),
                            coords={"lat": np.linspace(-10.0, 10.0, 30), "lon": np.arange(24) * 1.5})
    if kind == "3d-datetime":
        return xr.DataArray(rng.random((4, 20, 16)), dims=("time", "y", "x"),
                            coords={"time": pd.date_range("2026-01-01", periods=4, freq="D"),
                                    "y": np.arange(20.0), "x": np.arange(16) * 0.25})
    return xr.DataArray(rng.random((12, 5)), dims=("gene", "sample"),
                        coords={"gene": [f"g{i}" for i in range(12)],
                                "sample": ["s-a", "s-b", "s-c", "s-d", "s-e"]})


def _labelled_run(store, kind: str):
    from subzero import Workflow
    from subzero.operators import MeanFilter, Threshold
    wf = Workflow("labelled")
    a = wf.input("a")
    m = wf.add("smooth", MeanFilter(size=3), a)
    wf.add("bright", Threshold(0.5), m)
    return store.run(wf, inputs={"a": _labelled(kind)}, progress=False, engine="local")


KINDS = ["2d-float", "3d-datetime", "2d-string"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_view_cell_of_a_labelled_input_answers(tmp_path, kind):
    """Hovering, drawing and tracing every array of a labelled run: 200s with the cell's
    labels (a projection's folded axes have none), never a 500."""
    from starlette.testclient import TestClient

    from subzero.explore.app import build_app
    from subzero.explore.server import session_of
    st = subzero.open_store(tmp_path / "store")
    run = _labelled_run(st, kind)
    da = _labelled(kind)
    session = session_of(run)
    try:
        with TestClient(build_app(session)) as c:
            arrays = c.get("/api/run").json()["arrays"]
            for a in arrays:
                vr, vc = a["view"]
                assert c.get(f"/api/image/{a['name']}?size=40,40").status_code == 200
                for r, col in ((0, 0), (vr - 1, vc - 1), (vr // 2, vc // 3)):
                    got = c.get(f"/api/value/{a['name']}?cell={r},{col}")
                    assert got.status_code == 200, got.text
                    labels = got.json().get("labels", {})
                    row_dim, col_dim = da.dims[-2], da.dims[-1]
                    assert labels.get(row_dim) == _plain_label(da[row_dim].values[r])
                    assert labels.get(col_dim) == _plain_label(da[col_dim].values[col])
            got = c.post("/api/trace", content=json.dumps({"array": "bright", "box": [[1, 3], [1, 3]]}))
            assert got.status_code == 200, got.text
    finally:
        session.close()
        st.close()


def _plain_label(v):
    from subzero.coords.labels import _plain
    return _plain(v)


@pytest.mark.parametrize("kind", KINDS)
def test_hovering_a_labelled_input_in_the_browser_shows_its_labels(browser, tmp_path, kind):
    """Each kind of labels in the page: hovering a cell of an operator's output shows
    the cell's labels along the drawn axes (a cube's projection says so); a click
    traces it and highlights its lineage; no page error."""
    st = subzero.open_store(tmp_path / "store")
    run = _labelled_run(st, kind)
    da = _labelled(kind)
    r, c = 7, 3
    with explore.start(run) as ex:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(ex.url + "?array=smooth")
        page.wait_for_function("window.explorer && window.explorer.ready", timeout=60_000)
        pos = page.evaluate("([id, r, c]) => explorer.screenPos(id, r, c)", ["@main", r, c])
        page.mouse.move(pos["x"], pos["y"])
        page.wait_for_function("document.querySelector('#hover').textContent.includes('smooth[')")
        hover = page.inner_text("#hover")
        click_cell(page, "@main", r, c)
        traces_done(page, 1)
        title = page.inner_text("[data-view=a] .title")
        page.close()
    st.close()
    assert not errors, errors
    assert f"smooth[{r}, {c}]" in hover, hover
    assert ("max over the projected axes" in hover) == (da.ndim == 3), hover
    row_dim, col_dim = da.dims[-2], da.dims[-1]
    shown = dict(p.split("=", 1) for p in hover.split("·")[-1].replace(" ", "").split(","))
    for dim, k in ((row_dim, r), (col_dim, c)):
        label = _plain_label(da[dim].values[k])
        got = shown.get(dim)
        assert got is not None and (float(got) == label if isinstance(label, float)
                                    else got == str(label)), (dim, label, hover)
    cells = [(r, c)] if da.ndim == 2 else [(t, r, c) for t in range(da.shape[0])]
    want = run.trace("smooth", cells, to="a", record=False)
    assert f"{len(want):,} cells" in title, title
