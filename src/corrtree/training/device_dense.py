"""Dense gradient descent on a torch device (``train(..., device=...)``), float64.

The honest baseline of the array path: the CPU dense trainer's iteration
(:mod:`.dense`) with its tensors on the device, the weights resident there and only
``nK``-sized vectors crossing per step: the outputs, for the loss, with the History
row's counts (fired pairs, neurons, flips) in one transfer, the step's only host
synchronization, as PyTorch's own loop reads its loss; the errors back, queued through
a buffer pinned once (:class:`~corrtree._device.Staging`), as a mini-batch's points.
Its state is the CPU dense trainer's (the same :attr:`SCHEMA`, numpy
arrays), so a checkpoint written on one device resumes on the other.

Exactness: float64 throughout; a GEMM's sums are ordered by the library (cuBLAS, or
the CPU's BLAS), so the trajectory equals the CPU's to rounding (the tests ask 1e-9).
Every operation is a GEMM or elementwise (no atomic accumulation), so two runs on one
device give the same bits.  Θ(nmd) per iteration, like the CPU dense trainer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._device import Staging, check_device_memory, free_bytes
from ._base import Trainer, previous_fire
from ._sparse import keys_to_csr
from .dense import DenseTrainer
from .optim import LinearStep, explicit_update

__all__ = ["DeviceDenseTrainer"]

#: Share of the device's free memory a block's products and mask may take.
_BLOCK_SHARE = 0.25


class DeviceDenseTrainer(Trainer):
    """:class:`~.dense.DenseTrainer` with its tensors on ``device`` (module docstring).

    Options
    -------
    device : torch.device
        Where the tensors live (resolved and checked by :func:`corrtree.train`).
    block : int or "auto"
        Neurons per block of products (default: as many as fit in a quarter of the
        device's free memory).
    """

    name = "dense"
    SCHEMA = DenseTrainer.SCHEMA
    device: Any = None
    #: tensors on the device (torch is optional: typed loosely)
    u: Any
    mask: Any
    prev: Any
    Vt: Any

    @classmethod
    def device_need(
        cls, n: int, m: int, d: int, K: int, band_share: float, implicit: bool, linear: bool
    ) -> float:
        """Modelled resident device bytes of a run: ``W`` (twice with momentum buffers),
        ``X`` and the fire mask."""
        return 8.0 * m * d * (2 if linear else 1) + 8.0 * n * d + m * n

    def _prepare(self, W0: np.ndarray, device: Any = None, block: int | str = "auto") -> None:
        import torch

        self.device = device if device is not None else torch.device("cpu")
        self._setup(np.asarray(W0), block, None, None)

    def _setup(self, W, block, prev_fire, vel) -> None:
        import torch

        self.torch = torch
        dev = self.device
        n, d = self.X.shape
        per_row = 9.0 * n + 8.0 * d  # products (then coefficients), mask, gradient
        resident = self.device_need(n, self.m, d, 1, 0.0, False, vel is not None)
        check_device_memory(resident, dev, f"method='dense' at m={self.m}, d={d} on {dev}")
        if block == "auto":
            block = int(max(1, min(self.m, _BLOCK_SHARE * free_bytes(dev) // per_row)))
        block = int(block)
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.block = min(block, self.m)
        self.info["block"] = self.block
        self.info["device"] = str(dev)
        self.Wt = self._tensor(W)
        self.Xt = self._tensor(self.X)
        self.At = self._tensor(self.a)
        self.Vt = None if vel is None else self._tensor(vel)
        # the previous iteration's fire mask (all points), for the flip count
        self.prev = None
        if prev_fire is not None:
            self.prev = self._mask_of(*prev_fire)
        self.u = None
        self.mask = None  # this iteration's fire mask over all points (m × n, bool)
        self._batch: np.ndarray | None = None
        # the History row's counts of the last forward pass: fired pairs, neurons with a
        # pair, flips (against ``prev``; 0 without it)
        self._stats = [0, 0, 0]
        self._staging = Staging(torch, dev)  # the errors' uploads, queued

    def _tensor(self, arr: np.ndarray):
        """A float64 copy of ``arr`` on the device (the host array stays untouched)."""
        host = np.array(arr, dtype=np.float64, order="C")
        return self.torch.from_numpy(host).to(self.device)

    def _mask_of(self, indptr: np.ndarray, idx: np.ndarray):
        torch = self.torch
        rows = np.repeat(np.arange(self.m), np.diff(indptr))
        mask = torch.zeros((self.m, self.X.shape[0]), dtype=torch.bool, device=self.device)
        mask[
            torch.as_tensor(rows, device=self.device), torch.as_tensor(idx, device=self.device)
        ] = True
        return mask

    def _csr(self, mask) -> tuple[np.ndarray, np.ndarray]:
        keys = self.torch.nonzero(mask.reshape(-1)).reshape(-1).cpu().numpy()  # sorted
        return keys_to_csr(keys.astype(np.int64), self.m, mask.shape[1])

    # -- state ---------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {"W": self.Wt.cpu().numpy()}
        if self.Vt is not None:
            arrays["vel"] = self.Vt.cpu().numpy()
        if self.prev is not None:
            arrays["prev_indptr"], arrays["prev_idx"] = self._csr(self.prev)
        return arrays, {"block": self.block}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        import torch

        if self.device is None:
            self.device = torch.device("cpu")
        prev = previous_fire(arrays, self.X.shape[0])
        self._setup(arrays["W"], scalars["block"], prev, arrays.get("vel"))

    # -- iterations ----------------------------------------------------------------------
    def _forward(self, batch: np.ndarray | None = None) -> np.ndarray:
        torch = self.torch
        Xc = self.Xt
        if batch is not None:  # the batch's points, kept for the step (advance)
            Xc = self.Xt[self._staging.upload(batch, dtype=np.int64)]
        cols = Xc.shape[0]
        # one block (the usual case on a device) writes its mask and outputs where they
        # are made: no buffer to zero or copy into, the same sums
        mask: Any = None
        if self.block < self.m:
            mask = torch.empty((self.m, cols), dtype=torch.bool, device=self.device)
        u: Any = None
        with self.timer("forward"):
            for s in range(0, self.m, self.block):
                U = self.Wt[s : s + self.block] @ Xc.T
                if mask is None:
                    mask = U >= self.b
                else:
                    mask[s : s + self.block] = U >= self.b
                U -= self.b
                U.clamp_(min=0.0)
                part = U.T @ self.At[s : s + self.block]
                u = part if u is None else u.add_(part)
            u *= self.scale
            # the History row's counts of these fire sets ride with u: one transfer (the
            # host computes the loss), no synchronization to read them a step
            f64 = torch.float64
            stats = [mask.sum(dtype=f64), mask.any(dim=1).sum(dtype=f64)]
            if batch is None and self.prev is not None:
                stats.append((mask ^ self.prev).sum(dtype=f64))
            head = torch.cat((torch.stack(stats), u.reshape(-1))).cpu().numpy()
            out = head[len(stats) :].reshape(u.shape)
            self._stats = [int(v) for v in head[: len(stats)]] + [0]
        if batch is None:
            self.u, self.mask = out, mask
        else:
            self._batch, self._batch_mask, self._batch_X = batch, mask, Xc
        return out

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        if self.mask is None:
            self._forward()
        return self._csr(self.mask)

    def outputs(self) -> np.ndarray:
        if self.u is None:
            self._forward()
        return self.u

    def batch_outputs(self, batch: np.ndarray) -> np.ndarray:
        return self._forward(batch)

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        torch = self.torch
        batch, self._batch = self._batch, None
        if batch is None:
            if self.u is None:
                self._forward()
            mask, Xc = self.mask, self.Xt
            errc = self._staging.upload(err)
        else:
            mask, Xc = self._batch_mask, self._batch_X
            errc = self._staging.upload(err[batch])
        fired, moved, flips = self._stats[:3]  # read with the outputs (_forward)
        if step is not None and step.mu and self.Vt is None:
            check_device_memory(8.0 * self.m * self.X.shape[1], self.device, "momentum buffers")
            self.Vt = torch.zeros_like(self.Wt)
        for s in range(0, self.m, self.block):
            with self.timer("backward"):
                C = self.At[s : s + self.block] @ errc.T
                C *= mask[s : s + self.block]
                grad = C @ Xc
            with self.timer("update"):
                W = self.Wt[s : s + self.block]
                if step is None:
                    W -= self.eta_s * grad
                else:
                    grad *= self.scale
                    V = None if self.Vt is None else self.Vt[s : s + self.block]
                    explicit_update(W, V, grad, step)  # type: ignore[arg-type]  # tensors too
        if batch is None:
            self.prev = mask
        self.u = self.mask = None
        return self._row(fired, moved, flips, evaluated_pairs=Xc.shape[0] * self.m)

    def weights(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self.Wt[start:stop].cpu().numpy().copy()
