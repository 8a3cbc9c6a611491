"""``subzero`` command line: run, trace, explore, optimize, runs, show, du, trust, export.

Every command reads ``--store DIR`` (default ./.subzero), prints user errors
as one line on stderr with exit status 2, and offers ``--json``.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sqlite3
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, overload

from subzero.engines.choice import REQUESTS
from subzero.errors import SubZeroError, SubZeroWarning, UsageError, warn
from subzero.tuning import DEFAULT_KEEP, EXIT_GRACE_S
from subzero.tuning import KEEP_POLICIES as POLICIES

if TYPE_CHECKING:
    from subzero.engines.choice import EngineRequest

EXIT_USER = 2

#: the library's parameters as this command line spells them: a message that names
#: `name` or `name='value'` (in backquotes, as the library writes them) is shown with
#: the flag instead (--name value); a flag of its own for some values (`force=True`)
FLAGS: dict[str, str] = {
    "engine": "--engine", "master": "--master", "conf": "--conf", "manifest": "--inputs-from",
    "strategies": "--strategy", "inputs": "--input", "params": "--param", "plan": "--plan",
    "max_disk": "--max-disk", "max_runtime": "--max-runtime", "workload": "--workload",
    "tile": "--tile", "store": "--store", "cells": "--cells", "sky": "--sky", "sel": "--sel",
    "radius": "--radius", "to": "--to", "path": "--path", "start": "--from", "run": "--run",
    "pins": "--pin", "name": "--name", "host": "--host", "port": "--port",
    "keep_last": "--keep-last", "older_than": "--older-than"}
VALUE_FLAGS: dict[tuple[str, str], str] = {
    ("force", "True"): "--force", ("reprofile", "True"): "--reprofile",
    ("recalibrate", "True"): "--recalibrate", ("capture", "False"): "--no-lineage",
    ("shortcut", "False"): "--no-shortcut", ("planner", "None"): "--no-planner",
    ("keep_tagged", "False"): "--no-keep-tagged"}
_TERM = re.compile(r"`([A-Za-z_]\w*)(?:=('?)([^`']*)\2)?`")
#: a mapping parameter given one entry: `strategies={'cr': 'full'}` is --strategy cr=full
_ENTRY = re.compile(r"`([A-Za-z_]\w*)=\{'([^'`]*)': '([^'`]*)'\}`")


def cli_terms(text: str) -> str:
    """A library message in the command line's terms: `max_disk` is --max-disk,
    `engine='spark'` is --engine spark, `force=True` is --force; other backquoted
    text (a command to run) stays as it is."""
    def entry(m: re.Match) -> str:
        name, key, value = m.groups()
        return f"{FLAGS[name]} {key}={value}" if name in FLAGS else m.group(0)

    def flag(m: re.Match) -> str:
        name, value = m.group(1), m.group(3)
        if value is not None and (name, value) in VALUE_FLAGS:
            return VALUE_FLAGS[(name, value)]
        if name not in FLAGS:
            return m.group(0)
        return FLAGS[name] + (f" {value}" if value else "")
    return _TERM.sub(flag, _ENTRY.sub(entry, text))


def _kv(items, what: str) -> dict[str, str]:
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise SubZeroError(f"malformed {what} {it!r}; write NAME=VALUE")
        out[k.strip()] = v.strip()
    return out


def _params(items) -> dict:
    out = {}
    for k, v in _kv(items, "--param").items():
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _path(text: str) -> list[tuple[str, int]]:
    steps = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        op, sep, idx = part.rpartition(":")
        if not sep or not op:
            raise SubZeroError(f"malformed --path step {part!r}; write OP:IDX,OP:IDX,...")
        try:
            steps.append((op, int(idx)))
        except ValueError as err:
            raise SubZeroError(f"malformed --path step {part!r}: input index must be an integer") from err
    if not steps:
        raise SubZeroError("empty --path; write OP:IDX,OP:IDX,...")
    return steps


def _positive(text: str) -> int:
    from subzero.runs.options import MAX_TILE
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    if n > MAX_TILE:
        raise argparse.ArgumentTypeError(f"{text!r} is too large (at most {MAX_TILE})")
    return n


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _request(a, resuming: bool = False) -> EngineRequest:
    """Where the user asked a run to run: --engine, else $SUBZERO_ENGINE, else auto (the
    run chooses: Spark for Spark settings or big inputs, else in-process; see
    subzero.engines.choice, which says so first).  A resumed run keeps its engine
    unless --engine or Spark settings say otherwise ($SUBZERO_ENGINE does not)."""
    from subzero.engines.choice import EngineRequest
    engine = a.engine if resuming else a.engine or os.environ.get("SUBZERO_ENGINE") or "auto"
    request = EngineRequest(engine, a.master, _kv(a.conf, "--conf"),
                            instances=bool(getattr(a, "inputs_from", None)))
    request.check()
    return request


def cmd_run(a) -> int:
    from subzero.store import open_store
    if a.resume is not None:
        return _resume(a)
    if a.workflow is None:
        raise SubZeroError("subzero run needs a workflow (a .py file or module name), or "
                           "--resume RUN")
    request = _request(a)
    store = open_store(a.store)
    try:
        if a.inputs_from:
            return _run_many(store, a, request)
        plan = _run_plan(a)
        run = store.run(a.workflow, inputs=_kv(a.input, "--input"),
                        strategies=_kv(a.strategy, "--strategy"), params=_params(a.param),
                        capture=not a.no_lineage, progress=None if not a.json else False,
                        engine=request.engine, master=request.master, conf=request.conf,
                        tile=a.tile, log=_spark_log(a), plan=plan, max_disk=a.max_disk,
                        max_runtime=None if plan else a.max_runtime,
                        workload=None if plan else a.workload,
                        on_plan=None if a.json else (lambda p: print(p.table())),
                        announce=None if a.json or a.quiet else _say, **_keep_args(a))
        _report_run(store, run, a, "complete")
    finally:
        store.close()
    return 0


def _keep_args(a) -> dict:
    """``--keep`` and ``--pin`` as the run's options (none given: the store's default)."""
    out: dict = {}
    if a.keep is not None:
        out["keep"] = a.keep
    if a.pin:
        out["pins"] = tuple(a.pin)
    return out


def _say(line: str) -> None:
    """A line from the library, in the CLI's terms (flags, not parameters); flushed, so
    that a pipe or a log shows it before the work it announces (a JVM start)."""
    print(cli_terms(line), flush=True)


def _spark_log(a):
    """With -v (not --json), what the Spark engine does goes to stderr."""
    return (lambda m: print(f"  spark: {m}", file=sys.stderr)) if a.verbose and not a.json else None


def _report_run(store, run, a, how: str) -> None:
    """A finished run as `subzero run` prints it: JSON, or its summary line (-v: its
    operators) and its id (-q: the id alone)."""
    ops = run.ops()
    if a.json:
        print(json.dumps(_run_json(store, run.id), default=str))
        return
    print(f"run {run.id} {how}: workflow {run.row.workflow}, {len(ops)} operators, "
          f"{_footprint(store, run.row)}")
    if a.verbose:
        _ops_table(ops)
    print(run.id if a.quiet else f"run id: {run.id}")


def _resume(a) -> int:
    """``run --resume RUN``: the run keeps what it began with; only where it runs may change."""
    from subzero.store import open_store
    fixed = [f for f, v in (("--input", a.input), ("--strategy", a.strategy), ("--param", a.param),
                            ("--no-lineage", a.no_lineage), ("--tile", a.tile),
                            ("--inputs-from", a.inputs_from), ("--plan", a.plan),
                            ("--max-disk", a.max_disk), ("--max-runtime", a.max_runtime),
                            ("--keep", a.keep), ("--pin", a.pin)) if v]
    if fixed:
        raise SubZeroError(f"{fixed[0]} cannot be combined with --resume: a resumed run keeps "
                           f"the inputs, strategies, parameters, tile size and --keep policy "
                           f"it began with")
    # default: where the run began; a master or Spark settings given mean Spark
    request = _request(a, resuming=True)
    store = open_store(a.store, create=False)
    try:
        run = store.resume(a.resume, workflow=a.workflow, progress=None if not a.json else False,
                           engine=request.engine, master=request.master,
                           conf=request.conf, log=_spark_log(a), announce=None if a.json or a.quiet else _say)
        _report_run(store, run, a, "complete (resumed)")
    finally:
        store.close()
    return 0


_CLEAN_VERBS = {"remove": ("would remove", "removed"), "recover": ("would recover", "recovered"),
                "restore": ("would restore", "restored"),
                "adopt": ("would adopt", "adopted"),
                "quarantine": ("would quarantine", "quarantined (moved to quarantine/)")}


def cmd_clean(a) -> int:
    from subzero.store import open_store
    store = open_store(a.store, create=False)
    try:
        items = store.clean(dry_run=a.dry_run)
    finally:
        store.close()
    if a.json:
        # "removed" lists every entry acted on (its "action" says how), as before
        print(json.dumps({"dry_run": a.dry_run, "removed": items}))
        return 0
    for item in items:
        verb = _CLEAN_VERBS[item["action"]][0 if a.dry_run else 1]
        print(f"  {verb} {item['path']}  {_fmt_bytes(item['bytes'])}  ({item['why']})")
    gone = [i for i in items if i["action"] == "remove"]
    if not items:
        print(f"nothing to clean in {a.store}")
    else:
        print(("would remove" if a.dry_run else "removed")
              + f" {len(gone)} item(s), {_fmt_bytes(sum(i['bytes'] for i in gone))}"
              + "".join(f"; {n} {_CLEAN_VERBS[k][0 if a.dry_run else 1].split(' (')[0]}"
                        for k in ("recover", "adopt", "quarantine")
                        if (n := sum(1 for i in items if i["action"] == k))))
    return 0


def cmd_gc(a) -> int:
    from subzero.api import open_store
    with open_store(a.store, create=False) as store:
        items = store.gc(a.runs, keep_last=a.keep_last, older_than=a.older_than,
                         workflow=a.workflow, keep_tagged=a.keep_tagged, dry_run=a.dry_run)
    if a.json:
        print(json.dumps({"dry_run": a.dry_run, "items": items}))
        return 0
    runs = [i for i in items if i["run"] is not None]
    gone = [i for i in runs if i["action"] == "delete"]
    # the store's copy of an input is a folder and its checksums file: one line for both
    side = {i["path"].removesuffix(".sums.json"): i["bytes"] for i in items
            if i["run"] is None and i["path"].endswith(".sums.json")}
    copies = [{**i, "bytes": i["bytes"] + side.pop(i["path"].removesuffix(".zarr"), 0)}
              for i in items if i["run"] is None and not i["path"].endswith(".sums.json")]
    copies += [{"path": p + ".sums.json", "bytes": b, "why": "left without its copy"}
               for p, b in side.items()]
    for i in runs:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(i["started"]))
        verb = ("would delete" if a.dry_run else "deleted") if i["action"] == "delete" else "kept"
        size = f"  {_fmt_bytes(i['bytes'])}" if i["action"] == "delete" else ""
        print(f"  {verb} run {i['run']} ({i['workflow']}, {when}){size}  ({i['why']})")
    for i in copies:
        print(f"  {'would remove' if a.dry_run else 'removed'} {i['path']}  "
              f"{_fmt_bytes(i['bytes'])}  ({i['why']})")
    freed = sum(i["bytes"] for i in gone) + sum(i["bytes"] for i in copies)
    if not gone and not copies:
        print(f"no run to delete in {a.store}")
    else:
        print(f"{'would delete' if a.dry_run else 'deleted'} {len(gone)} run(s)"
              + (f" and {len(copies)} input cop{'y' if len(copies) == 1 else 'ies'}" if copies else "")
              + f", {'freeing' if a.dry_run else 'freed'} {_fmt_bytes(freed)}"
              + ("; run again without --dry-run to delete" if a.dry_run and gone else ""))
    return 0


def cmd_tag(a) -> int:
    from subzero.api import open_store
    with open_store(a.store, create=False) as store:
        if a.delete_name is not None:
            if a.run is not None:
                raise UsageError("give only the tag to remove: subzero tag --delete NAME")
            rid = store.untag(a.delete_name)
            print(f"removed tag {a.delete_name!r} (it named run {rid})")
            return 0
        if a.run is None:
            tags = store.tags()
            if a.json:
                print(json.dumps(tags))
                return 0
            if not tags:
                print("no tags yet; name a run with `subzero tag RUN NAME`")
            for name, rid in tags.items():
                print(f"  {name:<24} run {rid}")
            return 0
        if a.name is None:
            raise UsageError("give the run and its tag: subzero tag RUN NAME")
        rid = store.tag(a.run, a.name, force=a.force)
        print(f"run {rid} is tagged {a.name!r}")
    return 0


def cmd_fsck(a) -> int:
    """Check the whole store, repair what can be proven; exit 2 when a problem is left."""
    from subzero.runs.fsck import fsck
    findings = fsck(a.store, deep=a.deep, dry_run=a.dry_run)
    left = [f for f in findings if f.unresolved]
    if a.json:
        print(json.dumps({"store": str(a.store), "dry_run": a.dry_run, "deep": a.deep,
                          "findings": [f.as_dict() for f in findings], "unresolved": len(left)}))
        return EXIT_USER if left else 0
    for f in findings:
        what = f"run {f.run}: " if f.run is not None else ""
        act = {"": "NOT REPAIRED", "noted": "left as it is"}.get(f.action, f.action)
        if a.dry_run and f.action not in ("", "noted"):
            act = f"would be {f.action}"
        print(f"  {what}{cli_terms(f.problem)} [{act}]")
    print(f"store {a.store}: " + ("sound" if not findings else
                                  f"{len(findings)} finding(s), {len(left)} not repaired"
                                  + (" (dry run: nothing changed)" if a.dry_run else "")))
    return EXIT_USER if left else 0


def _run_plan(a) -> str | None:
    """``run --plan NAME`` (its name), or ``run --max-disk/--max-runtime`` (None: the run
    optimizes first, and its plan is printed and saved), checked."""
    budgeted = a.max_disk is not None or a.max_runtime is not None
    if (a.plan or budgeted) and (a.strategy or a.no_lineage or a.inputs_from):
        raise SubZeroError("--plan, --max-disk and --max-runtime choose the strategies; they "
                           "cannot be combined with --strategy, --no-lineage or --inputs-from")
    if a.plan and a.max_runtime is not None:
        raise SubZeroError("--max-runtime optimizes a new plan; give it without --plan")
    return a.plan


def _planner(run, a):
    """The query-time planner when this machine is calibrated (see `subzero optimize`)."""
    if getattr(a, "no_planner", False):
        return None
    from subzero.optimizer import planner_for
    return planner_for(run)


def cmd_optimize(a) -> int:
    from subzero.optimizer import optimize
    from subzero.store import open_store
    store = open_store(a.store)
    try:
        store.require_writable("optimize")     # before calibration, not after it
        plan = optimize(store, a.workflow, params=_params(a.param), inputs=_kv(a.input, "--input"),
                        max_disk=a.max_disk, max_runtime=a.max_runtime, workload=a.workload,
                        pins=a.pin or None, name=a.name, recalibrate=a.recalibrate,
                        reprofile=a.reprofile, progress=False if a.json else None,
                        force=a.force)
        if a.json:
            print(json.dumps(plan.as_dict(), default=str))
        else:
            print(plan.table())
            print(f"saved as plan {plan.name!r}; run it with: subzero run {a.workflow} "
                  f"--plan {plan.name}")
    finally:
        store.close()
    return 0


def _run_many(store, a, request) -> int:
    if a.input:
        raise SubZeroError("give inputs either with --input or with --inputs-from, not both")
    results = store.run_many(a.workflow, a.inputs_from, strategies=_kv(a.strategy, "--strategy"),
                             params=_params(a.param), capture=not a.no_lineage,
                             progress=None if not a.json else False, master=request.master,
                             conf=request.conf, tile=a.tile)
    ok = [r for r in results if r.ok]
    if a.json:
        print(json.dumps({"runs": [{"run_id": r.run_id, "ok": r.ok, "error": r.error or None,
                                    "seconds": r.seconds} for r in results]}))
    else:
        for r in results:
            print(f"  run {r.run_id}: " + (f"complete in {r.seconds:.1f}s" if r.ok else f"failed: {r.error}"))
        print(f"{len(ok)} of {len(results)} instances complete"
              + (f"; run ids {ok[0].run_id}-{ok[-1].run_id}" if ok else ""))
    return 0 if len(ok) == len(results) else EXIT_USER


def _ops_table(ops) -> None:
    print(f"  {'operator':<16} {'strategies':<34} {'run s':>8} {'lineage s':>9} {'pairs':>9} {'bytes':>10}")
    for o in ops:
        print(f"  {o['name']:<16} {'+'.join(o['strategies']):<34} {o['run_s']:8.3f} "
              f"{o['lineage_s']:9.3f} {o['pairs']:9d} {_fmt_bytes(o['lineage_bytes']):>10}")


def _region_flags(a) -> list[str]:
    """Which of --cells, --sky and --sel were given (`trace`, `impact`)."""
    return [flag for flag, v in (("--cells", a.cells), ("--sky", a.sky), ("--sel", a.sel)) if v]


def _check_radius(a) -> None:
    if a.radius is not None and not a.sky:
        raise SubZeroError("--radius goes with --sky")


def cmd_trace(a) -> int:
    from subzero.model.cells import parse_spec
    from subzero.store import open_store
    store = open_store(a.store, create=False)
    try:
        if a.workload:
            if a.export:
                raise SubZeroError("--export writes one trace's answer; it does not go with --workload")
            return _workload(store, a)
        if a.warm:
            raise SubZeroError("--warm goes with --workload")
        named = _region_flags(a)
        if not a.frm or len(named) != 1:
            raise SubZeroError("trace needs --from ARRAY and one of --cells SPEC, --sky RA,DEC or "
                               "--sel NAME=LABEL" + (f" (got {' and '.join(named)})" if named else "")
                               + " (or --workload FILE)")
        _check_radius(a)
        _check_exports(a.export, a.force)
        if a.plot:                  # before the trace, as --export: its folder must be there
            from subzero.export.impact import check_plot
            check_plot(a.plot, force=True)
        run = store.get(a.run)
        shapes = run.shapes()
        if a.frm not in shapes:
            raise SubZeroError(f"unknown array {a.frm!r} in run {run.id}; its arrays are: "
                               f"{', '.join(shapes)}")
        if a.cells:
            cells = parse_spec(a.cells, shapes[a.frm], a.frm)
        else:
            from subzero.coords import parse_sel
            cells = run.cells_at(a.frm, sky=a.sky, radius=a.radius,
                                 sel=parse_sel(a.sel) if a.sel else None)
        if (a.to is None) == (a.path is None):
            raise SubZeroError("give exactly one of --to ARRAY or --path OP:IDX,...")
        res = run.trace(a.frm, cells, to=a.to, path=_path(a.path) if a.path else None,
                        shortcut=not a.no_shortcut, planner=_planner(run, a),
                        exclude_all_to_all=a.exclude_all_to_all)
        out_cells = res.cells
        where = res.where()
        parts = res.parts()
        if a.json:
            print(json.dumps({"run_id": run.id, "from": a.frm, "to": res.target,
                              "direction": res.direction, "count": int(len(out_cells)),
                              "seconds": res.seconds, "cells_in": int(len(cells)),
                              "cells": out_cells.tolist(), **where,
                              "explain": res.explain(), "parts": parts,
                              "steps": [s.__dict__ for s in res.steps]}))
        else:
            _print_trace(res, out_cells, len(cells))
            _print_where(where, parts)
        if a.plot:
            from subzero.plot import plot_trace
            plot_trace(run, a.frm, cells, res, a.plot)
            if not a.json:
                print(f"plot written to {a.plot}")
        _write_exports(a.export, run, res, a.force, quiet=a.json)
    finally:
        store.close()
    return 0


def _check_exports(paths, force: bool) -> None:
    """Refuse --export paths whose format is unknown, that exist (without --force) or
    cannot be written, before the work begins."""
    if not paths:
        return
    from subzero.export import format_of
    from subzero.export.output import check_target
    for path in paths:
        format_of(path)
        check_target(path, force)


_FORMAT_NAMES = {"mask": "mask", "prov": "PROV-JSON", "openlineage": "OpenLineage event"}


def _write_exports(paths, run, res, force: bool, quiet: bool) -> list[dict]:
    if not paths:
        return []
    from subzero.export import export, format_of
    done = []
    for path in paths:
        written = export(path, run=run, result=res, force=force)
        done.append({"path": str(written), "format": format_of(path)})
        if not quiet:
            print(f"{_FORMAT_NAMES[format_of(path)]} written to {written}")
    return done


def cmd_export(a) -> int:
    """The run's provenance as PROV-JSON and/or an OpenLineage event (no trace)."""
    from subzero.export import write_openlineage, write_prov
    from subzero.export.output import check_target
    from subzero.run import Run
    from subzero.store import open_store
    if not a.prov and not a.openlineage:
        raise SubZeroError("export needs --prov PATH and/or --openlineage PATH (a trace's answer "
                           "is exported by `subzero trace ... --export PATH`)")
    for path in (a.prov, a.openlineage):
        if path:
            check_target(path, a.force)
    store = open_store(a.store, create=False)
    try:
        row = store.catalog.get_run(_chosen_run(a))
        run = store.get(row.id) if row.status == "complete" else Run(store, row)
        done = []
        if a.prov:
            done.append({"path": str(write_prov(run, a.prov, force=a.force)), "format": "prov"})
        if a.openlineage:
            done.append({"path": str(write_openlineage(run, a.openlineage, force=a.force)),
                         "format": "openlineage"})
        if a.json:
            print(json.dumps({"run_id": run.id, "written": done}))
        else:
            for d in done:
                print(f"{_FORMAT_NAMES[d['format']]} of run {run.id} ({row.status}) written to {d['path']}")
    finally:
        store.close()
    return 0


