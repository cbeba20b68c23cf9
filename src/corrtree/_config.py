"""Tuning constants of corrtree, each with the reason for its value.

Everything here is private: a value changes speed or memory, never a result
(the rounding margins only make certificates safe; any larger margin is
also exact, only slower).  See ``docs/design.md`` for the bounds they guard.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ._validation import available_memory

# -- rounding margins (certificates stay upper bounds under float64 rounding) -------

#: Relative enlargement of every computed norm or drift bound: a handful of
#: float64 operations err by at most ~10·2^-53 ≈ 1e-15 relative.
ROUND_UP = 1.0 + 1e-12

#: Absolute allowance on a computed quadratic form ``cᵀGc`` of ``p`` terms, in
#: units of ``(Σ|c|)²·max G``: its rounding is at most ~p·2^-53 of that, far below
#: 1e-13 for any pool segment that fits in memory.
QUAD_FORM_SLACK = 1e-13

#: Unit roundoff of float32.
U32 = 2.0**-24
#: Unit roundoff of float64.
U64 = 2.0**-53

#: Relative widening of a tree query threshold when leaves are float32: covers
#: the rounding of the leaves (2^-24) and of the threshold arithmetic, twice.
FLOAT32_QUERY_MARGIN = 4.0 * U32

#: Safety factor on the float32 GEMM error bound ``γ_{d+2}·||w||·||x||``
#: (the bound is already worst case; the factor absorbs the float32 conversion).
GEMM32_SAFETY = 2.0

# -- memory: blocks of work (big enough for BLAS to run at full speed) --------------

#: Products computed at once while preprocessing the band trainers.
ANCHOR_BLOCK_BYTES = 128 * 2**20
#: Exact rows recomputed at once when neurons are re-anchored.  Few large blocks: each
#: block's GEMM is followed by numba scans, and OpenBLAS's threads spin ~0.1 s after a
#: call unless ``OPENBLAS_THREAD_TIMEOUT`` was set before numpy loaded (``_threads``),
#: taking a core from those scans (W4's data, m = 2^16, every neuron re-anchored: blocks
#: of 128 MiB take half the time of blocks of 16 MiB, and about 10% less with the short
#: spin).
REANCHOR_BLOCK_BYTES = 128 * 2**20
#: A float64 GEMM does about this many flops in the time a kernel streams one
#: element of a row of G: a re-anchored row is ``W(t)[r]·Xᵀ`` (2dn/this, after
#: O(d·|prefix|) to form ``w_r(t)``) unless its float64 anchored row plus the Gram
#: identity (n·|prefix|) is cheaper.
REANCHOR_GEMM_GAIN = 8.0
#: New products computed at once by a correlation tree update.
TREE_UPDATE_BLOCK_BYTES = 256 * 2**20
#: Products computed at once by ``predict``/``loss``/``fire_counts`` and when a
#: model takes its trained weights back.
MODEL_BLOCK_BYTES = 256 * 2**20
#: Rows of ``W(T)`` materialized at once when a trainer writes them to the model: small
#: enough (under glibc's 32 MiB ceiling for mapping a block afresh) that every block
#: reuses the memory of the one before instead of faulting in new pages, which costs
#: about 1 s per GiB on the machines we measure on.
WEIGHTS_BLOCK_BYTES = 16 * 2**20

#: Dense GD keeps one block of products, mask and gradient: at most this share of
#: free memory, capped (beyond ~6 GiB a larger block buys no BLAS speed), and at
#: least this many neurons (smaller blocks make the GEMMs inefficient).
DENSE_BLOCK_MEMORY_SHARE = 0.25
DENSE_BLOCK_MAX_BYTES = 6 * 2**30
DENSE_MIN_BLOCK = 64

#: Anchored rows are stored in float64 only when they take at most this share of
#: free memory: they share it with W, the tracked pairs and the preprocessing blocks.
FLOAT64_ANCHOR_MEMORY_SHARE = 0.25

#: float32 GEMMs re-anchor only rows whose error bound (about 1e-4·||w_r||·R) stays below
#: this: their products, at most ||w_r||·R, are then far below float32's 3.4e38.
FLOAT32_SAFE_ERROR = 1e26
#: Bytes a tracked pair of the band trainers takes in the pool, its spare capacity and
#: scratch space included (measured: W1 at m = 2^20); the memory check before a run.
POOL_BYTES_PER_PAIR = 110.0
#: The same for an implicit model's run, whose segments get the tight slack
#: (``SEGMENT_SLACK_DIV_TIGHT``): measured 61 at W1, m = 2^20, with a margin.
POOL_BYTES_PER_PAIR_IMPLICIT = 70.0
#: Bytes of a neuron's rows in the band trainers' tables (``seg``, ``nf``, keys, drifts).
NEURON_TABLE_BYTES = 160.0
#: Bytes per weight-data pair of the paper's trees (products and their max levels).
TREE_BYTES_PER_PAIR = 10.0
#: The kernel trainer's dense NTK matrix may take at most this share of free memory.
NTK_MEMORY_SHARE = 0.5

# -- growth of the pool of tracked pairs --------------------------------------------

#: Initial entries per neuron before the first block tells the real count.
POOL_ENTRIES_PER_NEURON = 8
#: Capacity multiplier when the pool is full (amortized O(1) appends, and less
#: transient memory than doubling).
POOL_GROWTH = 1.5
#: The pool reserves this multiple of the set-up's places (estimated from the first
#: preprocessing block, segment slack included).  Re-anchored segments that outgrow
#: their places move to the pool's end; the reserve is address space until written
#: (fresh anonymous memory is committed page by page on first write), so it costs no
#: memory, while a growth copies every used place into fresh pages (W3 with
#: cross-entropy, m = 2^17: one growth of 18 M places took 3.3 s of a 14 s run; its
#: re-anchored segments reach 1.7× the set-up's places in 100 iterations).
POOL_RESERVE = 2.0
#: A neuron's segment gets ``count + count // SEGMENT_SLACK_DIV + SEGMENT_SLACK_ADD``
#: places, so that a few flips into its band do not move it.
SEGMENT_SLACK_DIV = 4
SEGMENT_SLACK_ADD = 4
#: The set-up slack of an implicit model's run, where memory is the limit: a segment
#: that outgrows it on re-anchoring moves to the pool's end (its old places are lost).
#: W1-shaped at m=2^20: 15% fewer pool places than the default, no segment moved
#: in 100 iterations.
SEGMENT_SLACK_DIV_TIGHT = 8
SEGMENT_SLACK_ADD_TIGHT = 1
#: Pool fields of at least this many bytes live in memory without transparent huge
#: pages (``_pool.zeros``): their first writes, segment by segment from parallel
#: threads, cost several times more in huge pages on this machine.
POOL_SMALL_PAGES_BYTES = 4 * 2**20

# -- band trainers -------------------------------------------------------------------

#: Half-width β of the tracked band at an anchor, in units of ``||w||·||x||`` drift:
#: wide enough that re-anchoring (O(n·k̃) per neuron) is rare, narrow enough that
#: the band holds a few times the firing pairs for unit-norm data (the mean
#: neuron's; each neuron's scales with its fire count, :data:`BAND_FIRE_EXPONENT`).
BAND = 0.55
#: Each neuron's band half-width is ``BAND·(f_r / mean f)^this`` at set-up, ``f_r`` its
#: number of firing points (:func:`~corrtree.training._anchors.band_widths`).
BAND_FIRE_EXPONENT = 0.5
#: The kernel trainer re-anchors a neuron ahead of time when its step plus the ``ρ/(1-ρ)``
#: steps still to come would leave its band, but only while each step shrinks the error
#: norm to at most this share (``ρ``): past it the geometric tail says little, and the
#: steps of coherent data (``ρ`` near 1) would re-anchor neurons that never leave.
LOOKAHEAD_CONTRACTION = 0.5

#: Neurons are summed in this many fixed chunks by the forward pass, so that the
#: outputs do not depend on thread scheduling.
FORWARD_CHUNKS = 64
#: Neurons are evaluated, and re-anchored ones rebuilt, in this many runs, each
#: with its own scratch vectors.
EVALUATE_CHUNKS = 256
#: Fewer neurons to visit, or flips to add, than this are done on the calling thread
#: (kernel trainer): waking the other threads costs more than a handful of visits.
SERIAL_WORK = 32
#: Re-anchored neurons are rebuilt at least this many a run: each run zero-fills
#: O(n) scratch, which would outweigh the few neurons of a small re-anchoring.
REBUILD_ROWS = 64

#: The kernel trainer evaluates its due neurons in groups whose entries, each with
#: room in the flip records, number at most this (a few MiB of records, reused).
FLIP_RECORD_ENTRIES = 2**19
#: The kernel trainer's set-up drops its band (keeps only the firing entries, whose
#: neurons the first step then re-anchors) where the first step would move at least
#: this share of the firing neurons past it anyway
#: (:meth:`~corrtree.training.kernel.KernelTrainer._start`): the band's float64 dot
#: products are then never read.  W4's data: 98%; W1's: 0.5%.
BAND_DROP_SHARE = 0.9
#: Firing neurons whose first step :meth:`~corrtree.training.kernel.KernelTrainer._start`
#: computes to judge that share.
BAND_DROP_SAMPLE = 256

#: Rows whose exact products at chosen points are computed together
#: (:func:`~corrtree.training._anchors.pair_dots`): each point's row of X is read once
#: for all of them, and serves eight of its pairs a pass where it has that many (W4's
#: entries, 4.6% of the products: about 24 a point).
DOT_ROWS = 512

#: The kernel trainer's heap switches from one-by-one to bulk pops and pushes
#: (an O(size) filter and heapify) when more than ``size // HEAP_BULK_DIV``
#: neurons are due: beyond that, k·log(size) exceeds size.
HEAP_BULK_DIV = 16

# -- learning rate ---------------------------------------------------------------------

#: A scattered read of G costs about as much as this many vectorized flops while G
#: stays in the last-level cache (~10 ns against ~10 flops/ns): ``lr="auto"``'s NTK
#: mat-vec reads G or rebuilds the Gram sums from X, whichever is cheaper by this fixed
#: exchange rate (:func:`scatter_cost`), so that every process and machine computes the
#: same ``lr``.  The band trainers' visits, where only time depends on the route,
#: measure the rate on the machine instead (:mod:`corrtree.training._calibrate`).
SCATTER_COST = 50.0
#: The same once G is too large for the cache (a miss to memory).
SCATTER_COST_FAR = 200.0
#: The kernel trainer bounds a neuron's move by its part along this many principal
#: directions of the data, exactly, plus the rest by the residual's norm.
PROJECTION_RANK = 32
#: ... or along none when they lower the residual's norm bound by less than this factor
#: (isotropic data: W1 and W4, where ||X||_2 is 1.10× and 1.06× the 33rd singular value).
PROJECTION_GAIN = 1.1
#: On data with leading directions the kernel trainer keeps each neuron's own clock
#: (an O(fired pairs) pass an iteration) while its visits read at least this share of
#: the fired pairs (their prefixes), and returns to the global clock's heap below
#: :data:`OWN_CLOCK_LEAVE`: a prefix entry visited costs about 10-15 times a fired pair
#: of the pass, and the global clock visits 1.5-2 times the neurons (W2).
OWN_CLOCK_ENTER = 0.25
OWN_CLOCK_LEAVE = 0.05
#: Up to this many features a neuron's own clock also bounds its step by the step's own
#: norm, ``||Σ_S e_l x_l||`` (:func:`~corrtree.training._clocks.own_clocks`: ``d`` more
#: multiply-adds a fired pair): on low-dimensional data a fitted model's errors are
#: nearly orthogonal to the features, so the norm is far below the triangle bound
#: (scikit-learn's diabetes set, d = 10, m = 2^16, 300 steps: kernel whole runs 37.0 and
#: 40.2 s without, 22.2 and 28.2 s with, side by side; at d = 30, W5, it did not pay:
#: 12.3 and 14.6 s without, 14.7 and 15.2 s with).
OWN_CLOCK_MOVE_DIM = 16
#: Up to this many features the lazy trainer may keep each neuron's move since its
#: anchor, ``Σ_l (C_rl - cref_rl)·x_l``, as an (m, d) array and add its exact step to it
#: (``d`` multiply-adds a firing pair), instead of rebuilding it from the coefficients of
#: every pair that ever fired; it then evaluates only the firing pairs and the others
#: whose key passed (``docs/design.md``, "The lazy trainer").  Whether it does is priced
#: from the set-up's fire sets (:func:`~corrtree.training.lazy.moves_pay`); the memory
#: model counts the array (``8·m·d`` bytes) wherever it may be kept.  Not for implicit
#: models.
LAZY_MOVE_MAX_DIM = 1024
#: The moves are kept while their modelled step costs at most this many times the
#: coefficient route's (``moves_pay``).  The model prices both at the set-up's fire
#: sets, where the coefficient route's prefixes only grow and each of its entries also
#: reads and writes its coefficient: measured whole-run ratios (coefficient route over
#: moves, 2-core AMD EPYC) were above the modelled ones by 1.13-1.35 where the model
#: called them even (W5 1.33, W3 1.14, image patches at d = 432 1.13-1.16 and at
#: d = 768 1.05-1.09 against a modelled 0.94) and by 2.5 where it favoured the
#: coefficients (W1, sphere d = 784: the moves 2.0-2.5 times slower, modelled 0.18).
LAZY_MOVE_GAIN = 1.25
#: Beyond this many features a kept move's row (``8·d`` bytes read and written a neuron
#: a step) costs about what its arithmetic does, and the moves pay only where the
#: coefficient route's prefixes outgrow the fire sets: on data whose points look alike,
#: :func:`~corrtree.training.costs.coherence` at least :data:`LAZY_MOVE_COHERENCE` times
#: that of random directions, ``sqrt(2/(π d))``.  Measured (2-core AMD EPYC, one process,
#: alternating): W4's sphere at m = 2^16 (d = 784, coherence 1.0 times random, fire sets
#: of 72 that the price calls even) 31.0 and 25.1 s with the moves against 27.5 and
#: 22.5 s without, 20 steps; image patches (17-23 times random) faster with them.
LAZY_MOVE_FREE_DIM = 64
LAZY_MOVE_COHERENCE = 4.0
#: Nanoseconds a flip's write into the kernel trainer's H takes in place (its row and
#: column, a cache miss each: W2, n = 2048, 4.1e6 writes took 0.17 s): the one price
#: of that write, for the trainer's choice of how to apply flips and for the cost model.
FLIP_WRITE_NS = 40.0
#: Sequential additions per nanosecond (a new H of W2: 9.7e8 additions in about 1 s).
ADDS_PER_NS = 1.0
#: A flip's write into H in sequential additions, the unit of the kernel trainer's
#: choice between the ways of applying flips.
FLIP_WRITE_COST = FLIP_WRITE_NS * ADDS_PER_NS
#: The same write along the flipped point's own row of a scratch matrix, the row in
#: cache while that point's flips write it (:func:`~corrtree.training._flips.apply_flips_by_rows`;
#: W2: 4.3e8 writes in 1.7 s, against 2.6e8 in place in 15.5 s).
FLIP_ROW_WRITE_COST = 4.0
#: ... which then adds the scratch matrix and its transpose to H in tiles of this
#: many rows and columns (a tile of float64 is 32 KiB) ...
FLIP_TILE = 64
#: ... at this many additions an entry of a tile (W2: 4.2e6 entries in 9-18 ms).
FLIP_TILE_COST = 4.0
#: ... while the scratch matrix (H's size) takes at most this many bytes.
FLIP_SCRATCH_BYTES = 512 * 2**20
#: G up to this size is taken to stay in cache.
CACHED_GRAM_BYTES = 16 * 2**20

#: Up to this order the NTK matrix is formed and LAPACK gives λ_max; beyond,
#: Lanczos runs on the sparse mat-vec.
NTK_DENSE_EIG_LIMIT = 2048

#: Up to this order (8·order² bytes: 512 MiB) ``lr="auto"`` forms the NTK matrix once,
#: O(Σ_r k̃_r²·K²), and runs Lanczos on it: far cheaper than Lanczos on the sparse
#: mat-vec, whose every step costs O(d·Σ_r k̃_r) or O(Σ_r k̃_r²) again.
NTK_DENSE_MATVEC_LIMIT = 8192

#: ``lr="auto"`` and the kernel trainer count the pairs of each two points that fire
#: together (``FᵀF``, one output) by float32 GEMMs of 0/1 rows when ``2·m·n²`` flops at
#: this rate cost less than the ``Σ_r k̃_r²`` additions at the next (2 cores: 0.43 s
#: against 2.2 s where neurons fire on a quarter of n = 442 points, m = 2^16; the
#: additions win from n = 2048 at 2% firing) ...
NTK_COUNT_GEMM_FLOPS = 5e10
NTK_COUNT_ADDS = 3e8
#: ... in blocks of rows of this many bytes (float32).
NTK_COUNT_BLOCK_BYTES = 64 * 2**20

#: The sparse NTK mat-vec rebuilt from the data adds the pairs of this many runs of
#: neurons into separate buffers (about equal work each), summed in a fixed order.
NTK_MATVEC_CHUNKS = 16

#: Lanczos on the sparse mat-vec starts from ``u ⊗ c``: ``u`` the top eigenvector of
#: the output-averaged NTK of about this many neurons (every ``m / NTK_WARM_NEURONS``-th,
#: cheap mat-vecs), ``c`` the top eigenvector of the ``K × K`` Ritz matrix of the
#: ``u ⊗ e_k`` (W3, digits K = 10: 17 mat-vecs instead of 41 from a random start).
NTK_WARM_NEURONS = 8192
#: ... plus this share of a fixed random vector, so that the start is never orthogonal
#: to the top eigenvector.
NTK_WARM_NOISE = 1e-2
#: Tolerance of Lanczos for ``u`` (a start vector: it needs no more).
NTK_WARM_TOL = 1e-2
#: Lanczos basis size (ARPACK's ``ncv``): ARPACK fills the basis before its first
#: convergence test, so a warm start converges within the first basis only if it is
#: small (W3: 17 mat-vecs with 8, 21 with ARPACK's default 20).
NTK_LANCZOS_BASIS = 8

#: Halvings of ``lr="auto"`` tried by the estimators and the CLI when a run
#: diverges (``1/λ_max`` assumes fire sets that barely change).
LR_RETRIES = 4

# -- the cost model behind method="auto" (training/costs.py) --------------------------
#: float64 GEMM, flop/s.
BLAS_FLOPS = 5e10
#: Gathers and scattered updates in numba kernels, per second.
SPARSE_OPS = 5e8
#: Streaming element-wise passes over arrays, elements per second.
STREAM_OPS = 2e9
#: Values read per reported leaf or updated path in a blocked max tree.
TREE_VISITS = 16
#: Vectorized flops per scattered operation when the band kernels rebuild pair values
#: from the data (O(d) per pair) instead of reading G (O(|prefix|) per pair).
DATA_FLOPS_PER_OP = 10.0
#: An evaluation by the kernel trainer against the lazy one's: keys, heap, σ of the
#: neurons that flipped (measured on breast cancer, where both evaluate every neuron).
KERNEL_EVALUATION = 1.5
#: Share of a visited neuron's tracked pairs whose key the kernel trainer finds passed
#: (image patches: 0.35 M of 2.6 M a step), each a Gram row of |prefix| reads.
KERNEL_DUE_SHARE = 0.13
#: Fixed operations per neuron brought up to date, beyond its pairs: the lazy trainer
#: walks its neurons in order (breast cancer: 0.56 µs each), the kernel trainer's visits
#: come from the heap and read its keys and bounds (1.1 µs each).
LAZY_NEURON_OPS = 150.0
KERNEL_VISIT_OPS = 450.0
#: Flips per firing pair and step grow with coherence × fired points x = coh·k while
#: the run keeps turning, and fall as ~1/x past this (strongly coherent data converges
#: in few steps: image patches flip 0.45% a step, breast cancer 1.1%, digits 0.9%).
FLIP_SATURATION = 8.0
#: Fired points per neuron at which every neuron of isotropic data is re-anchored once a
#: run (n = 4096 spheres: 206 k of 262 k neurons; coherent data: a few per thousand).
REANCHOR_POINTS = 50.0


def block_rows(row_bytes: float, total: int, budget: int) -> int:
    """Rows per block so that a block of rows of ``row_bytes`` takes at most ``budget``."""
    return int(max(1, min(total, budget // max(1, int(row_bytes)))))


def scatter_cost(n: int) -> float:
    """Flops a scattered read of the ``n × n`` float64 G costs: :data:`SCATTER_COST`
    while G fits :data:`CACHED_GRAM_BYTES`, else :data:`SCATTER_COST_FAR`."""
    return SCATTER_COST if 8.0 * n * n <= CACHED_GRAM_BYTES else SCATTER_COST_FAR


def ntk_bytes(n: int, outputs: int) -> float:
    """Bytes of the kernel trainer's ``nK × nK`` float64 NTK matrix."""
    return 8.0 * (n * outputs) ** 2


