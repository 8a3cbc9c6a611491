"""The data model: workflows of operators, lineage modes, storage strategies, cells.

Everything else builds on these; they depend on nothing but numpy and ``subzero.errors``.
"""