def _print_trace(res, cells, n_in) -> None:
    print(f"{res.direction} trace {res.start} -> {res.target}: {n_in} cell(s) in, "
          f"{len(cells)} cell(s) out in {res.seconds * 1000:.1f} ms")
    for line in _why(res.explain()):
        print(f"  {line}")
    if len(cells):
        lo, hi = cells.min(axis=0), cells.max(axis=0)
        box = ", ".join(f"{int(a)}:{int(b) + 1}" for a, b in zip(lo, hi))
        print(f"  bounding box: [{box}]  (shape of {res.target}: {tuple(res.shape)})")
        vals = res.values
        first = ", ".join(f"{tuple(int(x) for x in c)}={_v(v)}" for c, v in zip(cells[:8], vals[:8]))
        print(f"  first cells: {first}{' ...' if len(cells) > 8 else ''}")
    for s in res.steps:
        warm = f" (+{s.warmup * 1000:.1f} ms first use)" if s.warmup >= 0.0005 else ""
        print(f"  step {s.op}:{s.input} {s.direction:<8} {s.method:<30} {s.cells_in:>8} -> "
              f"{s.cells_out:<8} {s.seconds * 1000:8.2f} ms{warm}")
        if s.note:
            print(f"    {s.note}")


def _why(ex: dict) -> list[str]:
    """The answer explained: what came only through all-to-all steps, what widened it."""
    steps = ", ".join(f"{s.split(':')[0]} input {s.split(':')[1]}" for s in ex["all_to_all_steps"])
    lines = []
    if ex["excluded_all_to_all"] and steps:
        lines.append(f"why: steps through all-to-all inputs left out ({steps}); the answer holds "
                     f"only the cells reached without them")
    elif ex["all_to_all_only"]:
        lines.append(f"why: {ex['direct']:,} cells reached directly; {ex['all_to_all_only']:,} "
                     f"more only through all-to-all steps ({steps}: every cell of those inputs); "
                     f"--exclude-all-to-all leaves them out")
    if ex["widest"]:
        lines.append("widest steps: " + ", ".join(
            f"{w['op']} {w['cells_in']:,} -> {w['cells_out']:,}" for w in ex["widest"]))
    return lines


