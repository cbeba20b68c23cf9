"""``corrtree.train``: gradient descent (full batch or SGD) with a choice of exact methods."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import _config
from .._io import remove_stale_temporaries
from .._threads import quiet_blas
from .._validation import check_file_path
from ..model import TwoLayerReLU
from ._base import Trainer
from ._calibrate import fixed_rate, scatter_cost
from ._choice import (
    alternatives,
    check_device,
    check_iters,
    check_lr,
    check_method,
    check_run_memory,
    choose_method,
    fitting,
    runnable,
)
from ._loop import STOP_SIGNALS, Run, TrainingDiverged, check_divergence, check_eval_set
from ._registry import DEVICE_TRAINERS, METHODS, TRAINERS
from ._warmup import WARM_METHODS, Warmup, ensure
from .band import BandTrainer
from .checkpoint import check_overwritable, data_digest, save_checkpoint
from .history import History
from .losses import LOSSES, Loss, get_loss
from .optim import SGD

__all__ = ["METHODS", "TrainingDiverged", "Warmup", "train", "warmup"]


def train(
    model: TwoLayerReLU,
    X: np.ndarray,
    y: np.ndarray,
    method: str = "auto",
    lr: float | str = "auto",
    iters: int | None = None,
    callback: Callable[[int, History], bool | None] | None = None,
    *,
    batch_size: int | None = None,
    epochs: int | None = None,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    schedule: str | Callable[[int], float] | None = None,
    shuffle_seed: int = 0,
    eval_set: tuple[np.ndarray, np.ndarray] | None = None,
    patience: int = 5,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 0,
    lr_retries: int = 0,
    run_id: str | None = None,
    client: Any = None,
    shards: int | None = None,
    device: Any = None,
    loss: str = "squared",
    **options: Any,
) -> History:
    """Train ``model.W`` by gradient descent: full batch (the default) or mini-batch SGD.

    ``W(t+1) = W(t) - lr · ∂L/∂W(t)`` with
    ``∂L/∂w_r = (1/sqrt m) · Σ_{i: <w_r, x_i> >= b} (a_r · err_i) · x_i`` and
    ``err_i = ∂L/∂f(x_i)`` (``f(x_i) - y_i`` for the squared loss): the paper's
    update, only ``W`` trained.  With ``batch_size`` the sum runs over a batch of
    points, and ``momentum``, ``weight_decay`` and ``schedule`` follow
    ``torch.optim.SGD``.  Every method follows the same trajectory up to
    floating-point rounding.  The model keeps ``W(0)`` while the trainer runs and
    receives ``W(T)`` once, at the end; a run that fails or diverges leaves it
    unchanged.

    Parameters
    ----------
    model : TwoLayerReLU
        Trained in place (written once, after the last iteration).
    X : array_like, shape (n, d)
        Inputs (the paper assumes unit-norm rows; any finite data works).
    y : array_like, shape (n,) or (n, K)
        Targets, one column per model output; for ``loss="logistic"`` labels in
        {0, 1} or {-1, +1}, for ``loss="cross_entropy"`` integer classes ``0..K-1``
        or one-hot rows.
    method : {"auto", "dense", "dtree", "wtree", "lazy", "kernel"}, default "auto"
        ``"dense"``: BLAS reference; ``"dtree"``/``"wtree"``: the paper's two
        algorithms; ``"lazy"``/``"kernel"``: exact methods whose iterations
        cost O(Σ k̃²) and O((nK)²), independent of ``d``; ``"auto"``: the
        cheapest by a cost model among the methods that take the run and fit in
        memory (recorded in ``History.info["costs"]``).
    lr : float or "auto", default "auto"
        Learning rate; ``"auto"`` is ``1/(c·λ_max)`` of the NTK matrix
        ``H = (FᵀF/m) ∘ (XXᵀ)`` of the fire sets at initialization, computed
        from the sparse fire sets, with ``c`` the loss's curvature bound.
    iters : int, optional
        Number of steps ``T`` (default 100); with ``epochs``, leave it out.
    callback : callable, optional
        ``callback(t, history)`` after every iteration; returning ``False``
        stops training.  ``history.current_weights()`` gives ``W(t+1)`` there.
    batch_size : int, optional
        Points per step; ``None`` (the default) is full-batch gradient descent.
        The batch loss sums over the batch's points only.
    epochs : int, optional
        Passes over the data: ``epochs·ceil(n/batch_size)`` steps.
    momentum : float, default 0
        ``μ`` in ``[0, 1)``, as ``torch.optim.SGD``.
    nesterov : bool, default False
        Nesterov momentum (needs ``momentum > 0``).
    weight_decay : float, default 0
        ``λ >= 0``: the L2 penalty ``λ/2·||W||²`` added to the gradient.
    schedule : {None, "constant", "step", "cosine"} or callable, default None
        Factor of ``lr`` at global step ``t``: ``"step"`` multiplies it by 0.1 at
        half and at three quarters of the epochs, ``"cosine"`` is
        ``(1 + cos(π t / T))/2`` over the ``T`` steps, a callable
        ``schedule(t) -> float`` gives the factor itself (finite, ``>= 0``).
    shuffle_seed : int, default 0
        Seed of the batch permutations (one per epoch).
    eval_set : (X, y), optional
        Held-out data whose loss is recorded after every epoch
        (``History.epoch_test_loss``).
    patience : int, default 5
        Stop with :class:`TrainingDiverged` when the loss grows this many
        iterations in a row; at once when it is not finite or exceeds 1e4
        times the initial loss.
    checkpoint : path, optional
        Where to write the full training state (see :func:`resume`): every
        ``checkpoint_every`` iterations and when SIGINT (Ctrl-C) or SIGTERM
        arrives, after which :class:`KeyboardInterrupt` is raised.  Written
        atomically.
    checkpoint_every : int, default 0
        See ``checkpoint`` (0: never on a schedule).
    lr_retries : int, default 0
        With ``lr="auto"``: when the run diverges, halve the learning rate and
        start again, up to this many times (``History.info["lr_halvings"]``).
    run_id : str, optional
        Identifies the run in its checkpoints (default: a new random id).
    client : dask.distributed.Client, optional
        Shard the neurons over the client's workers, one contiguous slice each
        (:mod:`corrtree.distributed`); every iteration moves only ``nK``-sized
        vectors.
    shards : int, optional
        Number of shards (default: one per worker; without a client, shards
        in this process, which gives the sharded trajectory on one machine).
    device : str or torch.device, optional
        Run the array path on this torch device (``"cuda"``, ``"cuda:1"``,
        ``"cpu"``, ...; needs ``corrtree[gpu]``): methods ``"dense"``, ``"lazy"``,
        ``"kernel"`` and ``"auto"``, float64.  ``None`` (the default) runs the CPU
        trainers.
    loss : {"squared", "logistic", "cross_entropy"}, default "squared"
        The training loss, summed over the points: ``"squared"``
        ``½ Σ ||f(x_i) − y_i||²`` (the paper's), ``"logistic"`` (one output, two
        classes: binary cross-entropy of ``σ(f)``), ``"cross_entropy"`` (softmax
        over ``K >= 2`` outputs).  Every method follows the same trajectory with
        each; ``lr="auto"`` divides ``1/λ_max`` by the loss's curvature bound
        (1, 1/4, 1/2).
    **options
        Method options: ``block`` (dense: rows per BLAS block, default ``"auto"``),
        ``band`` (lazy, kernel: half-width of the tracked pairs below ``b``, default
        0.55), ``anchor_dtype`` (lazy, kernel: ``"float64"`` keeps the anchored
        rows, ``"float32"`` none; default by memory) and ``gemm_dtype`` (lazy,
        kernel: the set-up GEMM's precision, default ``"float32"``, exact either
        way) and ``moves`` (lazy: keep each neuron's move since its anchor, ``8·m·d``
        bytes; default on explicit models where the set-up's fire sets price it
        cheaper, beyond 64 features only on coherent data, up to 1024; the same
        trajectory).

    Returns
    -------
    History
        One row per iteration (loss, fired pairs, moved neurons, flips, phase
        times), the method that ran and the run's information (``info``).

    Raises
    ------
    ValueError
        A bad argument (NaN or infinite data, wrong shapes, labels that do not
        fit the loss, an unknown method, an impossible option), named in one line
        before any kernel runs.
    TypeError
        An option the method does not take (the message lists those it does).
    MemoryError
        The run's modelled memory does not fit in the room left (host, shards or
        device); the message names the widths and methods that would fit.
    TrainingDiverged
        The loss grew ``patience`` times in a row or left the finite range, after
        ``lr_retries`` halvings.
    KeyboardInterrupt
        SIGINT or SIGTERM during training, after the checkpoint (if any) is
        written.

    Notes
    -----
    Per iteration: dense Θ(nmd); dtree and wtree about the same once every neuron
    moves; lazy O(Σ_r k̃_r²) with ``k̃_r`` the points neuron r fires on; kernel
    O((nK)²) plus the neurons whose certificate expires.  Set-up of lazy and
    kernel: one float32 GEMM (``n·m·d``), ``G = XXᵀ`` (``n²·d``) and, for kernel,
    the NTK matrix.  Compilation of the kernels happens before the run's clock
    starts (``History.info["compile_s"]``).

    Examples
    --------
    >>> import corrtree as ct
    >>> ds = ct.datasets.sphere(n=64, d=8, seed=0)
    >>> model = ct.TwoLayerReLU.init(d=8, m=256, seed=0)
    >>> hist = ct.train(model, ds.X_train, ds.y_train, method="dense", iters=3)
    >>> len(hist.loss), hist.method
    (3, 'dense')
    """
    if not isinstance(model, TwoLayerReLU):
        raise ValueError(f"model must be a TwoLayerReLU, got {type(model).__name__}")
    X = model.check_X(X)
    loss_ = get_loss(loss)
    Y = loss_.targets(y, X.shape[0], model.outputs)
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if device is not None:
        device = check_device(device, method, client, shards)
    lr = check_lr(lr)
    sgd = SGD(batch_size, epochs, momentum, nesterov, weight_decay, schedule, shuffle_seed)
    if method == "auto":
        among = runnable(model, sgd, options, device is not None)
    else:
        check_method(method, model, sgd, options, device is not None)
        among = alternatives(model, sgd, device is not None)
    if iters is not None and epochs is not None:
        raise ValueError("give iters or epochs, not both")
    if iters is None and epochs is not None:
        iters = epochs * -(-X.shape[0] // min(batch_size or X.shape[0], X.shape[0]))
    iters = 100 if iters is None else check_iters(iters)
    if eval_set is not None:
        eval_set = check_eval_set(model, eval_set)
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"patience must be an integer >= 1, got {patience!r}")
    checkpoint_every = check_iters(checkpoint_every, "checkpoint_every")
    lr_retries = check_iters(lr_retries, "lr_retries")
    if shards is not None and (
        isinstance(shards, bool) or not isinstance(shards, int) or shards < 1
    ):
        raise ValueError(f"shards must be an integer >= 1, got {shards!r}")
    if run_id is not None and not isinstance(run_id, str):
        raise ValueError(f"run_id must be a string, got {run_id!r}")
    meta = {
        "iters": iters,
        "sgd": sgd.to_meta(),
        "loss": loss_.name,
        "patience": patience,
        "checkpoint_every": checkpoint_every,
        "run_id": run_id or uuid.uuid4().hex,
    }
    if checkpoint is not None:
        checkpoint = check_file_path("checkpoint", checkpoint)
        check_overwritable("checkpoint", checkpoint)
        meta["data_digest"] = data_digest(X, Y)
        remove_stale_temporaries(checkpoint)
    rate = lr
    for halvings in range(lr_retries + 1):
        try:
            if client is not None or shards is not None:
                from ..distributed import train_sharded

                meta["lr_auto"] = lr == "auto"
                if method == "auto":  # the cost model of one process picks the method
                    method = choose_method(X, X @ X.T, model, iters, sgd, among)[0]
                hist = train_sharded(
                    model,
                    X,
                    Y,
                    method,
                    rate,
                    meta,
                    client,
                    callback,
                    checkpoint,
                    options,
                    shards,
                    Run(sgd, eval_set, loss_),
                )
                hist.info["lr_halvings"] = halvings
                return hist
            trainer, hist = _make(
                method,
                among,
                model,
                X,
                Y,
                rate,
                iters,
                options,
                halvings,
                lr == "auto",
                sgd,
                device,
                loss_,
            )
            run = Run(sgd, eval_set, loss_)
            return run_steps(model, trainer, hist, meta, callback, checkpoint, run)
        except TrainingDiverged as exc:
            if lr != "auto" or halvings == lr_retries:
                raise
            rate = exc.lr / 2  # 1/λ_max assumes fire sets that barely change
    raise AssertionError("unreachable")  # pragma: no cover


def warmup(methods: str | Iterable[str] = WARM_METHODS) -> Warmup:
    """Compile (or load from numba's cache) the kernels of ``methods`` (a method's name,
    or several) now, for full-batch and mini-batch steps, so that later runs start at
    once; :func:`train` does it for its own method before its clock starts
    (``corrtree/training/_warmup.py``).  Every name is checked before anything compiles.
    Returns the total time and the number of functions compiled (0: all from the cache).

    Examples
    --------
    >>> import corrtree as ct
    >>> ct.warmup("dense").seconds >= 0
    True
    """
    names = [methods] if isinstance(methods, str) else methods
    try:
        names = list(dict.fromkeys(names))
    except TypeError:
        raise ValueError(
            f"methods must be a method's name or a sequence of them, got {methods!r}"
        ) from None
    if not names:
        raise ValueError(f"methods names no method; give one or more of {', '.join(WARM_METHODS)}")
    for method in names:
        if method not in WARM_METHODS:
            raise ValueError(
                f"methods: each must be one of {', '.join(WARM_METHODS)}; got {method!r}"
            )
    seconds, compiled = 0.0, 0
    for method in names:
        for linear in (False, True):
            took = ensure(train, method, linear, implicit=method in ("lazy", "kernel"))
            seconds += took.seconds
            compiled += took.compiled
    return Warmup(seconds, compiled)


def _make(
    method: str,
    among: list[str],
    model: TwoLayerReLU,
    X: np.ndarray,
    Y: np.ndarray,
    lr: float | str,
    iters: int,
    options: dict[str, Any],
    halvings: int,
    lr_auto: bool,
    sgd: SGD,
    device: Any = None,
    loss: Loss = LOSSES["squared"],
) -> tuple[Trainer, History]:
    """The trainer of a one-process run (preprocessing, ``lr``) and its empty History;
    ``among``: the methods ``"auto"`` may choose (:func:`~._choice.runnable`)."""
    t0 = time.perf_counter()
    fixed_rate()  # a bad CORRTREE_SCATTER_COST is refused before anything compiles
    info: dict[str, Any] = {}
    G = X @ X.T
    calibration = 0.0
    if method == "auto":  # the cheapest of those that fit
        fit = fitting(among, X, model, sgd.linear, options, device)
        if device is None:
            method, info["costs"] = choose_method(X, G, model, iters, sgd, fit)
        else:
            from .device_costs import choose_device_method

            method, info["costs"], calibration = choose_device_method(
                X, G, model, iters, sgd, device, fit
            )
            info["calibration_s"] = calibration
        info["auto"] = True
    check_run_memory(method, X, model, sgd.linear, options, device, candidates=among)
    if device is None:
        # the one-time loading (or compiling) of the method's kernels is not part of the run
        took = ensure(train, method, sgd.linear, model.implicit)
        # nor is measuring this machine's exchange rate of the visits' routes
        calibration = calibrate_visits(method, G, X)
        if calibration:
            info["calibration_s"] = calibration
        trainer = TRAINERS[method](model, X, Y, G, lr, loss, **options)
    else:
        took = Warmup(0.0, 0)  # torch: nothing to compile ahead
        trainer = DEVICE_TRAINERS[method](model, X, Y, G, lr, loss, device=device, **options)
    # the device's one-time calibration (auto) is reported apart, as compilation is
    t0 += took.seconds + calibration
    info["compile_s"], info["compiled"] = took.seconds, took.compiled
    hist = History.of_run(
        method,
        trainer.lr,
        model,
        X,
        t0,
        {**info, **trainer.info, "lr_auto": lr_auto, "lr_halvings": halvings},
    )
    return trainer, hist


def calibrate_visits(method: str | None, G: np.ndarray, X: np.ndarray) -> float:
    """For the band trainers, measure the exchange rate of their visits' routes
    (:func:`~._calibrate.scatter_cost`, once per process and data shape) before the run's
    clock starts; returns the seconds it took (0 when measured already)."""
    return scatter_cost(G, X).seconds if method in ("lazy", "kernel") else 0.0


def run_steps(
    model: TwoLayerReLU,
    trainer: Trainer,
    hist: History,
    meta: dict[str, Any],
    callback,
    checkpoint,
    run: Run,
) -> History:
    """The iterations from ``len(hist)`` to ``meta["iters"]`` (see :func:`train`)."""
    stop: list[int] = []

    def on_signal(signum, frame):  # finish the iteration, save, then stop
        stop.append(signum)

    opt = run.start(model, hist, meta, trainer.X.shape[0])
    trainer.loss = run.loss  # a restored trainer's, too
    if isinstance(trainer, BandTrainer):
        opt.check_scaling(trainer.b0, len(hist))
    use_signal = checkpoint is not None and threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS} if use_signal else {}
    hist.weights_source = trainer.weights
    # the band trainers' iterations are numba kernels between small GEMMs: OpenBLAS's
    # long-spinning threads (numpy imported before corrtree) would starve them
    with quiet_blas(isinstance(trainer, BandTrainer)):
        try:
            for t in range(len(hist), meta["iters"]):
                B = opt.batch(t)
                ub = trainer.outputs() if B is None else trainer.batch_outputs(B)
                err, loss, step = opt.errors(t, ub, trainer.Y)
                hist.append(**trainer.advance(err, step), loss=loss)
                run.end_step(hist, t, trainer.outputs, trainer.outputs_at, trainer.Y, meta)
                if callback is not None and callback(t, hist) is False:
                    break
                every = meta["checkpoint_every"]
                if checkpoint is not None and (stop or (every and (t + 1) % every == 0)):
                    save_checkpoint(checkpoint, model, trainer, hist, meta)
                if stop:
                    raise KeyboardInterrupt(
                        f"interrupted after iteration {t}; state saved to {checkpoint}"
                    )
        finally:
            hist.weights_source = None
            for s, handler in previous.items():
                signal.signal(s, handler)
    hist.final_loss = trainer.final_loss()
    if "moves" in trainer.info:  # the lazy trainer's route may change (linear steps)
        hist.info["moves"] = trainer.info["moves"]
    check_divergence(hist, trainer.lr, meta["patience"])
    if "costs" in hist.info:  # method="auto": the measurement beside the model's estimate
        hist.info["measured_s"] = hist.total_time
    write_weights(model, trainer)
    return hist


def write_weights(model: TwoLayerReLU, trainer: Trainer) -> None:
    """The one place a model is written during training: ``W(T)`` from the trainer.

    Block by block (:data:`~corrtree._config.WEIGHTS_BLOCK_BYTES`), in place: the
    model's rows hold ``W(0)`` until then, the band trainers read it from them,
    and each block depends on its own rows of ``W(0)`` only
    (:meth:`~._base.Trainer.write_weights`).  An implicit model takes the run's
    coefficients instead (``BandTrainer.implicit_update``): no ``m×d``.
    """
    if model.implicit:
        model.absorb_update(trainer.X, *trainer.implicit_update())
        return
    block = _config.block_rows(8 * model.d, model.m, _config.WEIGHTS_BLOCK_BYTES)
    for s in range(0, model.m, block):
        trainer.write_weights(s, model._writable_rows(s, min(s + block, model.m)))
