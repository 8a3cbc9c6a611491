"""SubZero's tuning constants, in one place.

These trade speed against memory, disk or accuracy and change no answer: a trace
gives the same cells whatever they are (the optimizer's constants choose another
plan, the explorer's and the export's draw or list less of an answer).  Values that a
store's format depends on (record block size, legacy key-block size) are not here;
they live with the format in ``subzero.storage.encodings``; nor is the calibration
benchmark's own workload (its query sizes and tiers, ``subzero.optimizer.calibration``),
which defines what the calibration measures.  Most were measured on the paper's
workloads (benchmarks/RESULTS.md) before they were set; a comment says what was
measured and how, or plainly "chosen, not measured" and why that order of magnitude.
This module is imported by everything (the CLI must start fast): it imports nothing.
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
#: Named sub-databases an LMDB environment may hold: one per (operator, strategy) of a
#: run, so this caps a run at about 4096 stored strategies.  A limit, not a speed knob:
#: LMDB keeps a slot per database in every transaction, and the shipped workflows use
#: under 100 (chosen, not measured).
LMDB_MAX_DBS = 4096
#: Bytes read at a time when checksumming a file (R-tree files, shards): memory stays
#: bounded whatever the file's size.  CRC-32 over a 200 MB file on this machine ran at
#: 2.5 GB/s with 64 KiB, 1 MiB or 4 MiB reads and 2.2 GB/s with 16 MiB (best of 3,
#: zlib.crc32 over a file in the page cache): any size from 64 KiB to 4 MiB is as fast.
CHECKSUM_READ_BYTES = 1 << 22
#: Zarr chunk (and Spark tile) size per axis.
DEFAULT_TILE = 512
#: A whole array in memory is written in slabs of whole chunks of at most this many
#: bytes (``ArrayStore.fill``): one zarr call per slab, not per chunk, its extra memory
#: the slab's encoded chunks.  Chosen, not measured.
FILL_SLAB_BYTES = 64 * 2**20
#: Bytes of array regions a trace's executor keeps after reading them for re-execution:
#: in a chain of elementwise operators one region is a step's output, checked, and the
#: next step's input (a 4-column strip of a 16 Mpix image decodes 16 whole chunks).
REGION_CACHE_BYTES = 64 << 20
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

# -- bounds on what is read from a store (subzero.storage.files) -----------------------
# A store's small files are read whole, so each kind has a bound: a file over it is damage
# (a planted link to /dev/zero or a huge file), refused before it is read.  Each bound is
# far above what SubZero writes there, so it never refuses a real file; none changes an
# answer.  Sizes measured on the shipped workflows (astronomy and genomics runs, local).
#: A run's signature file: about 200 bytes (one JSON object); room for a record that grows.
SIGNATURE_BYTES = 1 << 20
#: The signing key file: 65 bytes (32 bytes in hex and a newline).
KEY_BYTES = 4096
#: A run's ``workflow.pkl``: code and small parameters (under 100 KB for the shipped
#: workflows; 12.4 MB for astronomy when its calibration frames travelled inside).  A
#: workflow built in Python keeps its operators' large arrays inside (no module to
#: rebuild them from); 1 GiB bounds what ``subzero runs`` (which checks every run's
#: signature over it) may have to read.
PICKLE_BYTES = 1 << 30
#: An array a workflow's code holds from this size on is left out of ``workflow.pkl``
#: and rebuilt from the workflow module when the pickle loads (subzero.storage.constants):
#: a 64 KB array is a 90x90 float64 table, beyond what parameters are; smaller ones
#: (kernels, coefficients) travel inside, costing less than running the module again.
PICKLE_CONSTANT_BYTES = 64 << 10
#: An array's ``zarr.json`` and ``.sums.json`` files: at most 11.9 KB (astronomy's raw
#: frames, whose FITS headers travel as attributes).
METADATA_BYTES = 16 << 20
#: An interrupted run's journal: one line of a few hundred bytes per operator (plus the
#: begin line, which holds the strategies of every operator).
JOURNAL_BYTES = 64 << 20
#: A run's record (``run.json``): the catalog's rows of one run, about 40 KB for the
#: 26-operator LSST run (chosen with a wide margin, not measured further).
RECORD_BYTES = 64 << 20

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
#: Runs an impact query answers on Spark unless told otherwise (provisional, like
#: SPARK_PAYS_CELLS): a SparkSession takes seconds to start and a run is answered in
#: tens of milliseconds in-process, so Spark pays only for a night of thousands of runs
#: or a cluster's cores (``engine='spark'`` or a master asks for it at any count).
SPARK_PAYS_RUNS = 2000

#: Re-runs on Spark (``rerun --using OLD --engine spark``) run as jobs of this many runs,
#: a task per run: the driver commits and signs each job's re-runs when it ends, so a
#: job that dies loses at most this many runs' work, while a job still has enough tasks
#: to keep a cluster's executors busy.
RERUN_BATCH = 64
#: Runs per in-process worker of an impact query: fewer runs than twice this are answered
#: in this process alone (forking a worker costs about as much as answering a few runs).
IMPACT_RUNS_PER_WORKER = 8
#: Runs per Spark task of an impact query (at least one task per core of the session)
IMPACT_RUNS_PER_TASK = 16
#: cells per axis of the corner a fused Spark stage runs on in the driver to learn its
#: operators' output dtypes before the tasks write (halos are added to it)
PROBE_CELLS = 64
#: Spark JVM logs kept in the log folder (older ones, of ended processes, are removed).
KEEP_JVM_LOGS = 5
#: How long a spark:// master may take to accept a connection and answer the probe (s):
#: a real master answers in well under a second; anything else fails this fast.
MASTER_PROBE_S = 5.0

# -- queries ----------------------------------------------------------------------------
#: Cells a ``--cells`` SPEC may name, counted box by box once repeated boxes and boxes
#: inside another are dropped.  The cells are built as an (N, ndim) int64 array (16 bytes
#: a cell in 2-D): 2**27 cells hold 2 GiB, and every shipped workflow's largest array
#: (64 Mpix, the astronomy benchmark's) is selected whole (``:,:``) well within it.
MAX_SPEC_CELLS = 1 << 27
#: Query cells per lookup once a matched lookup stops growing its chunks.
LOOKUP_CHUNK = 1 << 16
#: First chunk of a matched lookup: a step whose target fills from its first few
#: cells (high fan-out) stops early.
FIRST_CHUNK = 8
#: A set between steps (subzero.model.cellset) is a bitmap of its array only once it
#: holds at least 1/DENSE_SET_RATIO of the array's cells; below, its sorted cell ids.
#: 16: a bitmap then costs at most 2 bytes per cell held (ids cost 8).
DENSE_SET_RATIO = 16
#: A sparse set answers membership of ids (``CellSet.contains``, a scan's every cell)
#: through a bitmap of its span when that span is at most 4x the ids asked (a bitmap's
#: byte a cell against the ids' eight) or this many cells, else by binary search (a
#: few ids against a wide set: no bitmap of its span for them).
CONTAINS_BITMAP_MIN = 1 << 12
#: ... or at most this many cells a member of the set (a scan asks a piece at a time,
#: and the bitmap, made once, serves every piece; at most 8x the set's own ids)
SPAN_CELLS_PER_MEMBER = 64
#: Pairs read per piece when a step scans every stored pair (a step against the
#: direction lineage is indexed in): the scan's memory follows the piece.
SCAN_PAIRS = 1 << 18
#: A forward step over backward-keyed payload lineage with a recorded reach looks up
#: only the output cells within the reach of its cells (subzero.model.reach.grown);
#: beyond this many such cells (2**20: 8 MB of ids, a key lookup of about a
#: megapixel) the query covers a good part of the image and it scans every pair.
REACH_GROWN_CELLS = 1 << 20
#: A backward step over payload lineage whose operator's ``map_p`` is batched calls it
#: once per distinct payload; with this many distinct payloads or more, most pairs
#: with a payload of their own, an operator with a vectorized ``map_p_pairs`` is
#: called once for every pair instead (subzero.query.relation.per_payload): one box
#: payload per tile made the calibration's 624 steps call ``map_p`` 174,000 times
#: (9.7 of its 34 s under cProfile, which inflates calls; 0.97x the calibration's wall
#: time, alternated without it).  Chosen, not measured against other values.
PAYLOAD_CALLS_VECTORIZED = 16
#: Pairs per records() call, and query cells per lookup() call, of a stored read that
#: runs against the planner's deadline (it checks the clock between calls).
TIMED_RECORD_PAIRS = 4096
TIMED_QUERY_CELLS = 1024
#: ... the first of those calls; each next one twice as large, up to this many times
#: the first (``sources.growing_chunks``)
TIMED_CHUNK_GROWTH = 16
#: A trace's re-run on a box of at most this many cells (its read region: at most one
#: default tile, 512x512) runs native thread pools (OpenMP, BLAS) on one thread
#: (subzero.query.threads).  astroscrappy's detect_cosmics (niter=4, on Gaussian noise)
#: on this shared 2-core machine (load average 5) took 2.0 / 12 / 54 / 205 ms on 64 /
#: 128 / 256 / 512-pixel squares with one OpenMP thread and 2.2 / 25 / 508 / 655 ms
#: with two (median of 5, alternated, threadpoolctl's limits).  Whole re-runs and the
#: engines' runs keep every thread.
SERIAL_BOX_CELLS = 512 * 512

# -- query-time planner (subzero.optimizer.planner) --------------------------------------
#: Never reconsider a stored read sooner than this (CPU seconds of its own work).
MIN_BUDGET_S = 0.002
#: A step whose first method by the simple rule (a stored read or mapping functions) is
#: priced under this many seconds (its central price: another method could save that
#: much in expectation; the pessimistic price decides when a read is given up) runs it
#: without the others priced, and another displaces it only when the model says it
#: saves at least this much: below it, choosing saves less than pricing costs (a step's
#: four or five methods cost 0.1-0.25 ms of CPU to price; at genomics 1x the planner's
#: pricing and its choices among sub-millisecond reads made a query 1.3-1.4x slower
#: than the simple rule).
PLAN_FLOOR_S = 0.001
#: The operator's declared defaults (which a plan keeps where it can) are displaced
#: only by a method priced under them by more than this factor: at genomics 100x a step
#: took a scan priced about as the backward index the defaults ran on (the two within 6%
#: in another store of that size), and the query ran 1.28x the defaults' time.  The
#: switches that paid (10,000x: a Pay lookup and a Pay scan priced 1.9-2.2x under the
#: FullOne index) are far outside it.
PLAN_TIE = 1.25
#: A stored read that has outrun its pessimistic price is given up for re-execution once
#: switching can cost at most this many times staying, whatever is left of the read: its
#: CPU time so far is at least 1 / (SWITCH_WORST - 1) times re-execution's pessimistic
#: price (the target of issue 33: no switch costs more than 1.2x staying).
SWITCH_WORST = 1.2
#: ... or sooner, when its measured progress says what is left of it costs at least this
#: many times re-execution's pessimistic price (a progress estimate off by 2x still leaves
#: the switch no slower than staying).  Chosen, not measured.
SWITCH_MARGIN = 2.0
#: A read at least this far through its work is never given up: what is left of it costs
#: at most what it has cost so far.  Chosen, not measured.
MOST_DONE = 0.5
#: Learned corrections of predicted step costs are clipped to this range.
CORRECTION_RANGE = (0.25, 8.0)
#: The calibration's error model buckets steps by size (cells in or out) at these edges.
ERROR_BUCKETS = (64, 4096, 65536)
#: Beyond the largest calibrated step, a prediction's error factors widen by this much
#: per decade of size (an assumption the optimizer benchmark's scale sweep measures).
EXTRAPOLATION_GROWTH = 0.5
#: Error factor assumed for a calibration without an error model.
DEFAULT_MARGIN = 2.0
#: A size bucket of the error model with fewer calibration steps than this joins the next
#: larger one: the 10th and 90th percentiles of fewer steps are their extremes.  Chosen,
#: not measured; in one calibration on 2 cores (``optimizer.calibrate()``) the smallest
#: bucket kept held 6 steps, and a threshold of 10 would have merged 7 of its 32 buckets.
ERROR_BUCKET_MIN_STEPS = 5
#: A learned correction needs at least this many traced steps of its kind ...
CORRECTION_MIN_STEPS = 2
#: ... and is the median over at most this many of the latest (older steps may predate a
#: change of the run's lineage or of the machine).  Both chosen, not measured.
CORRECTION_RECENT_STEPS = 20
#: While a process traces, a correction keeps this share of its value per observed step
#: (the step's own ratio gets the rest): one cold-cache step moves it by 30% of the way,
#: six consistent steps leave the old value 0.7**6 = 12%.  Chosen, not measured.
CORRECTION_KEEP = 0.7
#: Steps whose priced methods the planner keeps for inspection (commit 8bfae16 bounded
#: the log, which grew with every step of a long-running process).  Chosen, not measured:
#: the latest trace or two (a star's trace on the astronomy run has 39 steps).
DECISIONS_KEPT = 100
#: Step prices the cost model remembers before it forgets them all (the planner prices
#: the same steps again and again).  Measured: 50,000 entries of the memo's key and value
#: shapes hold 21.8 MB (437 B each; tracemalloc, one-off script on 2 cores).
PRICE_MEMO_ENTRIES = 50_000
#: (method, direction) pairs whose correction key is cached.  Chosen, not measured: there
#: are 12 stored strategies, mapping and re-execution, each named a few ways, times two
#: directions -- under a hundred keys; the bound only stops unbounded growth.
CORRECTION_KEYS_CACHED = 4096
#: Box radii whose offset grids ``subzero.window`` keeps (one per radius and rank; a
#: stencil's mapping function asks for the same few on every call).  Chosen, not
#: measured: the bound only stops unbounded growth (a radius of 5 in 3-D is 1,331 offsets,
#: 32 KB).
WINDOW_OFFSETS_CACHED = 256
#: Rows of at least this many values on average are gathered slice by slice
#: (``model.cells.csr_take``): a loop over few rows beats index arrays over all cells.
CSR_WIDE_ROW_CELLS = 1024

#: Blocks a stored read decodes together at most (``storage.codec.unpack_concat``): most
#: of the per-call work saved, and the temporary arrays of one decoding bounded (256
#: record blocks: 262,144 pairs), not the operator's whole lineage.  Chosen, not measured.
DECODE_BLOCKS = 256

# -- the process's allocator (subzero.heap) -------------------------------------------------
#: Blocks under this many bytes come from the heap, not fresh kernel pages (glibc's
#: dynamic threshold moves between 128 KB and this with what a process freed before:
#: a step's page faults then depend on its process's history).  32 MB is glibc's own
#: largest dynamic threshold.
HEAP_MMAP_BYTES = 32 * 2**20
#: Freed heap a process keeps before returning it to the system: 256 MB.  A trace's
#: temporaries are reused instead of faulted in again; a plain genomics 1,000x run
#: peaked 4% higher (1.02 against 0.98 GB).
HEAP_TRIM_BYTES = 256 * 2**20

# -- profiling runs (subzero.optimizer.profile) -------------------------------------------
#: Pairs encoded per candidate strategy at most (then extrapolated).
SAMPLE_PAIRS = 32 * 1024
#: A sample smaller than this (bytes) is grown before extrapolating.
SMALL_SAMPLE_BYTES = 64 * 4096
#: Lineage of at most SAMPLE_PAIRS pairs is encoded whole unless it holds more cells than
#: this: then a sample of whole pairs of about these cells (optimizer.profile._wide_rows),
#: at least WIDE_SAMPLE_PAIRS of them.
SAMPLE_CELLS = 2**20
WIDE_SAMPLE_PAIRS = 4
#: Cells asked of a profiled strategy's own sample to time its index read and its
#: scan (optimizer.sampleread), and the timings of each (median; one untimed first).
SAMPLE_READ_CELLS = 64
SAMPLE_READ_REPEATS = 3
#: ... fewer when its 64 would return more cells than this through the index (at least
#: 2 are asked), and a scan taking this long (seconds) is not timed again with 64:
#: both are then measured on seconds of decoding already.  Chosen, not measured.
SAMPLE_READ_OUT_CELLS = 2 * 2**20
SAMPLE_SCAN_ONCE_S = 0.25
#: ... and a third index read of this many cells (at most the sample's keys, and fewer
#: under the same cap on cells returned; FullOne and PayOne only): the factor of queries
#: of 10^4-10^6 cells, which the 64-cell read's (block costs) did not give.  With 16,384
#: (the calibration's largest scattered query) `extract`'s factor at genomics 1,000x
#: came out 0.65-0.97 against 1.3-1.6 for its 161,000-565,000-cell steps; 262,144 gave
#: 1.07 there.
SAMPLE_READ_BIG_CELLS = 2**18
#: Clamp of an operator's own decode factor (measured / predicted on its sample).
OWN_FACTOR_RANGE = (0.2, 50.0)
#: Beyond this factor (or below its inverse) between reading an operator's own sample
#: and the calibrated prediction, the optimizer keeps that operator's default strategies
#: in the plan: the model cannot vouch for the others.
VOUCH_FACTOR = 3.0
#: A profiling run prices each operator's strategies in a child process beside the
#: run (on two cores or more, where fork exists) ...
PROFILE_BESIDE = True
#: ... when the machine's available memory is above this many times the bytes of the
#: operator's pairs (the child's samples and reads, beside the run's next operator).
#: Chosen, not measured: a sample's encoding and its reads hold a few copies of it.
PROFILE_BESIDE_MEMORY = 6
#: ... a child taking, after the first job it is given, more queued jobs while their
#: bytes together stay under this (small jobs share a child: a child each cost more than
#: their pricing, and priced in the run's process they were a third of a budget run's
#: time at genomics 1x, while the second core sat idle) ...
PROFILE_BATCH_BYTES = 2**20
#: ... and at most this many of them: a child's jobs cannot be shared out again, and
#: one that took all 16 jobs queued at genomics 1x priced them for 0.3 s after the run
#: had ended while the other core sat idle.  A job there is priced in about 20 ms, a
#: child's fork, store and exit cost about as much as one.
PROFILE_BATCH_JOBS = 4
#: Bytes of lineage pairs a profiling run keeps in memory, of the modes it did not store,
#: for the budget run made from it (subzero.runs.planned); beyond them that run runs the
#: operators again.  Genomics at 1,000x keeps 27 MiB (the Pay pairs of extract, model and
#: predict, whose defaults store Full ones).
PROFILE_KEEP_PAIRS_BYTES = 2**30
#: ... and of the modes it stored, its own (the run made from it reads them back from
#: its lineage beyond these): genomics at 1,000x keeps 124 MiB (the Full pairs of
#: extract, model and predict), at 10,000x 1.2 GiB (read back, they were 3.7 s of the
#: 19 s that run took); apart from the bytes above, which save running operators again,
#: not only reading.
PROFILE_KEEP_STORED_BYTES = 2**31
#: ... and each of them only while it is at most this fraction (one over) of the memory
#: the machine has available when it is kept
PROFILE_KEEP_MEMORY_SHARE = 4
#: ... a thread checks this often (seconds) for a child that has ended, to start the next
BESIDE_POLL_S = 0.005
#: A run made from its profiling run encodes half its lineage in a child
#: (``runs.ahead``) only when the pairs to encode hold this many cells or more: below,
#: the fork and the hand-over cost what the child saves (genomics 100x, 1.3 million
#: cells: the made run took 0.19-0.21 s with the child, 0.16-0.19 s without; 1,000x,
#: 12.9 million: 0.7-0.85 s against 0.9-1.5 s)
AHEAD_MIN_CELLS = 4_000_000
#: ... counting, for a Pay strategy keyed forward, this many cells per cell of the
#: operator's Full pairs (its payloads expanded by ``map_p``, packed, sorted and keyed):
#: at genomics 10,000x ``extract``'s forward PayOne (31.7 million Full cells) took about
#: 12 s to encode, ``model``'s forward FullOne (76.8 million) 9.3 s
AHEAD_MAP_P_FACTOR = 3
#: A budget run shares the tracing of its workload on the profiling run with a forked
#: child (``optimizer.workloads.measure(split=True)``) when the profile's children have
#: priced everything, or when the profiling run took this long (its queries then take
#: seconds, and what children still price takes the other core's turns): genomics
#: 10,000x ran 31-34 s and its workload took 9-12 s in one process, whose start found a
#: child still pricing; 1,000x ran 3.5-4.5 s for a workload of 0.7 s, which a fork and a
#: second store opened would not shorten much
WORKLOAD_SPLIT_RUN_S = 10.0
#: A pricing child that has used no CPU time for this many seconds (and is not waiting
#: on the disk) is stuck -- a lock another thread of the run held when it was forked,
#: such as an import under way in an operator's own code -- and is killed; the run's
#: process prices its job instead.  Chosen, not measured: a live child is never idle
#: that long (its work is CPU work on pairs it already holds).
BESIDE_STALL_S = 20.0
#: Operators faster than this (seconds) are timed best of FAST_OP_REPEATS ...
FAST_OP_S = 0.05
#: ... runs; a slower one once (its timer noise is small, and re-running a mode that
#: takes seconds is what made profiling cost several workflow runs: commit c0672b3).
#: Chosen, not measured: three runs of a sub-50-ms operator cost at most 0.15 s a mode.
FAST_OP_REPEATS = 3

#: a running run's driver touches its heartbeat file this often (seconds) ...
HEARTBEAT_S = 5.0
#: ... and a run whose heartbeat is older than this, seen from another host, was
#: lost (its driver died or its host went away): `subzero runs` shows it
#: interrupted, and `subzero run --resume` may take it over.  Twelve missed beats:
#: a driver busy in native code or a slow shared file system is not taken for dead.
HEARTBEAT_STALE_S = 60.0

#: When a command is done, threads that user code started and left running (not daemon
#: threads, which Python would wait for forever) get this long to end before the command
#: names them and exits without them (seconds).  Chosen, not measured: the thread pools of
#: libraries end within milliseconds of the interpreter's exit, and a command's user waits
#: this long at most once.
EXIT_GRACE_S = 1.0

#: Spark jobs of independent branches (the two exposures' operators) a run submits at
#: once, each from a driver thread: a job that cannot fill the cluster (a statistic's
#: few blocks, a reduction's tree, a job's last tasks) leaves cores to the other
SPARK_CONCURRENT_JOBS = 4

# -- storage plans (subzero.optimizer.problem, .ilp, .stats, .workloads) ---------------------
# Measured by re-solving the integer program (``problem.build`` then ``ilp.solve``) with one
# constant varied, after ``optimizer.calibrate()`` and the profiles and shipped workloads of
# genomics (4 queries) and astronomy (9 queries, 1 Mpix), disk budgets unbounded, 200KB and
# 50KB (genomics), unbounded, 100KB and 20KB (astronomy); 2 cores.  GLPK solved every one of
# these to optimality in 0.3-129 ms (typically 1-3 ms), so the solver has no time limit.
#: Tie-break: storing every candidate would cost this share of the workload's black-box
#: cost, so megabytes are not spent on microseconds.  Measured (above): genomics unbounded
#: stores 239 KB at 0 (priced workload 2.28 ms), 235 KB at 1e-4, 45 KB at 1e-3 (2.34 ms,
#: +2.6%), 16 KB at 1e-2 (2.45 ms), 12 KB at 1e-1 (2.79 ms).  On astronomy within 100KB
#: it already outweighs query time: 1e-3 picks a plan of 90 KB, 0.067 s of lineage
#: runtime and 8.25 ms priced, where 0 picks 86 KB, 0.079 s, 6.73 ms (a black-box
#: workload of seconds makes 0.1% of it milliseconds).
TIE_BREAK = 1e-3
#: A plan's (pessimistic) price of a query may exceed the default strategies' by this
#: factor before the integer program pays BOUND_PENALTY for it (the optimizer-scale
#: benchmark's target is every query <= 1.2x the defaults, benchmarks/RESULTS.md).
#: Measured (above): genomics' plans are the same at every value from 1.0 to unbounded;
#: astronomy within 100KB picks the 86 KB plan at 1.0 and 1.05, the 90 KB one from 1.1 up.
DEFAULTS_TOLERANCE = 1.1
#: A query over its bound costs this many times the excess.  Measured (above): genomics'
#: plans are the same from 1 to 100; astronomy within 100KB picks the 90 KB plan at 1, 3
#: and 10, the 86 KB one at 30 and 100; within 20KB (one candidate left) only the
#: objective scales.
BOUND_PENALTY = 10.0
#: A workflow's runtime without lineage is the median of the profiling run and at most
#: this many of its latest complete runs (one run of a sub-second workflow is noise).
#: Chosen, not measured.
BASE_RUNTIME_RUNS = 20
#: Latest traces of the trace log that make a workload when none is given.  Chosen, not
#: measured: each is a catalog row and its steps; a thousand is a long session's worth.
WORKLOAD_TRACES = 1000

# -- the calibration benchmark (subzero.optimizer.calibration) ---------------------------------
#: The busy probe (optimizer.busy): seconds of spinning, and the share of one core under
#: which the machine counts as too busy to calibrate on quietly (a warning, and the
#: calibration records it).  Chosen: an idle core gives 0.95-1.0; one other busy
#: process on the same core gives about 0.5.
BUSY_PROBE_S = 0.2
BUSY_SHARE = 0.8
# Measured with ``optimizer.calibrate()`` (defaults) on 2 cores shared with other work:
# 34.7 s in all, 624 observations taking 22.9 s.
#: An observation is timed until its timings add up to this (at most
#: CALIBRATION_REPEATS times; a slow one once): its timer noise is small and
#: calibration time is not.  The profiler's timed reads of a strategy's own sample
#: (optimizer.sampleread) stop at the same sum.  Lowered from 0.1 (the calibration then took 62.9 s,
#: benchmarks/RESULTS.md, optimizer at scale; commit d7606c3).  Measured (above): 80 of 624
#: observations were over 50 ms and took 13.1 s, so a second timing of each would add about
#: that; 35 were over 100 ms (9.8 s); 25 ms would skip 42 more, worth 1.5 s.
#: Lowered from 0.05 to 0.02 with CPU-time medians (issue 33): a step of tens of
#: milliseconds varies little in CPU time, and the calibration's target is 30 s.
#: Not lowered to 0.01 (issue 33): it would save 2.5 s of the 14.8 s of timed work in
#: 624 observations, but the profile's sample reads stop at the same sum, and the one
#: benchmark run made with it had plans slower at genomics 100x (BQ1 1.33x) that there
#: was no time to tell from noise.
SLOW_OBSERVATION_S = 0.02
#: Timings of each fast observation (the median is kept: CPU seconds, issue 33).  Chosen,
#: not measured against other values; tests use 1.
CALIBRATION_REPEATS = 3
#: Fresh processes the calibration's observations are dealt to, side by side (at most one
#: a core): each times its own CPU seconds.  Two: the cores a CI machine has.
CALIBRATION_OBSERVERS = 2
#: An observer that prints nothing for this long (seconds) is stopped, and what it had
#: left is observed in the calibration's own process (an observation takes at most a
#: few seconds)
OBSERVER_SILENCE_S = 120.0
#: Alternations of the three capture-overhead runs (no capture, capture storing nothing,
#: one strategy), medians kept.  Measured (above): 3.3 s at 5; lowered to 3 for the
#: calibration's 30 s target (issue 33), not compared with other values.
CAPTURE_OVERHEAD_REPEATS = 3
#: Reads of each of the 1, 4 and 16 MB arrays whose median times give the load cost.
#: Chosen, not measured: the phase takes 0.5-0.7 s at 3, and its fitted fixed cost moved
#: between 4 and 10 ms from one run to the next at 1, 3 or 5 reads (shared cores).
LOAD_REPEATS = 3

# -- the explorer (subzero.explore) and export summaries (subzero.export.regions) -------------
#: At most this many pixels per axis in one image (a 1:1 view of a 16-Mpix array).  The page
#: asks for its screen size, so this binds "one pixel per cell" and requests without a size.
#: Measured (one-off script: ``render.window``/``image_png``/``overlay_png`` of the whole
#: array at one pixel per cell, the real amplifier tiled as ``astronomy.tiled_inputs``):
#: at 64 Mpix (18001 x 3567) a 2.0 MB grey PNG in ~2.0 s at 4096, 9.2 MB in ~4.2 s uncapped
#: (a 7x7-cell answer's overlay 27 vs 211 ms); at 16 Mpix 2.0 MB vs 4.0 MB uncapped, in
#: 0.7-1.3 s either way (reading and pooling the array dominates; shared cores).
MAX_PIXELS = 4096
#: zlib level of the explorer's PNGs.  Measured (same script, 16 Mpix pooled to 4096 x 2040):
#: level 0 / 1 / 6 / 9 encode the grey image in 74 / 105 / 146 / 246 ms to 8.4 / 2.0 / 2.0 /
#: 2.0 MB, and a quarter-array overlay in 9 / 15 / 33 / 117 ms to 8.4 MB / 42 / 20 / 14 KB.
PNG_LEVEL = 1
#: Answers a session keeps so that a zoom redraws an overlay without tracing again.
#: Chosen, not measured as a count; what one costs was measured on the astronomy demo run
#: (31 arrays, 27.7 M cells in all; ``explore.session.Session.trace``): a star's peak
#: traced backward keeps 1.9 MB, a 100 x 100 box of raw_1 forward 1.4 MB, the whole
#: ``stars`` array backward 32.9 MB (bitmaps: a byte per cell; larger runs, more).
KEEP_TRACES = 8
#: How long ``explore.start`` waits for its server to answer, and ``Running.stop`` for it to
#: end (s).  Measured on the demo run: start 12-92 ms, stop 0.19-0.20 s; these only catch a
#: server that will not start or stop.
EXPLORE_START_S = 30.0
EXPLORE_STOP_S = 10.0
#: uvicorn's graceful shutdown: open connections (the page's keep-alive) are given this
#: many seconds (an int, as uvicorn takes it).  Chosen, not measured.
EXPLORE_DRAIN_S = 1
#: How often ``explore.start`` checks whether its server answers (s).  Chosen, not
#: measured: start returns at most 20 ms after the server is up.
EXPLORE_POLL_S = 0.02
#: Runs of consecutive cells kept in a region summary (PROV-JSON, OpenLineage); beyond,
#: only the count and bounding box.  Measured (``regions.summary`` of a box of N rows,
#: one-off script): 1024 runs are 14-15 KB of JSON built in 4-12 ms on 1-64 Mpix arrays;
#: 8001 runs 123 KB in 68 ms.  An export holds a summary per array (31 for astronomy).
MAX_RUNS = 1024

# -- the environment ------------------------------------------------------------------
#: A write that failed without saying why (an R-tree's "corrupted data file", SQLite's
#: "disk I/O error") is reported as a full disk when its file system has less than this
#: free: a failed write leaves the disk at most a few blocks short of full (the writer
#: fills what is left first), and no SubZero write of a run or the catalog needs less
#: than this to succeed (chosen, not measured: 1 MiB is well above a file system's block
#: and SQLite's 32 KiB shared-memory file, and far below any disk one works on).
DISK_FULL_BYTES = 1 << 20

#: How long a reader of a run's LMDB file waits to lease it again when, having held a
#: lease, it finds the file opened for writing or being truncated by someone else (s).
#: A truncation takes that write access for microseconds after the reader gives its
#: lease back; the reader must not map the file in between (SIGBUS), so it waits for
#: the lease and then sees the new size.  A writer that keeps the file open longer
#: costs one wait, after which reads go on with size checks alone.  Chosen, not
#: measured: far above a truncation's time under load, far below a user's patience.
LEASE_WAIT_S = 2.0

#: ``--keep auto`` keeps an intermediate array that would take longer than this to make
#: again (its operator's run time, with that of the inputs it would make again first):
#: a read of it would wait that long (:mod:`subzero.runs.keep`)
KEEP_RECOMPUTE_S = 2.0
#: ``--keep auto`` keeps an array whose dropping would free less than this many bytes
#: (its metadata and checksums stay; a scalar made again whole rebuilds what it reads)
KEEP_MIN_SAVING = 16 << 10
#: under a disk budget the integer program prices every array ``--keep auto`` would keep
#: for a read outside the workload (slow to make again, or cheap to keep) as read this
#: many times per unit of the workload's weight (``subzero.optimizer.problem``): kept
#: while the budget has room, dropped before anything the workload reads
KEEP_ADHOC_READS = 0.05

#: the ``--keep`` policies (:mod:`subzero.runs.keep`), and that of a run naming none
KEEP_POLICIES = ("auto", "outputs", "all")
DEFAULT_KEEP = "auto"

#: Seconds a plan waits, once it is chosen, for the fresh process timing the load of the
#: workflow's operators (``optimizer.loadcost``), started when ``optimize`` began; a
#: load not measured by then is left out of the plan's first uses
LOADCOST_WAIT_S = 5.0
