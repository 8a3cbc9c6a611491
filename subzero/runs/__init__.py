"""Runs, from start to commit: how a workflow and its inputs become a complete run
in the store.

``options`` is how a run runs, as one value (:class:`RunOptions`); ``launch``
binds a workflow's inputs and strategies, picks the engine and drives the run
inside a ``transaction`` (begin, commit, fail), keeping a ``journal`` so a run
whose driver is lost can be resumed; ``many`` runs one instance per manifest
row on Spark; ``clean`` removes what abandoned runs left.  The engines
(:mod:`subzero.engines`) run the operators; this package decides what they run
and records it.
"""
