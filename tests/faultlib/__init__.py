"""Fault injection for SubZero stores (issue 11: "never silently wrong").

Small real runs are built once (:mod:`.fixtures`), each case copies one of them,
damages one file or one stored LMDB value (:mod:`.damage`) or moves a piece --
from another run or store, a link or FIFO in its place, a catalog edit
(:mod:`.moves`) -- traces every query of the run in a forked child
(:mod:`.forking`, :mod:`.cases`) and classifies the outcome against the answer
computed on the undamaged store:

* ``exact``          the correct cells and values (warnings allowed)
* ``clear error``    a one-line :class:`subzero.SubZeroError`
* ``internal error`` any other exception (a failure)
* ``wrong``          a normal return with other cells or values (the worst failure)
* ``data lost``      (moves) ``clean`` or ``fsck`` removed or quarantined a run folder
                     or a file of one, or left a run out of the catalog
* ``crash``          the child was killed by a signal
* ``hang``           the child ran past its timeout

Shared by ``tests/test_faults.py`` (a few hundred cases) and
``benchmarks/faults.py`` (the long campaign, which puts ``tests/`` on ``sys.path``).
"""

from faultlib.cases import Case, CaseResult, make_case, make_cases, run_cases, run_one
from faultlib.cli import CliResult, run_cli_cases
from faultlib.fixtures import Fixture, Query, build_fixtures, scratch_dir
from faultlib.report import FAILURES, OUTCOMES, counts_by_kind, failure_table, first_failures

__all__ = ["FAILURES", "OUTCOMES", "Case", "CaseResult", "CliResult", "Fixture", "Query",
           "build_fixtures", "counts_by_kind", "failure_table", "first_failures", "make_case",
           "make_cases", "run_cases", "run_cli_cases", "run_one", "scratch_dir"]
