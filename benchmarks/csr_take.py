"""``csr_take`` (gathering rows of values by their offsets, as lineage encoding and
reads do) against the gather by index arrays it used for every shape before stop 59,
timed in one process on the same arrays, median of ``--repeats``.

    .venv/bin/python benchmarks/csr_take.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, machine, median  # noqa: E402

from subzero.model.cells import csr_take  # noqa: E402

#: (rows, values per row, rows taken, consecutive): genomics' model at 1,000x (70 wide
#: rows), a few of them, many narrow rows, middling rows, and one record's pairs
CASES = [(70, 110_000, 70, False), (70, 110_000, 26, False), (200_000, 8, 100_000, False),
         (5_000, 300, 2_000, False), (200_000, 8, 1_024, True)]


def gather(values, offsets, rows):
    """The gather by index arrays over every value (csr_take before stop 59)."""
    rows = np.asarray(rows, dtype=np.int64)
    starts = offsets[rows]
    lens = offsets[rows + 1] - starts
    total = int(lens.sum())
    rel = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    return values[np.repeat(starts, lens) + rel]


def timed(f, values, offsets, rows, repeats):
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(values, offsets, rows)
        out.append(time.perf_counter() - t)
    return median(out) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    print(f"Command: `{command_line()}` — machine: {machine()}\n")
    print("| rows | values per row | rows taken | consecutive | gather ms | csr_take ms | ratio |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    rng = np.random.default_rng(0)
    for n, width, take, consecutive in CASES:
        offsets = np.arange(n + 1, dtype=np.int64) * width
        values = rng.integers(0, 1 << 40, n * width)
        rows = np.arange(1000, 1000 + take) if consecutive else \
            np.sort(rng.choice(n, take, replace=False))
        assert np.array_equal(gather(values, offsets, rows), csr_take(values, offsets, rows))
        g = timed(gather, values, offsets, rows, a.repeats)
        c = timed(csr_take, values, offsets, rows, a.repeats)
        print(f"| {n:,} | {width:,} | {take:,} | {'yes' if consecutive else 'no'} | {g:.3f} | "
              f"{c:.3f} | {c / g:.2f}x |")


if __name__ == "__main__":
    main()
