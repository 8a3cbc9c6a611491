"""Shared helpers for the benchmarks: timing, machine info, RESULTS.md sections."""

from __future__ import annotations

import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = """# Benchmark results

Every number below was measured by the command shown with it, on the machine
described with it.  Ratios compare a variant with a baseline measured in the
same process run (alternating, several repeats, median), because absolute
times are not comparable between runs on these machines.
"""


def machine() -> str:
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    return (f"{os.cpu_count()} cores, {mem:.0f} GiB RAM, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}")


def median(xs):
    return statistics.median(xs)


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *a):
        self.s = time.perf_counter() - self.t0


def update_section(name: str, body: str) -> None:
    """Replace (or append) the section ``name`` of RESULTS.md."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda m: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)


def command_line() -> str:
    return " ".join([".venv/bin/python", os.path.relpath(sys.argv[0])] + sys.argv[1:])
