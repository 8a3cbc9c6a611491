"""Engines run a workflow's operators and hand arrays, lineage and statistics to storage.

``base`` declares what an engine is (:class:`~subzero.engines.base.Engine`) and the
abilities it may declare; ``local`` (in-process) and ``spark`` (a package: Spark
jobs over tiles) implement it; ``choice`` resolves engine names, for the API and
the CLI alike; ``driver`` is the one loop over operators they share (jobs side by
side where the engine allows, statistics, lineage under the disk budget
(``lineage``), timing, progress); ``progress`` tells the user how far a run is;
``stats`` is what a run reports.  Starting, committing and resuming runs is
:mod:`subzero.runs`."""