def ntk_fits(n: int, outputs: int) -> bool:
    """Whether the kernel trainer's NTK matrix fits in its share of free memory."""
    return ntk_bytes(n, outputs) <= NTK_MEMORY_SHARE * available_memory()


# -- the array path's cost model (training/device_costs.py) ----------------------------
#: Tensor operations launched per iteration, counted in the trainers' code with
#: ``corrtree.bench.device_count`` (``tests/test_device_count.py``): dense (two GEMMs,
#: the mask, the reductions), lazy (the coefficients, every row's values by GEMM, the
#: re-anchoring batch, the outputs by GEMM, one transfer), kernel without a visit (the
#: mat-vec, the clocks, the due mask, one transfer) and a kernel visit (one batch of
#: the due neurons re-anchored, whatever their number, and the counts' update).  Each
#: costs the device's measured launch time, which on a GPU is what a small problem's
#: iteration costs.
DEVICE_DENSE_OPS = 12
DEVICE_LAZY_OPS = 128
DEVICE_KERNEL_OPS = 33
DEVICE_VISIT_OPS = 158
#: The device kernel trainer bounds a step by Gershgorin's σ (one GEMM of a visited
#: row's fire flags with |G|, 2·(n+1)² flops, recomputed when its fire set changes) when
#: the mean fire set at the start has at most this many points: σ beats the triangle
#: bound on incoherent data, whose fire sets are short (W1: 15 on average), while on
#: coherent data (image patches: hundreds) λ_max is near the trace and the triangle
#: bound is as good.
DEVICE_SIGMA_POINTS = 64
#: The file of the measured device rates (:func:`device_rates`): written by
#: ``bench_gpu.py --set-rates`` from a benchmark run on the device.
DEVICE_RATES_FILE = Path(__file__).with_name("device_rates.json")
#: The rates' names in :data:`DEVICE_RATES_FILE` (what ``corrtree.bench.device_count``
#: prices counts with) and in :data:`DEVICE_RATES`.
RATE_NAMES = {
    "flops64_per_s": "flops64",
    "flops32_per_s": "flops32",
    "gathers_per_s": "gathers",
    "scatters_per_s": "scatters",
    "bytes_per_s": "bytes",
    "sync_s": "sync",
    "launch_s": "launch",
}
#: Rates a device's entry may give beside :data:`RATE_NAMES`: ``row_gathers_per_s``, the
#: entries a second of an indexed read or write of whole rows (contiguous runs of at
#: least :data:`ROW_RUN` entries: a visit's rows of its packs, rows of ``W(0)``), which a
#: GPU reads as a stream rather than one access an entry.  Without it the count prices
#: those at ``gathers_per_s``, as single entries.  ``sorts_per_s``: the records a second
#: of a sort (keys with their indices); without it a sort is priced as the bytes it
#: streams, and the device trainers pick rows by prefix sums, never by a sort.
OPTIONAL_RATE_NAMES = {"row_gathers_per_s": "row_gathers", "sorts_per_s": "sorts"}
#: An indexed access moving runs of at least this many contiguous entries is a row access
ROW_RUN = 32