def _print_where(where: dict, parts: list[dict] | None = None) -> None:
    if parts is not None and len(parts) > 1:       # each part where it is: not one box
        for p in parts:
            box = ", ".join(f"{a}:{b}" for a, b in zip(*p["box"]))
            sky = p.get("sky")
            at = (f"; sky region: centre {sky['center_hmsdms']}, RA {sky['ra'][0]:.6f}.."
                  f"{sky['ra'][1]:.6f}, Dec {sky['dec'][0]:.6f}..{sky['dec'][1]:.6f}" if sky else "")
            via = {"direct": "reached directly",
                   "all-to-all only": "only through all-to-all steps"}.get(p["via"], p["via"])
            print(f"  {via}: {p['count']:,} cells in [{box}]{at}")
    elif "sky" in where:
        s = where["sky"]
        print(f"  sky region: centre {s['center_hmsdms']} (RA {s['center'][0]:.6f}, "
              f"Dec {s['center'][1]:.6f}); RA {s['ra'][0]:.6f}..{s['ra'][1]:.6f}, "
              f"Dec {s['dec'][0]:.6f}..{s['dec'][1]:.6f} (deg, ICRS)")
    if where.get("labels"):
        print("  labels: " + ", ".join(f"{k} {v[0]}..{v[1]}" for k, v in where["labels"].items()))


def _v(v) -> str:
    import numpy as np
    return f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v)


def _workload(store, a) -> int:
    from subzero.query.workload import load_workload, run_workload
    run = store.get(a.run)
    queries = load_workload(a.workload)
    run.planner = _planner(run, a)
    rows = run_workload(run, queries, warm=a.warm)
    if a.json:
        print(json.dumps({"run_id": run.id, "warm": a.warm, "queries": [
            {k: v for k, v in r.items() if k != "result"} for r in rows]}))
    else:
        print(f"workload {a.workload} on run {run.id}:")
        for r in rows:
            print(f"  {r['name']:<10} {r['direction']:<8} {r['from']} -> {r['to']}: "
                  f"{r['cells_in']} in, {r['count']} out, {r['seconds'] * 1000:.1f} ms")
    return 0


def cmd_explore(a) -> int:
    """Serve the lineage explorer over a run until Ctrl-C; the URL is the first line."""
    from subzero.explore import bind, serve
    from subzero.store import open_store
    store = open_store(a.store, create=False)
    try:
        run = store.get(a.run)
        sock = bind(a.host, a.port)      # a port in use or a bad host: one line, exit 2

        def ready(url: str) -> None:
            print(json.dumps({"url": url, "run_id": run.id}) if a.json else url, flush=True)
            # a graphical browser only, in the background (a console browser such as lynx
            # would take the terminal, and webbrowser waits for it)
            if not a.no_browser and (sys.platform != "linux" or os.environ.get("DISPLAY")
                                     or os.environ.get("WAYLAND_DISPLAY")):
                import threading
                import webbrowser
                threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
        try:
            serve(run, sock=sock, on_ready=ready)
        except KeyboardInterrupt:       # Ctrl-C is how a server is stopped: not an error
            pass
    finally:
        store.close()
    return 0


def cmd_runs(a) -> int:
    from subzero.store import open_store
    store = open_store(a.store, create=False)
    try:
        every = store.runs()
        rows = every if a.all else [r for r in every if r.status != "deleted"]
        from subzero.storage.trust import load_key
        load_key()          # a key that cannot be read concerns every run: one line, here
        trust = {r.id: _trust_state(store, r) for r in rows if r.status == "complete"}
        parents = store.catalog.reruns()
        tags: dict[int, list[str]] = {}
        for name, rid in store.tags().items():
            tags.setdefault(rid, []).append(name)
        if a.json:
            print(json.dumps([{**r.__dict__, "trust": trust.get(r.id), "parent": parents.get(r.id),
                               "tags": tags.get(r.id, [])} for r in rows], default=str))
            return 0
        if not rows:
            print("no runs yet" if not every else
                  f"no runs left ({len(every)} deleted by gc; `subzero runs --all` lists them)")
            return 0
        print(f"{'id':>5}  {'status':<11} {'workflow':<16} {'started':<19}  {'duration':>8}  "
              f"{'trust':<9}")
        for r in rows:
            t = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started))
            dur = f"{r.ended - r.started:.1f}s" if r.ended else "-"
            err = f"  ({r.error})" if r.error and r.status != "complete" else ""
            made = f"  re-run of {parents[r.id]}" if r.id in parents else ""
            named = f"  [{', '.join(tags[r.id])}]" if r.id in tags else ""
            print(f"{r.id:>5}  {r.status:<11} {r.workflow:<16} {t}  {dur:>8}  "
                  f"{trust.get(r.id, '-'):<9}{named}{made}{err}")
        if len(rows) < len(every):
            print(f"({len(every) - len(rows)} run(s) deleted by gc not listed; --all lists them)")
        lost = [r.id for r in rows if r.status == "interrupted"]
        if lost:
            print(f"interrupted runs ({', '.join(map(str, lost))}) lost their driver: finish one "
                  f"with `subzero run --resume {lost[-1]}`, or remove them with `subzero clean`")
        if any(v != "trusted" for v in trust.values()):
            print(f"runs not trusted are data: traces that need their code stop; see "
                  f"`subzero trust {store.path}`")
    finally:
        store.close()
    return 0


