"""The data along its leading principal directions: the kernel trainer's move bound and
screen (``docs/design.md``, "The kernel trainer")."""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from .. import _config

__all__ = ["PrincipalParts", "principal_parts"]

#: :func:`principal_parts`: the data's coordinates ``Z`` along its leading directions,
#: the residual norms ``resid``, the bound ``rho`` on the residual's spectral norm, the
#: screen's ``g``, ``rho_g`` and ``delta`` (``Z`` has no column on data without leading
#: directions).
PrincipalParts = namedtuple("PrincipalParts", ["Z", "resid", "rho", "g", "rho_g", "delta"])

_ROUND_UP = _config.ROUND_UP
_U64 = _config.U64
_EVALUATE_CHUNKS = _config.EVALUATE_CHUNKS


def _rest(lam: np.ndarray, k: int) -> float:
    """The (k+1)-th of the descending eigenvalues ``lam``, or 0 when there are ``k`` or fewer."""
    return float(lam[k]) if lam.shape[0] > k else 0.0


def principal_parts(X: np.ndarray, G: np.ndarray, rank: int, gain: float) -> PrincipalParts:
    """The data along its leading principal directions, for the move bound and the
    screen of :func:`visit`: ``Z = X Q`` (n×k, ``Q`` orthonormal d×k), the residual norms
    ``||x_l - Q z_l||`` and a bound ``ρ`` on the residual's spectral norm
    ``||X - Z Qᵀ||_2`` (the (k+1)-th singular value of X), each enlarged to cover
    the rounding of the eigensolver and of ``Z``.  ``k = min(rank, d, n)``, or 0 when
    ``||X||_2`` is within ``gain`` of that ``ρ`` (data without leading directions,
    as isotropic data): the bound is then ``||X||_2·||dl||``, with no O(k) work per
    pair.

    The screen splits ``G`` itself: ``G = Z Zᵀ + G_res`` with ``G_res + δI`` positive
    semidefinite (``δ`` covers the rounding of ``G``, of the eigensolver and of ``Z``),
    so for any coefficients ``c`` (Cauchy–Schwarz in the ``G_res + δI`` inner product)

        |cᵀ G e_j - <Zᵀc, z_j>| <= sqrt(cᵀ (G_res + δI) c) · g_j + δ·||c||_1,

    with ``g_j >= sqrt(G_res[j, j] + δ)`` and ``sqrt(cᵀ (G_res + δI) c) <= min(ρ_g,
    sqrt(Σ_{l: c_l ≠ 0} g_l²))·||c||``, ``ρ_g² >= λ_max(G_res) + δ``.  Returns ``(Z,
    residual norms, ρ, g, ρ_g, δ)``.  O(n·d·min(n, d) + min(n, d)³), from ``G`` when
    ``n <= d``.
    """
    n, d = X.shape
    # X = U S Vᵀ: eigenpairs of G = U S² Uᵀ, or of Xᵀ X = V S² Vᵀ
    M = G if n <= d else X.T @ X
    k = min(rank, d, n)
    # the values first: data without leading directions needs no vector (2.3x faster
    # at order 784)
    lam = np.linalg.eigvalsh(M)[::-1]
    if k and lam[0] > gain * gain * _rest(lam, k):
        lam, vec = np.linalg.eigh(M)
        lam, vec = lam[::-1], vec[:, ::-1]
    else:  # none: the bound is ||X||_2
        k = 0
        vec = np.empty((M.shape[0], 0))
    rest = _rest(lam, k)
    if n <= d:  # the top rows of S Vᵀ: Z = U_k S_k, Q = Xᵀ U_k / S_k
        top = np.maximum(lam[:k], 0.0)
        Z = np.ascontiguousarray(vec[:, :k] * np.sqrt(top))
        Q = X.T @ vec[:, :k] / np.where(top > 0, np.sqrt(top), 1.0)
    else:
        Q = vec[:, :k]
        Z = np.ascontiguousarray(X @ Q)
    scale = max(float(lam[0]), 0.0) if lam.shape[0] else 0.0
    # eigenvalues err by ~min(n, d)·2⁻⁵³·λ_1; Q's columns are orthonormal to the same order
    slack = 64.0 * min(n, d) * _U64 * scale
    R = X - Z @ Q.T
    resid = np.sqrt(np.einsum("ij,ij->i", R, R))
    bound = math.sqrt(max(rest, 0.0) + slack) * _ROUND_UP
    xn = np.sqrt(np.einsum("ij,ij->i", X, X))
    # G's rounding (<= (d+2)·2⁻⁵³·||x_i||·||x_j|| an entry) and Z's, as a spectral norm
    top = max(scale, float(np.max(xn, initial=0.0)) ** 2)  # type: ignore[arg-type]
    delta = slack + 64.0 * (n + d + 2) * (d + 2) * _U64 * top
    zz = np.einsum("ij,ij->i", Z, Z)
    g = np.sqrt(np.maximum(np.diag(G) - zz, 0.0) + delta + (k + 2) * _U64 * zz) * _ROUND_UP
    rho_g = math.sqrt(max(rest, 0.0) + 2.0 * delta) * _ROUND_UP
    return PrincipalParts(
        Z=Z,
        resid=resid * _ROUND_UP + math.sqrt(slack / max(scale, 1e-300)) * xn,
        rho=bound,
        g=g,
        rho_g=rho_g,
        delta=delta,
    )
