"""Concurrent Spark jobs on or off: the astronomy workflow at N megapixels, run in
one warm SparkSession with ``SparkEngine.concurrent_jobs`` alternating between 4
(independent branches' jobs side by side) and 1 (one job at a time).  Prints the
wall time of each run; the first run also warms the Python workers.

    .venv/bin/python benchmarks/spark_concurrency.py [--megapixels 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--megapixels", type=float, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--master", default="local[*]")
    a = ap.parse_args()
    import subzero
    from subzero.engines.spark import SparkEngine
    from subzero.engines.spark.session import session
    spark = session(a.master)
    spark.sparkContext.parallelize([0], 1).count()
    folder = Path(tempfile.mkdtemp(prefix="subzero-bench-"))
    try:
        st = subzero.open_store(folder / "store")
        for jobs in [4, 1] * a.repeats:
            SparkEngine.concurrent_jobs = jobs
            t0 = time.perf_counter()
            st.run(str(ROOT / "workflows" / "astronomy.py"), params={"megapixels": a.megapixels},
                   engine="spark", spark=spark, progress=False)
            print(f"concurrent_jobs={jobs}: {time.perf_counter() - t0:.1f} s", flush=True)
        st.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
