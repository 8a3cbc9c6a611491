"""Engines run a workflow's operators and hand arrays, lineage and statistics to storage:
in-process (``local``), on Spark (``spark``), and one run per instance (``instances``)."""
