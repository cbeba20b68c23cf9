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

import warnings
from typing import Any, ClassVar

import numpy as np

from .. import _config
from .._device import check_device_memory, free_bytes
from .._implicit import ImplicitWeights
from .._philox import normals_array
from ._base import Trainer
from ._sparse import keys_to_csr
from ._state import Field, Scalar, Schema
from .costs import fire_share
from .optim import LinearStep

__all__ = ["DeviceLazyTrainer"]

_EPS = 2.0**-52
#: Share of the device's free memory the batched gathers of a chunk of neurons may take.
_CHUNK_SHARE = 0.1


#: The state every tracked-pair trainer of the array path keeps: each row's tracked points
#: (the pad ``n``), their anchored products and coefficients, and the band half-widths.
ANCHOR_FIELDS = (
    Field("J", ("i8",), ("m", "Q"), index="n1"),
    Field("uref", ("f8",), ("m", "Q")),
    Field("cref", ("f8",), ("m", "Q")),
)


def marked_first(torch, mask, k: int):
    """Per row, the places of the first ``k`` marked entries of ``mask``, in order, then
    unmarked ones: a stable sort of the rows' flags (compacts a padded row's live places)."""
    return torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :k]


def segment_sums(torch, vals, counts):
    """Sums of consecutive runs of rows of ``vals`` (``counts`` rows each), each run added
    in its order whatever the device's scheduling: ``torch.segment_reduce``, or where a
    backend lacks it, the runs padded into the rows of a matrix summed along them (a
    fixed reduction per shape).  No atomic accumulation either way."""
    try:
        return torch.segment_reduce(vals, "sum", lengths=counts, axis=0)
    except (RuntimeError, NotImplementedError):
        return padded_sums(torch, vals, counts)


def padded_sums(torch, vals, counts):
    """:func:`segment_sums` by padding: run ``s`` in row ``s`` of a ``(runs, longest,
    K)`` array of zeros, then summed along its rows."""
    starts = torch.cumsum(counts, dim=0) - counts
    run = torch.repeat_interleave(torch.arange(counts.numel(), device=vals.device), counts)
    rank = torch.arange(vals.shape[0], device=vals.device) - starts[run]
    longest = int(counts.max()) if counts.numel() else 0
    out = torch.zeros(
        (counts.numel(), max(1, longest), vals.shape[1]), dtype=vals.dtype, device=vals.device
    )
    out[run, rank] = vals
    return out.sum(dim=1)


