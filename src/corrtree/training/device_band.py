"""What the tracked-pair trainers of the array path share (``device=``: lazy, kernel).

The band idea of the CPU trainers (``docs/design.md``, "Band trainers"), shaped for a
device: every neuron ``r`` keeps a padded row of ``Q`` tracked pairs (``J[r]``, points
in increasing order, the pad pointing at a zero point ``n``) chosen at its anchor time
``t_a``: every point whose product was within ``β`` of ``b`` or above, and every pair
with a coefficient.  ``W(t) = W(0) - C(t) X``.  :class:`DeviceBand` holds the rows and
what both trainers do with them:

- their anchoring: the exact row ``w_r(t)·Xᵀ`` (a GEMM) and the kept points listed by a
  prefix sum (no sort);
- the exact values by the Gram identity from the anchor,
  ``V = U(t_a) - (C - C(t_a))·G`` at the tracked places, by one GEMM of the
  coefficient changes spread over the points (``2·(n+1)²`` flops a row; where
  ``d < (n+1)/2`` by the move ``ΔW = ΔC·X`` and ``ΔW·Xᵀ``, ``4·(n+1)·d``), with the
  neuron's movement since its anchor ``D_r = sqrt(ΔCᵀ G ΔC)`` (or ``||ΔW||``) and a
  margin for its rounding;
- the outputs ``u_j = Σ a_r (V - b)`` over the firing pairs, the rows' contributions
  spread over the points and multiplied by the output weights (one GEMM: a fixed
  order, no atomic accumulation), and the weights from the coefficients.

The helpers keep every shape fixed by the run's sizes: a batch of marked rows is listed
without a host synchronization (:func:`compact`) in a size from :func:`capacity`.
float64 throughout (``docs/design.md``, "The array path").
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np

from .. import _config
from .._device import Staging, check_device_memory, free_bytes
from .._implicit import ImplicitWeights
from .._philox import normals_array
from ._base import Trainer
from ._sparse import keys_to_csr
from ._state import Field
from .costs import fire_share
from .optim import LinearStep

__all__ = ["DeviceBand"]

_EPS = 2.0**-52
#: Share of the device's free memory the batched gathers of a chunk of neurons may take.
_CHUNK_SHARE = 0.1
#: A tracked width that grows grows by this fraction more (1/_SLACK), so that the rows
#: that outgrow it do so seldom: a step that widens pays a second pass.
_SLACK = 4


#: The state every tracked-pair trainer of the array path keeps: each row's tracked points
#: (the pad ``n``), their anchored products and coefficients, and the band half-widths.
ANCHOR_FIELDS = (
    Field("J", ("i8",), ("m", "Q"), index="n1"),
    Field("uref", ("f8",), ("m", "Q")),
    Field("cref", ("f8",), ("m", "Q")),
)


def compact(torch, mask, cap: int, every=None, by_sort: bool = False):
    """The rows ``mask`` marks, in increasing order, then the unmarked ones, the first
    ``cap`` of them, and which of those are marked: ``(rows, live)``, both ``(cap,)``.
    Fixed shapes (prefix sums and one scatter, no host synchronization): a batch of
    ``cap`` distinct rows whose ``live`` ones are the marked rows, all of them when
    ``cap`` (at most ``mask``'s size) is at least their number.  ``every``: the indices
    of ``mask`` (``arange``), when the caller keeps them.  ``by_sort``: the same rows
    by one stable sort of the flags (three launches instead of seven; the cheaper way
    for a short mask, :meth:`DeviceBand._by_sort`)."""
    if by_sort:
        flags, order = torch.sort(mask.to(torch.uint8), descending=True, stable=True)
        return order[:cap], flags[:cap] > 0
    if every is None:
        every = torch.arange(mask.numel(), device=mask.device)
    on = torch.cumsum(mask, dim=0)
    total = on[-1:]
    place = torch.where(mask, on - 1, total + every - on)  # marked first, then the rest
    order = torch.empty_like(every).scatter_(0, place, every)[:cap]
    return order, every[:cap] < total


def own_at(E, J, A, by_gemm: bool = False):
    """``<a_r, E_j>`` at places ``J`` of rows with output weights ``A`` (``E``: by point,
    ``(n + 1, K)``): with one output one gather and one product; with ``K`` outputs
    ``K`` gathers a place and their sum, or (``by_gemm``) every row's products with
    every point by one GEMM, ``A·Eᵀ`` (``2·(n + 1)·K`` flops a row), and one gather a
    place (:func:`own_by_gemm` says which costs less)."""
    if A.shape[1] == 1:
        return E[:, 0][J] * A
    if by_gemm:
        return (A @ E.T).gather(1, J)
    return (E[J] * A[:, None, :]).sum(dim=2)


def own_by_gemm(rates: dict[str, float], n: int, Q: int, K: int) -> bool:
    """Whether :func:`own_at` at ``Q`` places a row among ``n + 1`` points with ``K > 1``
    outputs costs less by its GEMM than by ``K`` gathers a place, at a device's
    ``rates``: a row's ``Q·K`` gathers and three passes over them against
    ``2·(n + 1)·K`` flops, two passes over the ``n + 1`` products and ``Q`` gathers.
    Never where the products take more memory than the gathered entries
    (``n + 1 > Q·K``)."""
    if K == 1 or n + 1 > Q * K:
        return False
    by_gather = Q * K / rates["gathers"] + 24.0 * Q * K / rates["bytes"]
    by_gemm = 2.0 * (n + 1) * K / rates["flops64"] + 16.0 * (n + 1) / rates["bytes"]
    return by_gemm + Q / rates["gathers"] < by_gather


def capacity(count: int, m: int) -> int:
    """The batch size of ``count`` rows among ``m``: 0, or ``count`` (at least 64) rounded
    up to an eighth of the next power of two, at most ``m``: at most a quarter of a
    batch is padding, and the batch sizes are a bounded set (four an octave), so that a
    step repeats its shapes and can be captured where a device profile says it pays."""
    if count <= 0:
        return 0
    c = max(64, int(count))
    quantum = 1 << max((c - 1).bit_length() - 3, 0)
    return int(min(m, -(-c // quantum) * quantum))


def update_bytes(src: Any, m: int, d: int) -> float:
    """Device bytes of an implicit model's earlier run (:meth:`DeviceBand._upload_update`)
    at width ``m``: its points with the pad, ``indptr`` and the coefficients with int64
    columns (their number scaled to ``m``); 0 for any other weight source."""
    if not isinstance(src, ImplicitWeights) or src.update is None:
        return 0.0
    points = src.update[0].shape[0] + 1
    return 8.0 * (points * d + m + 1) + 16.0 * src.pairs * m / src.m


def _uploaded(torch: Any, W: np.ndarray, dev: Any) -> Any:
    """``W`` (read only, float64) on ``dev`` without a copy on the host: a view of its
    memory uploaded in one transfer (on ``cpu``, ``to`` gives the view itself: the
    trainers only read ``W(0)``).  A non-contiguous or non-float64 ``W`` is converted
    first."""
    host = np.ascontiguousarray(W, dtype=np.float64)
    with warnings.catch_warnings():  # torch warns of views of read-only arrays; none is written
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        view = torch.from_numpy(host)
    return view.to(dev)


class DeviceBand(Trainer):
    """What the array path's tracked-pair trainers share (lazy, kernel): padded rows of
    tracked pairs, their anchoring by GEMM, their values by the Gram identity, the
    outputs by a sorted segment reduction, and the weights from the coefficients.  A
    subclass keeps the coefficients its own way (:meth:`_coef`)."""

    implicit_ok = True  # W(0) is read by rows: regenerated on the device
    linear_ok = False  # plain gradient steps only (no momentum or weight decay yet)
    #: its state is its own (not the CPU trainers'): it resumes on a device only
    ARRAY_STATE = True
    device: Any = None
    #: the padded rows' tensors (torch is optional: typed loosely)
    W0: Any
    w0: Any
    F: Any
    V: Any
    u: Any
    PADDED: tuple[str, ...]
    #: bytes a tracked place takes on the device, and a subclass's fixed bytes: the
    #: memory check of :meth:`_bind_device`
    PLACE_BYTES = 41.0

    @classmethod
    def _fixed_bytes(cls, n: int, K: int) -> float:
        return 0.0

    @classmethod
    def device_need(
        cls, n: int, m: int, d: int, K: int, band_share: float, implicit: bool, linear: bool
    ) -> float:
        """Modelled device bytes of a run: ``W(0)`` (explicit models), ``G``, ``X``, and
        the padded rows at about twice the mean band (the widest row sets the padding;
        ``band_share``: the share of pairs in the band at the start)."""
        places = 2.0 * n * band_share + 8.0
        stored = 0 if implicit else m * d
        need = 8.0 * (stored + (n + 1) ** 2 + (n + 1) * d) + cls.PLACE_BYTES * m * places
        return need + cls._fixed_bytes(n, K)

    def _bind_device(self, W0: np.ndarray | ImplicitWeights, band: float) -> None:
        import torch

        self.torch = torch
        dev = self.device
        n, d = self.X.shape
        self.n, self.band = n, band
        norms = np.sqrt(np.einsum("ij,ij->i", self.X, self.X))
        share = fire_share(norms, self.b - band)
        implicit = isinstance(W0, ImplicitWeights)
        need = self.device_need(n, self.m, d, self.a.shape[1], share, implicit, False)
        need += update_bytes(W0, self.m, d)
        check_device_memory(need, dev, f"method={self.name!r} at m={self.m}, n={n}, d={d} on {dev}")
        host = np.zeros((n + 1, d))
        host[:n] = self.X
        self.Xp = torch.from_numpy(host).to(dev)  # a zero point n: the pad
        self.Gp = self.Xp @ self.Xp.T
        self._aranges: dict[int, Any] = {}
        self.At = torch.from_numpy(np.array(self.a, dtype=np.float64)).to(dev)
        self._update: tuple | None = None
        if isinstance(W0, ImplicitWeights):  # regenerated by rows, never stored
            self.W0, self.w0 = None, W0
            if W0.update is not None:
                self._update = self._upload_update(W0.update)
        else:  # an explicit model's rows (StoredWeights) or an array
            self.W0, self.w0 = _uploaded(torch, getattr(W0, "W", W0), dev), None
        self.xnorm = torch.sqrt((self.Xp * self.Xp).sum(dim=1))
        self.R = float(self.xnorm.max())
        self.alpha = 1.0
        self.info.update(band=band, device=str(dev))
        self.u = None
        self._flips_next = 0  # flips between W(t) and W(t+1), the next row's
        self._f64 = torch.float64
        self._staging: Any = None  # the host's error's buffer, pinned on a GPU (_upload)
        # values by the Gram matrix (2·(n+1)² flops a row) or by the move (4·(n+1)·d)
        self._by_gram = n + 1 <= 2 * d

    def _empty_rows(self, W0, device: Any, band: float | None):
        """The run's tensors with every row empty (one pad place), before the first
        anchoring; ``band`` checked.  Returns every row's index."""
        import torch

        self.device = device if device is not None else torch.device("cpu")
        band = _config.BAND if band is None else float(band)
        if not band > 0:
            raise ValueError(f"band must be > 0, got {band}")
        self._bind_device(W0, band)
        m, f64 = self.m, self._f64
        self.beta = torch.full((m,), band, dtype=f64, device=self.device)
        self.J = torch.full((m, 1), self.n, dtype=torch.int64, device=self.device)
        self.uref = torch.zeros((m, 1), dtype=f64, device=self.device)
        self.cref = torch.zeros_like(self.uref)
        return torch.arange(m, device=self.device)

    def _coef(self, idx):
        """The coefficients ``C(t)`` of rows ``idx`` at their tracked points, ``(k, Q)``."""
        raise NotImplementedError

    # -- anchoring ---------------------------------------------------------------------
    def _chunk(self, Q: int, extra: float = 0.0, copies: int = 1) -> int:
        """Rows per chunk of the batched products (``extra`` bytes a row on top): a row's
        tracked places and its rows over the points (:meth:`_gemm_values`, the
        anchoring's exact row); ``copies`` of all of that a row (a product of two rows
        a row).  At most ``m``: the memory is shared before the rows are capped, so a
        batch of fewer than ``m`` rows that fits is one chunk."""
        n, d = self.n, self.X.shape[1]
        per = (8.0 * (6 * Q + 4 * (n + 1) + d) + extra) * copies
        return int(max(1, min(self.m, _CHUNK_SHARE * free_bytes(self.device) // per)))

    def _anchor(self, rows, coef, keep=None, moved: bool = True):
        """Exact rows of ``rows`` now (GEMM) from their coefficients ``coef`` (at their
        tracked points), and their new tracked pairs: every point within ``β`` of ``b``
        or above, every pair with a coefficient, and the pairs ``keep`` marks (at the old
        points).  The tracked width grows to the widest row (one read of it).  Returns
        the coefficients at the new points.  ``moved=False``: the coefficients are all
        0 (the set-up), so the rows are ``W(0)``'s and the GEMM ``C·X`` is skipped.
        O(k·n·d)."""
        if rows.numel() == 0:
            return coef
        step = self._chunk(self.J.shape[1])
        picked = []
        for s in range(0, rows.numel(), step):
            part, C = rows[s : s + step], coef[s : s + step]
            ks = None if keep is None else keep[s : s + step]
            picked.append((part, *self._anchor_pick(part, C, ks, moved=moved)))
        width = max(int(k.sum(dim=1).max()) for *_, k in picked)
        if width > self.J.shape[1]:
            self._widen(width + width // _SLACK)
        return self.torch.cat([self._anchor_write(*p)[0] for p in picked])

    def _anchor_pick(self, part, C, keep=None, J=None, beta=None, moved: bool = True):
        """What :meth:`_anchor` keeps of rows ``part`` (their places ``J`` and band
        half-widths ``beta``, read when not given): their products with every point now
        ``U`` ``(k, n + 1)`` (the pad point's column 0), their coefficients by point
        ``Cd`` and the points kept ``(k, n)``; ``moved=False``: ``C`` is 0, the rows are
        ``W(0)``'s."""
        n = self.n
        Jold = self.J[part, : C.shape[1]] if J is None else J  # beyond: pads
        beta = self.beta[part] if beta is None else beta
        Cd = self._by_point(Jold, C)
        rows = self._current_rows(part, Cd) if moved else self._initial_rows(part)
        U = rows @ self.Xp.T
        kept = (U[:, :n] >= self.b - beta[:, None]) | (Cd[:, :n] != 0)
        if keep is not None:
            kept |= self._by_point(Jold, keep)[:, :n]
        return U, Cd, kept

    def _anchor_places(self, U, Cd, kept):
        """The places of rows anchored at what :meth:`_anchor_pick` kept, at the present
        width: the kept points in increasing order, then the pad (each kept point at its
        rank among the row's kept points: a prefix sum, no sort), and the products and
        coefficients there: ``(J, uref, cref)``.  A row keeping more points than the
        width holds is cut short (its caller does not use it)."""
        torch = self.torch
        n, Q = self.n, self.J.shape[1]
        # a kept point's place is its rank, 1, 2, ...; the others' (and those past the
        # width) the column Q + 1; column 0 stays the pad, and columns 1 to Q are kept
        place = torch.where(kept, torch.cumsum(kept, dim=1), Q + 1).clamp_(max=Q + 1)
        J = torch.full((U.shape[0], Q + 2), n, dtype=torch.int64, device=self.device)
        J = J.scatter_(1, place, self._arange(n).expand(U.shape[0], n))[:, 1 : Q + 1]
        return J, torch.gather(U, 1, J), torch.gather(Cd, 1, J)

    def _anchor_write(self, part, U, Cd, kept, live=None):
        """Rows ``part`` anchored at what :meth:`_anchor_pick` kept
        (:meth:`_anchor_places`; a row keeping more points than the width holds must not
        be written: ``live`` marks the rows written, all when ``None``).  Returns the
        coefficients and the products at the new points (the old ones where not
        written): right after its anchoring a row's values are its products."""
        torch = self.torch
        J, uref, C = self._anchor_places(U, Cd, kept)
        cref = C
        if live is not None:  # the rows not written keep their places and coefficients
            w, old = live[:, None], self.J[part]
            J, uref = torch.where(w, J, old), torch.where(w, uref, self.uref[part])
            C, cref = (
                torch.where(w, C, torch.gather(Cd, 1, old)),
                torch.where(w, C, self.cref[part]),
            )
        self.J[part], self.uref[part], self.cref[part] = J, uref, cref
        return C, uref

    def _by_point(self, J, vals):
        """``vals`` at the tracked points ``J`` spread over the ``n + 1`` points (the pad
        point ``n`` last): ``(k, n + 1)``.  Every padded array holds 0 (or False) at its
        pads (the keys, inf, are never spread), so the pad point's column is 0 too."""
        flag = vals.dtype == self.torch.bool  # scattered as bytes: every backend has those
        if flag:
            vals = vals.to(self.torch.uint8)
        dense = self.torch.zeros((J.shape[0], self.n + 1), dtype=vals.dtype, device=self.device)
        dense.scatter_(1, J, vals)
        return dense.bool() if flag else dense

    def _current_rows(self, idx, Cd):
        """``w_r(t) = w_r(0) - Σ_j C_rj x_j`` of rows ``idx`` from their coefficients by
        point ``Cd`` (one GEMM)."""
        w = self._initial_rows(idx)
        w -= Cd @ self.Xp
        return w

    #: the ``(m, Q)`` arrays a wider ``Q`` pads (the pad: the point ``n``, and zeros
    #: unless :attr:`PAD_FILL` says otherwise)
    PADDED = ("uref", "cref")
    PAD_FILL: ClassVar[dict[str, float]] = {}

    def _widen(self, width: int) -> None:
        torch = self.torch
        extra = width - self.J.shape[1]
        pad = torch.full((self.m, extra), self.n, dtype=torch.int64, device=self.device)
        self.J = torch.cat((self.J, pad), dim=1)
        for name in self.PADDED:
            a = getattr(self, name, None)
            if a is not None:
                fill = self.PAD_FILL.get(name, 0)
                z = torch.full((self.m, extra), fill, dtype=a.dtype, device=self.device)
                setattr(self, name, torch.cat((a, z), dim=1))

    # -- values, outputs ---------------------------------------------------------------
    def _distance_of(self, D2, dCp):
        """``D >= ||w_r(t) - w_r(t_a)||`` from the computed ``D2 = ΔCᵀGΔC``: its rounding
        is at most (P+2)·ε of its absolute terms, Σ_pq |ΔC_p||G_pq||ΔC_q| <=
        (Σ_p |ΔC_p|)²·R² (|G_pq| <= R²)."""
        absq = dCp.abs().sum(dim=1) ** 2 * (self.R * self.R)
        P = dCp.shape[1]
        return self.torch.sqrt(self.torch.clamp(D2, min=0.0) + 4.0 * (P + 2) * _EPS * absq)

    def _gemm_values(self, J, C, cref, uref):
        """Values ``V`` of rows at places ``J`` (coefficients ``C``, anchored ones
        ``cref`` and products ``uref`` there) from their anchors, and their distance
        from the anchor with its rounding margin, ``D >= ||w_r(t) - w_r(t_a)||``, by
        matrix products of the coefficient changes by point
        ``ΔC`` ``(k, n + 1)``: ``V = U(t_a) - ΔC·G`` at the places, ``D² = ΔCᵀGΔC``
        (``2·k·(n+1)²`` flops), or where ``d < (n+1)/2`` by the move ``ΔW = ΔC·X``, then
        ``ΔW·Xᵀ`` (``4·k·(n+1)·d``).  Fixed shapes whatever the rows' moves; either
        order of the same sums is the Gram identity to its rounding."""
        dC = C - cref
        dCd = self._by_point(J, dC)
        if self._by_gram:
            T = dCd @ self.Gp  # the pad point's row and column are 0
            D = self._distance_of((dCd * T).sum(dim=1), dCd)
        else:
            dW = dCd @ self.Xp
            T = dW @ self.Xp.T
            D = self._distance_by_move(dW, dC.abs().sum(dim=1))
        return uref - self.torch.gather(T, 1, J), D

    def _distance_by_move(self, dW, l1):
        """``D >= ||w_r(t) - w_r(t_a)||`` from the computed move ``dW``: each of its
        entries errs by at most ``γ_{n+1}·Σ_p |ΔC_p||x_pt|``, so the vector by
        ``γ_{n+1}·Σ|ΔC|·R``, and its norm by ``γ_d`` relative."""
        d = dW.shape[1]
        norm = self.torch.sqrt((dW * dW).sum(dim=1))
        return norm * (1.0 + 4.0 * (d + 2) * _EPS) + 4.0 * (self.n + 3) * _EPS * l1 * self.R

    def _expired(self, beta, D):
        """Whether a band of half-width ``beta`` may be exceeded at distance ``D``."""
        return D * self.R * (1.0 + 1e-12) + 1e-300 >= beta

    def _outputs(self):
        """``u`` from the firing pairs: each chunk of rows' contributions by point, then
        one GEMM with the output weights ``(n + 1, k)·(k, K)``; chunks added in order.
        Fixed shapes, no atomic accumulation: the same sums in the same order every
        time."""
        torch = self.torch
        K = self.At.shape[1]
        u = torch.zeros((self.n, K), dtype=self._f64, device=self.device)
        step = self._chunk(self.J.shape[1])
        for s in range(0, self.m, step):
            rows = slice(s, min(s + step, self.m))
            contrib = torch.where(self.F[rows], self.V[rows] - self.b, 0.0)
            u += self._by_point(self.J[rows], contrib)[:, : self.n].T @ self.At[rows]
        return u * self.scale * self.alpha

    # -- the trainer's interface ----------------------------------------------------------
    def initial_fire_sets(self) -> tuple[np.ndarray, np.ndarray]:
        torch = self.torch
        r, q = torch.nonzero(self.F, as_tuple=True)
        keys = (r * self.n + self.J[r, q]).cpu().numpy()
        return keys_to_csr(np.sort(keys).astype(np.int64), self.m, self.n)

    def _refuse_linear(self, step: LinearStep | None) -> None:
        if step is not None:
            raise ValueError(
                f"method={self.name!r} on a device takes plain gradient steps (no momentum "
                f"or weight decay yet): use method='dense' there"
            )

    def weights(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        torch = self.torch
        start, stop, _ = slice(start, stop).indices(self.m)
        out = np.empty((stop - start, self.X.shape[1]))
        step = self._chunk(self.J.shape[1])
        for s in range(start, stop, step):
            idx = torch.arange(s, min(s + step, stop), device=self.device)
            Cd = self._by_point(self.J[idx], self._coef(idx))
            out[s - start : s - start + idx.numel()] = self._current_rows(idx, Cd).cpu().numpy()
        return out

    def _rates(self) -> dict[str, float]:
        """The device's rates (:data:`~corrtree._config.DEVICE_RATES`)."""
        return _config.DEVICE_RATES.get(self.device.type, _config.DEVICE_RATES["cpu"])

    def _own_at(self, E, J, A):
        """:func:`own_at` the cheaper way at this device's rates (:func:`own_by_gemm`)."""
        return own_at(E, J, A, own_by_gemm(self._rates(), self.n, J.shape[1], A.shape[1]))

    def _by_sort(self, size: int) -> bool:
        """Whether :func:`compact` picks from a mask of ``size`` flags by a sort: where
        the device's rates price the sort below the four launches it saves."""
        rate = self._rates()
        return "sorts" in rate and size / rate["sorts"] < 4.0 * rate["launch"]

    def _arange(self, size: int):
        """``arange(size)`` on the device, made once for each size."""
        got = self._aranges.get(size)
        if got is None:
            got = self._aranges[size] = self.torch.arange(size, device=self.device)
        return got

    def _initial_rows(self, idx):
        """Rows ``idx`` of ``W(0)``, a new tensor: stored, or for an implicit model
        regenerated on the device by the generator's twin over torch
        (:func:`~corrtree._philox.normals_array`; the same integers, floats within a few
        ulps of the CPU's); a model trained before adds its coefficients on the host."""
        if self.w0 is None:
            return self.W0.index_select(0, idx)  # a new tensor
        src = self.w0
        rows = normals_array(self.torch, src.seed, idx + src.offset, src.d, like=idx)
        if self._update is not None:
            self._apply_update(rows, idx, *self._update)
        return rows

    def _upload_update(self, update) -> tuple:
        """An implicit model's earlier training, ``W = α·(W(0) - C' X')``, on the device
        once: ``X'`` with a zero pad point, ``C'`` in CSR (columns as int64) and the
        widest row's count (read on the host here, at set-up)."""
        X, indptr, cols, coef, alpha = update
        pts = np.zeros((X.shape[0] + 1, X.shape[1]))
        pts[:-1] = X
        width = int(np.diff(indptr).max(initial=0))
        sent = (self._tensor(a.astype(t)) for a, t in ((indptr, np.int64), (cols, np.int64)))
        return (self._tensor(pts), *sent, self._tensor(coef), width, float(alpha))

    def _apply_update(self, rows, idx, pts, indptr, cols, coef, width, alpha) -> None:
        """``rows = α·(rows - C'[idx] X')`` in place (:meth:`_upload_update`), in fixed
        shapes: each row's coefficients read at ``width`` places from its CSR start
        (those past its count are the pad point with 0), added by point (a column is in
        a row of the CSR once, so each sum is that coefficient), one GEMM against ``X'``.
        No host round trip.  O(len(idx)·(width + n'·d))."""
        torch = self.torch
        if width:
            pad = pts.shape[0] - 1
            start = indptr[idx]
            places = self._arange(width)[None, :]
            live = places < (indptr[idx + 1] - start)[:, None]
            at = torch.where(live, start[:, None] + places, 0)
            by = torch.zeros((idx.numel(), pad + 1), dtype=self._f64, device=self.device)
            by.scatter_add_(1, torch.where(live, cols[at], pad), torch.where(live, coef[at], 0.0))
            rows -= by @ pts
        if alpha != 1.0:
            rows *= alpha

    def implicit_update(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """``C`` in CSR over the pairs with a coefficient (an implicit model keeps these):
        ``(indptr, cols, coef, α = 1)``, points increasing within a row."""
        C = self._coef(self.torch.arange(self.m, device=self.device))
        keep = (C != 0) & (self.J < self.n)
        indptr = np.zeros(self.m + 1, dtype=np.int64)
        np.cumsum(keep.sum(dim=1).cpu().numpy(), out=indptr[1:])
        cols = self.J[keep].cpu().numpy().astype(np.int32)
        return indptr, cols, C[keep].cpu().numpy(), 1.0

    def _tensor(self, a):
        return self.torch.from_numpy(np.array(a)).to(self.device)

    def _upload(self, err: np.ndarray, out) -> None:
        """``out[...] = err``, the copy queued without waiting (:class:`~.._device.Staging`:
        the step's download waits for it before the host writes the buffer again)."""
        if self._staging is None:
            self._staging = Staging(self.torch, self.device)
        self._staging.upload(err, out)
