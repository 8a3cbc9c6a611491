"""The fault-injection campaign (issues 11 and 28): damage or move pieces of stores, trace, count.

    .venv/bin/python benchmarks/faults.py [--cases 10000] [--seed 0] [--jobs 2]
    .venv/bin/python benchmarks/faults.py --seed 0 --case 123 [--keep DIR]   # replay one case
    .venv/bin/python benchmarks/faults.py ... --results                      # also RESULTS.md

Builds the fixture stores of ``tests/faultlib`` (small real runs of
``workflows/example.py`` with every encoding and direction, COMP, MAP and
BLACKBOX, and one written by the Spark engine in local mode unless
``--no-spark``; each with a second run on other data, an older copy of its
catalog and a twin store), then runs the cases ``0 .. N-1`` of the seed: each
copies a store and either damages one file or one stored LMDB value (bit flips,
overwritten ranges of random bytes or zeros, truncation, deletion) or moves a
piece (``tests/faultlib/moves.py``: chunks swapped; a file, array, lineage or
run folder of another run or store; a link or FIFO in a file's place; catalog
rows edited or deleted, the catalog deleted or replaced by an older copy), and
traces the run's queries in a forked child with a timeout (after a move, also
``clean`` and ``fsck``, checking that no run is lost).  Outcomes: exact
(warnings allowed), clear error (a one-line SubZeroError), internal error,
wrong, data lost, crash, hang — the last five are failures.  Prints the counts
per target kind, per family and in total (a progress line on a terminal), the
first failing cases of each kind of failure (each replays with ``--case``), and
writes ``benchmarks/.work/faults.json``; ``--results`` also rewrites the
``faults`` section of ``benchmarks/RESULTS.md``.  Exit status 1 when any case
failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import faultlib as fl  # noqa: E402
from _common import command_line, machine, update_section  # noqa: E402
from faultlib.cases import FAMILIES  # noqa: E402
from faultlib.report import COLUMNS, as_json, counts_table, failure_report  # noqa: E402

WORK = HERE / ".work"


def replay(args, fixtures) -> int:
    case = fl.make_case(args.seed, args.case, fixtures, kind=args.kind,
                        kinds=FAMILIES[args.family])
    keep = args.keep is not None
    work = Path(args.keep) if keep else fl.scratch_dir()
    r = fl.run_one(case, fixtures, work, timeout=args.timeout, keep=keep)
    print(r.describe())
    for label, (outcome, detail) in r.queries.items():
        print(f"  {label:<40} {outcome}{': ' + detail if detail else ''}")
    for w in r.warnings:
        print(f"  warning: {w}")
    if r.log:
        print(f"child log:\n{r.log}")
    if r.kept:
        print(f"damaged store kept in {r.kept} (run {fl.fixtures.RUN_ID})")
    elif not keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if r.failed else 0


def campaign(args, fixtures) -> int:
    cases = fl.make_cases(args.seed, args.cases, fixtures, kinds=FAMILIES[args.family])
    done: list = []
    t0 = time.monotonic()
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=len(cases), unit="case", file=sys.stderr, dynamic_ncols=True)

    WORK.mkdir(exist_ok=True)

    def progress(r) -> None:
        done.append(r)
        if len(done) % 250 == 0:      # a long campaign leaves its counts so far
            (WORK / "faults.partial.json").write_text(json.dumps(
                {"seed": args.seed, "cases": len(done), "counts": fl.counts_by_kind(done),
                 "failures": {o: [as_json(r) for r in rs] for o, rs in
                              fl.first_failures(done, per=args.show).items()}}, indent=1))
            if bar is None:
                bad = sum(x.failed for x in done)
                print(f"{len(done)}/{len(cases)} cases, {bad} failed, "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        if bar is not None:
            bad = sum(x.failed for x in done)
            bar.set_postfix_str(f"{bad} failed", refresh=False)
            bar.update(1)
    work = fl.scratch_dir()
    try:
        results = fl.run_cases(cases, fixtures, work, jobs=args.jobs, timeout=args.timeout,
                               on_result=progress)
    finally:
        if bar is not None:
            bar.close()
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - t0
    counts = fl.counts_by_kind(results)
    table = counts_table(counts)
    print(f"{len(results)} fault cases, seed {args.seed}, {args.jobs} jobs, {seconds:.0f} s "
          f"({sum(r.cpu for r in results) / max(1, len(results)):.2f} CPU s per case)")
    print(table)
    print(counts_table(families(results)).replace("target kind", "family     "))
    print(failure_report(results, per=args.show))
    out = {"command": command_line(), "machine": machine(), "commit": commit(), "seed": args.seed,
           "family": args.family, "fixtures": [f.name for f in fixtures],
           "cases": len(results), "jobs": args.jobs, "timeout": args.timeout,
           "seconds": seconds, "counts": counts, "families": families(results),
           "failures": {o: [as_json(r) for r in rs]
                        for o, rs in fl.first_failures(results, per=args.show).items()}}
    (WORK / "faults.json").write_text(json.dumps(out, indent=1))
    print(f"summary written to {WORK / 'faults.json'}")
    if args.results:
        update_section("faults", results_section(out))
    return 1 if any(r.failed for r in results) else 0


def results_section(out: dict) -> str:
    cols = COLUMNS
    rows = ["| target kind | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for kind, row in out["counts"].items():
        name = f"**{kind}**" if kind == "total" else kind
        rows.append(f"| {name} | " + " | ".join(str(row[c]) for c in cols) + " |")
    fams = ["| family | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for fam, row in out["families"].items():
        fams.append(f"| {fam} | " + " | ".join(str(row[c]) for c in cols) + " |")
    return "\n".join([
        "## Fault injection (issues 11 and 28)",
        "",
        f"`{out['command']}` — {out['machine']}; commit {out['commit']}; seed {out['seed']}, "
        f"{out['cases']} cases in {out['seconds']:.0f} s; fixtures: {', '.join(out['fixtures'])}.",
        "",
        "Each case damages one file of a small real store (or one value stored in its LMDB "
        "environment), or moves a piece (another run's or another store's file, array, lineage "
        "or run folder; a link or a FIFO in a file's place; a catalog edit), and traces the "
        "run's queries; *exact* is the undamaged store's answer (warnings allowed), *clear "
        "error* a one-line SubZeroError. After a moved piece, `clean` and `fsck` run too and "
        "must lose no run folder or file (*data lost*). Internal error, wrong, data lost, "
        "crash and hang are failures.",
        "",
        *fams,
        "",
        *rows,
    ])


def families(results) -> dict[str, dict[str, int]]:
    """The counts per family of kinds (bytes damaged; pieces placed elsewhere; links and
    special files; catalog edits)."""
    from faultlib.moves import family
    names = {"damage": "bytes damaged (issue 11)", "place": "placement (place:*)",
             "link": "links and FIFOs (link:*)", "catalog": "catalog edits (catalog:*)"}
    out = {}
    for fam, label in names.items():
        rs = [r for r in results if family(r.case.target.kind) == fam]
        if rs:
            out[label] = fl.counts_by_kind(rs)["total"]
    return out


def commit() -> str:
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                              capture_output=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "subzero", "tests"],
                               cwd=HERE.parent, text=True, capture_output=True).stdout.strip()
    except OSError:
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=10_000, help="number of cases (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument("--case", type=int, help="replay this one case of the seed, verbosely")
    p.add_argument("--keep", metavar="DIR", help="with --case: keep the damaged store in DIR")
    p.add_argument("--kind", help="with --case: force this kind of target (as the fast suite's "
                                  "forced cases do)")
    p.add_argument("--no-spark", dest="spark", action="store_false",
                   help="leave out the fixture written by the Spark engine (local mode; about "
                        "30 s to build); cases then draw differently: replay with the same flag")
    p.add_argument("--family", choices=sorted(FAMILIES), default="all",
                   help="the kinds drawn: all (default), damage (bytes changed: the fast "
                        "suite's 300 cases) or moves (placement, links, catalog edits)")
    p.add_argument("--jobs", type=int, default=max(1, len(os.sched_getaffinity(0))),
                   help="cases at once (default: usable cores)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a case is a hang")
    p.add_argument("--show", type=int, default=5, help="failing cases shown per outcome")
    p.add_argument("--results", action="store_true", help="rewrite RESULTS.md's faults section")
    args = p.parse_args(argv)
    os.environ.setdefault("SUBZERO_ENGINE", "local")
    # a kill ends the children and removes the scratch folders, like Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = fl.scratch_dir("subzero-faults-fixtures-")
    try:
        t0 = time.monotonic()
        names = list(fl.fixtures.DEFAULT_FIXTURES)
        if args.spark:
            from subzero.engines.spark.session import java_version
            v = java_version()
            if v is not None and v >= 17:
                names += list(fl.fixtures.ENGINES)
            else:
                print("no Java 17+: the Spark-written fixture is left out (case numbers then "
                      "draw other cases)", file=sys.stderr)
        fixtures = fl.build_fixtures(root, names)
        print(f"fixtures: {', '.join(f.name for f in fixtures)} built in "
              f"{time.monotonic() - t0:.1f} s", file=sys.stderr)
        return replay(args, fixtures) if args.case is not None else campaign(args, fixtures)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
