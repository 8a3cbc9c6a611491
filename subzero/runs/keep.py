r"""Which arrays a run keeps: its ``--keep`` policy and ``--pin``\ s.

A run's intermediate arrays are most of what it keeps on disk (lineage is a small
part), and most of them are never read again: a trace whose steps answer from
stored lineage or mapping functions reads no array, only the values it prints
(of the arrays it starts and ends at).  So an intermediate array need not be
kept when its values can be made again, exactly: its operator run again on its
inputs (kept, or made again in turn), checked chunk by chunk against the SHA-256
of its values recorded as it was dropped (:meth:`~subzero.storage.arrays.ArrayStore.drop`).

The policies:

* ``all``: every array is kept (what SubZero did before ``--keep``);
* ``outputs``: the workflow's inputs and outputs (arrays no operator reads) are
  kept, intermediates are not;
* ``auto`` (the default): as ``outputs``, and also every array a trace reads:
  the inputs of an operator whose traces re-execute it (it stores no lineage and
  has no mapping functions), and an array that would take more than
  :data:`~subzero.tuning.KEEP_RECOMPUTE_S` to make again (its operator's run time,
  with that of the arrays it would have to make again first).

Always kept, whatever the policy: pinned arrays, and the output of an operator
that is not deterministic or whose statistic the engine merged over tiles (no
re-run could prove itself on them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from subzero.engines.stats import OpStats
from subzero.errors import UsageError
from subzero.model.modes import Mode
from subzero.model.strategy import Strategy
from subzero.model.workflow import Workflow
from subzero.tuning import DEFAULT_KEEP, KEEP_POLICIES, KEEP_RECOMPUTE_S

#: the policies
POLICIES = KEEP_POLICIES
__all__ = ["DEFAULT_KEEP", "POLICIES", "check_policy", "not_kept", "reexecuted"]


def check_policy(keep: str, pins: Iterable[str], wf: Workflow | None = None) -> None:
    """A policy that is one of :data:`POLICIES`, and pins that name arrays of ``wf``
    (one line naming the mistake)."""
    if keep not in POLICIES:
        raise UsageError(f"`keep` must be one of {', '.join(POLICIES)}, not {keep!r}")
    if wf is not None:
        for p in pins:
            if p not in wf.steps and p not in wf.inputs:
                raise UsageError(f"`pins` names no array of workflow {wf.name!r}: {p!r}; its "
                                 f"arrays are: {', '.join(wf.arrays())}")


def reexecuted(strategies: Sequence[Strategy]) -> bool:
    """Whether a trace through an operator with these strategies re-executes it (no
    stored lineage, no mapping functions): it then reads its inputs."""
    return not any(s.stored or s.mode is Mode.MAP for s in strategies)


def not_kept(wf: Workflow, strategies: Mapping[str, Sequence[Strategy]], stats: Iterable[OpStats],
             keep: str, pins: Iterable[str] = ()) -> list[str]:
    """The arrays a run drops under policy ``keep``, in the workflow's order."""
    if keep == "all":
        return []
    pinned = set(pins)
    by_op = {o.name: o for o in stats}
    must: set[str] = set(pinned)
    for name, step in wf.steps.items():
        op = step.operator
        o = by_op.get(name)
        if not op.deterministic or (o is not None and (o.statistic or o.rounds)) or o is None:
            must.add(name)
        if not wf.consumers(name):
            must.add(name)                               # a workflow output
        if keep == "auto" and reexecuted(strategies.get(name, ())):
            must.update(step.inputs)
    out: list[str] = []
    cost: dict[str, float] = {}
    for name in wf.order():
        if name in must:
            continue
        step = wf.steps[name]
        # seconds to make it again: its own run, and that of inputs made again first
        c = by_op[name].run_s + sum(cost.get(i, 0.0) for i in step.inputs)
        if keep == "auto" and c > KEEP_RECOMPUTE_S:
            continue
        cost[name] = c
        out.append(name)
    return out
