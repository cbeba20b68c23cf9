"""Storage of the band trainers: the pool of tracked pairs and the per-neuron tables.

A *tracked pair* (an *entry*) is a pair ``(r, j)`` whose exact product the lazy
and kernel trainers keep (see ``docs/design.md``, "Band trainers").  Entries
live in :class:`PoolArrays`, one flat array per field; neuron ``r`` owns the
segment ``[seg[r, START], seg[r, START] + seg[r, CNT])`` of capacity
``seg[r, CAP]``, whose first ``seg[r, SUPP]`` entries are the pairs that ever
fired (they never move), ``seg[r, NFIRE]`` of them firing now.  The float table
``nf`` holds the neuron's drift bookkeeping (columns below).
"""

from __future__ import annotations

import mmap
from collections import namedtuple

import numpy as np

from .. import _config

__all__ = [
    "BETA",
    "CAP",
    "CNT",
    "DRIFT",
    "KEY",
    "LEAF_ERR",
    "MINKEY",
    "NFIRE",
    "POOL_DTYPES",
    "SIGMA",
    "SIGMA_UNKNOWN",
    "START",
    "SUPP",
    "Pool",
    "PoolArrays",
    "zeros",
]

# columns of the per-neuron integer table ``seg`` (int64, m × 5)
START, CNT, CAP, SUPP, NFIRE = range(5)
# columns of the per-neuron float table ``nf`` (float64, m × 6):
#   DRIFT     bound on the distance the neuron moved since its anchor, summed per step
#   MINKEY    smallest key among its entries outside the ever-fired prefix (lazy)
#   BETA      its band half-width β
#   LEAF_ERR  bound on the error of its stored anchored row (0 when exact)
#   KEY       the value of P at which it must be looked at again (kernel)
#   SIGMA     sqrt of a Gershgorin bound on λ_max(G) over its fire set, or
#             SIGMA_UNKNOWN once the fire set changed (recomputed when needed)
DRIFT, MINKEY, BETA, LEAF_ERR, KEY, SIGMA = range(6)
SIGMA_UNKNOWN = -1.0

#: One flat array per field of the entries; a numba-compatible namedtuple, so
#: kernels read ``pool.val[q]`` and a new field cannot shift the others.
PoolArrays = namedtuple(
    "PoolArrays",
    (
        "j",  # int32: the data point of the pair
        "uref",  # float64: exact product at the neuron's anchor
        "val",  # float64: exact product at the last evaluation
        "key",  # float64: lazy: drift at which the entry must be evaluated again
        "kappa",  # float64: frozen part of the pair's coefficient C_rj
        "cref",  # float64: coefficient at the anchor
        "fire",  # bool: firing now
        "clast",  # float64: coefficient at the neuron's last evaluation
        "vel",  # float64: momentum coefficient (linear optimizers, optim.py); else empty
    ),
)

POOL_DTYPES = PoolArrays(  # fields of the entries, by name
    j=np.int32,
    uref=np.float64,
    val=np.float64,
    key=np.float64,
    kappa=np.float64,
    cref=np.float64,
    fire=np.bool_,
    clast=np.float64,
    vel=np.float64,
)


def zeros(size: int, dtype: type) -> np.ndarray:
    """``np.zeros(size, dtype)``, in memory the kernel backs with small pages when it
    holds at least :data:`~corrtree._config.POOL_SMALL_PAGES_BYTES` (where the
    platform can say so, Linux).

    numpy asks for transparent huge pages for large arrays.  The pool's first writes
    go segment by segment from parallel threads, and a huge-page fault of fresh memory
    costs far more per byte than small-page faults (``docs/design.md``, "Measurements
    behind the choices").  The entries are read a segment at a time, so small pages
    cost the iterations nothing measurable.  O(size) on first touch.
    """
    dt = np.dtype(dtype)
    nbytes = int(size) * dt.itemsize
    small = nbytes == 0 or nbytes < _config.POOL_SMALL_PAGES_BYTES
    if small or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.zeros(size, dtype=dt)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # zero-filled
    buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=dt, count=int(size))


def _by_name():
    return zip(PoolArrays._fields, POOL_DTYPES, strict=True)


class Pool:
    """Growable :class:`PoolArrays`: ``arrays`` holds the fields, ``used`` the
    number of places handed out to segments."""

    FIELDS = PoolArrays._fields

    def __init__(self, capacity: int) -> None:
        capacity = max(16, int(capacity))
        self.arrays = PoolArrays(
            *(zeros(capacity if k != "vel" else 0, dt) for k, dt in _by_name())
        )
        self.used = 0

    @classmethod
    def from_arrays(cls, arrays: PoolArrays, used: int) -> Pool:
        """A pool over existing field arrays (e.g. from a checkpoint; ``vel`` may be empty)."""
        pool = cls.__new__(cls)
        pool.arrays = PoolArrays(
            *(np.ascontiguousarray(a, dtype=dt) for a, dt in zip(arrays, POOL_DTYPES, strict=True))
        )
        pool.used = int(used)
        return pool

    @property
    def capacity(self) -> int:
        return self.arrays.j.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the places handed out (the rest of the capacity is reserved address
        space, committed on first write)."""
        return sum(a.itemsize * min(self.used, a.shape[0]) for a in self.arrays)

    @staticmethod
    def segment_caps(counts: np.ndarray, tight: bool = False) -> np.ndarray:
        """The places :meth:`place` gives segments of ``counts`` entries: the count plus
        a slack (:data:`~corrtree._config.SEGMENT_SLACK_DIV` and ``_ADD``, or their
        ``_TIGHT`` variants)."""
        if tight:
            div, add = _config.SEGMENT_SLACK_DIV_TIGHT, _config.SEGMENT_SLACK_ADD_TIGHT
        else:
            div, add = _config.SEGMENT_SLACK_DIV, _config.SEGMENT_SLACK_ADD
        return counts + counts // div + add

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more places at the end (amortized growth)."""
        need = self.used + int(extra)
        if need <= self.capacity:
            return
        new_cap = max(need, int(self.capacity * _config.POOL_GROWTH))
        grown = []
        for a in self.arrays:
            b = zeros(new_cap if a.shape[0] else 0, a.dtype)  # empty vel stays empty
            b[: self.used] = a[: self.used]
            grown.append(b)
        self.arrays = PoolArrays(*grown)

    def use_velocities(self) -> None:
        """Give the entries momentum coefficients (zero), once: only linear optimizers
        (``optim.py``) use them."""
        if self.arrays.vel.shape[0] != self.capacity:
            self.arrays = self.arrays._replace(vel=zeros(self.capacity, np.float64))

    def place(
        self, seg: np.ndarray, rows: np.ndarray, counts: np.ndarray, tight: bool = False
    ) -> None:
        """Give each neuron of ``rows`` a fresh, empty segment of capacity above its count
        (:meth:`segment_caps`; ``tight``: with the smaller slack)."""
        caps = self.segment_caps(counts, tight)
        self.reserve(int(caps.sum()))
        starts = self.used + np.concatenate(([0], np.cumsum(caps)[:-1]))
        seg[rows, START] = starts
        seg[rows, CAP] = caps
        seg[rows, CNT] = 0
        self.used += int(caps.sum())
