"""Named, versioned trainer state: the schema a checkpoint is checked against.

Every trainer declares a :class:`Schema`: the name, dtype and shape of each
array of its state (shapes in the run's sizes ``n, m, d, K`` or in sizes the
state itself fixes, such as a pool's capacity), the range of each index array,
and the scalars with their bounds; cross-field invariants (monotone index
pointers, segments inside their pool) are checked by the trainer's own hook.
:meth:`Schema.check` runs before any kernel sees the data and raises
:class:`CheckpointError` naming the field, so a damaged or hand-edited
checkpoint gives a one-line error, never a crash or a silently wrong run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CheckpointError", "Field", "Scalar", "Schema", "check_csr", "fail"]


class CheckpointError(ValueError):
    """A checkpoint file is missing pieces, corrupted, or belongs to another run or data."""


def fail(name: str, message: str) -> None:
    raise CheckpointError(f"checkpoint field {name!r}: {message}")


@dataclass(frozen=True)
class Field:
    """An array of the state.

    ``shape`` holds ints or size names (``"n"``, ``"m"``, ``"d"``, ``"K"``,
    ``"nK"``, ``"n1"`` = n + 1, ``"m1"`` = m + 1, or a new name that the first
    field using it fixes).  ``index``: every value lies in ``[0, size)``.
    """

    name: str
    dtypes: tuple[str, ...]
    shape: tuple[int | str, ...]
    index: str | None = None
    finite: bool = True  # False: infinities allowed (never NaN)
    optional: bool = False


@dataclass(frozen=True)
class Scalar:
    """A number of the state, with inclusive bounds (size names allowed)."""

    name: str
    kind: type
    low: float | str | None = None
    high: float | str | None = None


@dataclass(frozen=True)
class Schema:
    """The state of one trainer class, at one version."""

    version: int
    fields: tuple[Field, ...]
    scalars: tuple[Scalar, ...] = ()

    def check(
        self, arrays: dict[str, np.ndarray], scalars: dict[str, Any], sizes: dict[str, int]
    ) -> dict[str, int]:
        """Check ``arrays`` and ``scalars`` against the schema; returns the sizes,
        including those the state fixed.  Raises :class:`CheckpointError`."""
        sizes = dict(sizes)
        sizes.setdefault("nK", sizes["n"] * sizes["K"])
        sizes.setdefault("n1", sizes["n"] + 1)
        sizes.setdefault("m1", sizes["m"] + 1)
        known = {f.name for f in self.fields}
        for name in arrays:
            if name not in known:
                fail(name, "not part of this trainer's state")
        for f in self.fields:
            if f.name not in arrays:
                if f.optional:
                    continue
                fail(f.name, "missing")
            _check_array(f, arrays[f.name], sizes)
        names = {s.name for s in self.scalars}
        for name in scalars:
            if name not in names:
                fail(name, "not part of this trainer's state")
        for s in self.scalars:
            if s.name not in scalars:
                fail(s.name, "missing")
            _check_scalar(s, scalars[s.name], sizes)
        return sizes


def _size(value: float | str, sizes: dict[str, int]) -> float:
    return sizes[value] if isinstance(value, str) else value


def _check_array(f: Field, a: Any, sizes: dict[str, int]) -> None:
    if not isinstance(a, np.ndarray):
        fail(f.name, f"expected an array, got {type(a).__name__}")
    if a.dtype.str.lstrip("<>=|") not in f.dtypes:
        fail(f.name, f"expected dtype {' or '.join(f.dtypes)}, got {a.dtype}")
    if a.ndim != len(f.shape):
        fail(f.name, f"expected {len(f.shape)} dimensions, got shape {a.shape}")
    for axis, want in enumerate(f.shape):
        if isinstance(want, str) and want not in sizes:
            sizes[want] = int(a.shape[axis])  # the first field using a new size fixes it
        if a.shape[axis] != _size(want, sizes):
            fail(f.name, f"expected shape {tuple(_size(w, sizes) for w in f.shape)}, got {a.shape}")
    if a.dtype.kind == "f" and a.size:
        if f.finite and not np.isfinite(a).all():
            fail(f.name, "holds NaN or infinite values")
        if np.isnan(a).any():
            fail(f.name, "holds NaN")
    if f.index is not None and a.size:
        high = _size(f.index, sizes)
        if a.min() < 0 or a.max() >= high:
            fail(f.name, f"holds an index outside [0, {high})")


def _check_scalar(s: Scalar, v: Any, sizes: dict[str, int]) -> None:
    if s.kind is float:
        ok = isinstance(v, int | float) and not isinstance(v, bool)
    else:
        ok = isinstance(v, s.kind) and not (s.kind is int and isinstance(v, bool))
    if not ok:
        fail(s.name, f"expected {s.kind.__name__}, got {type(v).__name__}")
    if s.kind in (int, float):
        if s.kind is float and not math.isfinite(v):
            fail(s.name, f"must be finite, got {v!r}")
        low = None if s.low is None else _size(s.low, sizes)
        high = None if s.high is None else _size(s.high, sizes)
        if (low is not None and v < low) or (high is not None and v > high):
            fail(s.name, f"must lie in [{low}, {high}], got {v!r}")


def check_csr(
    name: str, indptr: np.ndarray, idx: np.ndarray, cols: int, sorted_rows: bool = True
) -> None:
    """A CSR pattern: ``indptr`` starts at 0, never decreases and ends at ``len(idx)``;
    indices lie in ``[0, cols)`` and increase within a row."""
    if indptr.shape[0] < 1 or indptr[0] != 0 or indptr[-1] != idx.shape[0]:
        fail(name, "index pointer must start at 0 and end at the number of indices")
    if np.any(np.diff(indptr) < 0):
        fail(name, "index pointer decreases")
    if idx.size and (idx.min() < 0 or idx.max() >= cols):
        fail(name, f"holds an index outside [0, {cols})")
    if sorted_rows and idx.shape[0] > 1:
        step = np.diff(idx) > 0
        starts = indptr[1:-1]
        starts = starts[(starts > 0) & (starts < idx.shape[0])]
        step[starts - 1] = True  # a new row may start lower
        if not step.all():
            fail(name, "indices must increase within a row")
