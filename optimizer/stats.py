"""Statistics the cost model works from, gathered from the catalog.

* the workflow's latest **profile** (a profiling run, see ``profile.py``):
  per operator its runtime with and without each lineage mode, pairs and
  cells per side (fan-in, fan-out), payload sizes, and for every candidate
  strategy its predicted bytes, write time and stored sizes;
* earlier **runs** of the same workflow and parameters: bytes and write time
  of every strategy actually stored replace the predictions;
* the **trace log** (per query step: method, cells in and out, seconds) is
  read by the cost model to correct its per-operator constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from subzero.errors import OptimizerError
from subzero.model.operator import lineage_reproducible, reruns
from subzero.model.operator import rerun_mode as capture_mode
from subzero.model.strategy import Strategy, parse_one
from subzero.tuning import BASE_RUNTIME_RUNS


@dataclass
class StrategyInfo:
    """What storing one strategy of one operator costs, and what it holds."""

    bytes: float
    write_s: float
    spaces: dict                 # key side -> sizes (engine.space_stats)
    measured: bool = False       # from a real run (else predicted by the profile)
    sample_frac: float = 1.0     # share of the pairs the profile encoded (1 = all, exact)
    #: the profile's timed reads of its own sample (``sampleread.time_reads``), or None
    sample: dict | None = None
    #: the profile wrote a sample and left it unread (``sampleread.Unread``): its decode
    #: rate is not known until the sample is read, or the workflow profiled again
    unread: bool = False


@dataclass
class OpInfo:
    name: str
    inputs: list[str]
    in_shapes: list[tuple[int, ...]]
    out_shape: tuple[int, ...]
    in_bytes: int
    run_s: float                          # without lineage work
    supports: frozenset[str]
    has_mapping: bool
    all_to_all: list[bool]
    map_p_batched: bool
    map_p_vectorized: bool
    deterministic: bool                   # re-execution may recompute its lineage
    reexec_mode: str | None
    modes: dict[str, dict] = field(default_factory=dict)      # mode -> run_s, gen_s, pairs, cells
    strategies: dict[str, StrategyInfo] = field(default_factory=dict)
    profiled: bool = True
    #: re-runs per black-box step: 2 unless its lineage is declared deterministic
    reruns: int = 1
    #: bytes of its output array in memory (uncompressed)
    out_bytes: int = 0
    #: bytes a run frees by not keeping its output array (its compressed chunks; 0:
    #: not measured)
    drop_saves: int = 0
    #: the stored strategies the operator declares as its defaults (what a run stores
    #: without a plan; empty in a profile made before profiles named them)
    defaults: tuple[str, ...] = ()

    @property
    def has_map(self) -> bool:
        """Mapping functions are this operator's lineage (Map mode, nothing stored)."""
        return "map" in self.supports and self.has_mapping

    def candidates(self) -> list[Strategy]:
        return [parse_one(s) for s in self.strategies]

    def fan(self, mode: str) -> tuple[float, float]:
        """(input cells, output cells) per pair of a lineage mode: fan-in and fan-out."""
        m = self.modes.get(mode)
        if not m or not m["pairs"]:
            return 0.0, 0.0
        return sum(m.get("in_cells", [])) / m["pairs"], m["out_cells"] / m["pairs"]


@dataclass
class WorkflowStats:
    workflow: str
    params: dict
    base_s: float                         # the workflow's runtime without lineage
    ops: dict[str, OpInfo]
    profile_run: int | None = None

    def op(self, name: str) -> OpInfo:
        try:
            return self.ops[name]
        except KeyError as err:
            raise OptimizerError(f"no statistics for operator {name!r} of workflow "
                                 f"{self.workflow!r}") from err


def _op_info(name: str, inputs: list[str], rec: dict) -> OpInfo:
    return OpInfo(
        name=name, inputs=inputs, in_shapes=[tuple(s) for s in rec["in_shapes"]],
        out_shape=tuple(rec["out_shape"]), in_bytes=int(rec["in_bytes"]), run_s=float(rec["run_s"]),
        supports=frozenset(rec["supports"]), has_mapping=bool(rec["has_mapping"]),
        all_to_all=list(rec["all_to_all"]), map_p_batched=bool(rec["map_p_batched"]),
        map_p_vectorized=bool(rec.get("map_p_vectorized", False)),
        deterministic=bool(rec["deterministic"]), reexec_mode=rec.get("reexec_mode"),
        modes=dict(rec.get("modes", {})), profiled=bool(rec.get("profiled", True)),
        reruns=int(rec.get("reruns", 1)), out_bytes=int(rec.get("out_bytes", 0)),
        drop_saves=int(rec.get("drop_saves", 0)),
        defaults=tuple(str(d) for d in rec.get("defaults", ()) if isinstance(d, str)),
        strategies={s: StrategyInfo(float(v["bytes"]), float(v["write_s"]), v["spaces"],
                                    sample_frac=float(v.get("sample_frac", 1.0)),
                                    sample=v.get("sample"), unread=v.get("unread") is True)
                    for s, v in rec.get("strategies", {}).items()})


