"""The run a first budget run makes from its profiling run, with the strategies the two
share copied from the profiling run (``Parent.copies``: checked, sealed again, stored)
against the same run with them decoded and encoded again (what it did before stop 61),
in one process: the same profile, plan and pairs, the two alternated, median of
``--rounds`` each.

    .venv/bin/python benchmarks/made_run.py [--genomics 1000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from _common import command_line, machine, median  # noqa: E402

import subzero  # noqa: E402
from subzero.engines.parent import Parent  # noqa: E402
from subzero.optimizer import optimize  # noqa: E402
from subzero.runs import planned  # noqa: E402
from subzero.runs.options import RunOptions  # noqa: E402

WORKFLOW = str(ROOT / "workflows" / "genomics.py")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--genomics", type=int, default=1000, help="replicate (patients / 96)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-disk", default="100MB")
    a = ap.parse_args()
    print(f"Command: `{command_line()}` — machine: {machine()}\n")
    work = Path(tempfile.mkdtemp(prefix="subzero-made-run-"))
    copies = Parent.copies
    try:
        st = subzero.open_store(work / "store")
        pairs: dict = {}
        sums: dict = {}
        params = {"replicate": a.genomics}
        plan = optimize(st, WORKFLOW, params=params, max_disk=a.max_disk, progress=False,
                        profile_pairs=pairs, profile_sums=sums)
        parent = st.get(plan.profiled_run)
        times: dict[str, list[float]] = {"encoded again": [], "copied": []}
        for r in range(a.rounds):
            for way in ("encoded again", "copied") if r % 2 == 0 else ("copied", "encoded again"):
                Parent.copies = copies if way == "copied" else (lambda self, op, wanted, uid: {})
                opts = RunOptions.of(params=params, plan=plan.as_dict(), progress=False,
                                     max_disk=a.max_disk)
                t = time.perf_counter()
                planned.make_from(st.catalog, st.runs_dir, parent, opts, pairs, sums)
                times[way].append(time.perf_counter() - t)
        Parent.copies = copies
        st.close()
    finally:
        Parent.copies = copies
        shutil.rmtree(work, ignore_errors=True)
    enc, cop = median(times["encoded again"]), median(times["copied"])
    print(f"plan: {', '.join(f'{k} {v}' for k, v in plan.strategies.items() if v != 'map')}\n")
    print("| size | encoded again | copied | ratio | rounds |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| genomics {a.genomics:,}x | {enc:.2f} s | {cop:.2f} s | {cop / enc:.2f}x | {a.rounds} each |")


if __name__ == "__main__":
    main()