def _uploaded(torch: Any, W: np.ndarray, dev: Any) -> Any:
    """``W`` (read only, float64) on ``dev`` without a copy on the host: a view of its
    memory uploaded in one transfer (on ``cpu``, the view itself: the trainers only read
    ``W(0)``).  A non-contiguous or non-float64 ``W`` is converted first."""
    host = np.ascontiguousarray(W, dtype=np.float64)
    with warnings.catch_warnings():  # torch warns of views of read-only arrays; none is written
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        view = torch.from_numpy(host)
    return view if dev.type == "cpu" else view.to(dev)


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
        need = self.device_need(
            n, self.m, d, self.a.shape[1], share, isinstance(W0, ImplicitWeights), False
        )
        check_device_memory(need, dev, f"method={self.name!r} at m={self.m}, n={n}, d={d} on {dev}")
        host = np.zeros((n + 1, d))
        host[:n] = self.X
        self.Xp = torch.from_numpy(host).to(dev)  # a zero point n: the pad
        self.Gp = self.Xp @ self.Xp.T
        self.At = torch.from_numpy(np.array(self.a, dtype=np.float64)).to(dev)
        if isinstance(W0, ImplicitWeights):  # regenerated by rows, never stored
            self.W0, self.w0 = None, W0
        else:  # an explicit model's rows (StoredWeights) or an array
            self.W0, self.w0 = _uploaded(torch, getattr(W0, "W", W0), dev), None
        self.xnorm = torch.sqrt((self.Xp * self.Xp).sum(dim=1))
        self.R = float(self.xnorm.max())
        self.alpha = 1.0
        self.info.update(band=band, device=str(dev))
        self.u = None
        self._flips_next = 0  # flips between W(t) and W(t+1), the next row's
        self._sorted = None
        self._f64 = torch.float64
        self._staging: Any = None  # the host's error, pinned on a GPU (_upload)

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
    def _chunk(self, Q: int, extra: float = 0.0) -> int:
        """Rows per chunk of the batched gathers (``extra`` bytes a row on top)."""
        per = 8.0 * (3 * Q * Q + self.n + self.X.shape[1] * Q) + extra
        return int(max(1, min(self.m, _CHUNK_SHARE * free_bytes(self.device) // per)))

    def _anchor(self, rows, coef, keep=None):
        """Exact rows of ``rows`` now (GEMM) from their coefficients ``coef`` (at their
        tracked points), and their new tracked pairs: every point within ``β`` of ``b``
        or above, every pair with a coefficient, and the pairs ``keep`` marks (at the old
        points).  Returns the coefficients at the new points.  O(k·n·d)."""
        torch = self.torch
        n = self.n
        if rows.numel() == 0:
            return coef
        step = self._chunk(self.J.shape[1])
        picked = []
        for s in range(0, rows.numel(), step):
            part, C = rows[s : s + step], coef[s : s + step]
            Jold = self.J[part, : C.shape[1]]  # beyond: pads
            Cd = self._by_point(Jold, C)
            U = self._current_rows(part, Cd) @ self.Xp[:n].T
            kept = (U >= self.b - self.beta[part][:, None]) | (Cd[:, :n] != 0)
            if keep is not None:
                kept |= self._by_point(Jold, keep[s : s + step])[:, :n]
            picked.append((part, U, Cd, kept))
        width = max(int(k.sum(dim=1).max()) for _, _, _, k in picked)
        if width > self.J.shape[1]:
            self._widen(width)
        Q = self.J.shape[1]
        out = []
        for part, U, Cd, kept in picked:
            # the kept points in increasing order, then the pad: each kept point goes
            # to its rank among the row's kept points (a prefix sum, no sort)
            place = torch.where(kept, torch.cumsum(kept, dim=1) - 1, Q)
            J = torch.full((part.numel(), Q + 1), n, dtype=torch.int64, device=self.device)
            points = torch.arange(n, device=self.device).expand(part.numel(), n)
            J.scatter_(1, place, points)
            J = J[:, :Q]
            Upad = torch.cat((U, torch.zeros_like(U[:, :1])), dim=1)
            self.J[part] = J
            self.uref[part] = torch.gather(Upad, 1, J)
            C = torch.gather(Cd, 1, J)
            self.cref[part] = C
            out.append(C)
        self._sorted = None  # the outputs' order changes with J
        return torch.cat(out)

    def _by_point(self, J, vals):
        """``vals`` at the tracked points ``J`` spread over the ``n + 1`` points (the pad
        point ``n`` last, always 0): ``(k, n + 1)``."""
        flag = vals.dtype == self.torch.bool  # scattered as bytes: every backend has those
        if flag:
            vals = vals.to(self.torch.uint8)
        dense = self.torch.zeros((J.shape[0], self.n + 1), dtype=vals.dtype, device=self.device)
        dense.scatter_(1, J, vals)
        dense[:, self.n] = 0
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
    def _moved(self, idx, C, P=None):
        """The coefficient changes since the anchor of rows ``idx`` at the columns that
        moved (those that fired: only they enter the Gram sums): their points ``Jp`` and
        changes ``dCp``, ``(k, P)``, P the most in a row (read from the device unless
        given: any bound on it gives the same sums, padded)."""
        torch = self.torch
        J = self.J[idx, : C.shape[1]]  # the rows' places beyond C's are pads
        dC = C - self.cref[idx, : C.shape[1]]
        moving = dC != 0
        if P is None:
            P = int(moving.sum(dim=1).max()) if idx.numel() else 0
        first = marked_first(torch, moving, P)
        return torch.gather(J, 1, first), torch.gather(dC, 1, first)

    def _distance_of(self, D2, dCp):
        """``D >= ||w_r(t) - w_r(t_a)||`` from the computed ``D2 = ΔCᵀGΔC``: its rounding
        is at most (P+2)·ε of its absolute terms, Σ_pq |ΔC_p||G_pq||ΔC_q| <=
        (Σ_p |ΔC_p|)²·R² (|G_pq| <= R²)."""
        absq = dCp.abs().sum(dim=1) ** 2 * (self.R * self.R)
        P = dCp.shape[1]
        return self.torch.sqrt(self.torch.clamp(D2, min=0.0) + 4.0 * (P + 2) * _EPS * absq)

    def _gram(self, idx, C):
        """Values ``V`` of rows ``idx`` (coefficients ``C``) by the Gram identity from
        their anchors, and their distance from the anchor with its rounding margin,
        ``D >= ||w_r(t) - w_r(t_a)||``.  O(k·P·Q) gathers, ``P`` the most moved
        coefficients in a row."""
        torch = self.torch
        uref = self.uref[idx, : C.shape[1]]
        Jp, dCp = self._moved(idx, C)
        if Jp.shape[1] == 0:
            return uref.clone(), torch.zeros(idx.numel(), dtype=self._f64, device=self.device)
        J = self.J[idx, : C.shape[1]]
        Gs = self.Gp[Jp[:, :, None], J[:, None, :]]  # (rows, P, Q)
        GdC = torch.bmm(dCp[:, None, :], Gs)[:, 0, :]
        D2 = (C - self.cref[idx, : C.shape[1]]).mul(GdC).sum(dim=1)
        return uref - GdC, self._distance_of(D2, dCp)

    def _expired(self, idx, D):
        """Whether the band of rows ``idx`` may be exceeded at distance ``D``."""
        return D * self.R * (1.0 + 1e-12) + 1e-300 >= self.beta[idx]

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
        return segment_sums(torch, vals, counts)[: self.n] * self.scale * self.alpha

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

    def _initial_rows(self, idx):
        """Rows ``idx`` of ``W(0)``, a new tensor: stored, or for an implicit model
        regenerated on the device by the generator's twin over torch
        (:func:`~corrtree._philox.normals_array`; the same integers, floats within a few
        ulps of the CPU's); a model trained before adds its coefficients on the host."""
        if self.w0 is None:
            return self.W0[idx].clone()
        src = self.w0
        if src.update is not None:
            rows = src.take(idx.cpu().numpy().astype(np.int64))
            return self.torch.from_numpy(rows).to(self.device)
        return normals_array(self.torch, src.seed, idx + src.offset, src.d, like=idx)

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
        """``out[...] = err`` through a staging buffer made once (pinned on a GPU), so the
        copy is queued without waiting: the host writes the buffer again only after the
        step's download, which waits for the copy."""
        torch = self.torch
        if self._staging is None or tuple(self._staging.shape) != err.shape:
            self._staging = torch.from_numpy(np.empty(err.shape))
            if self.device.type == "cuda":
                self._staging = self._staging.pin_memory()
        self._staging.copy_(torch.from_numpy(np.ascontiguousarray(err, dtype=np.float64)))
        out.copy_(self._staging, non_blocking=True)


class DeviceLazyTrainer(DeviceBand):
    """Module docstring.  Options: ``band`` (default :data:`~corrtree._config.BAND`)."""

    name = "lazy"
    SCHEMA = Schema(
        1,
        (
            *ANCHOR_FIELDS,
            Field("C", ("f8",), ("m", "Q")),
            Field("beta", ("f8",), ("m",)),
        ),
        (Scalar("band", float, 0.0), Scalar("flips_next", int, 0)),
    )
    PADDED = ("uref", "cref", "C", "V")

    def _prepare(self, W0: np.ndarray, device: Any = None, band: float | None = None) -> None:
        self.V = None
        rows = self._empty_rows(W0, device, band)
        self.C = self._anchor(rows, self.torch.zeros_like(self.uref))
        self._values()

    def _coef(self, idx):
        return self.C[idx]

    def _values(self, before=None):
        """``V``, ``F`` from the anchors; the neurons whose certificate expired are
        re-anchored (then evaluated again).  Returns them, with their tracked points
        and their firing flags ``before`` (the flags before the step)."""
        again = self._evaluate()
        old = None
        if again.numel() and before is not None:
            old = (self.J[again].clone(), before[again])
        if again.numel():
            self.C[again] = self._anchor(again, self.C[again])
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
            V, D = self._gram(idx, self.C[idx])
            self.V[idx] = V
            if rows is None:
                expired.append(idx[self._expired(idx, D)])
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

    def outputs(self) -> np.ndarray:
        if self.u is None:
            self.u = self._outputs().cpu().numpy()
        return self.u

    def advance(self, err: np.ndarray, step: LinearStep | None = None) -> dict[str, Any]:
        torch = self.torch
        self._refuse_linear(step)
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
            self.u = self._outputs().cpu().numpy()
            flips, self._flips_next = self._flips_next, self._flips(before, again, old)
        return self._row(
            fired,
            moved,
            flips,
            band_pairs=tracked,
            reanchored=int(again.numel()),
            evaluated_pairs=tracked,
        )

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
        t = self._tensor
        self.J, self.uref, self.cref = t(arrays["J"]), t(arrays["uref"]), t(arrays["cref"])
        self.C, self.beta = t(arrays["C"]), t(arrays["beta"])
        self._flips_next = int(scalars["flips_next"])
        self.V = None
        # the values from the anchors; every certificate held when the state was saved
        self._evaluate(torch.arange(self.m, device=self.device))
