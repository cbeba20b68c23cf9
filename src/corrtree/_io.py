"""Atomic file writes: a temporary file in the same folder, then ``os.replace``."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ._memory import format_bytes

__all__ = [
    "atomic_savez",
    "atomic_write_json",
    "atomic_write_npy",
    "atomic_write_text",
    "check_file_target",
    "digest_of",
    "open_npz",
    "remove_stale_temporaries",
]


def _atomic(path: str | os.PathLike, write, size: float = 0) -> Path:
    """Write ``path`` through ``write(fh)`` into a temporary file of its folder, then
    rename it: ``path`` is either as it was or complete.  ``size``: the bytes it will
    take, refused in one line (``ENOSPC``, naming ``path``) when the disk has less room
    left; a disk that fills during the write also leaves ``path`` as it was and no
    temporary file behind."""
    path = check_file_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if size:
        free = shutil.disk_usage(path.parent).free
        if size > free:
            raise OSError(
                errno.ENOSPC,
                f"no room to write {format_bytes(size)} (only {format_bytes(free)} free on "
                f"its disk)",
                str(path),
            )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; give it normal permissions
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def check_file_target(path: str | os.PathLike) -> Path:
    """``path`` as a file that can be written: not a folder, and every folder above it
    either a folder or absent (made when written).  Raises ``IsADirectoryError`` or
    ``NotADirectoryError`` in one line naming the path; checks names only, writes
    nothing, so a run can refuse a bad target before its first step."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder; give a file name", str(path))
    for above in path.parents:
        if above.exists():
            if not above.is_dir():
                raise NotADirectoryError(
                    errno.ENOTDIR, f"{above} is a file, so it cannot hold one", str(path)
                )
            break
    return path


def open_npz(path: str | os.PathLike) -> np.lib.npyio.NpzFile:
    """``np.load(path, allow_pickle=False)`` of an ``.npz`` archive, to be closed by the
    caller (a ``with`` block).  A file that is not one raises ``ValueError`` saying so:
    a single ``.npy`` array (``np.load`` would return it), or anything numpy does not
    recognize (which numpy would offer to unpickle: corrtree never does)."""
    try:
        data = np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" not in str(exc):
            raise
        raise ValueError("not an .npz archive (corrtree reads its files without pickle)") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError("a single .npy array, not an .npz archive")
    return data


def atomic_write_npy(
    path: str | os.PathLike, shape: tuple[int, int], blocks: Iterable[np.ndarray]
) -> Path:
    """Write a float64 ``.npy`` file of ``shape`` from ``blocks`` of rows (in order)
    atomically, holding one block at a time; its size is checked against the disk's
    room first (see :func:`_atomic`)."""

    def write(fh) -> None:
        header = {"descr": "<f8", "fortran_order": False, "shape": tuple(shape)}
        np.lib.format.write_array_header_1_0(fh, header)
        for block in blocks:
            fh.write(np.ascontiguousarray(block, dtype="<f8").tobytes())

    return _atomic(path, write, size=8.0 * shape[0] * shape[1] + 128)


def remove_stale_temporaries(path: str | os.PathLike) -> None:
    """Delete temporary files of ``path`` left by a write that was killed (SIGKILL)."""
    path = Path(path)
    if path.parent.is_dir():
        for tmp in path.parent.glob(f".{path.name}.*.tmp"):
            try:
                tmp.unlink()
            except OSError:
                pass


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return _atomic(path, lambda fh: fh.write(text.encode("utf-8")))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically (NaN and infinities as null)."""
    text = json.dumps(_finite(obj), indent=2, default=_json_default, allow_nan=False)
    return atomic_write_text(path, text + "\n")


def _finite(obj: Any) -> Any:
    """``obj`` with NaN and infinities replaced by ``None`` (JSON has no such numbers)."""
    if isinstance(obj, float | np.floating):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _finite(obj.tolist())
    return obj


def atomic_savez(path: str | os.PathLike, **arrays: np.ndarray) -> Path:
    """Save arrays to an uncompressed ``.npz`` file atomically (no pickled objects),
    refused first when the disk has no room for them."""
    size = sum(np.asarray(a).nbytes + 256 for a in arrays.values())
    return _atomic(path, lambda fh: np.savez(fh, **arrays), size=size)  # type: ignore[arg-type]


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def digest_of(manifest: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    """BLAKE2b of the manifest (without its digest) and of every array."""
    h = hashlib.blake2b(digest_size=32)
    h.update(
        json.dumps({k: v for k, v in manifest.items() if k != "digest"}, sort_keys=True).encode()
    )
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.reshape(-1).view(np.uint8).tobytes())
    return h.hexdigest()
