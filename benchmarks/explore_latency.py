"""Issue 14's explorer latency: click on a star -> every overlay drawn, in a real
headless Chromium, on the astronomy demo run and on a 16-megapixel run.

Per size: the astronomy workflow runs in-process into a temporary store (the
16-Mpix one tiles the real amplifier, as ``benchmarks/spark_megapixels.py``
does), ``subzero.explore.start`` serves it on 127.0.0.1, and the system's
Chromium (Playwright, ``/usr/bin/chromium``) opens the page with ``stars`` as the
main view.  For each of ``--clicks`` stars (the peak pixel of the brightest
ones), the main view is zoomed to a 40x40 window around the peak (not timed) and
the peak is clicked with the mouse.  The page measures, with ``performance.now()``,
from the click's mouseup event to the second animation frame after every overlay
image was decoded and placed (``explorer.lastLatency``): that is the
click-to-highlight latency.  The server's trace time (the executor's walk to every
array) is reported beside it; the first click is reported on its own.

    .venv/bin/python benchmarks/explore_latency.py [--sizes demo,16] [--clicks 20] [--no-results]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, update_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WF = str(ROOT / "workflows" / "astronomy.py")
TARGET_MS = 150.0
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def star_peaks(run, n: int) -> list[tuple[int, int]]:
    """The peak pixel (maximum of the cleaned image) of the ``n`` brightest stars."""
    from scipy import ndimage
    stars = run.array("stars").values
    image = run.array("rmcr").values
    labels = np.unique(stars[stars > 0])
    peaks = ndimage.maximum_position(image, stars, labels)
    values = ndimage.maximum(image, stars, labels)
    order = np.argsort(values)[::-1][:n]
    return [tuple(int(v) for v in peaks[k]) for k in order]


def p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95))


def measure(label: str, params: dict, clicks: int, workdir: Path) -> dict:
    from playwright.sync_api import sync_playwright

    import subzero
    from subzero import explore
    st = subzero.open_store(workdir / label)
    t0 = time.perf_counter()
    run = st.run(WF, params=params, engine="local", progress=False)
    run_s = time.perf_counter() - t0
    shape = run.shapes()["raw_1"]
    peaks = star_peaks(run, clicks + 1)
    print(f"{label}: run {run_s:.1f} s, raw_1 {shape}, {len(peaks)} stars", flush=True)
    rows = []
    with explore.start(run) as ex, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            tempfile.mkdtemp(prefix="chromium-", dir=workdir), executable_path=CHROMIUM,
            headless=True, args=ARGS, viewport={"width": 1400, "height": 1000})
        page = ctx.new_page()
        t0 = time.perf_counter()
        page.goto(ex.url + "?array=stars")
        page.wait_for_function("window.explorer && window.explorer.ready", timeout=600_000)
        load_s = time.perf_counter() - t0
        for k, (r, c) in enumerate(peaks):
            page.evaluate("([r, c]) => explorer.zoom('@main', [r - 20, r + 20, c - 20, c + 20])", [r, c])
            pos = page.evaluate("([r, c]) => explorer.screenPos('@main', r, c)", [r, c])
            page.mouse.click(pos["x"], pos["y"])
            page.wait_for_function(f"explorer.traces >= {k + 1} && !explorer.busy", timeout=120_000)
            if page.is_visible("#error"):
                raise SystemExit(f"the page shows an error: {page.inner_text('#error')}")
            lat = page.evaluate("explorer.lastLatency")
            rows.append(lat)
            print(f"  click {k + 1:>2} at ({r}, {c}): {lat['total_ms']:6.1f} ms "
                  f"(trace {lat['server_trace_ms']:5.1f} ms)", flush=True)
        ctx.close()
    st.close()
    first, warm = rows[0], rows[1:]
    total = [r["total_ms"] for r in warm]
    server = [r["server_trace_ms"] for r in warm]
    request = [r["request_ms"] for r in warm]
    return {"label": label, "shape": shape, "run_s": run_s, "load_s": load_s, "clicks": len(warm),
            "first_ms": first["total_ms"], "median_ms": statistics.median(total), "p95_ms": p95(total),
            "server_median_ms": statistics.median(server), "server_p95_ms": p95(server),
            "request_median_ms": statistics.median(request)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="demo,16",
                    help="comma-separated: demo (the 2001x513 amplifier) and/or megapixels")
    ap.add_argument("--clicks", type=int, default=20, help="timed clicks per size (after a first one)")
    ap.add_argument("--no-results", action="store_true", help="do not rewrite RESULTS.md")
    a = ap.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"needs Chromium at {CHROMIUM}: apt-get install chromium")
    out = []
    with tempfile.TemporaryDirectory(prefix="explore-bench-") as tmp:
        for size in a.sizes.split(","):
            size = size.strip()
            params = {} if size == "demo" else {"megapixels": float(size)}
            label = "demo" if size == "demo" else f"{size} Mpix"
            out.append(measure(label, params, a.clicks, Path(tmp)))
    lines = ["| run | raw shape | clicks | first click ms | median ms | p95 ms | median / 150 ms "
             "| server trace median (p95) ms | request median ms | page load s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in out:
        lines.append(f"| {r['label']} | {r['shape'][0]}x{r['shape'][1]} | {r['clicks']} | "
                     f"{r['first_ms']:.0f} | {r['median_ms']:.0f} | {r['p95_ms']:.0f} | "
                     f"{r['median_ms'] / TARGET_MS:.2f}x | {r['server_median_ms']:.1f} "
                     f"({r['server_p95_ms']:.1f}) | {r['request_median_ms']:.0f} | {r['load_s']:.1f} |")
    table = "\n".join(lines)
    print()
    print(table)
    verdicts = []
    for r in out:
        verdict = "met" if r["p95_ms"] <= TARGET_MS else ("median met, p95 missed"
                                                          if r["median_ms"] <= TARGET_MS else "missed")
        verdicts.append(f"* {r['label']}: median {r['median_ms']:.0f} ms, p95 {r['p95_ms']:.0f} ms "
                        f"against {TARGET_MS:.0f} ms: **{verdict}**")
    print("\n".join(verdicts))
    if not a.no_results:
        update_section("explore_latency", "\n".join([
            "## Explorer click-to-highlight latency (issue 14)", "",
            f"Command: `{command_line()}` — machine: {machine()}; headless Chromium "
            f"(`/usr/bin/chromium`, Playwright), server and browser on the same machine.", "",
            "The astronomy workflow run in-process; `subzero.explore` serves it on 127.0.0.1 and the "
            "page is opened with `stars` as the main view. For each star (the peak pixel of the "
            "brightest ones) the main view is zoomed to 40x40 cells around it (not timed) and the "
            "peak is clicked with the mouse. *Click → drawn*: `performance.now()` in the page from "
            "the click's mouseup to the second animation frame after every overlay (one per view, "
            "31 views) was decoded and placed. *Server trace*: the executor's walk from the clicked "
            "cell to every array upstream (39 steps). *Request*: the POST /api/trace round trip "
            "(trace, overlays as PNG, JSON). The first click is apart (the others are warm). "
            "Target: 150 ms.", "", table, "", *verdicts])
        )


if __name__ == "__main__":
    main()
