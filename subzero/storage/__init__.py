"""What a run leaves on disk: arrays (Zarr), lineage (LMDB + R-trees, its codec and
encodings), the catalog (SQLite), input loaders and the disk budget.  The on-disk
formats carry versions: lineage metadata in ``metadata.py``, catalog migrations in
``schema.py``."""