_NUMBER = (int, float)
#: what every operator's record of a profile holds, and of what type (``_op_info``
#: reads them, the cost model prices from them)
_OP_FIELDS = {"in_shapes": list, "out_shape": list, "in_bytes": _NUMBER, "run_s": _NUMBER,
              "supports": list, "has_mapping": bool, "all_to_all": list, "map_p_batched": bool,
              "deterministic": bool, "modes": dict, "strategies": dict}
_MODE_FIELDS = {"run_s": _NUMBER, "gen_s": _NUMBER, "pairs": _NUMBER, "out_cells": _NUMBER,
                "cells": _NUMBER}
#: ... and what a record may leave out (the cost model does without it), but not hold
#: as something else
_MODE_OPTIONAL = {"in_cells": list, "expanded": list, "payloads": _NUMBER}
_STRATEGY_FIELDS = {"bytes": _NUMBER, "write_s": _NUMBER, "spaces": dict}
_READ_FIELDS = {"backward": bool, "cells_in": _NUMBER, "cells_out": _NUMBER, "blocks": _NUMBER,
                "runs": _NUMBER, "seconds": _NUMBER}


def _fields_wrong(rec, fields: dict, optional: dict | None = None) -> str | None:
    """What is wrong with one record of the profile, or None."""
    if not isinstance(rec, dict):
        return "is not a record"
    for name, kind in {**fields, **(optional or {})}.items():
        if name not in rec:
            if name in fields:
                return f"has no {name!r}"
            continue
        if not isinstance(rec[name], kind) or (kind is _NUMBER and isinstance(rec[name], bool)):
            return f"has a {name!r} of the wrong type"
    return None


def _profile_wrong(profile: dict) -> str | None:
    """Where a profile read back from the catalog is not what a profiling run writes:
    the cost model would otherwise fail on it deep inside a query, as an internal
    error, or price from it."""
    ops = profile.get("ops")
    if not isinstance(ops, dict) or not isinstance(profile.get("base_s"), _NUMBER):
        return "it has no operators or no base runtime"
    for name, rec in ops.items():
        if (why := _fields_wrong(rec, _OP_FIELDS)) is not None:
            return f"operator {name!r} {why}"
        for mode, m in rec["modes"].items():
            if (why := _fields_wrong(m, _MODE_FIELDS, _MODE_OPTIONAL)) is not None:
                return f"operator {name!r}, {mode} lineage, {why}"
        for s, v in rec["strategies"].items():
            if (why := _fields_wrong(v, _STRATEGY_FIELDS)) is not None:
                return f"operator {name!r}, strategy {s}, {why}"
            smp = v.get("sample")
            if smp is None:
                continue
            if not isinstance(smp, dict) or not isinstance(smp.get("reads"), list) \
                    or not isinstance(smp.get("spaces"), dict):
                return f"operator {name!r}, strategy {s}: its sample is not a record of timed reads"
            for k, read in enumerate(smp["reads"]):
                if (why := _fields_wrong(read, _READ_FIELDS)) is not None:
                    return f"operator {name!r}, strategy {s}: timed read {k + 1} of its sample {why}"
    return None


def from_profile(store, profile: dict, workflow: str, params: dict,
                 only_run: int | None = None) -> WorkflowStats:
    """The profile's statistics, with the sizes every run of the workflow and parameters
    measured (``only_run``: that run's alone; the others' stay predictions).  A profile
    that is not what a profiling run writes (the catalog damaged or edited) is refused
    with what is wrong in it."""
    if (why := _profile_wrong(profile)) is not None:
        raise OptimizerError(
            f"the optimizer's profile of workflow {workflow!r} (profiling run "
            f"{profile.get('run_id')}) in the store's catalog is damaged: {why}; profile it again "
            f"(`subzero optimize WORKFLOW --reprofile`), or trace with --no-planner")
    run_ops = {o["name"]: o for o in store.catalog.ops(profile["run_id"])}
    ops = {n: _op_info(n, run_ops[n]["inputs"] if n in run_ops else [], rec)
           for n, rec in profile["ops"].items()}
    base = base_runtime(store, workflow, params, float(profile["base_s"]))
    stats = WorkflowStats(workflow, params, base, ops, profile["run_id"])
    _apply_measured(store, stats, only_run=only_run)
    return stats


