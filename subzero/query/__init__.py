"""Lineage queries: the executor that traces cells step by step, what a step means
over pairs (``relation``), re-execution, and query workloads."""
