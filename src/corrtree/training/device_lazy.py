"""The lazy trainer on a torch device (``device=``, ``"lazy"``): exact gradient descent
from tracked pairs.

The band idea of the CPU trainers (``docs/design.md``, "Band trainers"), shaped for a
device: every neuron ``r`` keeps a padded row of ``Q`` tracked pairs (``J[r]``, points
in increasing order, the pad pointing at a zero point ``n``) chosen at its anchor time
``t_a``: every point whose product was within ``β`` of ``b`` or above, and every pair
with a coefficient.  ``W(t) = W(0) - C(t) X``; per step, for all neurons at once:

- ``C += η/sqrt(m) · F ∘ (a_r · err_j)`` on the tracked pairs;
- the exact values by the Gram identity from the anchor,
  ``V = U(t_a) - (C - C(t_a))·G`` at the tracked places, by one GEMM of the
  coefficient changes spread over the points (``2·(n+1)²`` flops a row; where
  ``d < (n+1)/2`` by the move ``ΔW = ΔC·X`` and ``ΔW·Xᵀ``, ``4·(n+1)·d``);
- the neuron's movement since its anchor ``D_r = sqrt(ΔCᵀ G ΔC)`` (or ``||ΔW||``),
  with a margin for its rounding; an untracked pair had ``U < b - β`` at the anchor
  and moves at most ``D_r·||x_j||``, so while ``D_r·R < β`` it cannot fire.  A neuron
  past that is re-anchored now: its exact row ``w_r(t)·Xᵀ`` (a GEMM) gives its new
  pairs, in a batch sized from the last steps' re-anchorings (:func:`capacity`);
- the outputs ``u_j = Σ a_r (V - b)`` over the firing pairs, the rows' contributions
  spread over the points and multiplied by the output weights (one GEMM: a fixed
  order, no atomic accumulation).

Every shape in a step is fixed by the run's sizes and the batch's capacity, and a step
is two transfers: the number of expired rows, which sizes the batch (none when none
expired), and at the end the History row's counts and ``u(t+1)``; no other host
synchronization (``tests/test_device_count.py`` counts them).  Rows whose new pairs
outgrow the tracked width are re-anchored in one more pass after it.  Per step
O(m·(n+1)·min(n+1, 2d)) GEMM flops plus the re-anchored rows' GEMMs, against dense's
O(m·n·d): on a GPU the matrix products cost less than the gathers of the Gram identity
(one gathered entry about 1 600 float64 flops on an H200).  Unlike the CPU lazy trainer
it evaluates every tracked pair every step (a due mask of all ones).  float64
throughout; the CPU dense trajectory to rounding (a product within rounding of ``b``
can be classified differently, as between any two exact methods).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._state import Field, Scalar, Schema
from .device_band import _SLACK, ANCHOR_FIELDS, DeviceBand, capacity, compact
from .optim import LinearStep

__all__ = ["DeviceLazyTrainer"]


class DeviceLazyTrainer(DeviceBand):
    """Module docstring.  Options: ``band`` (default :data:`~corrtree._config.BAND`)."""

    name = "lazy"
    SCHEMA = Schema(
        2,
        (
            *ANCHOR_FIELDS,
            Field("C", ("f8",), ("m", "Q")),
            Field("beta", ("f8",), ("m",)),
        ),
        (
            Scalar("band", float, 0.0),
            Scalar("flips_next", int, 0),
            # the rows re-anchored in the last two steps, a record (each step sizes its
            # batch from its own count of expired rows, so a resumed run batches as the
            # uninterrupted one)
            Scalar("reanchored_before", int, 0, "m"),
            Scalar("reanchored", int, 0, "m"),
        ),
    )
    PADDED = ("uref", "cref", "C", "V")

    def _prepare(self, W0: np.ndarray, device: Any = None, band: float | None = None) -> None:
        self.V = None
        rows = self._empty_rows(W0, device, band)
        self.C = self._anchor(rows, self.torch.zeros_like(self.uref), moved=False)
        # at W(0) every row is at its anchor: its values are its products, none expired
        self.V = self.uref.clone()
        self.F = (self.V >= self.b) & (self.J < self.n)
        self._recent = [self.m, self.m]  # the rows re-anchored in the last two steps

    def _coef(self, idx):
        return self.C[idx]

    def _evaluate(self):
        """``V``, ``F`` of every row from its anchor (:meth:`_gemm_values`, by chunks);
        returns the mask of the rows whose certificate expired."""
        torch = self.torch
        m, Q = self.J.shape
        if self.V is None or self.V.shape != (m, Q):
            self.V = torch.zeros((m, Q), dtype=self._f64, device=self.device)
        expired = torch.zeros(m, dtype=torch.bool, device=self.device)
        step = self._chunk(Q)
        for s in range(0, m, step):
            rows = slice(s, min(s + step, m))
            self.V[rows], D = self._gemm_values(
                self.J[rows], self.C[rows], self.cref[rows], self.uref[rows]
            )
            expired[rows] = self._expired(self.beta[rows], D)
        self.F = (self.V >= self.b) & (self.J < self.n)
        return expired

    def _reanchor(self, rows, live, before):
        """Re-anchor the rows of ``rows`` that ``live`` marks and whose new pairs fit the
        present width (:meth:`_anchor_pick`, :meth:`_anchor_write`), by chunks; right
        after its anchoring a row's values are its products.  Returns the mask of those
        written (over ``rows``), their flips against the flags ``before`` compared by
        point, and the widest new row of those that did not fit (device scalars)."""
        torch = self.torch
        n, Q = self.n, self.J.shape[1]
        written, flips, need = [], [], []
        step = self._chunk(Q)
        for s in range(0, rows.numel(), step):
            part, want = rows[s : s + step], live[s : s + step]
            oldJ, was = self.J[part], before[part]
            U, Cd, kept = self._anchor_pick(part, self.C[part])
            width = kept.sum(dim=1, dtype=self._f64)
            ok = want & (width <= Q)
            need.append(torch.where(ok, 0.0, width).max())
            self.C[part], uref = self._anchor_write(part, U, Cd, kept, ok)
            self.V[part] = torch.where(ok[:, None], uref, self.V[part])
            # a written row fires where its product is at least b (each such point kept)
            changed = self._by_point(oldJ, was)[:, :n] != (U[:, :n] >= self.b)
            flips.append((changed & ok[:, None]).sum(dtype=self._f64))
            written.append(ok)
        if len(written) == 1:
            return written[0], flips[0], need[0]
        return torch.cat(written), sum(flips), torch.stack(need).max()

    def _padded(self, flags):
        Q = self.J.shape[1]
        if flags.shape[1] == Q:
            return flags
        return self.torch.cat((flags, flags.new_zeros((self.m, Q - flags.shape[1]))), dim=1)

    def outputs(self) -> np.ndarray:
        if self.u is None:
            self.u = self._outputs().cpu().numpy()
        return self.u

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        """One step in fixed shapes: the coefficients, every row's values by GEMM, the
        number expired read (one transfer), the expired rows re-anchored in a batch of
        their :func:`capacity`, the outputs by GEMM, and one transfer carrying the
        History row and ``u(t+1)``.  Expired rows whose new pairs outgrow the tracked
        width are re-anchored in one more pass (the width grown with :data:`_SLACK` to
        spare), one more transfer each."""
        torch = self.torch
        self._refuse_linear(step)
        n, m, K, f64 = self.n, self.m, self.At.shape[1], self._f64
        before = self.F
        with self.timer("backward"):
            Ep = torch.zeros((n + 1, K), dtype=f64, device=self.device)
            self._upload(err, Ep[:n])
            g = self._own_at(Ep, self.J, self.At)
            self.C.addcmul_(self.F, g, value=self.eta_s)  # C += η/√m·F∘g, one launch
        with self.timer("query"):
            # the History row describes W(t), before the step
            stats = (
                before.sum(dtype=f64),
                before.any(dim=1).sum(dtype=f64),
                (self.J < n).sum(dtype=f64),
            )
            expired = self._evaluate()
            done = torch.zeros(m, dtype=torch.bool, device=self.device)
            batch, need, first = 0, 0, True
            # the number expired read first (one transfer): the batch holds them all
            # (capacity), none when none expired, and a second pass is needed only for
            # rows whose new pairs outgrow the tracked width
            cap = capacity(int(expired.sum()), m)
            while True:
                todo = expired if first else expired & ~done
                if cap:
                    rows, live = compact(
                        torch, todo, cap, self._arange(todo.numel()), self._by_sort(todo.numel())
                    )
                    written, flips, need = self._reanchor(rows, live, self._padded(before))
                    if first:
                        done[rows] = written  # nothing was done before
                    else:
                        done[rows] |= written
                    batch = batch + flips
                self.F = (self.V >= self.b) & (self.J < n)
                undone = ~done
                same = ((self.F != self._padded(before)) & undone[:, None]).sum(dtype=f64)
                left = (todo & undone).sum(dtype=f64)
                if not torch.is_tensor(need):  # no batch: nothing outgrew the width
                    need = torch.zeros_like(left)
                counts = (*stats, batch + same, expired.sum(dtype=f64), left, need)
                u = self._outputs().reshape(-1)
                head = torch.cat((torch.stack(counts), u)).cpu().numpy()  # one transfer
                nflips, again, left, width = (int(v) for v in head[3:7])
                if not left:
                    break
                first = False
                if width > self.J.shape[1]:
                    self._widen(width + width // _SLACK)
                cap = capacity(left, m)
        self.u = np.array(head[7:].reshape(n, K))
        self._recent = [self._recent[-1], again]
        flips_row, self._flips_next = self._flips_next, nflips
        return self._row(
            int(head[0]),
            int(head[1]),
            flips_row,
            band_pairs=int(head[2]),
            reanchored=again,
            evaluated_pairs=int(head[2]),
        )

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {
            "J": self.J.cpu().numpy(),
            "uref": self.uref.cpu().numpy(),
            "cref": self.cref.cpu().numpy(),
            "C": self.C.cpu().numpy(),
            "beta": self.beta.cpu().numpy(),
        }
        before, last = self._recent
        scalars = {"band": self.band, "flips_next": self._flips_next}
        return arrays, scalars | {"reanchored_before": before, "reanchored": last}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        import torch

        if self.device is None:
            self.device = torch.device("cpu")
        self._bind_device(W0, scalars["band"])
        t = self._tensor
        self.J, self.uref, self.cref = t(arrays["J"]), t(arrays["uref"]), t(arrays["cref"])
        self.C, self.beta = t(arrays["C"]), t(arrays["beta"])
        self._flips_next = int(scalars["flips_next"])
        self.V = None
        # the values from the anchors; every certificate held when the state was saved
        self._evaluate()
        self._recent = [int(scalars["reanchored_before"]), int(scalars["reanchored"])]
