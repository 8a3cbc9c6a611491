"""Lineage capture while an operator runs: the ``ctx`` operators write to, the
in-memory pair buffer, and the tile geometry that turns tile-local cells global."""
