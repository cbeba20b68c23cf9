"""What every trainer provides to :func:`corrtree.train`, and the tree trainers' base.

Life of a trainer (``docs/design.md``, "Trainers")
    ``Trainer(model, X, Y, G, lr, **options)`` does the method's preprocessing
    from ``W(0) = model.W`` (read only), resolves ``lr`` (``"auto"``: from the
    fire sets it just found) and sets up everything that depends on it: a
    trainer is complete when it is made.  ``outputs()`` (or ``batch_outputs``)
    gives ``u(t)``; ``advance(err, step)`` performs one iteration
    ``W(t) -> W(t+1)`` and returns its History row; ``weights(start, stop)``
    gives rows of the current ``W(t)``.  The trainer owns the current weights;
    the model keeps ``W(0)`` until the run writes ``W(T)`` into it once, at
    the end (:func:`corrtree.training._train.write_weights`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .. import _config
from .._validation import check_memory
from ..model import TwoLayerReLU
from ._ntk import formed_is_used, lambda_max, lr_from_lambda
from ._sparse import count_changed, stepped_rows
from ._state import Field, Schema, check_csr, fail
from .losses import LOSSES, Loss
from .optim import LinearStep, explicit_update

__all__ = ["Prepared", "Timer", "Trainer", "TreeTrainer", "previous_fire", "tree_schema"]

PHASES = ("query", "forward", "backward", "update")


class Timer:
    """Accumulates wall time per phase: ``with timer("forward"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._phase = ""
        self._t0 = 0.0

    def __call__(self, phase: str) -> Timer:
        self._phase = phase
        return self

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds[self._phase] = (
            self.seconds.get(self._phase, 0.0) + time.perf_counter() - self._t0
        )

    def pop(self) -> dict[str, float]:
        """Times of the phases since the last ``pop``, as History columns."""
        out = {f"time_{k}": self.seconds.get(k, 0.0) for k in PHASES}
        self.seconds = {}
        return out


class Trainer:
    """Gradient descent (full batch or SGD) on a :class:`TwoLayerReLU`, one method.

    Parameters
    ----------
    model : TwoLayerReLU
        Its weights are ``W(0)``; the trainer never writes the model.
    X, Y : ndarray
        Validated data ``(n, d)`` and targets ``(n, K)``.
    G : ndarray
        ``X Xᵀ``.
    lr : float or "auto"
        Learning rate; ``"auto"`` is ``1/(c·λ_max)`` with ``λ_max`` of the NTK matrix of
        the initial fire sets (:func:`._ntk.lambda_max`) and ``c`` the loss's curvature.
    loss : Loss
        The training loss (:mod:`.losses`): the trainer takes its errors from the run
        loop; it reads the loss for ``lr="auto"`` and :meth:`final_loss`.
    **options
        Method options, passed to :meth:`_prepare`.
    """

    name = ""
    #: the run's loss (:mod:`.losses`; a restored or sharded trainer is given its run's)
    loss: Loss = LOSSES["squared"]

    def __init__(
        self,
        model: TwoLayerReLU,
        X: np.ndarray,
        Y: np.ndarray,
        G: np.ndarray,
        lr: float | str,
        loss: Loss = LOSSES["squared"],
        **options: Any,
    ) -> None:
        self._bind(model, X, Y, G)
        self.loss = loss
        self._prepare(self._initial(model), **options)
        lr_s = 0.0
        if lr == "auto":
            lam, lr_s = self._top_eigenvalue(G, X)
            lr = lr_from_lambda(lam, loss.curvature)
        self.info["lr_s"] = lr_s
        self._begin(float(lr))

    def _top_eigenvalue(self, G: np.ndarray, X: np.ndarray) -> tuple[float, float]:
        """``λ_max`` of the NTK matrix of ``W(0)``'s fire sets (:func:`._ntk.lambda_max`)
        and the seconds it took beyond forming them."""
        H = self.ntk()
        # the fire sets, when read, are kept for the first iteration: not lr's cost
        indptr, idx = (None, None) if formed_is_used(H) else self.initial_fire_sets()
        t0 = time.perf_counter()
        lam = lambda_max(indptr, idx, G, self.a, X, H, self.width)
        return lam, time.perf_counter() - t0

    @classmethod
    def prepare(
        cls,
        model: TwoLayerReLU,
        X: np.ndarray,
        Y: np.ndarray,
        G: np.ndarray,
        width: int,
        **options: Any,
    ) -> Prepared:
        """The preprocessing of a *shard*: the neurons of ``model`` are a slice of a
        network of ``width`` neurons (``1/sqrt(width)`` scales the outputs).  The
        learning rate, which needs every shard, comes with :meth:`Prepared.start`."""
        trainer = cls.__new__(cls)
        trainer._bind(model, X, Y, G, width)
        trainer._prepare(trainer._initial(model), **options)
        return Prepared(trainer)

    #: whether the method reads ``W(0)`` by blocks of rows only (and so trains implicit
    #: models, :mod:`corrtree._implicit`); the others need the stored array
    implicit_ok = False
    #: takes steps with momentum or weight decay (:class:`~.optim.LinearStep`)
    linear_ok = True

    def _initial(self, model: TwoLayerReLU):
        """``W(0)`` as the method reads it: the model's rows source, or its array."""
        if model.implicit and not self.implicit_ok:
            raise ValueError(
                f"method={self.name!r} needs the stored weight matrix; an implicit model "
                f"trains with method='lazy' or 'kernel' (or convert it: model.to_explicit())"
            )
        return model.weight_source if self.implicit_ok else model.W

    def _begin(self, lr: float) -> None:
        self._set_lr(lr)
        self._start()
        self.timer.pop()  # preprocessing is not part of the first iteration

    def _bind(
        self,
        model: TwoLayerReLU,
        X: np.ndarray,
        Y: np.ndarray,
        G: np.ndarray,
        width: int | None = None,
    ) -> None:
        """What every trainer holds of the run: data, output weights, threshold, and
        the network's width (the trainer's own neurons are ``model.m`` of them)."""
        self.X, self.Y, self.G = X, Y, G
        self.a = np.array(model.output_weights)  # (m, K)
        self.b = self.b0 = model.b  # b0: the model's; b: the threshold the trainer compares with
        self.m = model.m
        self.width = model.m if width is None else int(width)
        self.scale = 1.0 / math.sqrt(self.width)
        self.timer = Timer()
        self.info: dict[str, Any] = {}

    def _set_lr(self, lr: float) -> None:
        self.lr = float(lr)
        self.eta_s = self.lr * self.scale  # η/sqrt(m), the step of every coefficient

    # -- state: what a checkpoint holds (``_state.Schema``) ---------------------------
    SCHEMA: Schema

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The trainer's whole state as named arrays and scalars (see :attr:`SCHEMA`)."""
        raise NotImplementedError

    @classmethod
    def restore(
        cls,
        model: TwoLayerReLU,
        X: np.ndarray,
        Y: np.ndarray,
        G: np.ndarray,
        lr: float,
        arrays: dict[str, np.ndarray],
        scalars: dict[str, Any],
        width: int | None = None,
        device: Any = None,
    ) -> Trainer:
        """A trainer in the state ``(arrays, scalars)`` written by :meth:`state`, checked
        against :attr:`SCHEMA` first (:class:`~._state.CheckpointError` if it fails);
        ``device``: where a device trainer puts its tensors."""
        sizes = {"n": X.shape[0], "m": model.m, "d": model.d, "K": model.outputs}
        sizes = cls.SCHEMA.check(arrays, scalars, sizes)
        trainer = cls.__new__(cls)
        trainer._bind(model, X, Y, G, width)
        if device is not None:
            trainer.device = device  # type: ignore[attr-defined]  # the array path's trainers
        trainer._set_lr(lr)
        trainer._restore(trainer._initial(model), arrays, scalars, sizes)
        trainer.timer.pop()
        return trainer

    def _restore(
        self,
        W0: np.ndarray,
        arrays: dict[str, np.ndarray],
        scalars: dict[str, Any],
        sizes: dict[str, int],
    ) -> None:
        """Take the state (already checked against :attr:`SCHEMA`); ``W0``: ``model.W``."""
        raise NotImplementedError

    # -- what a method defines ------------------------------------------------------
    def _prepare(self, W0: np.ndarray, **options: Any) -> None:
        """Preprocessing from ``W0`` (read-only), before the learning rate is known."""
        raise NotImplementedError

    def _start(self) -> None:
        """Set up what depends on the learning rate (``self.lr``, ``self.eta_s``)."""

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        """r-major CSR ``(indptr, idx)`` of the fire sets of ``W(0)``."""
        raise NotImplementedError

    def ntk(self) -> np.ndarray | None:
        """The NTK matrix of ``W(0)`` if the method forms it (else ``None``)."""
        return None

    def implicit_update(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """The run's coefficients ``C`` as a CSR ``(indptr, cols, coef)`` and ``α``, for an
        implicit model (the methods with :attr:`implicit_ok` only)."""
        raise NotImplementedError(f"method={self.name!r} does not train implicit models")

    @classmethod
    def device_need(
        cls, n: int, m: int, d: int, K: int, band_share: float, implicit: bool, linear: bool
    ) -> float:
        """Modelled device bytes of a run (the array path's trainers only)."""
        raise NotImplementedError(f"method={cls.name!r} has no device trainer")

    def outputs(self) -> np.ndarray:
        """The network outputs ``u(t)`` at the current weights, ``(n, K)`` (for a shard:
        the sum over its neurons)."""
        raise NotImplementedError

    def batch_outputs(self, batch: np.ndarray) -> np.ndarray:
        """The outputs at the points ``batch`` (the trainers that keep every output
        take them from :meth:`outputs`)."""
        return self.outputs()[batch]

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        """The step for the error ``err = u(t) - Y`` of the whole network (zero outside
        a mini-batch): a gradient step at ``lr``, or with ``step`` the step of a linear
        optimizer (:mod:`.optim`).  Returns the History row without its loss."""
        raise NotImplementedError

    def final_loss(self) -> float:
        """Loss at the current weights (after the last step)."""
        loss = self.loss.value(self.outputs(), self.Y)
        self.timer.pop()
        return loss

    def weights(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` of the current weights ``W(t)``, as a new array."""
        raise NotImplementedError

    def write_weights(self, start: int, out: np.ndarray) -> None:
        """Turn ``out``, rows ``start : start + len(out)`` of ``W(0)``, into those rows
        of ``W(t)``, in place (the model's rows at the end of a run)."""
        out[...] = self.weights(start, start + out.shape[0])

    def outputs_at(self, X: np.ndarray) -> np.ndarray:
        """This trainer's share of the outputs at other points ``X`` ``(p, d)``, from the
        current weights in blocks of rows.  O(p·m·d) plus :meth:`weights`."""
        out = np.zeros((X.shape[0], self.a.shape[1]))
        block = _config.block_rows(8 * (X.shape[0] + X.shape[1]), self.m, _config.MODEL_BLOCK_BYTES)
        for s in range(0, self.m, block):
            U = self.weights(s, min(s + block, self.m)) @ X.T
            U -= self.b0
            np.maximum(U, 0.0, out=U)
            out += U.T @ self.a[s : s + block]
        return out * self.scale

    # -- shared helpers ---------------------------------------------------------------
    def _row(
        self,
        fired_pairs: int,
        moved_neurons: int,
        flips: int,
        band_pairs: int = 0,
        reanchored: int = 0,
        evaluated_pairs: int = 0,
    ) -> dict[str, Any]:
        """The History row of the iteration just done (no loss), with its phase times."""
        return {
            "fired_pairs": int(fired_pairs),
            "moved_neurons": int(moved_neurons),
            "flips": int(flips),
            "band_pairs": int(band_pairs),
            "reanchored": int(reanchored),
            "evaluated_pairs": int(evaluated_pairs),
            **self.timer.pop(),
        }


class TreeTrainer(Trainer):
    """What the paper's two trainers share: a correlation tree that owns ``W(t)``
    and its products, a sparse gradient on the fired pairs, one batched update."""

    tree: Any  # CorrelationDTree or CorrelationWTree, built by the subclass

    vel: np.ndarray | None = None  # momentum buffers of a linear optimizer (m, d)

    def _gradient_step(
        self, fire_r: tuple[np.ndarray, np.ndarray], err: np.ndarray, step: LinearStep | None
    ) -> np.ndarray:
        """Sparse gradient on the fired pairs (r-major fire sets), then the tree update
        for every neuron that moved (one batched ``update_many``).  Returns them.

        With a linear optimizer the rows that move are those with a gradient, a
        momentum buffer or (weight decay) all of them; ``vel`` holds the buffers."""
        indptr, idx = fire_r
        W = self.tree.W
        moved = np.flatnonzero(np.diff(indptr)).astype(np.int64)
        if step is not None:
            return self._linear_step(moved, indptr, idx, err, step)
        with self.timer("backward"):
            Z = stepped_rows(W[moved], moved, indptr, idx, self.X, self.a, err, self.eta_s)
        with self.timer("update"):
            self.tree.update_many(moved, Z)
        return moved

    def _linear_step(
        self, grads: np.ndarray, indptr: np.ndarray, idx: np.ndarray, err: np.ndarray, step
    ) -> np.ndarray:
        """The step of a linear optimizer on the rows that move: those with a gradient
        (``grads``), a momentum buffer, or with weight decay every row; in blocks of
        rows, so that the extra memory is the buffers ``vel`` (``m × d``) and a block."""
        W = self.tree.W
        if self.vel is None and step.mu:
            check_memory(W.nbytes, "the momentum buffers (m × d)")
            self.vel = np.zeros_like(W)
        has_grad = np.zeros(self.m, dtype=np.bool_)
        has_grad[grads] = True
        if step.lam:
            moved = np.arange(self.m)
        elif self.vel is None:
            moved = grads
        else:
            moved = np.flatnonzero(has_grad | self.vel.any(axis=1))
        block = _config.block_rows(8 * 4 * self.X.shape[1], self.m, _config.MODEL_BLOCK_BYTES)
        for s in range(0, moved.shape[0], block):
            rows = moved[s : s + block].astype(np.int64)
            with self.timer("backward"):
                grad = np.zeros((rows.shape[0], W.shape[1]))
                sel = has_grad[rows]
                grad[sel] = stepped_rows(
                    grad[sel], rows[sel], indptr, idx, self.X, self.a, err, -self.scale
                )
            with self.timer("update"):
                Z = W[rows]
                V = None if self.vel is None else self.vel[rows]
                explicit_update(Z, V, grad, step)  # type: ignore[arg-type]  # V: None without momentum
                if self.vel is not None and V is not None:
                    self.vel[rows] = V
                self.tree.update_many(rows, Z)
        return moved

    def _flips(
        self, previous: tuple[np.ndarray, np.ndarray] | None, current: tuple[np.ndarray, np.ndarray]
    ) -> int:
        return 0 if previous is None else count_changed(*previous, *current)

    def weights(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return np.array(self.tree.W[start:stop])

    def _tree_state(
        self, previous: tuple[np.ndarray, np.ndarray] | None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {"W": self.tree.W, "V": self.tree.products}
        if self.vel is not None:
            arrays["vel"] = self.vel
        if previous is not None:
            arrays["prev_indptr"], arrays["prev_idx"] = previous
        return arrays, {}


class Prepared:
    """A trainer whose preprocessing is done but whose learning rate is not yet known
    (see :meth:`Trainer.prepare`): it answers the questions ``lr="auto"`` asks of
    every shard, and :meth:`start` turns it into the trainer."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer: Trainer | None = trainer

    @property
    def _ready(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError("this prepared trainer was started already")
        return self._trainer

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        return self._ready.initial_fire_sets()

    def ntk(self) -> np.ndarray | None:
        return self._ready.ntk()

    @property
    def info(self) -> dict[str, Any]:
        return self._ready.info

    @property
    def width(self) -> int:
        return self._ready.width

    def start(self, lr: float) -> Trainer:
        """The trainer, complete, with learning rate ``lr``."""
        trainer, self._trainer = self._ready, None
        trainer._begin(lr)
        return trainer


def previous_fire(arrays: dict[str, np.ndarray], cols: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The optional fire sets of the previous iteration of a state (CSR, checked)."""
    if ("prev_indptr" in arrays) != ("prev_idx" in arrays):
        fail("prev_idx", "prev_indptr and prev_idx must come together")
    if "prev_indptr" not in arrays:
        return None
    check_csr("prev_idx", arrays["prev_indptr"], arrays["prev_idx"], cols)
    return arrays["prev_indptr"], arrays["prev_idx"]


def tree_schema(products: tuple[str, str], prev_rows: str) -> Schema:
    """State of a tree trainer: weights, stored products, the previous fire sets."""
    return Schema(
        1,
        (
            Field("W", ("f8",), ("m", "d")),
            Field("V", ("f8",), products),
            Field("vel", ("f8",), ("m", "d"), optional=True),
            Field("prev_indptr", ("i8",), (prev_rows,), optional=True),
            Field("prev_idx", ("i8",), ("nnz",), optional=True),
        ),
    )