def median(xs) -> float:
    """The median of a few numbers: ``np.median`` imports numpy.ma (17 ms of a budget run)
    and ``statistics`` fractions and decimal (3 ms of every planned trace's start)."""
    s = sorted(float(x) for x in xs)
    n = len(s)
    if n == 0:
        raise ValueError("the median of no numbers")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def base_runtime(store, workflow: str, params: dict, profiled: float,
                 recent: int = BASE_RUNTIME_RUNS) -> float:
    """The workflow's runtime without lineage: the median over its recent runs (each
    run's wall time minus its lineage work) and the profiling run's measurement.  One
    measurement of a sub-second workflow is noise; the runs log holds many."""
    xs = [profiled]
    rows = [r for r in store.catalog.runs() if r.status == "complete" and r.workflow == workflow
            and r.params == params and r.ended]
    for r in rows[-recent:]:
        ops = store.catalog.ops(r.id)
        xs.append(r.ended - r.started - sum(o["lineage_s"] + o["lwrite_s"] for o in ops))
    return median(xs)


def collect(store, workflow: str, params: dict) -> WorkflowStats | None:
    """Statistics of ``workflow`` with ``params``, or None when it was never profiled."""
    prof = store.catalog.latest_profile(workflow, params)
    return None if prof is None else from_profile(store, prof, workflow, params)


def _apply_measured(store, stats: WorkflowStats, only_run: int | None = None) -> None:
    """Bytes and write time of strategies stored by real runs replace the predictions
    (the newest run wins; ``only_run`` restricts to one run)."""
    for row in store.catalog.runs():
        if row.status != "complete" or row.workflow != stats.workflow:
            continue
        if only_run is not None and row.id != only_run:
            continue
        if only_run is None and row.params != stats.params:
            continue
        spaces = store.catalog.strategy_spaces(row.id)
        for st in store.catalog.strategy_stats(row.id):
            op = stats.ops.get(st["op"])
            sp = spaces.get((st["op"], st["strategy"]))
            if op is None or sp is None:
                continue
            old = op.strategies.get(st["strategy"])
            # the profile's timed reads of its sample stay, with the share of the pairs
            # they were made on: they are the operator's decode rate, whatever run stored it
            op.strategies[st["strategy"]] = StrategyInfo(
                float(st["bytes"]), float(st["write_s"]), sp, measured=True,
                sample_frac=old.sample_frac if old else 1.0, sample=old.sample if old else None,
                unread=old.unread if old else False)


def for_run(store, run) -> WorkflowStats | None:
    """Statistics for planning the queries of one run: its own stored strategies
    (exact sizes), plus the profile of its workflow and parameters for re-execution
    costs; without a profile, the run's own operator times stand in."""
    prof = store.catalog.latest_profile(run.row.workflow, run.row.params)
    if prof is not None:
        # this run's lineage, not other runs': measured over the profile's predictions
        # only where this run stored it (dropping what other runs measured dropped the
        # profile's own samples with it, and their decode rates: issue 33)
        return from_profile(store, prof, run.row.workflow, run.row.params, only_run=run.id)
    spaces = store.catalog.strategy_spaces(run.id)
    shapes = run.shapes()
    arrays = store.catalog.arrays(run.id)
    try:
        wf = run.workflow
    except Exception:
        return None
    ops = {}
    for o in run.ops():
        op = wf.steps[o["name"]].operator
        mode = capture_mode(op)
        info = OpInfo(
            name=o["name"], inputs=o["inputs"], in_shapes=[tuple(shapes[a]) for a in o["inputs"]],
            out_shape=tuple(o["shape"]),
            in_bytes=int(sum(arrays[a]["nbytes"] for a in o["inputs"])),
            run_s=max(o["run_s"] - o["lwrite_s"], 0.0),
            supports=frozenset(m.value for m in op.supported_modes()), has_mapping=op.has_mapping(),
            all_to_all=[bool(op.is_all_to_all(i)) for i in range(len(o["inputs"]))],
            map_p_batched=bool(op.map_p_batched), map_p_vectorized=False,
            deterministic=lineage_reproducible(op), reexec_mode=mode.value if mode else None,
            profiled=False, reruns=reruns(op))
        if mode is not None:   # re-running costs at least the operator's own run
            info.modes[mode.value] = {"run_s": o["run_s"], "gen_s": o["lwrite_s"],
                                      "pairs": o["pairs"], "cells": 2 * o["pairs"]}
        ops[o["name"]] = info
    stats = WorkflowStats(run.row.workflow, run.row.params, 0.0, ops, None)
    for st in store.catalog.strategy_stats(run.id):
        sp = spaces.get((st["op"], st["strategy"]))
        if sp is not None and st["op"] in ops:
            ops[st["op"]].strategies[st["strategy"]] = StrategyInfo(
                float(st["bytes"]), float(st["write_s"]), sp, measured=True)
    return stats


def required(stats: WorkflowStats | None, what: str) -> WorkflowStats:
    """``stats``, or a clear error where they must exist (a run that was just profiled)."""
    if stats is None:
        raise OptimizerError(f"no statistics for {what}: profile it again (`reprofile=True`)")
    return stats
