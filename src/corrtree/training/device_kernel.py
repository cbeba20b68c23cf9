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
  <a_r, err_l>`` over its fire set and ``σ_r² >= λ_max(G[S, S])`` (Gershgorin, by
  GEMM at its last visit, where fire sets are short; inf otherwise).  A neuron is due
  when its clock reaches its *limit*: the least ``(|V - b| - rounding)/||x_j||`` over
  its tracked pairs (``V`` their values at its last
  visit), and its band, ``β/R`` less its distance from its anchor.  Short of that no
  tracked pair crossed and no untracked pair fires.  The mask is recomputed each step
  (O(m·Q) for the clocks), no heap.
- **Clocks that wait** (one output).  Over ``T`` steps without a visit the fire sets stay
  as they are, so the clocks may gain the steps' bounds at once:
  ``η/√m·min(σ_r·sqrt(T·Σ_{l∈S} Σ_t e_l(t)²), Σ_{l∈S} Σ_t |e_l(t)|·||x_l||)``, at
  least the sum of the steps' own bounds, from two per-point sums (O(n) a step).  A
  step whose clocks wait costs the mat-vec and those sums: the host decides from ``err``
  itself, with no transfer, that no neuron can be due, as ``s1 = sqrt(T·Σ_t ||e(t)||²)``
  and ``s2 = ||Σ_t |e(t)| ||`` stay below thresholds the last step that updated the
  clocks left (:meth:`DeviceKernelTrainer._thresholds`: each neuron's room before its
  limit over ``σ_r`` and over ``sqrt(Σ_{l∈S} ||x_l||²)``, so that its bound, by
  Cauchy–Schwarz over all the points, cannot reach it).
- **A visit re-anchors** (the due neurons in one batch of
  :func:`~.device_band.capacity` rows, fixed shapes): each row rebuilt from ``W(0)`` and
  its coefficients and multiplied with every point (two GEMMs), its tracked pairs the
  points within its band of ``b`` and every pair with a coefficient or that fired, each
  at its exact product with a fresh key; flips found by place, ``u`` corrected by
  ``Σ (a_r/√m)(V - b)(F_new - F_old)`` (the flips spread over the points, one GEMM with
  the output weights: no atomics), and, once the visit's counts are read, the count
  matrix ``N = Σ_r (a_r a_rᵀ) ⊗ f_r f_rᵀ`` changed by float32 GEMMs of the flipped rows
  or at the entries the flips touch (each in a batch of their number), whichever the
  device's rates price lower, then ``H = N ∘ G / m`` recomputed there.

A step is two transfers at most: the number due with the History row (and ``u(t+1)``
if nothing is due), then the visit's counts with ``u(t+1)``.  Rows whose new pairs
outgrow the tracked width are left as they were and visited again once it is widened
(one more transfer), and fire sets that outgrow their lists are listed again; both
grow with slack, so this is seldom.  The rows' state sits in two packs (places and scalars), so
a visit reads and writes each once.

``N`` holds integers (exact in float64 whatever the order of its additions), so ``H``
does not drift from the fire sets and a checkpoint rebuilds it bit for bit.  Per step
O((nK)² + m·Q + visits), no ``m·n·d``.  float64 throughout.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import _config
from .._device import free_bytes
from ._state import Field, Scalar, Schema
from .device_band import (
    _CHUNK_SHARE,
    _EPS,
    _SLACK,
    ANCHOR_FIELDS,
    capacity,
    compact,
)
from .device_counts import DeviceCounts
from .optim import LinearStep

__all__ = ["DeviceKernelTrainer"]

#: Steps whose clock increments may wait (:meth:`DeviceKernelTrainer._defers`) at most,
#: in a row: their sums' rounding is covered for this many.
_LAG_MAX = 4096
#: The ratios ``s2/s1`` at which a materialized step sets the deferral thresholds
#: (:meth:`DeviceKernelTrainer._thresholds`): ``2^(-i/2)``, ``s2/s1`` lies in
#: ``[1/sqrt(T), 1]`` after ``T`` deferred steps, times the points' largest norm ``R``
#: (above 1, :meth:`~DeviceKernelTrainer._defers` takes the ratio 1 over ``s2``).
_LAG_RATIOS = 2.0 ** (-np.arange(24) / 2.0)


