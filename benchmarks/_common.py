"""Shared helpers for the benchmarks: timing, machine info, RESULTS.md sections."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

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


def update_section(name: str, body: str, before: str | None = None) -> None:
    """Replace (or add) the section ``name`` of RESULTS.md: a new one goes just before
    section ``before`` when that is there, else at the end."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    ahead = f"<!-- {before}:start -->" if before else None
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda m: block, text, flags=re.S)
    elif ahead and ahead in text:
        text = text.replace(ahead, block + "\n\n" + ahead, 1)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)


def command_line() -> str:
    return " ".join([".venv/bin/python", os.path.relpath(sys.argv[0])] + sys.argv[1:])


def strategy_figure(path, names, summary, rows, queries, disk_label: str) -> None:
    """The Table II figure: runtime ratio, disk ratio and query times per strategy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), gridspec_kw={"width_ratios": [1, 1, 2]})
    axes[0].bar(names, [summary[n]["runtime"] for n in names], color="tab:blue")
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_title("workflow runtime / no-lineage run")
    axes[1].bar(names, [max(summary[n]["disk"], 1e-4) for n in names], color="tab:orange")
    axes[1].set_yscale("log")
    axes[1].set_title(disk_label)
    width = 0.8 / len(names)
    for k, n in enumerate(names):
        axes[2].bar(np.arange(len(queries)) + k * width, [rows[(n, q.name)][0] for q in queries],
                    width, label=n)
    axes[2].set_xticks(np.arange(len(queries)) + 0.4 - width / 2)
    axes[2].set_xticklabels([q.name for q in queries])
    axes[2].set_yscale("log")
    axes[2].set_ylabel("seconds")
    axes[2].set_title("query time (cold block cache, median)")
    axes[2].legend(fontsize=7, ncol=2)
    for ax in axes[:2]:
        ax.tick_params(axis="x", rotation=35)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def sandwiched_runtimes(run_baseline, run_strategy, strategies: dict, repeats: int, bar=None):
    """Runtime ratio per strategy, each strategy run divided by the mean of the
    no-lineage runs just before and after it (position effects cancel).

    ``run_baseline()`` and ``run_strategy(spec)`` run the workflow and return
    the run; returns (ratios per strategy, baseline seconds, the last run of each).
    """
    ratios = {k: [] for k in strategies}
    base_times, kept = [], {}

    def baseline():
        t0 = time.perf_counter()
        run_baseline()
        base_times.append(time.perf_counter() - t0)
        return base_times[-1]

    for rep in range(repeats):
        before = baseline()
        if bar is not None:
            bar.update(1)
        for name, spec in strategies.items():
            t0 = time.perf_counter()
            run = run_strategy(spec)
            took = time.perf_counter() - t0
            after = baseline()
            ratios[name].append(took / ((before + after) / 2))
            before = after
            if rep == repeats - 1:
                kept[name] = run
            if bar is not None:
                bar.update(1)
    return ratios, base_times, kept


class Mismatch(Exception):
    """Variants of a benchmark answered differently: a wrong answer, which stops the
    benchmark (:func:`child_main` reports it, :func:`run_child` raises)."""


def child_main(measure: Callable[[], dict], result: Path,
               default: Callable[[Any], Any] | None = None) -> NoReturn:
    """The child side of :func:`run_child`: run ``measure``, write its numbers (or what
    went wrong: out of memory, a :class:`Mismatch`, any other error with its traceback
    on stderr) to ``result`` as JSON (``default`` as for ``json.dumps``), and exit 1 on
    an error, else 0."""
    try:
        res = measure()
    except MemoryError:
        res = {"error": "MemoryError"}
    except Mismatch as e:
        res = {"error": str(e), "mismatch": True}
    except Exception as e:
        traceback.print_exc()
        res = {"error": f"{type(e).__name__}: {e}"}
    result.write_text(json.dumps(res, default=default))
    sys.exit(1 if "error" in res else 0)


def run_child(cmd: list[str], result: Path, what: str, stream: bool = False) -> tuple[dict, float]:
    """Run a benchmark child process that writes its numbers to ``result``; returns
    (numbers, wall seconds).  A child that dies (killed, out of memory) is reported in
    the numbers, not fatal; a child that found a wrong answer (``mismatch``) stops the
    benchmark, naming ``what``.  ``stream``: the child's output goes straight to this
    process's stderr (its progress as it comes) rather than kept for an error."""
    t0 = time.perf_counter()
    if stream:
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, text=True)
        proc.stdout = ""
    else:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    if result.exists():
        res = json.loads(result.read_text())
    elif proc.returncode < 0:
        res = {"error": f"killed by {signal.Signals(-proc.returncode).name} (out of memory?)"}
    else:
        res = {"error": f"exit {proc.returncode}: {proc.stdout.strip().splitlines()[-1:]}"}
    if "error" in res and proc.stdout.strip():
        sys.stderr.write(proc.stdout[-3000:])
    if res.get("mismatch"):
        raise SystemExit(f"{what}: {res['error']}")
    return res, wall


def bytecode_env(cache: Path | None) -> dict[str, str]:
    """This process's environment for a child ``python``/``subzero``: with its own bytecode
    cache in ``cache`` (``PYTHONPYCACHEPREFIX``), as an installed SubZero loads its modules
    from bytecode; or none (``cache`` None): every module compiled by every process, as
    with ``PYTHONDONTWRITEBYTECODE=1``, which this machine's environment sets."""
    env = {key: v for key, v in os.environ.items()
           if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    if cache is not None:
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
