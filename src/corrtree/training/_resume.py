"""``corrtree.resume``: a run continued from its checkpoint, one-process or sharded, on
any device."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .._io import open_npz, remove_stale_temporaries
from .._validation import as_matrix, check_file_path
from ..model import TwoLayerReLU
from ._calibrate import fixed_rate
from ._choice import check_iters
from ._loop import Run
from ._state import CheckpointError
from ._train import calibrate_visits, run_steps, train
from ._warmup import WARM_METHODS, Warmup, ensure
from .checkpoint import FORMAT, check_overwritable, load_checkpoint, read_manifest
from .history import History
from .losses import get_loss
from .optim import SGD

__all__ = ["resume"]


def resume(
    path: str | os.PathLike,
    X: np.ndarray,
    y: np.ndarray,
    callback: Callable[[int, History], bool | None] | None = None,
    *,
    iters: int | None = None,
    checkpoint: str | os.PathLike | None = None,
    run_id: str | None = None,
    client: Any = None,
    shards: int | None = None,
    schedule: Callable[[int], float] | None = None,
    eval_set: tuple[np.ndarray, np.ndarray] | None = None,
    device: Any = None,
    loss: str | None = None,
) -> tuple[TwoLayerReLU, History]:
    """Continue a run from a checkpoint written by :func:`train`.

    The trainer's whole state is restored, so the run ends with exactly the
    weights of an uninterrupted one.  ``X`` and ``y`` must be the training
    data of the checkpoint (checked by a SHA-256 digest).  ``iters`` is the
    total number of iterations (default: the checkpointed run's).  Further
    checkpoints go to ``checkpoint`` (default: ``path``).  With ``run_id``,
    the checkpoint must belong to that run.  A sharded checkpoint resumes on
    ``client``'s workers (or in this process without one): bit for bit with
    the same number of shards, from ``W(t)`` with another (``shards``: how
    many; default one per worker, or as many as the checkpoint has).  The
    optimizer, its momentum buffers and the batch order continue as they were;
    a run with a callable ``schedule`` needs it again, and ``eval_set`` gives
    held-out data for the remaining epochs.  ``device`` continues a one-process run on
    the array path of that torch device (a checkpoint written on any device resumes
    on any other, or on the CPU trainers with ``device=None``).  The run continues with
    its own loss (recorded in the checkpoint); ``loss``, when given, must be that one.

    Returns
    -------
    model : TwoLayerReLU
        The model, trained to the end.
    history : History
        The whole history, from iteration 0.
    """
    from ..distributed import SHARDED_FORMAT, resume_sharded

    if checkpoint is not None:
        checkpoint = check_file_path("checkpoint", checkpoint)
        check_overwritable("checkpoint", checkpoint)
    remove_stale_temporaries(path)
    manifest = read_manifest(path, (FORMAT, SHARDED_FORMAT))
    if not isinstance(manifest.get("meta"), dict):
        raise CheckpointError(f"{path}: the manifest has no run metadata")
    if run_id is not None and manifest["meta"].get("run_id") != run_id:
        raise CheckpointError(
            f"{path} belongs to another run (id "
            f"{manifest['meta'].get('run_id')!r}, expected {run_id!r})"
        )
    Xc = as_matrix("X", X)
    d = manifest["history"].get("d")
    if isinstance(d, int) and Xc.shape[1] != d:
        raise ValueError(f"X has {Xc.shape[1]} columns but the checkpointed model has d={d}")
    outputs = manifest["history"].get("outputs")
    if not isinstance(outputs, int) or outputs < 1:
        raise CheckpointError(f"{path}: bad history (outputs {outputs!r})")
    recorded_loss = manifest["meta"].get("loss", "squared")  # written before losses: squared
    try:
        run_loss = get_loss(recorded_loss)
    except ValueError:
        raise CheckpointError(f"{path}: unknown loss {recorded_loss!r}") from None
    if loss is not None and get_loss(loss).name != run_loss.name:
        raise ValueError(
            f"loss={loss!r}, but the checkpointed run trains loss={run_loss.name!r}; "
            "a run resumes with its own loss"
        )
    Y = run_loss.targets(y, Xc.shape[0], outputs)
    recorded = manifest["meta"].get("sgd", {})
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{path}: bad optimizer {recorded!r}")
    if recorded.get("schedule") == "callable" and schedule is None:
        raise ValueError("the run used a callable schedule: pass it again as schedule=")
    try:
        run = Run(SGD.from_meta(recorded, schedule), eval_set, run_loss)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: bad optimizer ({exc})") from exc
    fixed_rate()  # a bad CORRTREE_SCATTER_COST is refused before anything loads
    dev = None
    if device is not None:
        from .._device import resolve

        dev = resolve(device)
        if manifest["format"] == SHARDED_FORMAT:
            raise ValueError("device= resumes one-process checkpoints only (this one is sharded)")
    if manifest["format"] == SHARDED_FORMAT:
        return resume_sharded(
            path,
            manifest,
            Xc,
            Y,
            client,
            callback,
            checkpoint,
            None if iters is None else check_iters(iters),
            shards,
            run,
        )
    method = manifest.get("trainer")
    took = (
        ensure(train, method, run.sgd.linear, _holds_implicit(path))
        if method in WARM_METHODS and dev is None
        else Warmup(0.0, 0)
    )
    G = Xc @ Xc.T
    calibration = calibrate_visits(method, G, Xc) if dev is None else 0.0
    model, trainer, hist, meta = load_checkpoint(path, Xc, Y, G, dev)
    hist.info["compile_s"], hist.info["compiled"] = took.seconds, took.compiled
    if calibration:
        hist.info["calibration_s"] = calibration
    if iters is not None:
        meta["iters"] = check_iters(iters)
    return model, run_steps(model, trainer, hist, meta, callback, checkpoint or path, run)


def _holds_implicit(path: str | os.PathLike) -> bool:
    """Whether the checkpoint at ``path`` holds an implicit model (its members' names)."""
    try:
        with open_npz(path) as data:
            return "model_w_seed" in data.files
    except (OSError, ValueError):
        return False  # load_checkpoint names what is wrong with the file