class DeviceKernelTrainer(DeviceCounts):
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
    #: the rows' state in two packs, so that a visit reads and writes each in one
    #: operation: ``(m, 4, Q)`` places (:data:`PLACES`) and ``(m, 6)`` scalars
    #: (:data:`SCALARS`), each name a view of its pack (:meth:`_pack`)
    PLACES = ("uref", "cref", "kappa", "key")
    SCALARS = ("beta", "sigma", "bandkey", "clock", "limit", "nfire")
    #: tensors made after the first anchoring, or per step (torch is optional)
    key: Any
    rowsQ: Any
    rowsS: Any
    Jf: Any
    XNf: Any
    u_dev: Any
    # J, uref, cref, κ, F, key, and the visits' gathers
    PLACE_BYTES = 49.0 + 24.0

    @classmethod
    def _fixed_bytes(cls, n: int, K: int) -> float:
        # N, H, a float32 count matrix while N is built, and |G|
        return 20.0 * (n * K) ** 2 + 8.0 * (n + 1) ** 2

    def _prepare(self, W0: np.ndarray, device: Any = None, band: float | None = None) -> None:
        rows = self._empty_rows(W0, device, band)
        torch, m, n, K, f64 = self.torch, self.m, self.n, self.At.shape[1], self._f64
        self.Gabs = self.Gp.abs()  # σ by GEMM (_sigma)
        self.kappa = torch.zeros_like(self.uref)
        self.key = torch.full_like(self.uref, np.inf)
        self.F = torch.zeros((m, 1), dtype=torch.bool, device=self.device)
        self.sigma = torch.full((m,), np.inf, dtype=f64, device=self.device)
        self.bandkey, self.clock, self.limit, self.nfire = (
            torch.zeros(m, dtype=f64, device=self.device) for _ in range(4)
        )
        self._pack()
        kappa = self._anchor(rows, self.kappa, moved=False)  # W(0): every C is 0; widens
        self.kappa.copy_(kappa)
        self.V = self.uref
        self.F = (self.V >= self.b) & (self.J < n)
        self.u_dev = self._outputs()
        self.V = None
        self.Ep = torch.zeros((n + 1, K), dtype=f64, device=self.device)
        self._new_lists()
        key, bandkey = self._fresh_keys(self.J, self.uref, self.beta, self.J < n)
        self.key.copy_(key)
        self.bandkey.copy_(bandkey)
        self.limit.copy_(self._limits(key, bandkey))
        self._counts()
        self._no_lag()

    def _no_lag(self) -> None:
        """No step waits for its clock increments (:meth:`_defers`), and none may until a
        step that visited nothing has updated the clocks and set thresholds."""
        torch = self.torch
        self._lag = 0  # steps whose increments wait
        self._lag_host = (0.0, np.zeros(self.n))  # Σ_t ||e(t)||², Σ_t |e(t)|
        zeros = torch.zeros((self.n + 1, 1), dtype=self._f64, device=self.device)
        self._lag_dev = (zeros, zeros.clone())  # Σ_t |e(t)|, Σ_t e(t)² by point
        self._lag_inverse = torch.as_tensor(1.0 / _LAG_RATIOS, dtype=self._f64, device=self.device)
        self._skip: np.ndarray | None = None  # the thresholds of _LAG_RATIOS
        self._quiet = False  # whether the last step visited nothing
        self._stats: np.ndarray | None = None  # its History row's counts, if it did

    def _pack(self) -> None:
        """The rows' state into its two packs, each name a view of its pack."""
        torch = self.torch
        self.rowsQ = torch.stack([getattr(self, k) for k in self.PLACES], dim=1)
        self.rowsS = torch.stack([getattr(self, k).to(self._f64) for k in self.SCALARS], dim=1)
        self._views()

    def _views(self) -> None:
        for k, v in zip(self.PLACES, self.rowsQ.unbind(1), strict=True):
            setattr(self, k, v)
        for k, v in zip(self.SCALARS, self.rowsS.unbind(1), strict=True):
            setattr(self, k, v)

    def _widen(self, width: int) -> None:
        """Every row's places widened to ``width`` (pads: the point ``n``, zeros, keys
        inf: a pad is never due)."""
        torch = self.torch
        m, extra = self.m, width - self.J.shape[1]
        pad = torch.full((m, extra), self.n, dtype=torch.int64, device=self.device)
        self.J = torch.cat((self.J, pad), dim=1)
        self.F = torch.cat(
            (self.F, torch.zeros((m, extra), dtype=torch.bool, device=self.device)), 1
        )
        fill = torch.zeros((m, len(self.PLACES), extra), dtype=self._f64, device=self.device)
        fill[:, self.PLACES.index("key")] = np.inf
        self.rowsQ = torch.cat((self.rowsQ, fill), dim=2)
        self._views()

    # -- coefficients, limits, clocks --------------------------------------------------
    def _coef(self, idx):
        g = self._own_at(self.Ep, self.J[idx], self.At[idx])
        return self.kappa[idx] + self.torch.where(self.F[idx], self.eta_s * g, 0.0)

    def _fresh_keys(self, J, V, beta, valid, dist=None):
        """The keys of rows anchored now at places ``J`` (``valid`` marks the tracked
        ones; the others' keys are inf), their products ``V`` (``dist``: ``|V - b|``, when
        known) and band half-widths ``beta``, at clock 0: each pair's
        ``(|V - b| - allow)/||x_j||`` and the band key ``(β - allow)/R``, ``allow`` the
        rounding of a value from this anchor on (by the Gram identity, ``Q`` terms, or by the
        move, ``n + 1`` terms then ``d``: a value within it of ``b`` may be on either
        side).  Returns both."""
        torch = self.torch
        terms = max(J.shape[1], self.n + 1) + self.X.shape[1]
        allow = 8.0 * (terms + 2) * _EPS * torch.linalg.vector_norm(V, ord=np.inf, dim=1)
        dist = (V - self.b).abs() if dist is None else dist
        gap = (dist - allow[:, None]) / self.xnorm[J]
        # a band is left no sooner than a move of (β - allow)/R (the R rounded up)
        return torch.where(valid, gap, np.inf), (beta - allow) / (self.R * (1.0 + 1e-12))

    def _limits(self, key, bandkey):
        """A row is due when its clock reaches the least of its keys and its band key (a
        pad's key is inf wherever keys are made or rows widened: never due)."""
        return self.torch.minimum(key.amin(dim=1), bandkey)

    def _steps(self, E):
        """A bound on each neuron's step for the error ``E`` (padded; ``None``: no step,
        the waiting steps alone), float64 rounding included: ``η/√m·min(σ_r·||e||, Σ
        |e_l|·||x_l||)``, over the compact fire sets (``m·Pf`` gathers, ``Pf`` the most
        firing points of a neuron); with ``T`` steps in all (those that waited,
        :meth:`_defers`, and this one) ``η/√m·min(σ_r·sqrt(T·Σ_l Σ_t e_l(t)²), Σ_l Σ_t
        |e_l(t)|·||x_l||)``, at least the sum of their own bounds (``2·m·Pf`` gathers).
        The waiting steps are then done."""
        torch = self.torch
        lag, T = self._lag_dev, self._lag + (E is not None)
        if self._lag:
            a, q = lag if E is None else (lag[0] + E.abs(), torch.addcmul(lag[1], E, E))
            both = torch.cat((a, q), dim=1)[self.Jf]  # (m, Pf, 2)
            bound = (both[:, :, 0] * self.XNf).sum(dim=1)
            sq = both[:, :, 1].sum(dim=1).mul_(T)
            self._lag, self._lag_host = 0, (0.0, np.zeros(self.n))  # the sums start again
        else:
            if self.At.shape[1] == 1:
                e = E[self.Jf, 0]  # |<a_r, err_l>| = |err_l|
            else:
                e = (E[self.Jf] * self.At[:, None, :]).sum(dim=2)
            bound = (e.abs() * self.XNf).sum(dim=1)
            sq = None
        if self._sigmas:  # some σ is known: the lesser bound where it is (an unknown σ,
            # inf, gives inf, or nan with a zero error: fmin keeps the other bound)
            norm = torch.linalg.vector_norm(e, dim=1) if sq is None else torch.sqrt(sq)
            bound = torch.fmin(bound, self.sigma * norm)
        return bound * (self.eta_s * (1.0 + 4.0 * (self.Jf.shape[1] + T + 4) * _EPS))

    def _defers(self, err: np.ndarray, E) -> bool:
        """Whether this step's clock increments may wait: one output, thresholds set
        (:meth:`_thresholds`) and no neuron's bound over the waiting steps and this one
        able to reach its limit, as the host finds from ``err`` (its ``s1``, ``s2``, see
        the module docs; the grid ratio at or above ``s2/s1``, where the threshold is
        lower).  If so the per-point sums take ``E`` (this step's error, padded, on the
        device).  O(n)."""
        if self._skip is None or self._lag >= _LAG_MAX:
            return False
        torch = self.torch
        e = err[:, 0]
        T = self._lag + 1
        sq = self._lag_host[0] + float(e @ e)
        absum = self._lag_host[1] + np.abs(e)
        s1 = float(np.sqrt(T * sq))
        s2 = float(np.linalg.norm(absum))
        # the thresholds are in units of the bound's factor and R (and the rounding of
        # the sums, the room and these scalars: 1e-9 relative covers them)
        scale = self.eta_s * (1.0 + 4.0 * (self.Jf.shape[1] + _LAG_MAX + 4) * _EPS)
        s1 *= scale * (1.0 + 1e-9)
        s2 *= scale * self.R * (1.0 + 1e-9)
        if self._skip.shape[0] == 1:  # σ not used: min_r q_r, against s2 alone
            if not s2 < self._skip[0]:
                return False
        else:
            i = len(_LAG_RATIOS) - 1
            if s1 > 0 and s2 > 0:  # the grid ratio at or above s2/s1
                i = min(i, int(np.floor(-2.0 * np.log2(s2 / s1))))
            if i >= 0:
                if not s1 < self._skip[i]:
                    return False
            # above the grid (s2 > s1, where some point's norm exceeds 1, if only by its
            # rounding, as unit vectors' often do): for ρ = s2/s1 > 1, max(p, q/ρ) >=
            # max(p, q)/ρ, so s2 = ρ·s1 below the threshold of ρ = 1 bounds every neuron
            elif not s2 < self._skip[0]:
                return False
        a, q = self._lag_dev
        if self._lag:
            a.add_(E.abs())
            q.addcmul_(E, E)
        else:  # the sums start here
            torch.abs(E, out=a)
            torch.mul(E, E, out=q)
        self._lag = T
        self._lag_host = (sq, absum)
        return True

    def _thresholds(self):
        """For each ratio ``ρ`` of :data:`_LAG_RATIOS`, the least ``s1`` (module docs) at
        which some neuron's bound over waiting steps may reach its limit when ``s2 =
        ρ·s1``, in units of ``η/√m`` and the rounding (:meth:`_defers` applies them):
        ``min_r max(p_r, q_r/ρ)``, ``p_r`` the room before its limit over ``σ_r`` (0 where
        σ is not used), ``q_r`` over ``R·sqrt(|S_r|) >= sqrt(Σ_{l∈S} ||x_l||²)`` (a neuron
        that fires nowhere never moves: inf).  The room's rounding is a relative ``ε``.
        O(m·len(_LAG_RATIOS))."""
        torch = self.torch
        room = self.limit - self.clock
        q = room / torch.sqrt(self.nfire)  # 0 points: inf (a room <= 0 there: no wait)
        if not self._sigmas:  # p = 0: max(p, q/ρ) = q/ρ, the host divides by ρ
            return q.amin()[None]
        return torch.maximum(
            room[:, None] / self.sigma[:, None], q[:, None] * self._lag_inverse
        ).amin(dim=0)

    def _new_lists(self) -> None:
        """Every row's compact fire set (:meth:`_fire_lists`), the lists as wide as the
        largest fire set and :data:`~.device_band._SLACK` more, and whether visits bound
        the steps by σ (:meth:`_sigma`, ``2·(n+1)²`` flops a visited row): where the mean
        fire set has at most :data:`~corrtree._config.DEVICE_SIGMA_POINTS` points
        (incoherent data, short fire sets; on coherent data ``λ_max`` is near the trace
        and the triangle bound is as good, so σ stays inf).  One read for both."""
        torch = self.torch
        sizes = self.F.sum(dim=1)
        known = torch.isfinite(self.sigma).sum()
        most, total, rows, known = torch.stack(
            (sizes.max(), sizes.sum(), sizes.gt(0).sum(), known)
        ).tolist()
        self._use_sigma = total <= _config.DEVICE_SIGMA_POINTS * max(1, rows)
        # σ bounds the steps once a visit computes one (a resumed run: as it was saved)
        self._sigmas = self._use_sigma or known > 0
        Pf = max(1, int(most))
        self._fire_lists(None, self.F, width=Pf + Pf // _SLACK)

    def _fire_lists(self, idx, F, J=None, nfire=None, width: int | None = None):
        """The compact fire sets of rows ``idx`` (``None``: every row, the lists made
        anew ``width`` wide) (flags ``F`` at their places ``J``, by default theirs;
        ``nfire``: their numbers of fired places, when known): their points first (the
        pad ``n`` after) and their norms, at the lists' width.
        Returns the most points a row of them fires on (a device scalar): a caller that
        finds it above the width lists every row again, wider."""
        torch = self.torch
        if J is None:
            J = self.J[:, : F.shape[1]] if idx is None else self.J[idx, : F.shape[1]]
        Pf = self.Jf.shape[1] if width is None else width
        # the fired points in place order, then the pad n: a fired place's column is its
        # rank among the row's fired places (a prefix sum, no sort), 1, 2, ...; the
        # others' (and those past the width) the column Pf + 1, column 0 the pad
        place = torch.where(F, torch.cumsum(F, dim=1), Pf + 1).clamp_(max=Pf + 1)
        lists = torch.full((J.shape[0], Pf + 2), self.n, dtype=J.dtype, device=J.device)
        lists = lists.scatter_(1, place, J)[:, 1 : Pf + 1]
        if idx is None:
            self.Jf, self.XNf = lists, self.xnorm[lists]
        else:
            self.Jf[idx], self.XNf[idx] = lists, self.xnorm[lists]
        return (F.sum(dim=1) if nfire is None else nfire).max()

    def _sigma(self, F, J):
        """Gershgorin: ``σ_r² = max_{p∈S} Σ_{q∈S} |G_pq|`` over each fire set ``S`` (flags
        ``F`` at places ``J``), by one GEMM of the flags by point with ``|G|``
        (``2·k·(n+1)²`` flops, whatever the sets' sizes); the rounding of ``n + 1``
        terms of one sign included."""
        torch = self.torch
        f = self._by_point(J, F.to(self._f64))
        rows = (f @ self.Gabs * f).amax(dim=1)  # f is 0/1: the sums at the points of S
        return torch.sqrt(rows * (1.0 + 4.0 * (self.n + 3) * _EPS))

    # -- a visit -------------------------------------------------------------------------
    def _visit(self, idx, live):
        """Visit the rows of ``idx`` that ``live`` marks at ``W(t+1)``, in fixed shapes
        (the others are read and written back as they were; each pack read and written
        once): a visit re-anchors.  Each row is rebuilt, ``w_r(t+1) = w_r(0) - C_r·X``,
        and multiplied with every point (:meth:`DeviceBand._anchor_pick`, two GEMMs:
        ``2·(n+1)·d + 2·n·d`` flops a row, as many as the values by the move and within
        1.5× of those by the Gram identity, where the launches, not the flops, are a
        small step's cost); its tracked pairs become the points within its band of ``b``
        and every pair with a coefficient or that fired, their products exact now, its
        clock 0 and its keys fresh (fresh keys move the row's limit as far as they can).
        Flips (``κ`` and the outputs, corrected by one GEMM of the flips by point with
        the output weights; ``N`` and ``H`` once the counts are read), ``σ`` where the
        fire set changed, keys, fire lists.

        Returns the device scalars ``(re-anchored, values, flips, width, lists,
        touched)`` in one float64 tensor (``width``: the widest new pairs of a live row,
        above the tracked width where a row was left as it was for want of room;
        ``lists``: the largest fire set, against the lists' width), the mask (over
        ``idx``) of the rows re-anchored, and what :meth:`_change_counts` takes once the
        counts are read (the flips and ``touched``, the rows with a flip, price its two
        ways)."""
        torch = self.torch
        n, Q, f64 = self.n, self.J.shape[1], self._f64
        J, fo, A = self.J[idx], self.F[idx], self.At[idx]
        old = self.rowsQ[idx]
        kap = old[:, self.PLACES.index("kappa")]
        beta, sigma, bandkey, clock, _, _ = self.rowsS[idx].unbind(1)
        # η/√m·<a_r, E_j> at every point (one GEMM), κ and the fire flags by point (one
        # scatter; the pad point's columns 0), and C = κ + f·η/√m·<a_r, E_j> by point
        own = (A @ self.Ep.T).mul_(self.eta_s)
        by = torch.zeros((J.shape[0], 2, n + 1), dtype=f64, device=self.device)
        by.scatter_(2, J[:, None, :].expand(-1, 2, -1), torch.stack((kap, fo.to(f64)), 1))
        Cd = torch.addcmul(by[:, 0], by[:, 1], own)
        U = self._current_rows(idx, Cd) @ self.Xp.T  # every product now, (k, n + 1)
        # a pair with a coefficient has κ ≠ 0 or fired
        kept = (U[:, :n] >= self.b - beta[:, None]) | by[:, :, :n].any(dim=1)
        wide = kept.sum(dim=1, dtype=f64)
        ok = live & (wide <= Q)  # the others wait for a wider Q, as they were
        width = torch.where(live, wide, 0.0).max()  # above Q only where a row is not ok
        newJ, V, Cn = self._anchor_places(U, Cd, kept)
        w = ok[:, None]
        # κ and the flags at the new places (an untracked pair has κ = 0 and is off)
        moved = torch.gather(by, 2, newJ[:, None, :].expand(-1, 2, -1))
        J = torch.where(w, newJ, J)
        due = w & (J < n)
        fo = torch.where(w, moved[:, 1] > 0, fo)
        kap = torch.where(w, moved[:, 0], kap)
        fn = torch.where(due, V >= self.b, fo)
        changed = fn != fo
        touched = changed.any(dim=1)
        kap = torch.where(changed, Cn - torch.where(fn, torch.gather(own, 1, J), 0.0), kap)
        dist = (V - self.b).abs()
        # (V - b)(f_new - f_old) at a flip is |V - b|: on where V >= b, off where V < b
        delta = self._by_point(J, torch.where(changed, dist, 0.0))
        self.u_dev.addmm_(delta[:, :n].T, A, alpha=self.scale * self.alpha)
        keys, fresh_band = self._fresh_keys(J, V, beta, due, dist)
        # the rows not ok keep their places, κ included (their κ above is the old one)
        places = torch.where(w[:, None], torch.stack((V, Cn, kap, keys), dim=1), old)
        bandkey = torch.where(ok, fresh_band, bandkey)
        clock = torch.where(ok, 0.0, clock)
        if self._use_sigma:  # σ where the fire set changed (or is not known yet)
            redo = ok & (touched | torch.isinf(sigma))
            sigma = torch.where(redo, self._sigma(fn, J), sigma)
        limit, nfire = self._limits(places[:, 3], bandkey), fn.sum(dim=1, dtype=f64)
        self.rowsQ[idx] = places
        self.rowsS[idx] = torch.stack((beta, sigma, bandkey, clock, limit, nfire), dim=1)
        self.J[idx], self.F[idx] = J, fn
        lists = self._fire_lists(idx, fn, J, nfire)
        ok_n, due_n, flips_n, touched_n = (c.sum(dtype=f64) for c in (ok, due, changed, touched))
        counts = torch.stack((ok_n, due_n, flips_n, width, lists, touched_n))
        return counts, ok, (J, fo, fn, changed, touched, A)

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
        # the History row describes W(t), before the step: as the last one's if that
        # step visited nothing (only visits change fire sets and places)
        known = self._quiet and self._stats is not None
        parts = []
        if not known:
            nfire = self.nfire
            parts.append((nfire > 0).sum(dtype=f64)[None])
            parts.append(nfire.sum()[None])
            parts.append((self.J < n).sum(dtype=f64)[None])
        with self.timer("backward"):
            E = torch.zeros((n + 1, K), dtype=f64, device=self.device)
            self._upload(err, E[:n])
            # u(t+1) = u(t) - η·H·err(t), in place (u is contiguous: the view fails if not)
            self.u_dev.view(-1).addmv_(self.H, E[:n].reshape(-1), alpha=-self.lr)
            self.Ep += E
            waits = K == 1 and self._defers(err, E)  # no neuron can be due: no clocks
            if not waits:
                moves = self._steps(E)
                self.clock += moves
        with self.timer("query"):
            # one transfer carries what the host decides on (the History row, the number
            # due, the thresholds of the steps that may wait) and u(t+1) as it is if
            # nothing is due (counts are exact in float64); thresholds only after a step
            # that visited nothing (visits move clocks and limits)
            want = not waits and K == 1 and self._quiet
            if not waits:  # a neuron that did not move keeps its pairs' sides
                due = (self.clock >= self.limit) & (moves > 0)
                parts.append(due.sum(dtype=f64)[None])
                if want:
                    parts.append(self._thresholds())
            head = torch.cat((*parts, self.u_dev.reshape(-1))).cpu().numpy()
            at = 0
            if not known:
                self._stats, at = head[:3].astype(np.int64), 3
            ndue = 0 if waits else int(head[at])
            at += 0 if waits else 1
            if not waits:  # thresholds hold while no visit moves a clock or a limit
                size = parts[-1].shape[0] if want else 0
                self._skip = np.array(head[at : at + size]) if want and not ndue else None
                at += size
            stats = self._stats
            assert stats is not None  # read now or by the step before
            self._quiet = ndue == 0
            self.u = np.array(head[at:].reshape(n, K))  # unless a visit flips a pair
            totals = np.zeros(3)  # re-anchored, values, flips
            while ndue:
                todo, got = self._visit_due(due, ndue)
                totals += got[:3]
                width, lists, left = (int(v) for v in got[3:])
                if lists > self.Jf.shape[1]:  # a fire set outgrew the lists: list again
                    self._fire_lists(None, self.F, width=lists + lists // _SLACK)
                if width > self.J.shape[1]:  # rows whose new pairs outgrow the width
                    self._widen(width + width // _SLACK)
                due, ndue = todo, left
        with self.timer("forward"):
            flips_row, self._flips_next = self._flips_next, int(totals[2])
        return self._row(
            int(stats[1]),
            int(stats[0]),
            flips_row,
            band_pairs=int(stats[2]),
            reanchored=int(totals[0]),
            evaluated_pairs=int(totals[1]),
        )

    def _visit_due(self, due, ndue: int):
        """The ``ndue`` rows ``due`` marks visited in a batch of :func:`capacity`
        rows, by chunks within a share of the device's memory; one transfer brings
        back the visits' counts (:meth:`_visit`) and ``u(t+1)``.  Returns the mask of
        the rows left for a pass after widening (``None`` when there are none) and the
        counts, the number of those rows last."""
        torch = self.torch
        cap = capacity(ndue, self.m)
        rows, live = compact(torch, due, cap, self._arange(self.m), self._by_sort(self.m))
        n, d, Q = self.n, self.X.shape[1], self.J.shape[1]
        per = 8.0 * (12.0 * Q + 8.0 * (n + 1) + 2.0 * d) + 4.0 * n * self.At.shape[1]
        step = max(1, int(_CHUNK_SHARE * free_bytes(self.device) // per))
        counts, oks, flips = [], [], []
        for s in range(0, rows.numel(), step):
            got, ok, changes = self._visit(rows[s : s + step], live[s : s + step])
            counts.append(got)
            oks.append(ok)
            flips.append(changes)
        head = torch.cat((*counts, self.u_dev.reshape(-1))).cpu().numpy()  # one transfer
        k = len(counts)
        per = head[: 6 * k].reshape(k, 6)
        for (touched, flipped), (J, fo, fn, changed, rows_touched, A) in zip(
            per[:, [5, 2]], flips, strict=True
        ):
            self._change_counts(J, fo, fn, changed, rows_touched, A, int(touched), int(flipped))
        self.u = np.array(head[6 * k :].reshape(self.n, -1))
        left = ndue - int(per[:, 0].sum())  # every live row is due: those not re-anchored
        todo = None
        if left:
            todo = torch.zeros_like(due)
            todo[rows] = live & ~(torch.cat(oks) if k > 1 else oks[0])
        total = np.concatenate((per[:, :3].sum(axis=0), per[:, 3:5].max(axis=0)))
        return todo, np.append(total, left)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if self._lag:  # the clocks take the waiting steps' bound, as a resumed run's start
            self.clock += self._steps(None)
        # a resumed run starts here with no thresholds and the counts read: so does this one
        self._skip, self._quiet = None, False
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
        self.Gabs = self.Gp.abs()
        for k in ("J", "uref", "cref", "kappa", "F", "beta", "sigma", "key", "bandkey", "clock"):
            setattr(self, k, self._tensor(arrays[k]))
        self.limit, self.nfire = (
            torch.zeros(self.m, dtype=self._f64, device=self.device) for _ in range(2)
        )
        self._pack()
        self.limit.copy_(self._limits(self.key, self.bandkey))
        E = np.zeros((self.n + 1, arrays["E"].shape[1]))
        E[: self.n] = arrays["E"]
        self.Ep, self.u_dev = self._tensor(E), self._tensor(arrays["u"])
        self._flips_next = int(scalars["flips_next"])
        self.V = None
        self._counts()
        self._new_lists()
        self._no_lag()