def device_rates(path: str | Path = DEVICE_RATES_FILE) -> dict[str, Any]:
    """The measured device rates in ``path`` (JSON: by device type, the rates of
    :data:`RATE_NAMES`, each positive and finite, and where, how and when they were
    measured: ``measured_on``, ``how``, ``date``); a file that does not hold them is
    refused in one line."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    for kind, rates in data.items():
        if not isinstance(rates, dict):
            raise ValueError(f"{path}: {kind} must map rate names to numbers")
        missing = sorted(set(RATE_NAMES) - set(rates))
        named = (*RATE_NAMES, *OPTIONAL_RATE_NAMES)
        bad = [k for k in named if k in rates and not _positive(rates[k])]
        if missing or bad:
            raise ValueError(
                f"{path}: the {kind} rates must give {', '.join(missing + bad)} "
                "as positive finite numbers"
            )
    return data


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


#: The rates the device kernel trainer prices its choices with, by device type: float64
#: and float32 GEMM flops, gathered and scattered (accumulated) entries, records sorted
#: (where given) and bytes streamed, each a second, and the seconds of a host
#: synchronization and of a launch.  A visit's flips change ``N`` entry by entry
#: (``2·Q·K²`` scattered additions a flip) or by float32 GEMMs of the flipped rows' fire
#: sets (``DeviceKernelTrainer._change_counts``); a batch is picked from a mask by prefix
#: sums or by a sort (``DeviceBand._by_sort``).  ``cuda``: measured on an H200, read from
#: :data:`DEVICE_RATES_FILE` (``G = XXᵀ`` at n = 2048, d = 768 in float64 in 0.12 ms;
#: 14 M gathers from a resident ``G`` with a row sum in 0.42 ms, 3.6 ms through a
#: deterministic ``index_add_``; a sort of 450 k records in 0.16 ms); ``cpu``: torch on
#: the 2-core machines of the benchmarks (a 2048 × 768 × 2048 float64 GEMM in about
#: 0.1 s; advanced indexing at about 1e8 entries a second, ``index_put_`` with
#: accumulation at a fifth of that; a stable sort at 0.5-1.5e7 records a second).
DEVICE_RATES = {
    "cuda": {
        short: float(device_rates()["cuda"][name])
        for name, short in {**RATE_NAMES, **OPTIONAL_RATE_NAMES}.items()
        if name in device_rates()["cuda"]
    },
    "cpu": {
        "flops64": 5e10,
        "flops32": 1e11,
        "gathers": 1e8,
        "scatters": 2e7,
        "sorts": 1e7,
        "bytes": 1e10,
        "sync": 1e-6,
        "launch": 2e-6,
    },
}
#: The padded rows hold the widest row's tracked pairs: about this many times the mean.
DEVICE_PAD_FACTOR = 2.0
#: The share of neurons a kernel step visits once the first steps are past, per unit of
#: ``coherence × fired points`` (the CPU kernel trainer's measured shares, see costs.py),
#: at most :data:`DEVICE_VISIT_MAX`; the first :data:`DEVICE_VISIT_WAVE` steps visit all.
DEVICE_VISIT_SLOPE = 0.2
DEVICE_VISIT_MAX = 0.95
DEVICE_VISIT_WAVE = 6

#: A run whose loss exceeds this many times its initial loss has diverged, however
#: short it is (a stable step never raises the loss by orders of magnitude).
DIVERGED_GROWTH = 1e4

#: Inputs larger than this in absolute value are refused: a product with weights of
#: size ~10 over d ≤ 1e6 terms stays far below the float64 limit (1.8e308).
MAX_ABS_INPUT = 1e150
