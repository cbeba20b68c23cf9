"""Input validation shared by every public entry point.

Every check runs before any kernel does and raises ``ValueError``, ``IndexError``
or ``MemoryError`` with a message that names the offending argument.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable

import numpy as np

from ._io import check_file_target
from ._memory import format_bytes, system_available

__all__ = [
    "as_matrix",
    "as_vector",
    "available_memory",
    "check_index",
    "check_indices",
    "check_memory",
    "check_positive_int",
    "check_real",
    "check_rows",
    "check_shape_2d",
    "format_bytes",
    "readonly",
    "widest_fitting",
]


def available_memory() -> int:
    """Bytes of memory this process can still allocate: ``MemAvailable``, or less under
    a memory cgroup's limit (:func:`corrtree._memory.system_available`).  Every memory
    check reads it here, one place to replace in tests."""
    return system_available()


def check_memory(
    nbytes: float, what: str, hint: str = "", available: float | None = None, where: str = ""
) -> None:
    """Raise ``MemoryError`` naming ``what`` if ``nbytes`` cannot fit in ``available``
    bytes (default :func:`available_memory`; ``where``: whose memory it is, e.g. "on
    cuda:0"); the message ends with ``hint`` (what would fit instead), if given."""
    avail = available_memory() if available is None else available
    if nbytes > avail:
        raise MemoryError(
            f"{what} needs {format_bytes(nbytes)} but only {format_bytes(avail)} "
            f"of memory is available{where}" + (f"; {hint}" if hint else "")
        )


def widest_fitting(bytes_at: Callable[[int], float], m: int, available: float | None = None) -> int:
    """The largest power of two below ``m`` whose ``bytes_at(width)`` fits in
    ``available`` bytes (default :func:`available_memory`); 0 if none does."""
    avail = available_memory() if available is None else available
    width = 1 << max(int(m - 1).bit_length() - 1, 0)
    while width >= 1 and bytes_at(width) > avail:
        width //= 2
    return width if width < m else 0


def check_file_path(name: str, path: object) -> str | os.PathLike:
    """A file path the run may write later (a checkpoint): a string or path, not a folder,
    under folders that are folders or absent (``_io.check_file_target``).  One line
    naming ``name`` otherwise, before any work, rather than at the first save."""
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise ValueError(f"{name} must be a file path, got {path!r}")
    try:
        check_file_target(path)
    except OSError as exc:
        raise ValueError(f"{name}={str(path)!r}: {exc.strerror}") from None
    return path


def check_shape_2d(name: str, A: object) -> tuple[int, int]:
    """Check that ``A`` is a non-empty 2-D real array and return its shape.

    Nothing is copied, so this is safe on huge (e.g. broadcast) inputs whose
    conversion would not fit in memory.
    """
    arr = A if isinstance(A, np.ndarray) else np.asarray(A)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got {arr.ndim}-D with shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must have a real numeric dtype, got {arr.dtype}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must not be empty, got shape {arr.shape}")
    return int(arr.shape[0]), int(arr.shape[1])


def as_matrix(name: str, A: object, *, copy: bool = True) -> np.ndarray:
    """Return ``A`` as a C-contiguous float64 2-D array with finite entries.

    Parameters
    ----------
    name : str
        Argument name used in error messages.
    A : array_like
        Input; must be 2-D, non-empty and of a real numeric dtype.
    copy : bool, default True
        Always return a new array (so later in-place updates never touch the
        caller's data).
    """
    check_shape_2d(name, A)
    out = np.array(A, dtype=np.float64, order="C", copy=True if copy else None)
    if not np.isfinite(out).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return out


def check_real(name: str, x: object, *, allow_inf: bool = False) -> float:
    """Return ``x`` as a float, rejecting NaN (and infinities unless allowed)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {x!r}")
    v = float(x)
    if math.isnan(v) or (not allow_inf and math.isinf(v)):
        raise ValueError(f"{name} must be a finite real number, got {x!r}")
    return v


def check_positive_int(name: str, x: object, *, minimum: int = 1) -> int:
    """Return ``x`` as an int that is at least ``minimum``."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {x!r}")
    if int(x) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return int(x)


def check_index(name: str, i: object, size: int) -> int:
    """Return ``i`` as an int in ``[0, size)`` or raise ``IndexError``."""
    if isinstance(i, bool) or not isinstance(i, numbers.Integral):
        raise IndexError(f"{name} must be an integer index, got {i!r}")
    j = int(i)
    if not 0 <= j < size:
        raise IndexError(f"{name}={j} is out of range [0, {size})")
    return j


def check_indices(name: str, idx: object, size: int) -> np.ndarray:
    """Return ``idx`` as a 1-D int64 array with every entry in ``[0, size)``."""
    arr = np.asarray(idx)
    if arr.ndim != 1:
        raise IndexError(f"{name} must be a 1-D array of indices, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise IndexError(f"{name} must hold integer indices, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= size):
        bad = arr[(arr < 0) | (arr >= size)][0]
        raise IndexError(f"{name} holds index {bad}, out of range [0, {size})")
    return np.ascontiguousarray(arr)


def as_vector(name: str, z: object, d: int) -> np.ndarray:
    """Return ``z`` as a finite float64 vector of length ``d``."""
    arr = np.asarray(z)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must have a real numeric dtype, got {arr.dtype}")
    if arr.shape[0] != d:
        raise ValueError(f"{name} must have length d={d}, got {arr.shape[0]}")
    out = np.array(arr, dtype=np.float64, copy=True)
    if not np.isfinite(out).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return out


def check_rows(name: str, Z: object, k: int, d: int) -> np.ndarray:
    """Return ``Z`` as a finite C-contiguous float64 array of shape ``(k, d)`` (not a
    copy when it already is one: callers only read it)."""
    arr = np.asarray(Z)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {arr.shape}")
    if arr.shape != (k, d):
        raise ValueError(f"{name} must have shape ({k}, {d}), got {arr.shape}")
    if k == 0:
        return np.empty((0, d), dtype=np.float64)
    return as_matrix(name, arr, copy=False)


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``."""
    v = a.view()
    v.flags.writeable = False
    return v
