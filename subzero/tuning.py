"""SubZero's tuning constants, in one place.

These trade speed against memory or disk and change no answer: a trace gives
the same cells whatever they are.  Values that a store's format depends on
(record block size, legacy key-block size) are not here; they live with the
format in ``subzero.storage.encodings``.  Each was measured on the paper's
workloads (see benchmarks/RESULTS.md) before it was set.
"""

from __future__ import annotations

# -- capture and storage ------------------------------------------------------------
#: Key-index block size (2**KEY_BITS cells) for new writes.  Small blocks keep a
#: point lookup cheap: a query decodes whole blocks, and a cell of a high fan-in pair
#: carries many pair ids.  Each space records the size it was written with.
KEY_BITS = 10
#: Covered output cells of composite lineage, per stored chunk.
COVERED_CHUNK = 1 << 20
#: LMDB map size of a writer (virtual: the file grows as needed).
LMDB_MAP_SIZE = 1 << 40
#: Zarr chunk (and Spark tile) size per axis.
DEFAULT_TILE = 512
#: A stencil's Spark task covers enough Zarr tiles per axis (up to 4) that its core is
#: at least this many times its halo: a 40-cell halo on 512-cell tiles would read 34%
#: more than the core, on 1024-cell task tiles 16%.
HALO_TILE_RATIO = 16
#: Tiles per axis of the blocks a whole-array statistic's partials run over on Spark:
#: a partial is a small summary whatever its block's size, so bigger blocks mean fewer
#: tasks and less halo to read (at 16 Mpix, 64 tasks a round took 5 s).
STAT_BLOCK_TILES = 4
#: Output cells per batch when a built-in operator emits Full pairs (bounds memory).
EMIT_BATCH_CELLS = 1 << 21

# -- engines -------------------------------------------------------------------------------
#: How often a Spark run's progress bar asks Spark's status tracker for tiles done (s).
PROGRESS_POLL_S = 0.25
#: Cells of a run's largest input from which `subzero run` without --engine uses Spark
#: (local mode) rather than the in-process engine.  Measured on 2 cores
#: (benchmarks/spark_megapixels.py, the astronomy workflow, RESULTS.md): Spark `local[*]`
#: / in-process run time 2.16x at 1 Mpix, 1.78x at 4, 1.35x at 16, 1.21x at 64, plus
#: 6-7 s of start-up -- Spark does not pay in time on two cores; it pays in memory: the
#: in-process run needed 875 MB at 16 Mpix and 2.4 GB at 64, Spark's driver 191-197 MB
#: at every size.  Set where one process would need gigabytes; on more cores choose
#: Spark with --engine spark or --master.
SPARK_PAYS_CELLS = 64_000_000
#: cells per axis of the corner a fused Spark stage runs on in the driver to learn its
#: operators' output dtypes before the tasks write (halos are added to it)
PROBE_CELLS = 64
#: Spark JVM logs kept in the log folder (older ones, of ended processes, are removed).
KEEP_JVM_LOGS = 5
#: How long a spark:// master may take to accept a connection and answer the probe (s):
#: a real master answers in well under a second; anything else fails this fast.
MASTER_PROBE_S = 5.0

# -- queries ----------------------------------------------------------------------------
#: Query cells per lookup once a matched lookup stops growing its chunks.
LOOKUP_CHUNK = 1 << 16
#: First chunk of a matched lookup: a step whose target fills from its first few
#: cells (high fan-out) stops early.
FIRST_CHUNK = 8
#: A set between steps (subzero.model.cellset) is a bitmap of its array only once it
#: holds at least 1/DENSE_SET_RATIO of the array's cells; below, its sorted cell ids.
#: 16: a bitmap then costs at most 2 bytes per cell held (ids cost 8).
DENSE_SET_RATIO = 16
#: Pairs read per piece when a step scans every stored pair (a step against the
#: direction lineage is indexed in): the scan's memory follows the piece.
SCAN_PAIRS = 1 << 18
#: Pairs per records() call, and query cells per lookup() call, of a stored read that
#: runs against the planner's deadline (it checks the clock between calls).
TIMED_RECORD_PAIRS = 4096
TIMED_QUERY_CELLS = 1024

# -- query-time planner (subzero.optimizer.planner) --------------------------------------
#: Never give up on stored lineage sooner than this (seconds).
MIN_BUDGET_S = 0.002
#: A stored read whose pessimistic price is at most this share of the predicted
#: re-execution is abandoned once it overruns that price (a query then costs at most
#: about 1 + SAFE_SHARE times black-box); a read not that clearly faster is committed to.
SAFE_SHARE = 0.2
#: Learned corrections of predicted step costs are clipped to this range.
CORRECTION_RANGE = (0.25, 8.0)
#: The calibration's error model buckets steps by size (cells in or out) at these edges.
ERROR_BUCKETS = (64, 4096, 65536)
#: Beyond the largest calibrated step, a prediction's error factors widen by this much
#: per decade of size (an assumption the optimizer benchmark's scale sweep measures).
EXTRAPOLATION_GROWTH = 0.5
#: Error factor assumed for a calibration without an error model.
DEFAULT_MARGIN = 2.0

# -- profiling runs (subzero.optimizer.profile) -------------------------------------------
#: Pairs encoded per candidate strategy at most (then extrapolated).
SAMPLE_PAIRS = 32 * 1024
#: A sample smaller than this (bytes) is grown before extrapolating.
SMALL_SAMPLE_BYTES = 64 * 4096
#: Operators faster than this (seconds) are timed best-of-3.
FAST_OP_S = 0.05

#: a running run's driver touches its heartbeat file this often (seconds) ...
HEARTBEAT_S = 5.0
#: ... and a run whose heartbeat is older than this, seen from another host, was
#: lost (its driver died or its host went away): `subzero runs` shows it
#: interrupted, and `subzero run --resume` may take it over.  Twelve missed beats:
#: a driver busy in native code or a slow shared file system is not taken for dead.
HEARTBEAT_STALE_S = 60.0

#: Spark jobs of independent branches (the two exposures' operators) a run submits at
#: once, each from a driver thread: a job that cannot fill the cluster (a statistic's
#: few blocks, a reduction's tree, a job's last tasks) leaves cores to the other
SPARK_CONCURRENT_JOBS = 4
