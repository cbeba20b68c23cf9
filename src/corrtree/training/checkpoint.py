"""Checkpoints: the full state of a training run in one ``.npz`` file, without pickle.

A checkpoint holds the model, the history so far, and every array and
number of the trainer (anchored products, tracked pairs, heaps, buffers...),
so a resumed run performs exactly the same floating-point operations as an
uninterrupted one and ends with bit-for-bit the same weights.  The object
graph is described by a JSON manifest whose classes come from a fixed list;
arrays are stored as plain ``.npz`` members and read with
``allow_pickle=False``.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from typing import Any

import numpy as np

from .._io import atomic_savez
from ..model import TwoLayerReLU
from ..trees import CorrelationDTree, CorrelationWTree
from ._band import BandState, Pool
from ._base import Timer, Trainer
from .dense import DenseTrainer
from .dtree import DTreeTrainer
from .history import History
from .kernel import KernelTrainer
from .lazy import LazyTrainer
from .wtree import WTreeTrainer

__all__ = ["CheckpointError", "data_digest", "load_checkpoint", "save_checkpoint"]

FORMAT = "corrtree.checkpoint/1"
_CLASSES = {cls.__name__: cls for cls in (
    DenseTrainer, DTreeTrainer, WTreeTrainer, LazyTrainer, KernelTrainer, BandState, Pool,
    CorrelationDTree, CorrelationWTree, Timer)}


class CheckpointError(ValueError):
    """A checkpoint file is missing pieces, corrupted, or belongs to other data."""


def data_digest(X: np.ndarray, Y: np.ndarray) -> str:
    """SHA-256 of the training data, to refuse resuming on different data."""
    h = hashlib.sha256()
    for A in (X, Y):
        A = np.ascontiguousarray(A, dtype=np.float64)
        h.update(str(A.shape).encode())
        h.update(A.tobytes())
    return h.hexdigest()


class _Writer:
    def __init__(self, shared: dict[int, str]) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.shared = shared

    def value(self, v: Any) -> dict[str, Any]:
        if id(v) in self.shared:
            return {"ref": self.shared[id(v)]}
        if isinstance(v, np.ndarray):
            name = f"a{len(self.arrays)}"
            self.arrays[name] = v
            return {"array": name}
        if isinstance(v, np.dtype):
            return {"dtype": v.str}
        if v is None or isinstance(v, bool | int | float | str):
            return {"value": v}
        if isinstance(v, np.generic):
            return {"value": v.item()}
        if isinstance(v, tuple):
            return {"tuple": [self.value(e) for e in v]}
        if isinstance(v, dict):
            return {"dict": {str(k): self.value(e) for k, e in v.items()}}
        if type(v).__name__ in _CLASSES and _CLASSES[type(v).__name__] is type(v):
            return {"object": type(v).__name__,
                    "attrs": {k: self.value(e) for k, e in vars(v).items()}}
        raise TypeError(f"cannot checkpoint a {type(v).__name__}")


class _Reader:
    def __init__(self, arrays: Any, shared: dict[str, Any]) -> None:
        self.arrays = arrays
        self.shared = shared

    def value(self, spec: dict[str, Any]) -> Any:
        if "ref" in spec:
            return self.shared[spec["ref"]]
        if "array" in spec:
            return np.array(self.arrays[spec["array"]])  # writable copy
        if "dtype" in spec:
            return np.dtype(spec["dtype"])
        if "value" in spec:
            return spec["value"]
        if "tuple" in spec:
            return tuple(self.value(e) for e in spec["tuple"])
        if "dict" in spec:
            return {k: self.value(e) for k, e in spec["dict"].items()}
        if "object" in spec:
            cls = _CLASSES.get(spec["object"])
            if cls is None:
                raise CheckpointError(f"unknown class {spec['object']!r} in checkpoint")
            obj = cls.__new__(cls)
            for k, e in spec["attrs"].items():
                setattr(obj, k, self.value(e))
            return obj
        raise CheckpointError(f"malformed checkpoint entry {spec!r}")


def save_checkpoint(path: str | os.PathLike, model: TwoLayerReLU, trainer: Trainer,
                    history: History, meta: dict[str, Any]) -> None:
    """Write the run's state to ``path`` atomically."""
    shared = {id(model._W): "W", id(model._a): "a", id(trainer.X): "X", id(trainer.Y): "Y",
              id(trainer.G): "G"}
    writer = _Writer(shared)
    attrs = {k: writer.value(v) for k, v in vars(trainer).items()
             if k not in ("model", "X", "Y", "G", "a")}
    manifest = {"format": FORMAT, "trainer": type(trainer).__name__, "attrs": attrs,
                "history": history.as_dict(), "meta": meta, "b": model.b,
                "squeeze": model._squeeze}
    atomic_savez(path, manifest=np.array(json.dumps(manifest)), model_W=model._W,
                 model_a=model._a, **writer.arrays)


def load_checkpoint(path: str | os.PathLike, X: np.ndarray, Y: np.ndarray, G: np.ndarray
                    ) -> tuple[TwoLayerReLU, Trainer, History, dict[str, Any]]:
    """Rebuild ``(model, trainer, history, meta)`` from ``path`` for the data ``X, Y``.

    Raises
    ------
    CheckpointError
        If the file is unreadable, truncated, not a checkpoint, or was written
        for other data.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            if "manifest" not in data.files:
                raise CheckpointError(f"{path} is not a corrtree checkpoint")
            manifest = json.loads(str(data["manifest"]))
            if manifest.get("format") != FORMAT:
                raise CheckpointError(f"{path} is not a corrtree checkpoint")
            if manifest["meta"]["data_digest"] != data_digest(X, Y):
                raise CheckpointError(f"{path} was written for different training data")
            W, a = np.array(data["model_W"]), np.array(data["model_a"])
            model = TwoLayerReLU(W, a[:, 0] if manifest["squeeze"] else a, manifest["b"])
            shared = {"W": model._W, "a": model._a, "X": X, "Y": Y, "G": G}
            cls = _CLASSES.get(manifest["trainer"])
            if cls is None or not issubclass(cls, Trainer):
                raise CheckpointError(f"unknown trainer {manifest['trainer']!r}")
            trainer = cls.__new__(cls)
            reader = _Reader(data, shared)
            for k, spec in manifest["attrs"].items():
                setattr(trainer, k, reader.value(spec))
    except FileNotFoundError:
        raise
    except CheckpointError:
        raise
    except (OSError, EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    trainer.model, trainer.X, trainer.Y, trainer.G = model, X, Y, G
    trainer.a = model._a
    return model, trainer, History.from_dict(manifest["history"]), manifest["meta"]
