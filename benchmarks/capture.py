"""FullOne capture throughput: a 1000x1000 one-to-one operator, every cell a
region pair, against the same run with no lineage capture (issue: >= 1M
pairs/s, <= 24 bytes/pair).

    .venv/bin/python benchmarks/capture.py [--size 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, median, update_section  # noqa: E402

import subzero  # noqa: E402
from subzero import Mode, Operator, Workflow  # noqa: E402


class OneToOne(Operator):
    """out = in + 1; every output cell depends on the same input cell."""

    def supported_modes(self):
        return {Mode.FULL, Mode.BLACKBOX}

    def run(self, ctx, x):
        out = x + 1.0
        if Mode.FULL in ctx.modes:
            cells = np.argwhere(np.ones(x.shape, bool))   # the operator's own lineage work
            ctx.lwrite(cells, cells, each=True)
        return out


def workflow():
    wf = Workflow("capture")
    a = wf.input("a")
    wf.add("one", OneToOne(), a)
    return wf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    a = ap.parse_args()
    x = np.random.default_rng(0).normal(size=(a.size, a.size))
    n = a.size * a.size
    work = Path(tempfile.mkdtemp(prefix="sz-capture-"))
    base, full, cap, lw, nbytes = [], [], [], [], []
    try:
        st = subzero.open_store(work / "store")
        for _ in tqdm(range(a.repeats), desc="capture benchmark", unit="repeat", file=sys.stderr):
            t = time.perf_counter()
            st.run(workflow(), inputs={"a": x}, capture=False, progress=False)
            base.append(time.perf_counter() - t)
            t = time.perf_counter()
            run = st.run(workflow(), inputs={"a": x}, strategies={"one": "full:fullone:backward"},
                         progress=False)
            full.append(time.perf_counter() - t)
            op = run.ops()[0]
            assert op["pairs"] == n
            cap.append(op["lwrite_s"] + op["lineage_s"])
            lw.append(op["lineage_s"])
            nbytes.append(op["lineage_bytes"])
            # correctness while measuring: a pair really maps a cell to itself
            c = np.array([[a.size // 2, a.size // 3]])
            assert run.trace("one", c, to="a").cells.tolist() == c.tolist()
            shutil.rmtree(run.dir)
        st.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pps = n / median(cap)
    bpp = median(nbytes) / n
    ratio = median([f / b for f, b in zip(full, base)])
    print(f"pairs: {n}  capture {median(cap):.3f} s  ({pps / 1e6:.2f} M pairs/s)  "
          f"encode+write {median(lw):.3f} s  bytes/pair {bpp:.2f}")
    print(f"run without lineage {median(base):.3f} s, with FullOne {median(full):.3f} s, "
          f"overhead ratio {ratio:.2f}x")
    if a.no_write:
        return
    update_section("capture", f"""## FullOne capture (issue 2)

Command: `{command_line()}` — machine: {machine()}.

A {a.size}x{a.size} one-to-one operator writes every output cell as a region pair
(`ctx.lwrite(cells, cells, each=True)`), stored backward FullOne in LMDB.
Baseline: the same run with no lineage capture (arrays are stored by both).
Median of {a.repeats} alternating repeats.

| metric | measured | target |
| --- | --- | --- |
| region pairs | {n:,} | |
| capture time (lwrite + validate + encode + LMDB write) | {median(cap):.3f} s | |
| capture throughput | {pps / 1e6:.2f} M pairs/s | >= 1 M pairs/s |
| bytes per pair (LMDB pages) | {bpp:.2f} | <= 24 |
| run with no lineage | {median(base):.3f} s | |
| run with FullOne lineage | {median(full):.3f} s | |
| runtime overhead ratio | {ratio:.2f}x | |

One-to-one lineage is the best case for the delta + zstd cell encoding (runs of
consecutive cells); random pairs cost more, see the microbenchmark.
""")


if __name__ == "__main__":
    main()
