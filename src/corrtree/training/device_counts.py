"""The kernel trainer's NTK matrix on a torch device: the count matrix ``N`` of the fire
sets and ``H = N ∘ (G ⊗ 1_{K×K}) / m``.

``N = Σ_r (a_r a_rᵀ) ⊗ f_r f_rᵀ`` (``f_r`` the fire set of neuron ``r`` as a 0/1 vector)
holds integers, exact in float64 whatever the order of its additions, so ``H`` does not
drift from the fire sets and a checkpoint rebuilds it bit for bit.  It is built by float32
GEMMs of 0/±1 rows (each partial sum an integer below ``2^24``, so exact) and changed after
a visit either by GEMMs of the rows with a flip or entry by entry at the entries the flips
touch, whichever the device's rates price lower (:meth:`DeviceCounts._change_counts`).
"""

from __future__ import annotations

from typing import Any

from .._device import free_bytes
from .device_band import _CHUNK_SHARE, DeviceBand, capacity, compact

__all__ = ["DeviceCounts"]

#: float32 GEMM of 0/±1 matrices: every partial sum an integer below this, so exact
_EXACT_F32 = 2**24


class DeviceCounts(DeviceBand):
    """:class:`~.device_band.DeviceBand` with the count matrix ``N`` of its fire sets and
    the NTK matrix ``H`` from it (the kernel trainer's resident matrices)."""

    #: ``(nK, nK)`` float64 tensors: the counts and ``H``; the fired places per row
    N: Any
    H: Any
    nfire: Any

    def _counts(self) -> None:
        """``N`` from the fire sets (float32 GEMMs of 0/±1 rows, exact), then ``H``."""
        torch = self.torch
        nK = self.n * self.At.shape[1]
        self.N = torch.zeros((nK, nK), dtype=self._f64, device=self.device)
        self.H = torch.empty_like(self.N)
        # the signs of new and old flags in :meth:`_add_counts`, made once
        self._signs = torch.tensor([1.0, -1.0], dtype=torch.float32, device=self.device)
        self._signs = self._signs[None, :, None, None]
        self._add_counts(self.J, self.F, self.At)
        self._rebuild_h()
        self.nfire.copy_(self.F.sum(dim=1))

    def _add_counts(self, J, F, A, old=None) -> None:
        """``N += Σ_r (a_r a_rᵀ) ⊗ f_r f_rᵀ`` over rows with output weights ``A`` (their
        fire flags ``F`` at their tracked points ``J``), less the same of their flags
        ``old`` when given (one GEMM of both: ``[M; M_old]ᵀ·[M; -M_old]``): float32 GEMMs
        of 0/±1 rows, each partial sum an integer below 2^24, so exact, and added to
        ``N`` exactly.  With one output ``A`` is not read (``None`` will do)."""
        torch = self.torch
        n, K = self.n, self.At.shape[1]
        nK = n * K
        f32 = torch.float32
        unit = K == 1  # a_r = ±1 (the model holds no other): a_r a_rᵀ = 1, the flags alone
        # with the old flags each row is two rows of the GEMM: half the rows a chunk, and
        # its sums (up to twice the rows) still below 2^24
        copies = 1 if old is None else 2
        rows = self._chunk(J.shape[1], 8.0 * (n + 1) * (K + 1), copies)
        step = max(1, min((_EXACT_F32 - 1) // copies, rows))
        for s in range(0, J.shape[0], step):
            Js = J[s : s + step]
            if old is None:
                M = self._by_point(Js, F[s : s + step].to(f32))[:, :n]
                if not unit:
                    M = (M[:, :, None] * A[s : s + step, None, :].to(f32)).reshape(-1, nK)
                self.N.add_(M.T @ M)
                continue
            # both flags of each row by point in one scatter, then [M; M_old]ᵀ·[M; -M_old]
            by = torch.zeros((Js.shape[0], 2, n + 1), dtype=f32, device=self.device)
            flags = torch.stack((F[s : s + step], old[s : s + step]), dim=1).to(f32)
            by.scatter_(2, Js[:, None, :].expand(-1, 2, -1), flags)
            if unit:  # the pad point's column (zeros) left out by a strided view
                M = by.view(-1, n + 1)[:, :n]
                signed = (by * self._signs[:, :, :, 0]).view(-1, n + 1)[:, :n]
            else:
                M = by[:, :, :n, None] * A[s : s + step, None, None, :].to(f32)
                signed = (M * self._signs).reshape(-1, nK)
                M = M.reshape(-1, nK)
            self.N.add_(M.T @ signed)

    def _rebuild_h(self) -> None:
        """``H = N ∘ (G ⊗ 1_{K×K}) / m`` everywhere, the same expression as
        :meth:`_ntk_at` (so an entry recomputed there equals the matrix built anew): two
        launches and no temporaries, ``G`` broadcast over the outputs (entry ``(jK + k,
        lK + k')`` of ``H`` is ``(j, k, l, k')`` of its ``(n, K, n, K)`` view)."""
        torch = self.torch
        n, K = self.n, self.At.shape[1]
        g = self.Gp[:n, :n]
        if K == 1:
            torch.mul(self.N, g, out=self.H)
        else:
            torch.mul(self.N.view(n, K, n, K), g[:, None, :, None], out=self.H.view(n, K, n, K))
        self.H.div_(float(self.width))

    def _ntk_at(self, Ir, Jx, g):
        """``H`` at the flat indices ``(Ir, Jx)`` from ``N`` and ``g``, the entries of ``G``
        there: ``N ∘ G / m``, one expression everywhere, so an entry recomputed equals the
        matrix built anew."""
        return self.N[Ir, Jx] * g / float(self.width)

    def _change_counts(self, J, fo, fn, changed, rows_touched, A, touched: int, flips: int):
        """Add ``f_new f_newᵀ - f_old f_oldᵀ`` (times ``a_r a_rᵀ``) of visited rows (places
        ``J``, output weights ``A``) to ``N`` at the entries that change, and recompute
        ``H`` there; ``touched`` rows have a flip (``rows_touched`` marks them) and there
        are ``flips`` flips (both read with the visit's counts, so priced exactly).
        The additions are integers, so ``N`` is exact whatever their order and grouping.

        Two ways, priced with the device's rates: by float32 GEMMs of the touched rows
        (a batch of :func:`capacity` rows, or the whole visited batch where its extra
        rows cost less than picking those), their old fire sets subtracted and their new
        ones added (:meth:`_add_counts`: ``4·k·(nK)²`` flops, fixed shapes) and ``H``
        rebuilt (:meth:`_rebuild_h`); or entry by entry, each flip ``2·Q·K²`` entries
        (:meth:`_scatter_counts`), each way with its launches."""
        torch = self.torch
        K = self.At.shape[1]
        nK = self.n * K
        if not touched:
            return
        rate = self._rates()
        size = J.shape[0]
        k = capacity(touched, size)
        # the touched rows picked (a compaction and four gathers), or the whole batch (a
        # row without a flip adds nothing), whichever costs less
        gemm = 4.0 * nK * nK / rate["flops32"]
        whole = size * gemm <= k * gemm + 7 * rate["launch"]
        by_gemm = (size if whole else k) * gemm + 48.0 * nK * nK / rate["bytes"]
        by_gemm += (13 if whole else 20) * rate["launch"]
        entries = 2.0 * capacity(flips, changed.numel()) * J.shape[1] * K * K
        scattered = entries / rate["scatters"] + 40 * rate["launch"]  # as counted
        rows_share = 8.0 * (size if whole else k) * nK  # the rows' products
        fits = rows_share <= _CHUNK_SHARE * free_bytes(self.device)
        if fits and by_gemm <= scattered:
            if whole:
                self._add_counts(J, fn, A, old=fo)
            else:  # the batch's padding rows have no flip either: they add nothing
                by_sort = self._by_sort(size)
                rows, _ = compact(torch, rows_touched, k, self._arange(size), by_sort)
                self._add_counts(J[rows], fn[rows], None if K == 1 else A[rows], old=fo[rows])
            self._rebuild_h()
            return
        self._scatter_counts(J, fo, fn, changed, A, flips)

    def _scatter_counts(self, J, fo, fn, changed, A, flips: int) -> None:
        """:meth:`_change_counts` entry by entry, in fixed shapes: the ``flips`` flipped
        places listed in a batch (:func:`capacity`), each with the ``Q`` entries of its
        row, ``f_new[q] f_new[q'] - f_old[q] f_old[q']`` (zeros included: adding 0 to
        ``N`` changes nothing, and ``H`` recomputed from an unchanged entry is the
        same), by groups within a share of the device's memory."""
        torch = self.torch
        K, Q = A.shape[1], J.shape[1]
        n = self.n
        cap = capacity(flips, changed.numel())
        by_sort = self._by_sort(changed.numel())
        flat, live = compact(torch, changed.reshape(-1), cap, by_sort=by_sort)
        per = 4.0 * Q * K * K * 64.0  # indices, values, G and H for each entry
        group = max(1, int(_CHUNK_SHARE * free_bytes(self.device) // per))
        fnd, fod = fn.to(self._f64), fo.to(self._f64)
        Jc = torch.where(J < n, J, 0)  # a pad's entries are 0: added at a real point
        for s in range(0, cap, group):
            rg, qg, w = flat[s : s + group] // Q, flat[s : s + group] % Q, live[s : s + group]
            # (q, q') with q flipped: f_new[q] f_new[q'] - f_old[q] f_old[q']
            val = fnd[rg, qg, None] * fnd[rg] - fod[rg, qg, None] * fod[rg]
            val = torch.where(w[:, None], val, 0.0)
            # and (q', q) with q' unchanged (a flipped q' has its own entries)
            back = torch.where(changed[rg], 0.0, val)
            j1 = Jc[rg, qg, None].expand(-1, Q)
            j2 = Jc[rg]
            v, r = torch.cat((val, back)).reshape(-1), torch.cat((rg, rg))[:, None].expand(-1, Q)
            j1, j2 = torch.cat((j1, j2)).reshape(-1), torch.cat((j2, j1)).reshape(-1)
            r = r.reshape(-1)
            g = self.Gp[j1, j2]
            if K == 1:  # a_r = ±1: a_r² = 1
                vals, Ir, Jx = v, j1, j2
            else:
                a = A[r]
                kk = torch.arange(K, device=self.device)
                Ir = (j1[:, None, None] * K + kk[None, :, None]).expand(-1, K, K).reshape(-1)
                Jx = (j2[:, None, None] * K + kk[None, None, :]).expand(-1, K, K).reshape(-1)
                vals = (v[:, None, None] * a[:, :, None] * a[:, None, :]).reshape(-1)
                g = g[:, None].expand(-1, K * K).reshape(-1)
            self.N.index_put_((Ir, Jx), vals, accumulate=True)
            self.H[Ir, Jx] = self._ntk_at(Ir, Jx, g)
