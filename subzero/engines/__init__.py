"""Engines run a workflow's operators and hand arrays, lineage and statistics to storage.

``base`` declares what an engine is (:class:`~subzero.engines.base.Engine`);
``local`` (in-process) and ``spark`` (Spark jobs over tiles) implement it;
``driver`` is the one loop over operators they share (statistics, lineage under
the disk budget, timing, progress); ``transaction`` is a run's begin / commit /
fail in the store; ``instances`` runs one workflow instance per manifest row as
Spark tasks, each through the same loop and transaction; ``progress`` tells the
user how far a run is."""
