"""Making an array a run did not keep again (see :mod:`subzero.runs.keep`): its
operator run whole on its inputs, as the operator read them.  Plain code over a
workflow and a reader of the run's arrays, so the same runs in the driver, in a
re-run of the run, and on a Spark executor re-running it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from subzero.capture.runner import run_operator
from subzero.model.workflow import Workflow


def remaker(wf: Workflow, read_value: Callable[[str], Any]) -> Callable[[str], np.ndarray]:
    """A function giving the values of array ``name`` of a run of ``wf`` made again:
    its operator on its inputs, each read by ``read_value`` (the run's array store,
    which makes an input it did not keep either again, in turn, and checks what this
    returns against the checksums it recorded)."""
    def remake(name: str) -> np.ndarray:
        from subzero.errors import StoreError
        from subzero.storage.arrays import as_dataarray
        step = wf.steps.get(name)
        if step is None:
            raise StoreError(f"array {name!r} was not kept, and no operator of workflow "
                             f"{wf.name!r} makes it")
        out = run_operator(name, step.operator, [read_value(i) for i in step.inputs], (),
                           capture=False)[0]
        return np.asarray(as_dataarray(out, name).values)
    return remake
