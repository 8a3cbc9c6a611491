"""Issue 13's scale-out benchmark: the astronomy workflow on the real amplifier
tiled to N megapixels (16 = one LSST CCD), on Spark and in one process.

Per size, each configuration runs in a fresh child process, so that its driver's
peak memory is its own:

* in-process (the local engine), SubZero's strategies;
* Spark (``--master``: ``local[*]``, or ``cluster`` for a standalone master and
  two one-core workers started from the installed pyspark on 127.0.0.1), with
  SubZero's strategies and with no lineage (the capture overhead's baseline).

Reported: wall time of the run (the SparkSession's start-up apart), capture
overhead (SubZero run / no-lineage run), lineage bytes / input bytes, the
driver's peak memory (the Python driver process; Spark's driver JVM has its own
heap), the largest worker peak memory of any task (from the run's log), and the
latency of backward star traces on the Spark-made run.

    .venv/bin/python benchmarks/spark_megapixels.py [--sizes 1,4,16] [--master local[*]]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, update_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WF = str(ROOT / "workflows" / "astronomy.py")


def child(cfg: dict) -> dict:
    """One run, in this (fresh) process; its measurements as a dict."""
    import numpy as np

    import subzero
    out: dict = {}
    spark = None
    if cfg["engine"] == "spark":
        from subzero.engines.spark.session import session
        t0 = time.perf_counter()
        spark = session(cfg["master"])
        spark.sparkContext.parallelize([0], 1).count()      # executors up
        out["startup_s"] = time.perf_counter() - t0
    st = subzero.open_store(cfg["store"])
    t0 = time.perf_counter()
    run = st.run(WF, params={"megapixels": cfg["mp"]}, engine=cfg["engine"], spark=spark,
                 capture=cfg["capture"], progress=False)
    out["seconds"] = time.perf_counter() - t0
    out["driver_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["lineage_bytes"] = run.lineage_bytes()
    out["input_bytes"] = sum(a["nbytes"] for a in st.catalog.arrays(run.id).values()
                             if a["kind"] == "input")
    out["shape"] = list(run.array("raw_1").shape)
    log = run.dir / "run.log"
    peaks = [float(m) for m in re.findall(r"largest worker peak memory (\d+) MB",
                                          log.read_text())] if log.exists() else []
    out["task_peak_mb"] = max(peaks) if peaks else None
    out["jobs"] = len(re.findall(r" done in ", log.read_text())) if log.exists() else None
    if cfg["capture"]:
        stars = run.array("stars").values
        ids = np.unique(stars[stars > 0])[:10]
        lat = []
        for s in ids:
            cell = tuple(np.argwhere(stars == s)[0])
            run.executor().clear_cache()
            t1 = time.perf_counter()
            run.trace("stars", [cell], to="raw_1", record=False)
            lat.append(time.perf_counter() - t1)
        out["trace_ms"] = statistics.median(lat) * 1000 if lat else None
    st.close()
    return out


def measure(cfg: dict) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{cfg}: failed\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--master", default="local[*]", help="local[*], or 'cluster' (two workers)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    sizes = [float(x) for x in a.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="sz-mp-"))
    cluster = None
    master = a.master
    if a.master == "cluster":
        from subzero.engines.spark.standalone import LocalCluster
        cluster = LocalCluster(workers=2, cores=1, memory="3g", folder=work / "cluster").start()
        master = cluster.master_url
    rows = []
    try:
        for mp in sizes:
            row = {"mp": mp}
            for label, engine, capture in (("local", "local", True), ("spark", "spark", True),
                                           ("spark-nolineage", "spark", False)):
                cfg = {"engine": engine, "master": master, "capture": capture, "mp": mp,
                       "store": str(work / f"store-{label}")}
                row[label] = measure(cfg)
                print(f"{mp:g} Mpix {label}: {json.dumps(row[label])}", file=sys.stderr, flush=True)
            rows.append(row)
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    lines = table(rows)
    print("\n".join(lines))
    if not a.no_write:
        update_section(f"spark_megapixels_{'cluster' if cluster else 'local'}", "\n".join(
            [f"## Spark scale-out by image size (issue 13), master {a.master}", "",
             f"Command: `{command_line()}` — machine: {machine()}.", "",
             "The astronomy workflow on the real amplifier tiled to N megapixels; every "
             "configuration in a fresh process (one repeat). `run s` excludes the SparkSession's "
             "start-up (its own column). Overhead: SubZero run / no-lineage run, both on Spark. "
             "Driver peak: the Python driver process's maximum RSS.", "", *lines]))


def table(rows: list[dict]) -> list[str]:
    out = ["| Mpix | shape | in-process s | Spark run s | Spark start s | Spark / in-process | "
           "capture overhead | lineage / input | driver peak MB (in-process, Spark) | "
           "largest task MB | Spark jobs | star trace ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, sp, nl = r["local"], r["spark"], r["spark-nolineage"]
        out.append(
            f"| {r['mp']:g} | {sp['shape'][0]}x{sp['shape'][1]} | {lo['seconds']:.1f} | "
            f"{sp['seconds']:.1f} | {sp['startup_s']:.1f} | {sp['seconds'] / lo['seconds']:.2f}x | "
            f"{sp['seconds'] / nl['seconds']:.2f}x | {sp['lineage_bytes'] / sp['input_bytes']:.4f}x | "
            f"{lo['driver_peak_mb']:.0f}, {sp['driver_peak_mb']:.0f} | {sp['task_peak_mb'] or 0:.0f} | "
            f"{sp['jobs']} | {sp['trace_ms']:.1f} |")
    return out


if __name__ == "__main__":
    main()