def cmd_du(a) -> int:
    """Where the store's bytes go: per run, the inputs stored once, the catalog, the total."""
    from subzero.api import open_store
    run = _chosen_run(a, default=None)
    with open_store(a.store, create=False) as store:
        du = store.disk_usage(run)
    if a.json:
        print(json.dumps(du.as_dict()))
        return 0
    if run is not None:
        _du_run(du.runs[0])
        return 0
    print(f"store {du.path}: {_fmt_bytes(du.total)} on disk (each file once)")
    if du.runs:
        print(f"  {'run':>5}  {'status':<11} {'workflow':<14} {'arrays':>9} {'lineage':>9} "
              f"{'pickles':>9} {'stats':>9} {'other':>9} {'total':>9} {'alone':>9}")
    for r in du.runs:
        k = r.kinds
        print(f"  {r.run:>5}  {r.status or '?':<11} {(r.workflow or '?')[:14]:<14} "
              + " ".join(f"{_fmt_bytes(k[n].bytes):>9}" for n in ("arrays", "lineage", "pickles",
                                                                   "statistics", "other"))
              + f" {_fmt_bytes(r.total.bytes):>9} {_fmt_bytes(r.total.own):>9}")
    # rows that add up to the total: what each part owns alone, and hard-linked files once
    cat = du.catalog.own - du.trace_log - du.plans
    rows = [("runs (their bytes alone)", sum(r.total.own for r in du.runs)),
            ("inputs stored once (inputs/)", du.inputs.own), ("catalog", cat),
            ("trace log (in the catalog)", du.trace_log), ("plans (in the catalog)", du.plans),
            ("other (store.json, quarantine/, folders)", du.other.own),
            ("hard-linked between runs or inputs (once)", du.shared)]
    for what, n in rows:
        print(f"  {what:<44} {_fmt_bytes(n):>9}")
    print(f"  {'total':<44} {_fmt_bytes(du.total):>9}")
    return 0


def _du_run(r) -> None:
    """One run's bytes, array by array (``du --run``)."""
    print(f"run {r.run} ({r.workflow or '?'}, {r.status or '?'}): {_fmt_bytes(r.total.bytes)} in "
          f"{', '.join('runs/' + f for f in r.folders) or 'no folder'}; "
          f"{_fmt_bytes(r.total.own)} its own, {_fmt_bytes(r.total.shared)} shared (hard links)")
    print(f"  {'':<24} {'bytes':>9} {'alone':>9} {'shared':>9}  files")
    parts = sorted(r.arrays.items(), key=lambda kv: (-kv[1].bytes, kv[0]))
    parts = [(f"array {n}", p) for n, p in parts] + \
        [(k if k != "pickles" else "pickles (workflow.pkl)", r.kinds[k])
         for k in ("lineage", "pickles", "statistics", "other")]
    for what, p in parts:
        print(f"  {what[:24]:<24} {_fmt_bytes(p.bytes):>9} {_fmt_bytes(p.own):>9} "
              f"{_fmt_bytes(p.shared):>9}  {p.files}")
    if r.not_kept:
        print(f"  not kept (--keep; made again, checked, when read): {', '.join(r.not_kept)}")
    if r.inputs:
        print("  inputs read from the store's copies (inputs/, not in the run's folder): "
              + ", ".join(f"{n} {_fmt_bytes(b)}" for n, b in r.inputs.items()))


def _footprint(store, row) -> str:
    """A run's bytes on disk, as `run` and `show` print them."""
    r = store.run_usage(row)
    k = r.kinds
    line = (f"{_fmt_bytes(r.total.bytes)} on disk: arrays {_fmt_bytes(k['arrays'].bytes)}, lineage "
            f"{_fmt_bytes(k['lineage'].bytes)}, pickles {_fmt_bytes(k['pickles'].bytes)}, "
            f"statistics {_fmt_bytes(k['statistics'].bytes)}, other {_fmt_bytes(k['other'].bytes)}")
    if r.total.shared:
        line += f" ({_fmt_bytes(r.total.shared)} of it hard-linked with other runs)"
    if r.inputs:
        line += f"; its inputs, stored once for the store: {_fmt_bytes(sum(r.inputs.values()))}"
    if r.not_kept:
        line += f"; {len(r.not_kept)} intermediate array(s) not kept (`subzero du` names them)"
    return line


def cmd_inputs(a) -> int:
    from subzero.store import open_store
    with open_store(a.store, create=False) as store:
        if a.input is not None:
            digest = store.digest_of(a.input)
            uses = store.runs_using(digest)
            if a.json:
                print(json.dumps({"digest": digest, "runs": [{"run_id": r, "input": n} for r, n in uses]}))
                return 0
            print(f"{a.input}: content {digest}")
            if not uses:
                print("  no run of this store read it")
            for r, n in uses:
                print(f"  run {r}: input {n}")
            return 0
        found = store.inputs()
        if a.json:
            print(json.dumps([{**e, "uses": [{"run_id": r, "input": n} for r, n in e["uses"]]}
                              for e in found]))
            return 0
        if not found:
            print("no inputs yet")
            return 0
        print(f"{'content':<24} {'shape':<16} {'dtype':<9} {'size':>9} {'on disk':>9} {'copies':>6}"
              f"  {'runs':>4}  used as")
        for e in found:
            names = sorted({n for _, n in e["uses"]})
            ids = [r for r, _ in e["uses"]]
            runs = ", ".join(map(str, ids[:6])) + (f" and {len(ids) - 6} more" if len(ids) > 6 else "")
            print(f"{e['digest'][:24]:<24} {str(tuple(e['shape'])):<16} {e['dtype']:<9} "
                  f"{_fmt_bytes(e['nbytes']):>9} {_fmt_bytes(e['stored']['bytes']):>9} "
                  f"{e['stored']['copies']:>6}  {len(ids):>4}  {', '.join(names)} (runs {runs})")
        total = sum(e["stored"]["bytes"] for e in found)
        print(f"{len(found)} distinct input(s), {_fmt_bytes(total)} on disk for "
              f"{sum(len(e['uses']) for e in found)} use(s) by runs")
    return 0


def cmd_impact(a) -> int:
    from subzero.engines.choice import EngineRequest
    from subzero.export import impact as out
    from subzero.export.output import check_target
    from subzero.store import open_store
    named = _region_flags(a)
    if len(named) != 1:
        raise SubZeroError("impact needs one of --cells SPEC, --sky RA,DEC or --sel NAME=LABEL"
                           + (f" (got {' and '.join(named)})" if named else ""))
    _check_radius(a)
    if (a.input is None) == (a.name is None):
        raise SubZeroError("impact needs --input FILE|DIGEST, or --run N --name INPUT")
    request = EngineRequest(a.engine or os.environ.get("SUBZERO_ENGINE") or "auto", a.master,
                            _kv(a.conf, "--conf"))
    request.check()
    files = [p for p in (a.table, a.plot, a.prov, a.openlineage) if p]
    if len(set(map(os.path.abspath, files))) != len(files):
        raise SubZeroError("--table, --plot, --prov and --openlineage need a file each")
    if a.table:                        # every file checked before the query runs
        out.check_table(a.table, a.force)
    if a.plot:
        out.check_plot(a.plot, a.force)
    for path in (a.prov, a.openlineage):
        if path:
            check_target(path, a.force)
    with open_store(a.store, create=False) as store:
        what, name = (a.input, None) if a.input is not None else (a.run, a.name)
        sel = None
        if a.sel:
            from subzero.coords import parse_sel
            sel = parse_sel(a.sel)
        res = store.impact(what, a.cells, name=name, to=a.to, sky=a.sky, radius=a.radius, sel=sel,
                           engine=request.engine, master=request.master, conf=request.conf,
                           progress=False if a.json else None,
                           announce=None if a.json else _say)
        written = []
        for path, fmt, write in ((a.table, "table", lambda p: res.to_table(p, a.force)),
                                 (a.plot, "plot", lambda p: res.plot(p, a.force)),
                                 (a.prov, "prov", lambda p: out.write_prov(store, res, p, a.force)),
                                 (a.openlineage, "openlineage",
                                  lambda p: out.write_openlineage(store, res, p, a.force))):
            if path:
                written.append({"path": str(write(path)), "format": fmt})
        if a.json:
            print(json.dumps({**res.as_dict(), **({"written": written} if written else {})}, default=str))
            return 0
        print(f"input {res.digest}: {res.cells_in} cells; read by {len(res.runs)} runs, "
              f"{len(res.touched)} affected")
        for wf, runs in res.by_workflow().items():
            print(f"workflow {wf}: {len(runs)} runs")
            for r in runs:
                if r.error:
                    print(f"  run {r.run_id} (input {r.input}): cannot be answered: {r.error}")
                    continue
                parts = [f"{t.array} {t.count} cells"
                         + (f" in [{', '.join(f'{lo}:{hi}' for lo, hi in zip(*t.bounds))}]" if t.bounds else "")
                         + (f" (ids {_ids_text(t.objects['ids'])})" if t.objects.get("ids") else "")
                         for t in r.targets]
                print(f"  run {r.run_id} (input {r.input}): " + ("; ".join(parts) or "nothing downstream"))
        for d in written:
            print(f"{d['format']} written to {d['path']}")
    return 0


