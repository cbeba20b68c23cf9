"""Checkpoints: the full state of a training run in one ``.npz`` file, without pickle.

A checkpoint holds the model's ``W(0)`` and output weights, the history so
far, the run's bookkeeping (``meta``: its id, the digest of its data, its
length) and the trainer's named state (:meth:`Trainer.state`, described by
the trainer's versioned :attr:`~corrtree.training._base.Trainer.SCHEMA`), so
a resumed run performs exactly the same floating-point operations as an
uninterrupted one and ends with bit-for-bit the same weights.  A JSON
manifest carries the scalars and a BLAKE2 digest of everything, so a damaged
file is refused before anything is used; the arrays are plain ``.npz``
members read with ``allow_pickle=False`` and checked against the schema
before any kernel sees them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from typing import Any

import numpy as np

from .._implicit import ImplicitWeights
from .._io import atomic_savez, digest_of, open_npz
from ..model import TwoLayerReLU
from ._base import Trainer
from ._registry import DEVICE_TRAINERS, TRAINERS
from ._state import CheckpointError
from .history import History

__all__ = [
    "FORMAT",
    "CheckpointError",
    "check_entries",
    "check_overwritable",
    "data_digest",
    "digest_of",
    "load_checkpoint",
    "model_arrays",
    "model_from_arrays",
    "save_checkpoint",
]

FORMAT = "corrtree.checkpoint/2"
_STATE = "state_"  # prefix of the trainer's arrays among the members


def data_digest(X: np.ndarray, Y: np.ndarray) -> str:
    """SHA-256 of the training data, to refuse resuming on different data."""
    h = hashlib.sha256()
    for A in (X, Y):
        A = np.ascontiguousarray(A, dtype=np.float64)
        h.update(str(A.shape).encode())
        h.update(A.tobytes())
    return h.hexdigest()


def save_checkpoint(
    path: str | os.PathLike,
    model: TwoLayerReLU,
    trainer: Trainer,
    history: History,
    meta: dict[str, Any],
) -> str:
    """Write the run's state to ``path`` atomically; returns the file's digest."""
    state, scalars = trainer.state()
    arrays = {
        **model_arrays(model),
        "model_a": model.output_weights,
        **{_STATE + k: v for k, v in state.items()},
    }
    manifest = {
        "format": FORMAT,
        "trainer": trainer.name,
        "schema": trainer.SCHEMA.version,
        "lr": trainer.lr,
        "width": trainer.width,
        "b": model.b,
        "squeeze": model.a.ndim == 1,
        "scalars": scalars,
        "array_state": bool(getattr(trainer, "ARRAY_STATE", False)),
        "history": history.as_dict(),
        "meta": meta,
    }
    manifest["digest"] = digest_of(manifest, arrays)
    atomic_savez(path, manifest=np.array(json.dumps(manifest)), **arrays)
    return str(manifest["digest"])


def check_overwritable(name: str, path: str | os.PathLike) -> None:
    """Refuse, in one line naming ``name``, a checkpoint path where a file that is not a
    corrtree checkpoint (of any version or kind) stands: a run would replace it at its
    first save (``checkpoint="data.csv"``).  Reads the manifest only; nothing there, or a
    checkpoint, is fine."""
    if not os.path.isfile(path):
        return
    fmt = None
    try:
        with open_npz(path) as data:
            if "manifest" in data.files:
                fmt = json.loads(str(data["manifest"])).get("format")
    except (OSError, EOFError, ValueError, AttributeError, zipfile.BadZipFile):
        pass
    if not (isinstance(fmt, str) and fmt.startswith("corrtree.")):
        raise ValueError(
            f"{name}={str(path)!r} is a file that is not a corrtree checkpoint, which the "
            "run would replace: give another path, or remove the file"
        )


def read_manifest(path: str | os.PathLike, formats: tuple[str, ...] = (FORMAT,)) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path``; its format must be one of ``formats``
    (a one-process checkpoint checks its entries too)."""
    with _open(path) as data:
        try:
            raw = json.loads(str(data["manifest"]))
        except (KeyError, OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"{path} is not a corrtree checkpoint ({exc})") from exc
        if not isinstance(raw, dict) or raw.get("format") not in formats:
            raise CheckpointError(
                f"{path} is not a corrtree checkpoint of format {' or '.join(formats)}"
            )
        return _manifest(path, data) if raw["format"] == FORMAT else raw


