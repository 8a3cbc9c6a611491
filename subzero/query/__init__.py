"""Lineage queries.

``executor``  traces cells through a run, step by step (run-lifetime state only)
``graph``     the run's DAG as plain data: reachability, walks, path checks
``methods``   a step's methods as values (Stored, Mapping, Reexec), the simple rule
``planner``   the query-time planner protocol (StepInfo in, StepStat back)
``steps``     one method run for one step
``sources``   the pair-source protocol: stored, in-memory, under a deadline
``relation``  what a step means over pairs (full, payload, composite)
``reexec``    black-box re-execution collecting only the query's pairs
``trace``     TraceOptions and TraceResult
``mask``      the result as a labelled boolean mask (TraceResult.to_xarray)
``workload``  query workloads as data
"""