def cmd_rerun(a) -> int:
    """``rerun RUN --input NAME=PATH`` or ``rerun --using OLD --input NAME=PATH``."""
    from subzero.store import open_store
    given = _kv(a.input, "--input")
    if not given:
        raise SubZeroError("rerun needs the corrected input: --input NAME=PATH")
    a.run = _chosen_run(a, default=None)
    if (a.run is None) == (a.using is None):
        raise SubZeroError("rerun needs a run (subzero rerun RUN --input NAME=PATH) or --using "
                           "OLD (every run that read OLD), not both")
    if a.using is not None and len(given) != 1:
        raise SubZeroError("rerun --using OLD takes one --input NAME=PATH: the file that replaces OLD")
    for name, path in given.items():
        if not os.path.exists(path):
            raise SubZeroError(f"--input {name}: file not found: {path}")
    from subzero.engines.choice import EngineRequest
    request = EngineRequest(a.engine or "auto", a.master, _kv(a.conf, "--conf"))
    request.check()
    if a.run is not None and (request.engine == "spark" or request.master or request.conf):
        raise SubZeroError("a re-run of one run runs in this process; --engine spark, --master and "
                           "--conf are for --using (many runs)")
    with open_store(a.store, create=False) as store:
        progress = False if a.json else None
        if a.run is not None:
            runs = [store.rerun(a.run, given, progress=progress)]
        else:
            (name, path), = given.items()
            runs = store.rerun_using(a.using, path, name=name, progress=progress,
                                     engine=request.engine if request.engine != "auto" else
                                     ("spark" if request.master or request.conf else "local"),
                                     master=request.master, conf=request.conf)
        infos = [(r, r.rerun_info() or {}) for r in runs]
        if a.json:
            print(json.dumps([{"run_id": r.id, **info} for r, info in infos], default=str))
            return 0
        for r, info in infos:
            print(_rerun_line(r.id, info))
            if a.verbose:
                _rerun_table(info, [o["name"] for o in r.ops()])
        if not a.verbose:
            print("per operator: `subzero show RUN` (or rerun -v)")
    return 0


def _rerun_line(run_id: int, info: dict) -> str:
    """One re-run in a line: its parent, and what it recomputed."""
    ops = [v for v in info.get("ops", {}).values() if v.get("kind") != "input"]
    tiles = sum(int(v.get("tiles") or 0) for v in ops)
    ran = sum(int(v.get("ran") or 0) for v in ops)
    kept = sum(v.get("kind") == "kept" for v in ops)
    changed = sum(bool(v["changed"]["chunks"]) for v in ops)
    return (f"run {run_id}: re-run of run {info.get('parent')} with new "
            f"{', '.join(info.get('inputs', []))}: {ran} of {tiles} tiles recomputed; "
            f"{kept} of {len(ops)} operators untouched; {changed} outputs changed")


def _rerun_table(info: dict, order: list[str] | None = None) -> None:
    """Per operator (in ``order``, the run's, when given): how it was made, the tiles that
    ran, the chunks whose values changed, and its statistic."""
    ops = info.get("ops", {})
    names = [n for n in (order or []) if n in ops] + [n for n in ops if n not in (order or [])]
    print(f"    {'operator':<20} {'how':<6} {'tiles run':>12} {'chunks changed':>15}  statistic")
    for name in names:
        v = ops[name]
        if v.get("kind") in ("input", "kept"):
            continue
        st = v.get("statistic") or {}
        stat = "" if not st else ("recomputed" if "changed" not in st else
                                  "changed" if st["changed"] else "unchanged") + (
            f", reaches {st['tiles_using']} more tiles" if st.get("tiles_using") else "")
        ran = f"{v.get('ran', 0)} of {v.get('tiles', 1)}"
        print(f"    {name:<20} {v['kind']:<6} {ran:>12} {v['changed']['chunks']:>15}  {stat}")
    kept = [n for n in names if ops[n].get("kind") == "kept"]
    if kept:
        print(f"    the parent's, untouched: {_few(kept, 12)}")


def _ids_text(ids: list) -> str:
    shown = ", ".join(map(str, ids[:8]))
    return shown + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")


def _trust_state(store, row) -> str:
    """A complete run's trust state for the list; a run whose catalog rows cannot be
    read is listed as "damaged" (with a warning saying why), so the others still are."""
    from subzero.errors import StoreError
    try:
        state = store.verdict(row).state
        differ = store.binding(row)["catalog_differs"]
    except StoreError as e:
        warn(str(e))
        return "damaged"
    if differ:
        warn(f"run {row.id}: the catalog differs from the run's record ({'; '.join(differ[:2])}); "
             f"`subzero fsck --store {store.path}` repairs it")
        if any(d.startswith("rows that cannot be read") for d in differ):
            return "damaged"
    return state


@overload
def _chosen_run(a) -> str: ...
@overload
def _chosen_run(a, default: None) -> str | None: ...


def _chosen_run(a, default: str | None = "latest") -> str | None:
    """The run of a command that takes it both ways (`show`, `export`, `rerun`, `du`):
    ``--run RUN`` as every command takes it, or the positional RUN they took first;
    ``default`` when neither is given."""
    if a.run is not None and a.run_opt is not None and a.run != a.run_opt:
        raise UsageError(f"two runs given ({a.run} and --run {a.run_opt}); give one")
    return a.run_opt or a.run or default


def _run_args(sp: argparse.ArgumentParser, what: str) -> None:
    """The run as a positional argument (what these commands took first) and as --run."""
    sp.add_argument("run", nargs="?", help=f"{what}; or --run")
    sp.add_argument("--run", dest="run_opt", metavar="RUN", help="the run, as every command takes it")


def cmd_show(a) -> int:
    from subzero.store import open_store
    store = open_store(a.store, create=False)
    try:
        row = store.catalog.get_run(_chosen_run(a))
        if a.json:
            print(json.dumps(_run_json(store, row.id), default=str))
            return 0
        ops, arrays = _described(store, row)
        print(f"run {row.id}: workflow {row.workflow} ({row.source or 'in-process'}), {row.status}"
              + (f": {row.error}" if row.error else ""))
        named = sorted(n for n, rid in store.tags().items() if rid == row.id)
        if named:
            print(f"  tags: {', '.join(named)}")
        if row.status == "complete":
            verdict = store.verdict(row)
            print("  trusted: its code (operators) may be loaded" if verdict.trusted else
                  f"  NOT trusted: {verdict.why}; traces answer only from stored lineage "
                  f"(trust it with `subzero trust {store.path} --run {row.id}`)")
            bound = store.binding(row)
            if bound.get("damaged"):
                print(f"  DAMAGED: {bound['damaged']}")
            elif not bound["bound"]:
                print("  unbound: made before runs were bound to their place (a piece moved in "
                      "from another run is caught only where its checksum differs)")
            if bound["catalog_differs"]:
                print(f"  the catalog differs from the run's signed record "
                      f"({', '.join(bound['catalog_differs'][:4])}); traces follow the record; "
                      f"`subzero fsck --store {store.path}` repairs the catalog")
        if row.status == "interrupted":
            print(f"  its driver is gone: finish it with `subzero run --resume {row.id}`, or "
                  f"remove it with `subzero clean`")
        digests = store.input_digests(row) if row.status == "complete" else {}
        for k, v in row.inputs.items():
            shape = arrays.get(k, {}).get("shape")
            where = f"shape {tuple(shape)}" if shape is not None else f"not stored (the run is {row.status})"
            print(f"  input {k} = {v}  {where}" + (f"  content {digests[k]}" if digests.get(k) else ""))
        if ops:
            _ops_table(ops)
            total = sum(o["lineage_bytes"] for o in ops)
            inb = sum(v["nbytes"] for v in arrays.values() if v["kind"] == "input")
            print(f"  lineage total {_fmt_bytes(total)} ({total / max(inb, 1):.3f}x the input bytes)")
        if row.status != "failed" or store.run_dir(row.id).exists():
            print(f"  {_footprint(store, row)} (`subzero du --run {row.id}`: array by array)")
        for d in store.catalog.downgrades(row.id):
            print(f"  downgraded: {d['reason']}")
        info = store.catalog.rerun_of(row.id)
        if info is not None:
            print("  " + _rerun_line(row.id, info))
            _rerun_table(info, [o["name"] for o in ops])
        children = sorted(k for k, v in store.catalog.reruns().items() if v == row.id)
        if children:
            print(f"  re-run as run{'s' if len(children) > 1 else ''} {', '.join(map(str, children))}")
        coords = _coordinates(store, row)
        if coords:
            sky = [k for k, v in coords.items() if v.get("sky")]
            no_sky = [k for k in coords if k not in sky]
            labelled = {k: v["labels"] for k, v in coords.items() if v.get("labels")}
            if sky:
                print(f"  sky coordinates (--sky) on {len(sky)} of {len(coords)} arrays"
                      + (f"; not on {_few(no_sky)}" if no_sky else ""))
            if labelled:
                print("  labelled axes (--sel): " + "; ".join(
                    f"{k} ({', '.join(v)})" for k, v in list(labelled.items())[:6])
                    + (f"; and {len(labelled) - 6} more arrays" if len(labelled) > 6 else ""))
    finally:
        store.close()
    return 0


def _few(names: list[str], n: int = 4) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _coordinates(store, row) -> dict[str, dict]:
    """Per array of a complete run: its dims, labelled axes and whether it has a sky WCS
    (what ``trace --sel`` and ``--sky`` can use).  An array whose grid cannot be read
    says why instead."""
    if row.status != "complete":
        return {}
    run = store.get(row.id)
    out: dict[str, dict] = {}
    for name in run.array_names():
        try:
            g = run.grid(name)
        except SubZeroError as e:
            out[name] = {"error": str(e)}
            continue
        out[name] = {"dims": list(g.dims) if g else None, "labels": list(g.coords) if g else [],
                     "sky": bool(g is not None and g.wcs)}
    return out


