"""Counting and printing outcomes: per kind of target, per kind of damage, failures first."""

from __future__ import annotations

from collections import Counter, defaultdict

from faultlib.cases import CaseResult

OUTCOMES = ("exact", "clear error", "internal error", "wrong", "data lost", "crash", "hang")
FAILURES = ("wrong", "data lost", "crash", "hang", "internal error")
#: the columns of a count table: "exact, warned" counts the exact answers that came
#: with a warning (damage detected and answered another way)
COLUMNS = ("cases", "exact", "exact, warned", "clear error", "internal error", "wrong",
           "data lost", "crash", "hang")


def counts_by_kind(results: list[CaseResult]) -> dict[str, dict[str, int]]:
    """{target kind: {column: n, ...}, ..., "total": {...}} (see COLUMNS)."""
    per: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        for key in (r.case.target.kind, "total"):
            per[key]["cases"] += 1
            per[key][r.outcome] += 1
            per[key]["exact, warned"] += r.outcome == "exact" and bool(r.warnings)
    order = sorted(k for k in per if k != "total") + (["total"] if per else [])
    return {k: {"cases": per[k]["cases"], **{o: per[k][o] for o in COLUMNS[1:]}} for k in order}


def counts_table(counts: dict[str, dict[str, int]]) -> str:
    lines = [f"{'target kind':<20}" + "".join(f"{c:>15}" for c in COLUMNS)]
    for kind, row in counts.items():
        lines.append(f"{kind:<20}" + "".join(f"{row[c]:>15}" for c in COLUMNS))
    return "\n".join(lines)


def failure_table(results: list[CaseResult]) -> str:
    """Failures per (target kind, damage kind), with how many cases each cell had."""
    cases: Counter = Counter()
    bad: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in results:
        key = (r.case.target.kind, r.case.damage.kind)
        cases[key] += 1
        if r.failed:
            bad[key][r.outcome] += 1
    if not bad:
        return "no failures"
    lines = [f"{'target kind':<20} {'damage':<18} {'cases':>6}  failures"]
    for key in sorted(bad):
        what = ", ".join(f"{n} {o}" for o, n in sorted(bad[key].items()))
        lines.append(f"{key[0]:<20} {key[1]:<18} {cases[key]:>6}  {what}")
    return "\n".join(lines)


def first_failures(results: list[CaseResult], per: int = 3) -> dict[str, list[CaseResult]]:
    """The first ``per`` failing cases of each failing outcome (they reproduce from
    their seed and case number)."""
    out: dict[str, list[CaseResult]] = {}
    for o in FAILURES:
        hits = [r for r in results if r.outcome == o][:per]
        if hits:
            out[o] = hits
    return out


def failure_report(results: list[CaseResult], per: int = 3) -> str:
    lines = [failure_table(results)]
    for o, rs in first_failures(results, per).items():
        lines.append(f"first {o} cases:")
        lines += [f"  {r.describe()}" for r in rs]
    return "\n".join(lines)


def as_json(r: CaseResult) -> dict:
    c = r.case
    return {"seed": c.seed, "case": c.number, "fixture": c.fixture, "kind": c.target.kind,
            "target": c.target.describe(), "damage": c.damage.describe(), "outcome": r.outcome,
            "query": r.query, "detail": r.detail, "log": r.log[-500:]}
