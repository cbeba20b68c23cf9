"""Exact gradient descent on a torch device by the NTK recurrence (``device=``, ``"kernel"``).

The CPU kernel trainer's idea (``docs/design.md``, "The kernel trainer"), shaped for a
device.  While no pair crosses ``b`` the outputs obey exactly

    u(t+1) = u(t) - η·H·err(t),    H = (1/m)·Σ_r (a_r a_rᵀ) ⊗ (f_r f_rᵀ ∘ G)

(``f_r`` the fire set of neuron ``r`` as a 0/1 vector, ``H`` ``nK × nK`` and resident),
so a step is one mat-vec, plus the work on the neurons whose pairs may cross:

- **Coefficients without a pass over the pairs.**  ``E(t) = Σ_{τ<t} err(τ)``; a pair that
  fires has ``C = κ + η/√m·<a_r, E_j>``, one that does not ``C = κ``; a flip rewrites
  ``κ`` so that ``C`` is continuous.  A step adds ``err`` to ``E`` (O(nK)).
- **A clock per neuron, a due mask.**  Each step adds to ``clock[r]`` a bound on
  ``||w_r(t+1) - w_r(t)||``: ``η/√m·min(σ_r·||e||, Σ_l |e_l|·||x_l||)``, ``e_l =
  <a_r, err_l>`` over its fire set and ``σ_r² >= λ_max(G[S, S])`` (Gershgorin, from its
  last visit).  A neuron is due when its clock reaches its *limit*: the least
  ``(|V - b| - rounding)/||x_j||`` over its tracked pairs (``V`` their values at its last
  visit), and its band, ``β/R`` less its distance from its anchor.  Short of that no
  tracked pair crossed and no untracked pair fires.  The mask is recomputed each step
  (O(m·Q) for the clocks), no heap.
- **A visit** (due neurons, batched): values by the Gram identity from the anchor
  (:meth:`DeviceBand._gram`), re-anchoring by GEMM past the band, flips found by place,
  ``u`` corrected by ``Σ (a_r/√m)(V - b)(F_new - F_old)`` (a stable sort by point, then
  a segment reduction: no atomics), and the count matrix ``N = Σ_r (a_r a_rᵀ) ⊗ f_r f_rᵀ``
  changed at the entries the flips touch, then ``H = N ∘ G / m`` recomputed there.

``N`` holds integers (exact in float64 whatever the order of its additions), so ``H``
does not drift from the fire sets and a checkpoint rebuilds it bit for bit.  Per step
O((nK)² + m·Q + visits), no ``m·n·d``.  float64 throughout.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np

from .. import _config
from .._device import free_bytes
from ._state import Field, Scalar, Schema
from .device_band import (
    _CHUNK_SHARE,
    _EPS,
    ANCHOR_FIELDS,
    DeviceBand,
    marked_first,
    segment_sums,
)
from .optim import LinearStep

__all__ = ["DeviceKernelTrainer"]

#: float32 GEMM of 0/±1 matrices: every partial sum an integer below this, so exact
_EXACT_F32 = 2**24


class DeviceKernelTrainer(DeviceBand):
    """Module docstring.  Options: ``band`` (default :data:`~corrtree._config.BAND`)."""

    name = "kernel"
    SCHEMA = Schema(
        1,
        (
            *ANCHOR_FIELDS,
            Field("kappa", ("f8",), ("m", "Q")),
            Field("F", ("b1",), ("m", "Q")),
            Field("beta", ("f8",), ("m",)),
            Field("sigma", ("f8",), ("m",), finite=False),
            Field("key", ("f8",), ("m", "Q"), finite=False),
            Field("bandkey", ("f8",), ("m",)),
            Field("clock", ("f8",), ("m",)),
            Field("E", ("f8",), ("n", "K")),
            Field("u", ("f8",), ("n", "K")),
        ),
        (Scalar("band", float, 0.0), Scalar("flips_next", int, 0)),
    )
    PADDED = ("uref", "cref", "kappa", "F", "key")
    PAD_FILL: ClassVar[dict[str, float]] = {"key": np.inf}  # a pad is never due
    #: tensors made after the first anchoring, or per step (torch is optional)
    key: Any
    Jf: Any
    XNf: Any
    u_dev: Any
    # J, uref, cref, κ, F, key, and the visits' gathers
    PLACE_BYTES = 49.0 + 24.0

    @classmethod
    def _fixed_bytes(cls, n: int, K: int) -> float:
        return 20.0 * (n * K) ** 2  # N, H, and a float32 count matrix while N is built

    def _prepare(self, W0: np.ndarray, device: Any = None, band: float | None = None) -> None:
        rows = self._empty_rows(W0, device, band)
        torch, m, n, K, f64 = self.torch, self.m, self.n, self.At.shape[1], self._f64
        self.key = None  # made after the first anchoring
        self.kappa = torch.zeros_like(self.uref)
        self.F = torch.zeros((m, 1), dtype=torch.bool, device=self.device)
        self.kappa = self._anchor(rows, self.kappa)  # W(0): every coefficient is 0
        self.V = self.uref
        self.F = (self.V >= self.b) & (self.J < n)
        self.u_dev = self._outputs()
        self.V = None
        self.Ep = torch.zeros((n + 1, K), dtype=f64, device=self.device)
        self.sigma = torch.full((m,), np.inf, dtype=f64, device=self.device)
        self.Jf = None
        self._fire_lists(rows, self.F)
        self.clock = torch.zeros(m, dtype=f64, device=self.device)
        self.limit = torch.zeros(m, dtype=f64, device=self.device)
        allow = self._allow(rows, self.kappa)
        self.key = self._keys(rows, self.uref, allow, self.clock)
        self.bandkey = self._band_keys(rows, allow, self.clock)
        self._set_limits(rows)
        self._counts()

    # -- N and H -----------------------------------------------------------------------
    def _counts(self) -> None:
        """``N`` from the fire sets (float32 GEMMs of 0/±1 rows, exact), then ``H``."""
        torch = self.torch
        nK = self.n * self.At.shape[1]
        self.N = torch.zeros((nK, nK), dtype=self._f64, device=self.device)
        self.H = torch.empty_like(self.N)
        every = torch.arange(self.m, device=self.device)
        self._add_counts(every, self.J, self.F, 1.0)
        self._rebuild_h()
        self.nfire = self.F.sum(dim=1)

    def _add_counts(self, rows, J, F, sign: float) -> None:
        """``N += sign·Σ_r (a_r a_rᵀ) ⊗ f_r f_rᵀ`` over ``rows`` (their fire flags ``F`` at
        their tracked points ``J``): float32 GEMMs of 0/±1 rows, each partial sum an
        integer below 2^24, so exact, and added to ``N`` exactly."""
        torch = self.torch
        n, K = self.n, self.At.shape[1]
        nK = n * K
        step = max(1, min(_EXACT_F32 - 1, self._chunk(J.shape[1], 8.0 * (n + 1) * (K + 1))))
        for s in range(0, rows.numel(), step):
            part = rows[s : s + step]
            Fd = self._by_point(J[s : s + step], F[s : s + step].to(torch.float32))
            M = (Fd[:, :n, None] * self.At[part, None, :].to(torch.float32)).reshape(-1, nK)
            self.N.add_(M.T @ M, alpha=sign)

    def _rebuild_h(self) -> None:
        """``H = N ∘ G / m`` everywhere (:meth:`_ntk_at`), by blocks of rows: the
        temporaries stay a share of the device's memory."""
        torch = self.torch
        K = self.At.shape[1]
        nK = self.N.shape[0]
        every = torch.arange(nK, device=self.device)
        block = max(1, int(_CHUNK_SHARE * free_bytes(self.device) // (24.0 * nK)))
        for s in range(0, nK, block):
            Ir, Jx = every[s : s + block, None], every[None, :]
            self.H[s : s + block] = self._ntk_at(Ir, Jx, self.Gp[Ir // K, Jx // K])

    def _ntk_at(self, Ir, Jx, g):
        """``H`` at the flat indices ``(Ir, Jx)`` from ``N`` and ``g``, the entries of ``G``
        there: ``N ∘ G / m``, one expression everywhere, so an entry recomputed equals the
        matrix built anew."""
        return self.N[Ir, Jx] * g / float(self.width)

    def _change_counts(self, rows, J, fo, fn, changed) -> None:
        """Add ``f_new f_newᵀ - f_old f_oldᵀ`` (times ``a_r a_rᵀ``) of ``rows`` to ``N``
        at the entries that change, and recompute ``H`` there; by groups of flips, each
        flip ``2·Q·K²`` entries at most.  The additions are integers, so ``N`` is exact
        whatever their order and grouping.

        Where the device's rates price it lower (many flips on long fire sets: image
        patches), the changed rows' old fire sets are subtracted from ``N`` and their new
        ones added by float32 GEMMs instead (:meth:`_add_counts`: ``4·k·(nK)²`` flops for
        ``k`` rows), and ``H`` is rebuilt (:meth:`_rebuild_h`): the same integers in
        ``N``, the same expression for ``H``."""
        torch = self.torch
        K = self.At.shape[1]
        nK = self.n * K
        touched = changed.any(dim=1)
        entries = changed.sum(dim=1) * (fn.sum(dim=1) + fo.sum(dim=1))
        both = torch.stack((entries.sum() * K * K, touched.sum())).tolist()  # one transfer
        scattered, k = (int(v) for v in both)
        rate = self._rates()
        by_gemm = 4.0 * k * nK * nK / rate["flops32"] + 48.0 * nK * nK / rate["bytes"]
        fits = 8.0 * nK * nK <= _CHUNK_SHARE * free_bytes(self.device)  # a float32 product
        if fits and by_gemm < 2.0 * scattered / rate["scatters"]:  # N and H, entry by entry
            t = touched.nonzero().reshape(-1)
            self._add_counts(rows[t], J[t], fo[t], -1.0)
            self._add_counts(rows[t], J[t], fn[t], 1.0)
            self._rebuild_h()
            return
        rl, q = torch.nonzero(changed, as_tuple=True)
        per = 2.0 * J.shape[1] * K * K * 64.0  # indices, values, G and H for each entry
        group = max(1, int(_CHUNK_SHARE * free_bytes(self.device) // per))
        fnd, fod = fn.double(), fo.double()
        for s in range(0, rl.numel(), group):
            rg, qg = rl[s : s + group], q[s : s + group]
            # (q, q') with q changed: f_new[q] f_new[q'] - f_old[q] f_old[q']
            val = fnd[rg, qg, None] * fnd[rg] - fod[rg, qg, None] * fod[rg]
            e, q2 = torch.nonzero(val, as_tuple=True)
            v, j1, j2, r = val[e, q2], J[rg[e], qg[e]], J[rg[e], q2], rg[e]
            # and (q', q) with q' unchanged (a changed q' has its own entries)
            back = ~changed[r, q2]
            r, v = torch.cat((r, r[back])), torch.cat((v, v[back]))
            j1, j2 = torch.cat((j1, j2[back])), torch.cat((j2, j1[back]))
            g = self.Gp[j1, j2]
            if K == 1:
                vals, Ir, Jx = v * self.At[rows[r], 0] ** 2, j1, j2
            else:
                a = self.At[rows[r]]
                kk = torch.arange(K, device=self.device)
                Ir = (j1[:, None, None] * K + kk[None, :, None]).expand(-1, K, K).reshape(-1)
                Jx = (j2[:, None, None] * K + kk[None, None, :]).expand(-1, K, K).reshape(-1)
                vals = (v[:, None, None] * a[:, :, None] * a[:, None, :]).reshape(-1)
                g = g[:, None].expand(-1, K * K).reshape(-1)
            self.N.index_put_((Ir, Jx), vals, accumulate=True)
            self.H[Ir, Jx] = self._ntk_at(Ir, Jx, g)

    # -- coefficients, limits, clocks --------------------------------------------------
    def _own(self, idx, Ep, width: int | None = None):
        """``<a_r, E_j>`` at the first ``width`` places (all: ``None``) of rows ``idx``."""
        return (Ep[self.J[idx, :width]] * self.At[idx, None, :]).sum(dim=2)

    def _coef(self, idx, width: int | None = None):
        g = self._own(idx, self.Ep, width)
        F = self.F[idx, :width]
        return self.kappa[idx, :width] + self.torch.where(F, self.eta_s * g, 0.0)

    def _allow(self, idx, C):
        """The rounding of two evaluations of a value of rows ``idx`` (coefficients
        ``C``), by the Gram identity (``Q`` terms) or by the move (``n + 1`` terms, then
        ``d``): a value within it of ``b`` may be on either side."""
        Q = C.shape[1]
        dC = (C - self.cref[idx, :Q]).abs().sum(dim=1)
        uref = self.uref[idx, :Q].abs().amax(dim=1)
        terms = max(self.J.shape[1], self.n + 1) + self.X.shape[1]
        return 8.0 * (terms + 2) * _EPS * (uref + dC * self.R * self.R)

    def _keys(self, idx, V, allow, clock):
        """Each tracked pair's key: the clock at which it may cross ``b``, its value ``V``
        at clock ``clock``: ``clock + (|V - b| - allow)/||x_j||`` (pads: inf)."""
        J = self.J[idx, : V.shape[1]]
        valid = J < self.n
        gap = ((V - self.b).abs() - allow[:, None]) / self.torch.where(valid, self.xnorm[J], 1.0)
        return self.torch.where(valid, clock[:, None] + gap, np.inf)

    def _band_keys(self, idx, allow, clock, D=None):
        """The clock at which rows ``idx`` may leave their band, from their distance ``D``
        from the anchor at clock ``clock`` (0 when ``None``)."""
        key = clock + (self.beta[idx] - allow) / (self.R * (1.0 + 1e-12))
        return key if D is None else key - D

    def _set_limits(self, idx) -> None:
        """A row is due when its clock reaches the least of its keys."""
        key = self.torch.where(self.J[idx] < self.n, self.key[idx], np.inf)  # pads: never
        self.limit[idx] = self.torch.minimum(key.amin(dim=1), self.bandkey[idx])

    def _steps(self, E):
        """A bound on each neuron's step for the error ``E`` (padded), float64 rounding
        included: ``η/√m·min(σ_r·||e||, Σ |e_l|·||x_l||)``, over the compact fire sets
        (``m·Pf`` gathers, ``Pf`` the most firing points of a neuron)."""
        torch = self.torch
        if self.At.shape[1] == 1:
            e = E[self.Jf, 0]  # |<a_r, err_l>| = |err_l|
        else:
            e = (E[self.Jf] * self.At[:, None, :]).sum(dim=2)
        tri = (e.abs() * self.XNf).sum(dim=1)
        two = self.sigma * torch.sqrt((e * e).sum(dim=1))
        bound = torch.where(torch.isinf(self.sigma), tri, torch.minimum(tri, two))
        return self.eta_s * bound * (1.0 + 4.0 * (self.Jf.shape[1] + 4) * _EPS)

    def _fire_lists(self, idx, F) -> None:
        """The compact fire sets of rows ``idx`` (flags ``F`` at their places): their
        points first (the pad ``n`` after) and their norms, widened for all rows when a
        row fires on more points than the lists hold."""
        torch = self.torch
        Pf = max(1, int(F.sum(dim=1).max()) if idx.numel() else 1)
        if self.Jf is None or Pf > self.Jf.shape[1]:
            Jf = torch.full((self.m, Pf), self.n, dtype=torch.int64, device=self.device)
            if self.Jf is not None:
                Jf[:, : self.Jf.shape[1]] = self.Jf
            self.Jf, self.XNf = Jf, self.xnorm[Jf]
        k = min(F.shape[1], self.Jf.shape[1])  # the rows' places may be fewer than the lists'
        first = marked_first(torch, F, k)
        fired = torch.gather(F, 1, first)
        J = self.J[idx, : F.shape[1]]
        lists = torch.full((idx.numel(), self.Jf.shape[1]), self.n, dtype=J.dtype, device=J.device)
        lists[:, :k] = torch.where(fired, torch.gather(J, 1, first), self.n)
        self.Jf[idx], self.XNf[idx] = lists, self.xnorm[lists]

    def _sigma(self, idx, F):
        """Gershgorin: ``σ_r² = max_p Σ_q |G_pq|`` over the fire set, rounding included."""
        torch = self.torch
        Pf = int(F.sum(dim=1).max()) if idx.numel() else 0
        if Pf == 0:
            return torch.zeros(idx.numel(), dtype=self._f64, device=self.device)
        first = marked_first(torch, F, Pf)
        J = self.J[idx, : F.shape[1]]
        Jf = torch.where(torch.gather(F, 1, first), torch.gather(J, 1, first), self.n)
        rows = self.Gp[Jf[:, :, None], Jf[:, None, :]].abs().sum(dim=2).amax(dim=1)
        return torch.sqrt(rows * (1.0 + 4.0 * (Pf + 2) * _EPS))

    # -- a visit -------------------------------------------------------------------------
    def _distance(self, idx, C, P=None):
        """``D >= ||w_r(t) - w_r(t_a)||`` of rows ``idx``: ``sqrt(ΔCᵀ G ΔC)`` over the
        moved columns, with the margin of its rounding (:meth:`DeviceBand._distance_of`);
        ``P``: as for :meth:`DeviceBand._moved`."""
        torch = self.torch
        Jp, dCp = self._moved(idx, C, P)
        P = Jp.shape[1]
        if P == 0:
            return torch.zeros(idx.numel(), dtype=self._f64, device=self.device)
        G = self.Gp[Jp[:, :, None], Jp[:, None, :]]
        return self._distance_of((dCp * torch.bmm(dCp[:, None, :], G)[:, 0, :]).sum(dim=1), dCp)

    def _values_at(self, idx, C, due, P=None, Qd=None):
        """Values of rows ``idx`` by the Gram identity at the places ``due`` (0 elsewhere):
        O(k·P·Qd) gathers, ``Qd`` the most due places in a row (read from the device
        unless given, as ``P``: :meth:`DeviceBand._moved`)."""
        torch = self.torch
        width = C.shape[1]
        J = self.J[idx, :width]
        if Qd is None:
            Qd = int(due.sum(dim=1).max())
        places = marked_first(torch, due, Qd)
        real = torch.gather(due, 1, places)
        Jd = torch.where(real, torch.gather(J, 1, places), self.n)
        Vd = torch.gather(self.uref[idx, :width], 1, places)
        Jp, dCp = self._moved(idx, C, P)
        if Jp.shape[1]:
            Gs = self.Gp[Jp[:, :, None], Jd[:, None, :]]  # (k, P, Qd)
            Vd = Vd - torch.bmm(dCp[:, None, :], Gs)[:, 0, :]
        V = torch.zeros((idx.numel(), width), dtype=self._f64, device=self.device)
        V.scatter_(1, places, torch.where(real, Vd, 0.0))
        return V

    def _by_product(self, idx, C, due, banded) -> tuple[bool, int, int]:
        """Whether rows ``idx`` cost less by their moves than by the Gram identity,
        priced with the device's rates (:data:`~corrtree._config.DEVICE_RATES`): the
        Gram identity gathers ``P·Qd`` entries a row for its due values and ``P²`` a
        banded row for its distance (``P`` the most moved coefficients of a row, ``Qd``
        its most due places: the batch is padded to them); the moves are one GEMM
        ``ΔC·X`` (``2·n·d`` flops a row), and the values one more against every point
        (``2·n·d``), from which the due ones are gathered.  Either gives every value and
        distance to its rounding (:meth:`_allow`).  Returns the choice, ``P`` and ``Qd``
        (one transfer: the Gram identity then reads neither again)."""
        torch = self.torch
        moving = C != self.cref[idx, : C.shape[1]]
        most = torch.stack((moving.sum(dim=1).max(), due.sum(dim=1).max(), banded.sum()))
        P, Qd, kb = (int(v) for v in most.tolist())  # one transfer
        if P == 0:
            return False, P, Qd
        rate = self._rates()
        k, n, d = idx.numel(), self.n, self.X.shape[1]
        gram = (k * Qd + kb * P) * P / rate["gathers"]
        product = 2.0 * k * n * d * (1 + (Qd > 0)) / rate["flops64"]
        return product + k * (n + 1 + Qd) / rate["gathers"] < gram, P, Qd

    def _rates(self) -> dict[str, float]:
        """The device's rates (:data:`~corrtree._config.DEVICE_RATES`)."""
        return _config.DEVICE_RATES.get(self.device.type, _config.DEVICE_RATES["cpu"])

    def _moves(self, idx, C):
        """``ΔW = ΔC·X`` of rows ``idx`` since their anchors (one GEMM over the points)
        and ``Σ|ΔC|`` of each: ``(k, d)``, ``(k,)``."""
        dC = C - self.cref[idx, : C.shape[1]]
        dW = self._by_point(self.J[idx, : C.shape[1]], dC) @ self.Xp
        return dW, dC.abs().sum(dim=1)

    def _distance_by_move(self, dW, l1):
        """``D >= ||w_r(t) - w_r(t_a)||`` from the computed move ``dW``: each of its
        entries errs by at most ``γ_{n+1}·Σ_p |ΔC_p||x_pt|``, so the vector by
        ``γ_{n+1}·Σ|ΔC|·R``, and its norm by ``γ_d`` relative."""
        d = dW.shape[1]
        norm = self.torch.sqrt((dW * dW).sum(dim=1))
        return norm * (1.0 + 4.0 * (d + 2) * _EPS) + 4.0 * (self.n + 3) * _EPS * l1 * self.R

    def _values_by_move(self, idx, C, due, dW):
        """:meth:`_values_at` from the moves: ``U(t_a) - ΔW·x_j`` for every point
        (one GEMM), gathered at the due places."""
        torch = self.torch
        width = C.shape[1]
        J = self.J[idx, :width]
        delta = dW @ self.Xp.T  # (k, n + 1); the pad point's column is 0
        V = self.uref[idx, :width] - torch.gather(delta, 1, J)
        return torch.where(due, V, 0.0)

    def _visit(self, idx, width: int, flips: list) -> tuple[int, int]:
        """Visit rows ``idx`` at ``W(t+1)``, their tracked places within the first
        ``width``: the exact distance of the rows whose band key passed (re-anchoring
        those past the band), the values of the pairs whose key passed, flips (``κ``,
        ``N`` and ``H``, the outputs' corrections appended to ``flips``), ``σ``, keys.
        Returns how many rows were re-anchored and how many values computed."""
        torch = self.torch
        n = self.n
        clock = self.clock[idx]
        C = self._coef(idx, width)
        fo, kap = self.F[idx, :width], self.kappa[idx, :width]
        key, bandkey = self.key[idx, :width], self.bandkey[idx]
        banded = clock >= bandkey
        due = (key <= clock[:, None]) & (self.J[idx, :width] < n)
        product, P, Qd = self._by_product(idx, C, due, banded)
        if product:
            dW, l1 = self._moves(idx, C)
        D = torch.zeros_like(clock)
        if bool(banded.any()):
            if product:
                D[banded] = self._distance_by_move(dW[banded], l1[banded])
            else:
                D[banded] = self._distance(idx[banded], C[banded], P)
        bad = banded & self._expired(idx, D)
        again = int(bad.sum())
        due &= ~bad[:, None]
        if not bool(due.any()):
            V = torch.zeros_like(C)
        elif product:
            V = self._values_by_move(idx, C, due, dW)
        else:
            V = self._values_at(idx, C, due, P, Qd)
        if again:
            ra = idx[bad]
            oldJ, fo_ra, kap_ra = self.J[ra, :width], fo[bad], kap[bad]
            Cn = self._anchor(ra, C[bad], keep=fo_ra)
            width = max(width, int((self.J[ra] < n).sum(dim=1).max()))
            V, C, fo, kap, due = (self._pad(x, width) for x in (V, C, fo, kap, due))
            key = self._pad(key, width, np.inf)
            # the old flags and κ move to the new places, by point; every value is fresh
            newJ = self.J[ra, :width]
            fo[bad] = torch.gather(self._by_point(oldJ, fo_ra), 1, newJ)
            kap[bad] = torch.gather(self._by_point(oldJ, kap_ra), 1, newJ)
            V[bad], C[bad], due[bad] = self.uref[ra, :width], Cn[:, :width], newJ < n
            clock = torch.where(bad, 0.0, clock)
            D = torch.where(bad, 0.0, D)
        J = self.J[idx, :width]
        fn = torch.where(due, V >= self.b, fo) & (J < n)
        changed = fn != fo
        if bool(changed.any()):
            g = self._own(idx, self.Ep, width)
            kap = torch.where(changed, C - torch.where(fn, self.eta_s * g, 0.0), kap)
            rl, q = torch.nonzero(changed, as_tuple=True)
            delta = (V[rl, q] - self.b) * (fn[rl, q].double() - fo[rl, q].double())
            flips.append((J[rl, q], idx[rl], delta))
            self._change_counts(idx, J, fo, fn, changed)
        allow = self._allow(idx, C)
        fresh = due | bad[:, None]  # a re-anchored row's keys are all new (pads: inf)
        key = torch.where(fresh, self._keys(idx, V, allow, clock), key)
        bandkey = torch.where(banded, self._band_keys(idx, allow, clock, D), bandkey)
        self.kappa[idx, :width], self.F[idx, :width], self.key[idx, :width] = kap, fn, key
        self.bandkey[idx], self.clock[idx] = bandkey, clock
        self._set_limits(idx)
        self.nfire[idx] = fn.sum(dim=1)
        self._fire_lists(idx, fn)
        # σ where the fire set changed (or is not known yet): O(Pf²) a row, so only for
        # short fire sets; a long one keeps the triangle bound alone (σ = inf)
        redo = changed.any(dim=1) | torch.isinf(self.sigma[idx])
        short = self.nfire[idx] <= _config.DEVICE_SIGMA_POINTS
        self.sigma[idx[redo & ~short]] = np.inf
        if bool((redo & short).any()):
            self.sigma[idx[redo & short]] = self._sigma(idx[redo & short], fn[redo & short])
        return again, int(due.sum())

    def _buckets(self, due) -> list[tuple[Any, int]]:
        """The due rows in chunks of about equal tracked counts (sorted by it), each with
        its width and within a share of the device's memory: a chunk pads its rows to its
        widest, not to the widest of all."""
        torch = self.torch
        n, d = self.n, self.X.shape[1]
        tracked = (self.J[due] < n).sum(dim=1)
        order = torch.argsort(tracked, stable=True)
        due, tracked = due[order], tracked[order].cpu().numpy()
        width = np.maximum(tracked, 1).astype(np.float64)
        # a row's bytes at its width: the P×Q gathers (P <= Q), the GEMM and by-point rows
        per = 8.0 * (3.0 * width * width + n + d * width) + 17.0 * (n + 1)
        per += 8.0 * (2.0 * (n + 1) + d)  # the moves, and their products with the points
        budget = _CHUNK_SHARE * free_bytes(self.device)
        out, s = [], 0
        while s < len(per):
            # rows are sorted by width: a chunk [s, e) costs (e - s)·per[e - 1]
            e = s + 1
            grow = np.flatnonzero((np.arange(s + 1, len(per) + 1) - s) * per[s:] <= budget)
            if grow.size:
                e = s + 1 + int(grow[-1])
            out.append((due[s:e], int(width[e - 1])))
            s = e
        return out

    def _pad(self, x, Q, value=0):
        if x.shape[1] == Q:
            return x
        shape = (x.shape[0], Q - x.shape[1])
        fill = self.torch.full(shape, value, dtype=x.dtype, device=x.device)
        return self.torch.cat((x, fill), dim=1)

    def _apply_flips(self, flips: list) -> None:
        """The outputs' corrections summed point by point, in increasing neuron order
        (a stable sort, a segment reduction)."""
        torch = self.torch
        points = torch.cat([f[0] for f in flips])
        rows = torch.cat([f[1] for f in flips])
        delta = torch.cat([f[2] for f in flips])
        order = torch.argsort(points * self.m + rows)  # by point, then by neuron
        vals = (delta[:, None] * self.At[rows])[order]
        counts = torch.bincount(points, minlength=self.n + 1)
        corr = segment_sums(torch, vals, counts)[: self.n]
        self.u_dev += corr * self.scale * self.alpha

    # -- the trainer's interface ----------------------------------------------------------
    def _top_eigenvalue(self, G: np.ndarray, X: np.ndarray) -> tuple[float, float]:
        """Up to order :data:`~corrtree._config.NTK_DENSE_EIG_LIMIT`, ``λ_max`` of the
        resident ``H`` by the device's symmetric eigensolver (LAPACK's result to
        rounding, as the CPU methods' ``lr``); beyond, the host's way."""
        if self.H.shape[0] > _config.NTK_DENSE_EIG_LIMIT:
            return super()._top_eigenvalue(G, X)
        t0 = time.perf_counter()
        lam = float(self.torch.linalg.eigvalsh(self.H)[-1]) if bool(self.H.any()) else 0.0
        return lam, time.perf_counter() - t0

    def ntk(self) -> np.ndarray | None:
        """``H`` on the host where ``lr="auto"`` reads the formed matrix
        (:func:`~._ntk.formed_is_used`): the fire sets then need not cross."""
        order = self.H.shape[0]
        return self.H.cpu().numpy() if order <= _config.NTK_DENSE_MATVEC_LIMIT else None

    def outputs(self) -> np.ndarray:
        if self.u is None:
            self.u = self.u_dev.cpu().numpy()
        return self.u

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        torch = self.torch
        self._refuse_linear(step)
        n, K = self.n, self.At.shape[1]
        f64 = self._f64
        # the History row describes W(t), before the step
        stats = torch.stack(((self.nfire > 0).sum(), self.nfire.sum(), (self.J < n).sum()))
        with self.timer("backward"):
            E = torch.zeros((n + 1, K), dtype=f64, device=self.device)
            self._upload(err, E[:n])
            self.u_dev -= self.lr * (self.H @ E[:n].reshape(-1)).reshape(n, K)
            moves = self._steps(E)
            self.clock += moves
            self.Ep += E
        with self.timer("query"):
            # a neuron that did not move keeps its pairs' sides
            due_mask = (self.clock >= self.limit) & (moves > 0)
            # one transfer carries what the host decides on (the History row, the number
            # due) and u(t+1) as it is if nothing is due (counts are exact in float64)
            head = torch.cat((stats.to(f64), due_mask.sum().reshape(1).to(f64)))
            head = torch.cat((head, self.u_dev.reshape(-1))).cpu().numpy()
            stats, ndue = head[:3], int(head[3])
            flips: list = []
            evaluated = reanchored = 0
            if ndue:
                due = torch.nonzero(due_mask).reshape(-1)
                for part, width in self._buckets(due):
                    again, values = self._visit(part, width, flips)
                    reanchored, evaluated = reanchored + again, evaluated + values
        with self.timer("forward"):
            count = 0
            if flips:
                self._apply_flips(flips)
                count = sum(int(f[0].numel()) for f in flips)
            # without flips u(t+1) is the one transferred (visits change u only by flips)
            self.u = None if flips else np.array(head[4:].reshape(n, K))
            flips_row, self._flips_next = self._flips_next, count
        return self._row(
            int(stats[1]),
            int(stats[0]),
            flips_row,
            band_pairs=int(stats[2]),
            reanchored=reanchored,
            evaluated_pairs=evaluated,
        )

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        names = ("J", "uref", "cref", "kappa", "F", "beta", "sigma", "key", "bandkey", "clock")
        arrays = {k: getattr(self, k).cpu().numpy() for k in names}
        arrays["E"] = self.Ep[: self.n].cpu().numpy()
        arrays["u"] = self.u_dev.cpu().numpy()
        return arrays, {"band": self.band, "flips_next": self._flips_next}

    def _restore(self, W0, arrays, scalars, sizes) -> None:
        import torch

        if self.device is None:
            self.device = torch.device("cpu")
        self._bind_device(W0, scalars["band"])
        for k in ("J", "uref", "cref", "kappa", "F", "beta", "sigma", "key", "bandkey", "clock"):
            setattr(self, k, self._tensor(arrays[k]))
        self.limit = torch.zeros(self.m, dtype=self._f64, device=self.device)
        self._set_limits(torch.arange(self.m, device=self.device))
        E = np.zeros((self.n + 1, arrays["E"].shape[1]))
        E[: self.n] = arrays["E"]
        self.Ep, self.u_dev = self._tensor(E), self._tensor(arrays["u"])
        self._flips_next = int(scalars["flips_next"])
        self.V = None
        self._counts()
        self.Jf = None
        self._fire_lists(self.torch.arange(self.m, device=self.device), self.F)