def cmd_trust(a) -> int:
    """Show what code runs contain, ask, and sign them with this user's key."""
    from subzero.store import open_store
    where = a.store_dir or a.store
    store = open_store(where, create=False)
    try:
        if a.run is not None:
            rows = [store.catalog.get_run(a.run)]
            if rows[0].status != "complete":
                raise SubZeroError(f"run {rows[0].id} did not complete ({rows[0].status}); only a "
                                   f"complete run has code to trust")
        else:
            rows = [r for r in store.runs() if r.status == "complete" and not store.verdict(r).trusted]
        codes = [store.code_of(r) for r in rows]
        if not codes:
            if a.json:
                print(json.dumps({"runs": [], "trusted": []}))
            else:
                print(f"every complete run of {where} is trusted already")
            return 0
        if not a.json:
            for c in codes:
                _print_code(c)
        if not a.yes:
            if a.json or not (sys.stdin.isatty() and sys.stderr.isatty()):
                raise SubZeroError("trusting needs a confirmation: read what the runs contain "
                                   "(above, or `subzero trust` on a terminal) and pass --yes")
            ids = ", ".join(str(c["run_id"]) for c in codes)
            print(f"Trust run{'s' if len(codes) > 1 else ''} {ids} of {where}? Their code will run "
                  f"on this machine when traces need it. [y/N] ", end="", file=sys.stderr, flush=True)
            if input().strip().lower() not in ("y", "yes"):
                print("nothing trusted")
                return EXIT_USER
        done: list[int] = []
        for c in codes:
            done += store.trust(c["run_id"], payloads={c["run_id"]: c["payload_sha256"]})
        if a.json:
            print(json.dumps({"runs": codes, "trusted": done}))
        else:
            print(f"trusted run{'s' if len(done) > 1 else ''} {', '.join(map(str, done))}: signed "
                  f"with your key ({_key_path()})")
    finally:
        store.close()
    return 0


def _key_path() -> str:
    from subzero.storage.trust import key_path
    return str(key_path())


def _print_code(c: dict) -> None:
    """What one run would load, read from its files without loading anything."""
    from subzero.storage.pickles import risky
    state = "trusted" if c["trust"] == "trusted" else f"not trusted: {c['why']}"
    print(f"run {c['run_id']} (workflow {c['workflow']}; {state})")
    print("  operators: " + (", ".join(f"{o['name']} ({o['class']})" for o in c["operators"])
                             or "(none)"))
    if not c["pickle"]:
        print("  no workflow.pkl: its code is the module it re-imports")
    else:
        if c["classes"] or c["functions"]:
            print(f"  code stored inside workflow.pkl (runs when it loads): classes "
                  f"{', '.join(c['classes']) or '(none)'}; {len(c['functions'])} functions")
        print("  workflow.pkl imports:")
        for mod, names in c["modules"].items():
            flagged = [n for n in names if risky(mod, n)] or ([mod] if risky(mod, "") else [])
            note = "   <- can run commands or load code" if flagged else ""
            print(f"    {mod}: {', '.join(names) if names else '(module)'}{note}")
        if c["unreadable"]:
            print(f"  (could not read all of it: {c['unreadable']})")
    if c["source"] and c.get("constants"):
        print(f"  re-imports {c['source']} when workflow.pkl loads: it rebuilds arrays the "
              f"operators hold, left out of the pickle (and when the pickle cannot be loaded)")
    elif c["source"]:
        print(f"  re-imports {c['source']} when workflow.pkl cannot be loaded")


def _described(store, row) -> tuple[list, dict]:
    """A run's operators and arrays as ``show`` prints them: from its signed record when
    that verifies (catalog rows may have been edited or damaged since), else from the
    catalog."""
    if row.status == "complete":
        try:
            steer = store.steering(row)
            if steer.verified:
                return steer.ops, steer.arrays
        except SubZeroError:
            pass                    # the catalog's rows, and their own errors, below
    return store.catalog.ops(row.id), store.catalog.arrays(row.id)


def _run_json(store, run_id: int) -> dict:
    """One run as `run --json` and `show --json` print it: the catalog's run row,
    its operators, arrays, strategy statistics and downgrades (``run_id`` and
    ``workflow`` repeat the row's id and workflow at the top, for scripts)."""
    row = store.catalog.get_run(run_id)
    return {"run_id": row.id, "workflow": row.workflow, "run": row.__dict__,
            "trust": store.verdict(row).state if row.status == "complete" else None,
            "binding": store.binding(row) if row.status == "complete" else None,
            **dict(zip(("ops", "arrays"), _described(store, row))),
            "strategies": store.catalog.strategy_stats(row.id),
            "downgrades": store.catalog.downgrades(row.id),
            "coordinates": _coordinates(store, row),
            "input_digests": store.input_digests(row) if row.status == "complete" else {},
            "rerun": store.catalog.rerun_of(row.id),
            "tags": sorted(n for n, rid in store.tags().items() if rid == row.id)}