def load_checkpoint(
    path: str | os.PathLike, X: np.ndarray, Y: np.ndarray, G: np.ndarray, device: Any = None
) -> tuple[TwoLayerReLU, Trainer, History, dict[str, Any]]:
    """Rebuild ``(model, trainer, history, meta)`` from ``path`` for the data ``X, Y``;
    with ``device`` (a ``torch.device``), the trainer of the array path on it (a
    checkpoint of either path resumes on either).

    Raises
    ------
    CheckpointError
        If the file is unreadable, truncated, altered, not a checkpoint, of an
        unknown version, or was written for other data.
    """
    with _open(path) as data:
        manifest = _manifest(path, data)
        try:
            arrays = {k: np.array(data[k]) for k in data.files if k != "manifest"}
        except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if manifest.get("digest") != digest_of(manifest, arrays):
        raise CheckpointError(f"checkpoint {path} is damaged (its digest does not match)")
    meta = manifest["meta"]
    if meta.get("data_digest") != data_digest(X, Y):
        raise CheckpointError(f"{path} was written for different training data")
    cls = (TRAINERS if device is None else DEVICE_TRAINERS).get(manifest["trainer"])
    if cls is None and device is not None and manifest["trainer"] in TRAINERS:
        raise CheckpointError(
            f"{path}: method {manifest['trainer']!r} has no device path; resume it with device=None"
        )
    if cls is None:
        raise CheckpointError(f"{path}: unknown trainer {manifest['trainer']!r}")
    if manifest.get("array_state", False) != getattr(cls, "ARRAY_STATE", False):
        where = "on a device (device=...)" if manifest.get("array_state") else "with device=None"
        raise CheckpointError(
            f"{path}: the state of method {manifest['trainer']!r} was written by the "
            f"{'array' if manifest.get('array_state') else 'CPU'} path; resume it {where}"
        )
    if manifest["schema"] != cls.SCHEMA.version:
        raise CheckpointError(
            f"{path}: state version {manifest['schema']!r} of trainer "
            f"{cls.name!r} is not {cls.SCHEMA.version} (written by another "
            "corrtree version)"
        )
    model = model_from_arrays(path, arrays, manifest, X.shape[1], Y.shape[1])
    try:
        history = History.from_dict(manifest["history"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path}: bad history ({exc})") from exc
    state = {k[len(_STATE) :]: v for k, v in arrays.items() if k.startswith(_STATE)}
    width = manifest.get("width", model.m)
    if isinstance(width, bool) or not isinstance(width, int) or width < model.m:
        raise CheckpointError(f"{path}: manifest entry 'width' must be an integer >= m")
    trainer = cls.restore(model, X, Y, G, manifest["lr"], state, manifest["scalars"], width, device)
    return model, trainer, history, meta


def _open(path: str | os.PathLike):
    try:
        return open_npz(path)
    except FileNotFoundError:
        raise
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc


def _manifest(path: str | os.PathLike, data: Any) -> dict[str, Any]:
    try:
        manifest = json.loads(str(data["manifest"]))
    except (KeyError, OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{path} is not a corrtree checkpoint ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a corrtree checkpoint of format {FORMAT}")
    kinds = {
        "trainer": str,
        "schema": int,
        "lr": float,
        "b": float,
        "squeeze": bool,
        "scalars": dict,
        "history": dict,
        "meta": dict,
        "digest": str,
    }
    check_entries(path, manifest, kinds)
    if not manifest["lr"] > 0:
        raise CheckpointError(f"{path}: manifest entry 'lr' must be > 0")
    return manifest


def check_entries(
    path: str | os.PathLike, manifest: dict[str, Any], kinds: dict[str, type]
) -> None:
    """Every ``manifest[key]`` is a ``kind`` (``float``: a finite number, ``int``: not a
    bool), or CheckpointError naming the entry."""
    for key, kind in kinds.items():
        value = manifest.get(key)
        if kind is float:
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
            )
        else:
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise CheckpointError(f"{path}: manifest entry {key!r} must be a {kind.__name__}")


def model_arrays(model: TwoLayerReLU) -> dict[str, np.ndarray]:
    """The model's weights as checkpoint members: ``model_W``, or for an implicit model
    its seed, coefficients and points (``model_w_*``, :meth:`ImplicitWeights.arrays`)."""
    if model.implicit:
        return model.implicit_weights.arrays("model_w_")
    return {"model_W": model.W}


def model_from_arrays(
    path: str | os.PathLike,
    arrays: dict[str, np.ndarray],
    manifest: dict[str, Any],
    d: int,
    outputs: int,
) -> TwoLayerReLU:
    """The model of a checkpoint from its ``model_W``, ``model_a`` (float64, shapes that
    fit ``d`` and ``outputs``) and the manifest's ``b``, or from the ``model_w_*`` of an
    implicit model; CheckpointError otherwise."""
    if "model_w_seed" in arrays:
        return _implicit_from_arrays(path, arrays, manifest, d, outputs)
    W, a = arrays.get("model_W"), arrays.get("model_a")
    if W is None or a is None:
        raise CheckpointError(f"{path}: the model's arrays are missing")
    if W.dtype != np.float64 or a.dtype != np.float64:
        raise CheckpointError(
            f"{path}: the model's arrays must be float64, got {W.dtype} and {a.dtype}"
        )
    if W.ndim != 2 or W.shape[1] != d:
        raise CheckpointError(
            f"{path}: the checkpointed model has weights of shape "
            f"{W.shape}, not (m, {d}) for this data"
        )
    if a.ndim != 2 or a.shape != (W.shape[0], outputs):
        raise CheckpointError(
            f"{path}: the checkpointed model has output weights of shape "
            f"{a.shape}, not ({W.shape[0]}, {outputs}) for these targets"
        )
    try:
        return TwoLayerReLU(W, a[:, 0] if manifest["squeeze"] else a, manifest["b"])
    except ValueError as exc:
        raise CheckpointError(f"{path}: bad model ({exc})") from exc


def _implicit_from_arrays(path, arrays, manifest, d, outputs) -> TwoLayerReLU:
    try:
        src = ImplicitWeights.from_arrays(arrays, "model_w_")
    except ValueError as exc:
        raise CheckpointError(f"{path}: bad implicit model ({exc})") from exc
    a = arrays.get("model_a")
    if src.d != d:
        raise CheckpointError(
            f"{path}: the checkpointed model has d={src.d}, not {d} for this data"
        )
    if a is None or a.dtype != np.float64 or a.shape != (src.m, outputs):
        raise CheckpointError(
            f"{path}: the checkpointed model's output weights must be float64 of shape "
            f"({src.m}, {outputs})"
        )
    if not np.isin(a, (-1.0, 1.0)).all() or not manifest["b"] == manifest["b"]:
        raise CheckpointError(f"{path}: bad model (a must hold only +1 and -1)")
    return TwoLayerReLU._of_implicit(src, np.array(a), manifest["b"], manifest["squeeze"])
