"""The files of a sharded checkpoint: one per shard, and an atomic manifest that names
them with their digests (``docs/distributed.md``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from ._io import atomic_savez, open_npz, remove_stale_temporaries
from .model import TwoLayerReLU
from .training._registry import TRAINERS
from .training._state import CheckpointError
from .training.checkpoint import check_entries, digest_of, model_arrays
from .training.history import History

__all__ = ["SHARDED_FORMAT", "arrays_of", "check_manifest", "save_shards"]

SHARDED_FORMAT = "corrtree.sharded-checkpoint/1"


def check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """The entries of a sharded manifest, before anything uses them."""
    kinds = {
        "method": str,
        "lr": float,
        "b": float,
        "squeeze": bool,
        "options": dict,
        "shards": list,
        "history": dict,
        "meta": dict,
    }
    check_entries(path, manifest, kinds)
    if manifest["method"] not in TRAINERS or not manifest["lr"] > 0 or not manifest["shards"]:
        raise CheckpointError(f"{path}: bad method, learning rate or shard list")
    edge = 0
    for shard in manifest["shards"]:
        if not (
            isinstance(shard, dict)
            and isinstance(shard.get("file"), str)
            and Path(shard["file"]).name == shard["file"]
            and shard.get("start") == edge
            and isinstance(shard.get("stop"), int)
            and not isinstance(shard.get("stop"), bool)
            and shard["stop"] > edge
        ):
            raise CheckpointError(
                f"{path}: the shard list must cover the neurons in order, with plain file names"
            )
        edge = shard["stop"]
    try:
        History.from_dict(manifest["history"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path}: bad history ({exc})") from exc


def arrays_of(path: Path) -> dict[str, np.ndarray]:
    with open_npz(path) as data:
        return {k: np.array(data[k]) for k in data.files if k != "manifest"}


def save_shards(
    path: Path, pool, slices, model: TwoLayerReLU, hist: History, meta: dict[str, Any]
) -> int:
    """One file per shard, then the manifest (atomic), then the older shard files go."""
    remove_stale_temporaries(path)
    t = len(hist)
    tag = uuid.uuid4().hex[:8]
    names = [f"{path.stem}.t{t}-{tag}.shard{k}.npz" for k in range(len(slices))]
    digests = pool.call(
        "save", [(str(path.parent / name), {**meta, "shard": k}) for k, name in enumerate(names)]
    )
    manifest = {
        "format": SHARDED_FORMAT,
        "method": hist.method,
        "lr": hist.lr,
        "b": model.b,
        "squeeze": model.a.ndim == 1,
        "options": meta["options"],
        "shards": [
            {"start": s, "stop": e, "file": name, "digest": digest}
            for (s, e), name, digest in zip(slices, names, digests, strict=True)
        ],
        "history": hist.as_dict(),
        "meta": meta,
    }
    arrays = {**model_arrays(model), "model_a": model.output_weights}
    manifest["digest"] = digest_of(manifest, arrays)
    atomic_savez(path, manifest=np.array(json.dumps(manifest)), **arrays)
    for old in path.parent.glob(f"{path.stem}.t*.shard*.npz"):
        if old.name not in names:
            old.unlink(missing_ok=True)
    return t