class _Version(argparse.Action):
    """``--version``: the version of the code that runs (``subzero.version``), which
    tests/test_imports.py holds equal to the installed package's and to
    pyproject.toml's.  Not looked up in the installed distributions: importlib.metadata
    parses them, 60 ms of a 0.15 s budget for the whole command."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show the program's version number and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from subzero.version import __version__
        parser._print_message(f"subzero {__version__}\n", sys.stdout)
        parser.exit()


#: what each command's --help ends with: a few runnable lines (the demo's store and files)
EXAMPLES: dict[str, tuple[str, ...]] = {
    "run": ("subzero run workflows/astronomy.py --store .subzero-demo",
            "subzero run myflow.py --input raw=exposure.fits --input cube=era5.nc:t2m --param k=3",
            "subzero run workflows/genomics.py --max-disk 20MB   # choose strategies for a budget",
            "subzero run --resume 7                              # finish an interrupted run"),
    "trace": ("subzero trace --from stars --cells 1162,112 --to raw_1",
              "subzero trace --from stars --sky 23:49:21.56,-2:44:58.9 --radius 1arcsec --to raw_1",
              "subzero trace --from raw_1 --cells 0:16,0:16 --to stars --plot fwd.png --json",
              "subzero trace --from stars --cells 1162,112 --to raw_1 --exclude-all-to-all"),
    "export": ("subzero export --run 3 --prov run3.prov.json --openlineage run3.ol.json",),
    "optimize": ("subzero optimize workflows/genomics.py --max-disk 20MB --name small",
                 "subzero run workflows/genomics.py --plan small"),
    "explore": ("subzero explore --run latest --port 8765",),
    "runs": ("subzero runs", "subzero runs --all --json"),
    "du": ("subzero du", "subzero du --run 3 --json"),
    "inputs": ("subzero inputs", "subzero inputs flat.fits"),
    "impact": ("subzero impact --input flat.fits --cells 0:64,20:22 --table night.csv",
               "subzero impact --run 3 --name flat --cells 10:20,30:40 --plot night.png"),
    "rerun": ("subzero rerun 3 --input flat=flat_fixed.fits",
              "subzero rerun --using flat.fits --input flat=flat_fixed.fits"),
    "clean": ("subzero clean --dry-run", "subzero clean"),
    "gc": ("subzero gc --keep-last 5 --dry-run", "subzero gc --older-than 30d --keep-last 5",
           "subzero gc 3 4"),
    "tag": ("subzero tag 12 golden", "subzero tag", "subzero tag --delete golden"),
    "fsck": ("subzero fsck --dry-run", "subzero fsck --deep"),
    "show": ("subzero show", "subzero show --run golden --json"),
    "trust": ("subzero trust .subzero-shared", "subzero trust --run 4 --yes"),
}


class _Help(argparse.HelpFormatter):
    """Descriptions wrapped as usual; the examples epilog kept line by line."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="subzero", description="Region lineage for array workflows.")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def command(name: str, **kw: Any) -> argparse.ArgumentParser:
        """A command, with its examples at the end of its --help."""
        lines = EXAMPLES.get(name, ())
        if lines:
            kw.setdefault("epilog", "examples:\n" + "\n".join(f"  {x}" for x in lines))
        return sub.add_parser(name, formatter_class=_Help, **kw)

    def region_args(sp):
        """The cells a query starts from, as `trace` and `impact` take them."""
        sp.add_argument("--cells", metavar="SPEC", help="cells: 12,40 or 12,40;13,41 or 10:20,30:40")
        sp.add_argument("--sky", metavar="RA,DEC",
                        help="cells at a sky position (degrees, or 23:47:09.8,-2:17:37) through the "
                             "array's FITS WCS")
        sp.add_argument("--radius", metavar="ANGLE",
                        help="with --sky: every cell within this angle, e.g. 2arcsec (number: arcsec)")
        sp.add_argument("--sel", action="append", metavar="NAME=LABEL",
                        help="labelled cells, e.g. time=2020-01-03 or lat=10:20 (repeatable)")

    def spark_args(sp, engine_help):
        """Where a command runs: --engine (its own help), --master, --conf."""
        sp.add_argument("--engine", choices=REQUESTS, default=None, help=engine_help)
        sp.add_argument("--master", metavar="URL", help="Spark master, e.g. spark://host:7077 or local[4]")
        sp.add_argument("--conf", action="append", metavar="KEY=VALUE", help="Spark configuration")

    def common(sp):
        sp.add_argument("--store", default=os.environ.get("SUBZERO_STORE", ".subzero"),
                        help="store directory (default ./.subzero)")
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        # SUPPRESS: when not given after the command, the top-level --debug stands
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)

    r = command("run", help="run a workflow and capture its lineage",
                       description="Runs a workflow (a .py file or module that defines "
                                   "workflow()) on its inputs and stores every array and the "
                                   "lineage its operators' strategies keep, as one new run: "
                                   "complete, or failed and leaving nothing behind; prints the "
                                   "run's id and its bytes on disk (`subzero du` lists them array "
                                   "by array). --max-disk chooses the strategies for a disk budget "
                                   "first; --resume finishes a run whose driver was lost.")
    r.add_argument("workflow", nargs="?",
                   help="workflow .py file or module name (defines workflow())")
    r.add_argument("--resume", metavar="RUN",
                   help="finish an interrupted run (its driver was lost) from its first "
                        "unfinished operator")
    r.add_argument("--input", action="append", metavar="NAME=PATH",
                   help="bind a workflow input to a .npy/.fits/.nc/.zarr/.csv file; one "
                        "variable of several: cube.nc:temp, obs.zarr:group/flux")
    r.add_argument("--strategy", action="append", metavar="OP=STRATEGY",
                   help="lineage strategy of an operator: full, map, blackbox, pay, comp, or "
                        "MODE:ENCODING:DIRECTION, several joined with +")
    r.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="keyword argument for the module's workflow() (JSON values allowed)")
    r.add_argument("--no-lineage", action="store_true", help="run without capturing lineage")
    r.add_argument("--keep", choices=POLICIES, default=None,
                   help=f"which arrays the run keeps on disk: all, outputs (inputs and outputs "
                        f"only), auto (also what traces read, and what is slow to make again); "
                        f"one not kept is made again, checked, when read (default: {DEFAULT_KEEP})")
    r.add_argument("--pin", action="append", metavar="ARRAY",
                   help="keep this array whatever --keep says (repeatable)")
    spark_args(r, "spark (local mode unless --master), local (in-process), or auto "
                  "(default: Spark for a --master or big inputs, else in-process)")
    r.add_argument("--tile", type=_positive, metavar="N", help="tile size per axis (default 512)")
    r.add_argument("--inputs-from", metavar="MANIFEST.csv",
                   help="one workflow instance per row (columns = inputs, values = paths), "
                        "run as parallel Spark tasks")
    r.add_argument("--plan", metavar="NAME", help="store what a saved plan chose (subzero optimize)")
    r.add_argument("--max-disk", metavar="SIZE",
                   help="optimize for this disk budget of the run's arrays and lineage (e.g. "
                        "500KB, 20MB, 1.5GB), then run")
    r.add_argument("--max-runtime", metavar="FACTOR",
                   help="with --max-disk: allowed runtime over the no-lineage run, e.g. 1.5")
    r.add_argument("--workload", metavar="FILE", help="the query workload to optimize for")
    r.add_argument("-v", "--verbose", action="store_true", help="print per-operator statistics")
    r.add_argument("-q", "--quiet", action="store_true",
                   help="no engine line; the last line is the run id alone (for scripts)")
    common(r)
    r.set_defaults(fn=cmd_run, command_parser=r)

    t = command("trace", help="trace cells backward or forward through a run",
                       description="Traces cells of one array of a run to another array, "
                                   "backward (which cells made these?) or forward (what did "
                                   "these cells affect?), along every path of the workflow "
                                   "between them. Prints the cells (their count, box, values "
                                   "and sky or label region); --json, --plot and --export keep "
                                   "them.")
    t.add_argument("--run", default="latest", help="run id or 'latest' (default)")
    t.add_argument("--from", dest="frm", metavar="ARRAY", help="start array (operator or input name)")
    region_args(t)
    t.add_argument("--to", metavar="ARRAY", help="target array; every DAG path to it is traced")
    t.add_argument("--path", metavar="OP:IDX,...", help="explicit path of (operator, input index)")
    t.add_argument("--workload", metavar="FILE",
                   help="run every query of a workload file, each timed from nothing decoded")
    t.add_argument("--warm", action="store_true",
                   help="with --workload: let each query use the lineage earlier ones decoded "
                        "(a session's total; a query's time then depends on those before it)")
    t.add_argument("--plot", metavar="FILE.png", help="draw the start and result arrays")
    t.add_argument("--no-shortcut", action="store_true",
                   help="disable the entire-array short-cut for all-to-all operators")
    t.add_argument("--no-planner", action="store_true",
                   help="choose each step's method by the simple rule, not the cost model")
    t.add_argument("--exclude-all-to-all", action="store_true",
                   help="leave out steps through inputs an operator reads all-to-all (an overscan "
                        "mean, a global median): they bring in every cell of that input")
    t.add_argument("--export", action="append", metavar="PATH",
                   help="write the answer to PATH, by suffix: .zarr or .nc (a labelled mask), "
                        ".prov.json (PROV-JSON), .openlineage.json or .ol.json (an OpenLineage "
                        "event of the run with this trace); repeatable")
    t.add_argument("--force", action="store_true", help="with --export: replace existing files")
    common(t)
    t.set_defaults(fn=cmd_trace, command_parser=t)

    ex = command("export", help="a run's provenance as PROV-JSON or an OpenLineage event",
                        description="Writes a run (its operators, arrays and the lineage stored "
                                    "per operator) as W3C PROV-JSON and/or an OpenLineage run "
                                    "event, for lab catalogs such as Marquez. To export a trace's "
                                    "answer too, use `subzero trace ... --export PATH`.")
    _run_args(ex, "run id, tag or 'latest' (default)")
    ex.add_argument("--prov", metavar="PATH", help="write PROV-JSON here")
    ex.add_argument("--openlineage", metavar="PATH", help="write the OpenLineage run event here")
    ex.add_argument("--force", action="store_true", help="replace existing files")
    common(ex)
    ex.set_defaults(fn=cmd_export, command_parser=ex)

    o = command("optimize", help="choose lineage strategies for a disk/runtime budget",
                       description="Chooses each operator's lineage strategies so that the "
                                   "workload's queries are fastest within a disk budget (and a "
                                   "runtime budget), by an integer program over the machine's "
                                   "calibration and one profiling run of the workflow; saves the "
                                   "plan for `subzero run --plan NAME`.")
    o.add_argument("workflow", help="workflow .py file or module name")
    o.add_argument("--max-disk", metavar="SIZE",
                   help="disk budget of a run's arrays and lineage, e.g. 500KB, 20MB, 1.5GB")
    o.add_argument("--max-runtime", metavar="FACTOR",
                   help="allowed runtime with lineage over the run without, e.g. 1.5")
    o.add_argument("--workload", metavar="FILE",
                   help="query workload (default: the trace log, else WORKFLOW_workload.json)")
    o.add_argument("--pin", action="append", metavar="OP=STRATEGY",
                   help="keep this operator's strategy fixed (repeatable)")
    o.add_argument("--name", metavar="NAME", help="save the plan under this name")
    o.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="keyword argument for the module's workflow()")
    o.add_argument("--input", action="append", metavar="NAME=PATH", help="workflow input file")
    o.add_argument("--recalibrate", action="store_true",
                   help="re-run the machine's calibration benchmark")
    o.add_argument("--reprofile", action="store_true", help="profile the workflow again")
    o.add_argument("--force", action="store_true", help="replace a saved plan of the same name")
    common(o)
    o.set_defaults(fn=cmd_optimize, command_parser=o)

    ex = command("explore", help="explore a run's lineage in the browser (a local web page)",
                        description="Serves a web page over a run: click a cell or drag a "
                                    "rectangle on any array and see its backward or forward "
                                    "lineage on every other array. Prints the URL first and "
                                    "serves until Ctrl-C.")
    ex.add_argument("--run", default="latest", help="run id or 'latest' (default)")
    ex.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1: this machine only)")
    ex.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free port)")
    ex.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    common(ex)
    ex.set_defaults(fn=cmd_explore, command_parser=ex)

    ru = command("runs", help="list runs",
                        description="Lists the store's runs: id, status (complete, running, "
                                    "interrupted, failed), workflow, start, duration, whether "
                                    "their code is trusted here, tags and re-run parents.")
    ru.add_argument("--all", action="store_true", help="also list runs deleted by gc")
    common(ru)
    ru.set_defaults(fn=cmd_runs, command_parser=ru)

    du = command("du", help="where the store's bytes go: per run and array, inputs, catalog",
                        description="Lists the bytes of the store: per run (its arrays, lineage, "
                                    "pickles such as workflow.pkl, statistics and the rest of its "
                                    "folder, with what it owns alone and what it shares through "
                                    "hard links: a re-run's unchanged chunks), the inputs stored "
                                    "once for all runs (inputs/), the catalog with its trace log "
                                    "and plans, and the total. Every file is counted once, however "
                                    "many links it has (as `du -sb`): the total is what the disk "
                                    "holds, and removing a run would free only what it owns "
                                    "alone. Reads only: works on a read-only store. With a run: "
                                    "that run's arrays one by one.")
    _run_args(du, "a run (an id, a tag or latest): its arrays one by one")
    common(du)
    du.set_defaults(fn=cmd_du, command_parser=du)

    inp = command("inputs", help="the store's inputs by content, and the runs that read them",
                         description="Lists every distinct input of the store's runs by its content "
                                     "digest (values, shape, type and labels; not the file's name or "
                                     "format), with the runs that read it. Given a file or a digest, "
                                     "lists the runs that read that content.")
    inp.add_argument("input", nargs="?", metavar="FILE|DIGEST",
                     help="a file (.npy, .fits, .zarr, .nc, ...) or a digest (sz1:...)")
    common(inp)
    inp.set_defaults(fn=cmd_inputs, command_parser=inp)

    im = command("impact", help="what a region of an input affected in every run that read it",
                        description="Finds every run that read the input (by content: any file "
                                    "or format with the same values and labels) and traces the "
                                    "region forward in each, to the arrays given with --to or to "
                                    "the workflow's outputs.")
    im.add_argument("--input", metavar="FILE|DIGEST", help="the input: a file or a digest (sz1:...)")
    im.add_argument("--run", metavar="N", help="with --name: the input of this run")
    im.add_argument("--name", metavar="INPUT", help="with --run: the input's name in that run")
    region_args(im)
    im.add_argument("--to", action="append", metavar="ARRAY",
                    help="an array to trace to (repeatable; default: the workflow's outputs)")
    spark_args(im, "local (this process and its forks), spark (one job over runs), or auto "
                   "(default: Spark for a --master or many runs, else local)")
    im.add_argument("--table", metavar="FILE", help="one row per run and array: .csv or .parquet")
    im.add_argument("--plot", metavar="FILE.png", help="draw every run's affected regions, by workflow")
    im.add_argument("--prov", metavar="FILE", help="the answer as W3C PROV-JSON")
    im.add_argument("--openlineage", metavar="FILE",
                    help="one OpenLineage run event per run (JSON Lines)")
    im.add_argument("--force", action="store_true", help="replace existing files")
    common(im)
    im.set_defaults(fn=cmd_impact, command_parser=im)

    rr = command("rerun", help="make runs again with a corrected input, recomputing only what it reaches",
                        description="Makes a complete run again with corrected inputs (a new "
                                    "run; the old one stays), running again only the tiles the "
                                    "correction can reach and keeping the rest of the old run. "
                                    "The new run is bit-identical to a full run on the new "
                                    "inputs. With --using OLD, re-runs every run that read OLD.")
    _run_args(rr, "the run to make again (an id, a tag or latest)")
    rr.add_argument("--using", metavar="FILE|DIGEST",
                    help="re-run every complete run that read this input")
    rr.add_argument("--input", action="append", metavar="NAME=PATH",
                    help="a corrected input file (repeatable without --using)")
    spark_args(rr, "with --using: local (one re-run after another, in this process), spark "
                   "(a task per run, in jobs of runs), or auto (Spark for a --master)")
    rr.add_argument("-v", "--verbose", action="store_true", help="per operator: tiles run, chunks changed")
    common(rr)
    rr.set_defaults(fn=cmd_rerun, command_parser=rr)

    c = command("clean", help="remove what interrupted and failed runs left behind",
                       description="Removes the folders of interrupted runs (their driver is "
                                   "gone, on any host), task attempts' folders and leftovers no "
                                   "run owns. Complete and running runs are never touched; an "
                                   "interrupted run cleaned can no longer be resumed.")
    c.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    common(c)
    c.set_defaults(fn=cmd_clean, command_parser=c)

    g = command("gc", help="delete complete runs by a retention policy",
                       description="Deletes complete runs: those named, or every run older than "
                                   "--older-than and not among the newest --keep-last of its "
                                   "workflow (either policy alone). Tagged runs are kept (unless "
                                   "--no-keep-tagged), and so is the parent of a re-run still "
                                   "running. What kept runs share with a deleted one stays (a "
                                   "re-run's chunks, inputs stored once). Each run is deleted at "
                                   "once or not at all. Try --dry-run first.")
    g.add_argument("runs", nargs="*", metavar="RUN", help="runs to delete (ids or tags)")
    g.add_argument("--keep-last", type=int, metavar="N",
                   help="keep the newest N runs of each workflow")
    g.add_argument("--older-than", metavar="AGE", help="delete only runs older than AGE (30d, 12h, 90m, 2w)")
    g.add_argument("--workflow", metavar="NAME", help="only runs of this workflow")
    g.add_argument("--keep-tagged", action=argparse.BooleanOptionalAction, default=True,
                   help="keep tagged runs (default; --no-keep-tagged deletes them too)")
    g.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    common(g)
    g.set_defaults(fn=cmd_gc, command_parser=g)

    tg = command("tag", help="name a run (kept by gc), list tags, or remove one",
                        description="subzero tag RUN NAME names a complete run; the name then "
                                    "works wherever a run is asked for (--run NAME) and gc keeps "
                                    "the run. subzero tag lists the tags; --delete NAME removes one.")
    tg.add_argument("run", nargs="?", help="the run (an id, a tag or latest)")
    tg.add_argument("name", nargs="?", help="the tag: a letter, then letters, digits, . _ -")
    tg.add_argument("--delete", metavar="NAME", dest="delete_name", help="remove this tag")
    tg.add_argument("--force", action="store_true", help="move a tag that names another run")
    common(tg)
    tg.set_defaults(fn=cmd_tag, command_parser=tg)

    fk = command("fsck", help="check the whole store and repair what can be proven",
                        description="Checks the store's identity, its catalog and every run folder. "
                                    "Repairs what can be proven from the runs' signed records: "
                                    "rebuilds a missing catalog, records committed runs the "
                                    "catalog does not know, rewrites catalog rows that differ "
                                    "from a signed record, moves folders that prove nothing to "
                                    "quarantine/ (never deletes). Reports the rest; exit 2 when "
                                    "something is left unrepaired.")
    fk.add_argument("--deep", action="store_true",
                    help="also read and check every array chunk and stored lineage block")
    fk.add_argument("--dry-run", action="store_true", help="report only, change nothing")
    common(fk)
    fk.set_defaults(fn=cmd_fsck, command_parser=fk)

    s = command("show", help="show a run's operators, strategies and statistics",
                       description="Shows one run: its status and trust, its inputs (with their "
                                   "content digests), each operator's strategies, runtime and "
                                   "lineage size, its arrays, coordinates, re-run history and "
                                   "whole footprint on disk (`subzero du --run N` lists it array "
                                   "by array).")
    _run_args(s, "run id, tag or 'latest' (default)")
    common(s)
    s.set_defaults(fn=cmd_show, command_parser=s)

    tr = command("trust", help="show the code of runs from elsewhere and trust them",
                        description="A run is trusted when its signature verifies with your key "
                                    "(made by you, or trusted here before); only then may traces "
                                    "load its code. This lists what code the runs contain (read "
                                    "without running it), asks, and signs them with your key.")
    tr.add_argument("store_dir", nargs="?", metavar="STORE", help="store directory (default: --store)")
    tr.add_argument("--run", metavar="N", help="only this run (default: every run not trusted yet)")
    tr.add_argument("--yes", action="store_true", help="do not ask (after reading the listing)")
    common(tr)
    tr.set_defaults(fn=cmd_trust, command_parser=tr)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """SubZero's own warnings as one line in the user's terms; others as Python shows them."""
    if issubclass(category, SubZeroWarning):
        print(f"subzero: warning: {cli_terms(str(message))}", file=sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv``: its arguments; None: this process's own, which also
    means the process ends when this returns: see :func:`_not_waiting_for_threads`)."""
    parser = build_parser()
    saved, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        code = _dispatch(parser, argv)
        sys.stdout.flush()      # here, not at exit, so that a closed pipe is caught below
    except BrokenPipeError:
        code = _closed_pipe()
    finally:
        warnings.showwarning = saved
    if argv is None:
        _not_waiting_for_threads(code)
    return code


def _not_waiting_for_threads(code: int) -> None:
    """Python waits at exit for every thread not marked daemon, so a thread that a
    workflow module or an operator started and never ended would keep the command
    alive forever.  A watcher (itself a daemon thread) gives the threads still running
    when the command is done :data:`~subzero.tuning.EXIT_GRACE_S` -- thread pools of
    libraries end within it, at exit -- then names those left in one warning line and
    ends the process with the command's status."""
    left = [t for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not left:
        return

    def watch() -> None:
        time.sleep(EXIT_GRACE_S)
        still = [t for t in left if t.is_alive()]
        if not still:
            return
        try:
            sys.stdout.flush()
            print(f"subzero: warning: code run by this command left thread(s) running: "
                  f"{', '.join(repr(t.name) for t in still)}; exiting without waiting for them",
                  file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
        os._exit(code)
    threading.Thread(target=watch, name="subzero-exit", daemon=True).start()


#: exit status on a closed output pipe (`subzero trace ... | head`): what a process
#: killed by SIGPIPE reports, as coreutils and git do
EXIT_PIPE = 128 + 13


def _closed_pipe() -> int:
    """The reader of our output went away: stop quietly.  Stdout is pointed at
    /dev/null so that Python's final flush does not complain again."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):   # not a real file (tests capture it)
        pass
    return EXIT_PIPE


#: options whose value may begin with a minus sign (a negative coordinate or angle):
#: argparse reads ``--cells -1,5`` as two options, so such a value is joined to its
#: option first (``--cells=-1,5``), and the cell parser says what is wrong with it
SIGNED_VALUES = ("--cells", "--sky")
_SIGNED = re.compile(r"^-\.?\d")


def join_signed(argv: list[str]) -> list[str]:
    """``argv`` with ``--cells -1,5`` written ``--cells=-1,5`` (see SIGNED_VALUES)."""
    out: list[str] = []
    k = 0
    while k < len(argv):
        if argv[k] == "--":
            return out + argv[k:]
        if argv[k] in SIGNED_VALUES and k + 1 < len(argv) and _SIGNED.match(argv[k + 1]):
            out.append(f"{argv[k]}={argv[k + 1]}")
            k += 2
        else:
            out.append(argv[k])
            k += 1
    return out


def _traceback(a) -> None:
    """With --debug, the traceback first; the one line and the exit status stay what
    they are without it (a script's ``$?`` does not change with --debug)."""
    if getattr(a, "debug", False):
        import traceback
        traceback.print_exc()


def _dispatch(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    a, extra = parser.parse_known_args(join_signed(list(sys.argv[1:] if argv is None else argv)))
    if extra:   # argparse would blame the top-level parser: show the sub-command's usage
        (getattr(a, "command_parser", None) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(a, "fn", None):
        parser.print_help()
        return EXIT_USER
    if argv is None:         # this process is the command's own: its steps cost alike
        from .heap import steady
        steady()
    try:
        return a.fn(a)
    except SubZeroError as e:
        _traceback(a)
        print(f"subzero: error: {cli_terms(str(e))}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("subzero: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _traceback(a)
        return _closed_pipe()
    except sqlite3.DatabaseError as e:   # the store's catalog (the catalog names most itself)
        _traceback(a)
        print(f"subzero: error: the catalog of store {a.store} failed: {e}", file=sys.stderr)
        return EXIT_USER
    except OSError as e:   # the environment, not a bug: name the file and what the OS said
        _traceback(a)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            print(f"subzero: error: the disk is full: {e.filename or a.store} cannot be written "
                  f"({e.strerror}); free some space there, or use a store on another disk",
                  file=sys.stderr)
            return EXIT_USER
        what = e.strerror or type(e).__name__
        where = f": {e.filename}" if e.filename else f" ({e})" if str(e) else ""
        print(f"subzero: error: {what}{where} (rerun with --debug for a traceback)",
              file=sys.stderr)
        return EXIT_USER
    except Exception as e:  # an internal bug, not a user mistake: still one line
        _traceback(a)
        print(f"subzero: internal error: {type(e).__name__}: {e} (rerun with --debug for a "
              f"traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
