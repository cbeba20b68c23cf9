"""Exact gradient descent on a torch device from tracked pairs (``device=``, ``"lazy"``).

The band idea of the CPU trainers (``docs/design.md``, "Band trainers"), shaped for a
device: every neuron ``r`` keeps a padded row of ``Q`` tracked pairs (``J[r]``, points
in increasing order, the pad pointing at a zero point ``n``) chosen at its anchor time
``t_a``: every point whose product was within ``β`` of ``b`` or above, and every pair
with a coefficient.  ``W(t) = W(0) - C(t) X``; per step, for all neurons at once:

- ``C += η/sqrt(m) · F ∘ (a_r · err_j)`` on the tracked pairs;
- the exact values by the Gram identity from the anchor,
  ``V = U(t_a) - (C - C(t_a)) · G[J, J]`` (a batched gather of ``G = X Xᵀ``, resident);
- the neuron's movement since its anchor ``D_r = sqrt(ΔCᵀ G[J, J] ΔC)``, with a margin
  for its rounding; an untracked pair had ``U < b - β`` at the anchor and moves at most
  ``D_r·||x_j||``, so while ``D_r·R < β`` it cannot fire.  A neuron past that is
  re-anchored now: its exact row ``w_r(t)·Xᵀ`` (a GEMM) gives its new pairs;
- the outputs ``u_j = Σ a_r (V - b)`` over the firing pairs, sorted by point once per
  anchoring and summed in that fixed order (no atomic accumulation).

Per step O(m·Q²) gathered multiply-adds (no ``d``, no ``n``) plus the re-anchored
rows' GEMMs, against dense's O(m·n·d).  Unlike the CPU lazy trainer it evaluates every
tracked pair every step (a due mask of all ones): on a device the regular batched form
costs less than the bookkeeping of keys.  float64 throughout; the CPU dense trajectory
to rounding (a product within rounding of ``b`` can be classified differently, as
between any two exact methods).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _config
from .._device import check_device_memory, free_bytes
from ._base import Trainer
from ._sparse import keys_to_csr
from ._state import Field, Scalar, Schema
from .costs import fire_share
from .optim import LinearStep

__all__ = ["DeviceLazyTrainer"]

_EPS = 2.0**-52
#: Share of the device's free memory the batched gathers of a chunk of neurons may take.
_CHUNK_SHARE = 0.1


class DeviceLazyTrainer(Trainer):
    """Module docstring.  Options: ``band`` (default :data:`~corrtree._config.BAND`)."""

    name = "lazy"
    #: its state is its own (not the CPU lazy trainer's): it resumes on a device only
    ARRAY_STATE = True
    SCHEMA = Schema(
        1,
        (
            Field("J", ("i8",), ("m", "Q"), index="n1"),
            Field("uref", ("f8",), ("m", "Q")),
            Field("cref", ("f8",), ("m", "Q")),
            Field("C", ("f8",), ("m", "Q")),
            Field("beta", ("f8",), ("m",)),
        ),
        (Scalar("band", float, 0.0), Scalar("flips_next", int, 0)),
    )
    device: Any = None

    def _prepare(self, W0: np.ndarray, device: Any = None, band: float | None = None) -> None:
        import torch

        self.device = device if device is not None else torch.device("cpu")
        band = _config.BAND if band is None else float(band)
        if not band > 0:
            raise ValueError(f"band must be > 0, got {band}")
        self._bind_device(W0, band)
        rows = torch.arange(self.m, device=self.device)
        self.beta = torch.full((self.m,), band, dtype=torch.float64, device=self.device)
        self.J = torch.full((self.m, 1), self.n, dtype=torch.int64, device=self.device)
        zeros = torch.zeros((self.m, 1), dtype=torch.float64, device=self.device)
        self.uref, self.cref, self.C = zeros, zeros.clone(), zeros.clone()
        self._anchor(rows)
        self._values()

    def _bind_device(self, W0: np.ndarray, band: float) -> None:
        import torch

        self.torch = torch
        dev = self.device
        n, d = self.X.shape
        self.n, self.band = n, band
        # W(0), G, X, and the padded rows (J, U(t_a), C(t_a), C, V: 41 bytes a place) at
        # about twice the mean band: the widest row sets the padding
        norms = np.sqrt(np.einsum("ij,ij->i", self.X, self.X))
        places = 2.0 * n * fire_share(norms, self.b - band) + 8.0
        need = 8.0 * (self.m * d + (n + 1) ** 2 + (n + 1) * d) + 41.0 * self.m * places
        check_device_memory(need, dev, f"method='lazy' at m={self.m}, n={n}, d={d} on {dev}")
        f64 = torch.float64
        host = np.zeros((n + 1, d))
        host[:n] = self.X
        self.Xp = torch.from_numpy(host).to(dev)  # a zero point n: the pad
        self.Gp = self.Xp @ self.Xp.T
        self.At = torch.from_numpy(np.array(self.a, dtype=np.float64)).to(dev)
        self.W0 = torch.from_numpy(np.array(W0, dtype=np.float64)).to(dev)
        self.R = float(torch.sqrt((self.Xp * self.Xp).sum(dim=1)).max())
        self.alpha = 1.0
        self.info.update(band=band, device=str(dev))
        self.u = None
        self._flips_next = 0  # flips between W(t) and W(t+1), the next row's
        self.V = None
        self._sorted = None
        self._f64 = f64

    # -- anchoring ---------------------------------------------------------------------
    def _chunk(self, Q: int) -> int:
        per = 8.0 * (3 * Q * Q + self.n + self.X.shape[1] * Q)
        return int(max(1, min(self.m, _CHUNK_SHARE * free_bytes(self.device) // per)))

    def _anchor(self, rows) -> None:
        """Exact rows of ``rows`` now (GEMM), and their new tracked pairs."""
        torch = self.torch
        if rows.numel() == 0:
            return
        n = self.n
        step = self._chunk(self.J.shape[1])
        picked = []
        for s in range(0, rows.numel(), step):
            part = rows[s : s + step]
            w = self.W0[part] - torch.bmm(self.C[part][:, None, :], self.Xp[self.J[part]])[:, 0]
            U = w @ self.Xp[:n].T
            Cd = torch.zeros((part.numel(), n + 1), dtype=self._f64, device=self.device)
            Cd.scatter_(1, self.J[part], self.C[part])
            keep = (U >= self.b - self.beta[part][:, None]) | (Cd[:, :n] != 0)
            picked.append((part, U, Cd, keep))
        width = max(int(k.sum(dim=1).max()) for _, _, _, k in picked)
        if width > self.J.shape[1]:
            self._widen(width)
        Q = self.J.shape[1]
        for part, U, Cd, keep in picked:
            # the kept points first, in increasing order; then the pad
            key = torch.where(keep, 0, n) + torch.arange(n, device=self.device)[None, :]
            order = torch.sort(key, dim=1).indices[:, :Q]
            valid = torch.gather(keep, 1, order)
            J = torch.where(valid, order, torch.full_like(order, n))
            Upad = torch.cat((U, torch.zeros_like(U[:, :1])), dim=1)
            self.J[part] = J
            self.uref[part] = torch.where(valid, torch.gather(Upad, 1, J), 0.0)
            C = torch.gather(Cd, 1, J)
            self.C[part] = C
            self.cref[part] = C
        self._sorted = None  # the outputs' order changes with J

    def _widen(self, width: int) -> None:
        torch = self.torch
        extra = width - self.J.shape[1]
        pad = torch.full((self.m, extra), self.n, dtype=torch.int64, device=self.device)
        self.J = torch.cat((self.J, pad), dim=1)
        z = torch.zeros((self.m, extra), dtype=self._f64, device=self.device)
        self.uref = torch.cat((self.uref, z), dim=1)
        self.cref = torch.cat((self.cref, z), dim=1)
        self.C = torch.cat((self.C, z), dim=1)
        if self.V is not None:
            self.V = torch.cat((self.V, z), dim=1)

    # -- values, certificate, outputs ---------------------------------------------------
    def _values(self, before=None):
        """``V``, ``F`` from the anchors; the neurons whose certificate expired are
        re-anchored (then evaluated again).  Returns them, with their tracked points
        and their firing flags ``before`` (the flags before the step)."""
        again = self._evaluate()
        old = None
        if again.numel() and before is not None:
            old = (self.J[again].clone(), before[again])
        if again.numel():
            self._anchor(again)
            self._evaluate(again)
        return again, old

    def _evaluate(self, rows=None):
        """``V`` (and ``F``) of ``rows`` (all: ``None``) by the Gram identity from their
        anchors; for all rows, returns those whose certificate expired."""
        torch = self.torch
        m, Q = self.J.shape
        if self.V is None or self.V.shape != (m, Q):
            self.V = torch.zeros((m, Q), dtype=self._f64, device=self.device)
        expired = []
        step = self._chunk(Q)
        total = m if rows is None else rows.numel()
        for s in range(0, total, step):
            if rows is None:
                idx = torch.arange(s, min(s + step, total), device=self.device)
            else:
                idx = rows[s : s + step]
            J = self.J[idx]
            dC = self.C[idx] - self.cref[idx]
            # only the pairs whose coefficient moved since the anchor (those that fired)
            # enter the sums: gather G at those P columns only, P = their most in a row
            moving = dC != 0
            P = int(moving.sum(dim=1).max()) if idx.numel() else 0
            if P == 0:
                self.V[idx] = self.uref[idx]
                continue
            first = torch.argsort((~moving).to(torch.int8), dim=1, stable=True)[:, :P]
            Jp, dCp = torch.gather(J, 1, first), torch.gather(dC, 1, first)
            Gs = self.Gp[Jp[:, :, None], J[:, None, :]]  # (rows, P, Q)
            GdC = torch.bmm(dCp[:, None, :], Gs)[:, 0, :]
            self.V[idx] = self.uref[idx] - GdC
            if rows is None:
                D2 = (dC * GdC).sum(dim=1)
                # rounding of the quadratic form: at most (P+2)·ε of its absolute terms
                absq = (dC.abs() * torch.bmm(dCp.abs()[:, None, :], Gs.abs())[:, 0, :]).sum(dim=1)
                D = torch.sqrt(torch.clamp(D2, min=0.0) + 4.0 * (P + 2) * _EPS * absq)
                bad = D * self.R * (1.0 + 1e-12) + 1e-300 >= self.beta[idx]
                expired.append(idx[bad])
        self.F = (self.V >= self.b) & (self.J < self.n)
        if rows is None:
            none = torch.zeros(0, dtype=torch.int64, device=self.device)
            return torch.cat([none, *expired])
        return None

    def _flips(self, before, again, old) -> int:
        """Pairs whose firing changed: by place where the tracked points stayed, by
        point on the re-anchored rows."""
        torch = self.torch
        Q = self.F.shape[1]
        if before.shape[1] < Q:
            before = torch.cat((before, before.new_zeros((self.m, Q - before.shape[1]))), dim=1)
        changed = self.F != before
        if again.numel() == 0:
            return int(changed.sum())
        same = torch.ones(self.m, dtype=torch.bool, device=self.device)
        same[again] = False
        flips = int(changed[same].sum())
        k = again.numel()
        was = torch.zeros((k, self.n + 1), dtype=torch.bool, device=self.device)
        was.scatter_(1, old[0], old[1])
        now = torch.zeros_like(was)
        now.scatter_(1, self.J[again], self.F[again])
        return flips + int((was[:, : self.n] != now[:, : self.n]).sum())

    def _outputs(self):
        """``u`` from the firing pairs, summed point by point in a fixed order."""
        torch = self.torch
        if self._sorted is None:
            flat = self.J.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = torch.bincount(flat, minlength=self.n + 1)
            self._sorted = (order, counts)
        order, counts = self._sorted
        K = self.At.shape[1]
        contrib = torch.where(self.F, self.V - self.b, 0.0)[:, :, None] * self.At[:, None, :]
        vals = contrib.reshape(-1, K)[order]
        u = torch.segment_reduce(vals, "sum", lengths=counts, axis=0)[: self.n]
        return (u * self.scale * self.alpha).cpu().numpy()

    # -- the trainer's interface ----------------------------------------------------------
    def outputs(self) -> np.ndarray:
        if self.u is None:
            self.u = self._outputs()
        return self.u

    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        torch = self.torch
        r, q = torch.nonzero(self.F, as_tuple=True)
        keys = (r * self.n + self.J[r, q]).cpu().numpy()
        return keys_to_csr(np.sort(keys).astype(np.int64), self.m, self.n)

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        torch = self.torch
        if step is not None:
            raise ValueError(
                "method='lazy' on a device takes plain gradient steps (no momentum or "
                "weight decay yet): use method='dense' there"
            )
        before = self.F
        with self.timer("backward"):
            E = torch.from_numpy(np.ascontiguousarray(err, dtype=np.float64)).to(self.device)
            Ep = torch.cat((E, torch.zeros_like(E[:1])), dim=0)
            g = (Ep[self.J] * self.At[:, None, :]).sum(dim=2)
            self.C += self.eta_s * torch.where(self.F, g, 0.0)
        with self.timer("query"):
            fired = int(before.sum())  # the History row describes W(t), before the step
            moved = int(before.any(dim=1).sum())
            tracked = int((self.J < self.n).sum())
            again, old = self._values(before)
        with self.timer("forward"):
            self.u = self._outputs()
            flips, self._flips_next = self._flips_next, self._flips(before, again, old)
        return self._row(
            fired,
            moved,
            flips,
            band_pairs=tracked,
            reanchored=int(again.numel()),
            evaluated_pairs=tracked,
        )

    def weights(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        torch = self.torch
        start, stop, _ = slice(start, stop).indices(self.m)
        idx = torch.arange(start, stop, device=self.device)
        w = self.W0[idx] - torch.bmm(self.C[idx][:, None, :], self.Xp[self.J[idx]])[:, 0]
        return w.cpu().numpy()

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {
            "J": self.J.cpu().numpy(),
            "uref": self.uref.cpu().numpy(),
            "cref": self.cref.cpu().numpy(),
            "C": self.C.cpu().numpy(),
            "beta": self.beta.cpu().numpy(),
        }
        return arrays, {"band": self.band, "flips_next": self._flips_next}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        import torch

        if self.device is None:
            self.device = torch.device("cpu")
        self._bind_device(W0, scalars["band"])
        t = lambda a: torch.from_numpy(np.array(a)).to(self.device)  # noqa: E731
        self.J, self.uref, self.cref = t(arrays["J"]), t(arrays["uref"]), t(arrays["cref"])
        self.C, self.beta = t(arrays["C"]), t(arrays["beta"])
        self._flips_next = int(scalars["flips_next"])
        self._sorted = None
        # the values from the anchors; every certificate held when the state was saved
        self._evaluate(torch.arange(self.m, device=self.device))
