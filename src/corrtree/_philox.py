"""Counter-based Gaussian weights: ``W(0)[r, c]`` as a pure function of ``(seed, r, c)``.

Generator
    Philox-4×32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as
    easy as 1, 2, 3", SC 2011): a keyed bijection of 128-bit counters, checked
    against the Random123 known-answer vectors in the tests.  The key is the
    seed (64 bits); the counter of the pair of columns ``(2q, 2q+1)`` of row
    ``r`` of stream ``s`` is ``(q, r mod 2³², r div 2³², s)``.  Any block of rows
    is regenerated alone, in any order, on any worker, with the same bits.

Transform (fixed, written here, not a library's)
    The four 32-bit words ``x0..x3`` of a counter give two 53-bit uniforms
    ``u1 = ((x0 >> 5)·2²⁶ + (x1 >> 6) + 1)·2⁻⁵³`` in ``(0, 1]`` and
    ``u2 = ((x2 >> 5)·2²⁶ + (x3 >> 6))·2⁻⁵³`` in ``[0, 1)``, and Box–Muller gives
    the two Gaussians ``sqrt(-2 ln u1)·cos(2π u2)`` (column ``2q``) and
    ``sqrt(-2 ln u1)·sin(2π u2)`` (column ``2q+1``).  Exactly one counter per two
    columns, unlike a ziggurat, whose number of draws varies.  The integers are
    the same in every implementation; the floats agree to the rounding of each
    library's ``log``, ``cos`` and ``sin`` (a few ulps).

Streams
    0: the hidden weights ``W(0)``; 1: the output weights ``a`` (bit ``k`` of the
    words of counter ``(k div 128, r mod 2³², r div 2³², 1)`` gives ``a[r, k] = ±1``).

:func:`philox_array` and :func:`normals_array` are the same generator written
over any array library with int64 arithmetic (numpy, torch), the twin of the
numba kernels here.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ._jit import njit

__all__ = [
    "normal_rows",
    "normal_take",
    "normals_array",
    "philox4x32",
    "philox_array",
    "sign_rows",
]

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_MASK = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_ROUNDS = 10
_TWO_PI = 2.0 * math.pi
_INV53 = 1.0 / 9007199254740992.0  # 2^-53
STREAM_W, STREAM_A = 0, 1
SEED_LIMIT = 2**64


@njit(cache=True, inline="always")
def _philox(c0, c1, c2, c3, k0, k1):
    """Philox-4×32-10 of the counter ``(c0..c3)`` under the key ``(k0, k1)``: every
    argument a uint64 holding 32 bits; returns the four output words."""
    for _ in range(_ROUNDS):
        p0 = _M0 * c0
        p1 = _M1 * c2
        hi0, lo0 = p0 >> _S32, p0 & _MASK
        hi1, lo1 = p1 >> _S32, p1 & _MASK
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _W0) & _MASK
        k1 = (k1 + _W1) & _MASK
    return c0, c1, c2, c3


@njit(cache=True)
def philox4x32(ctr, key):
    """Philox-4×32-10 of each row of ``ctr`` (``(p, 4)`` uint32) under ``key`` (2 uint32);
    returns ``(p, 4)`` uint32.  For the known-answer tests."""
    out = np.empty(ctr.shape, dtype=np.uint32)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for p in range(ctr.shape[0]):
        x = _philox(
            np.uint64(ctr[p, 0]),
            np.uint64(ctr[p, 1]),
            np.uint64(ctr[p, 2]),
            np.uint64(ctr[p, 3]),
            k0,
            k1,
        )
        for i in range(4):
            out[p, i] = x[i]
    return out


@njit(cache=True, inline="always")
def _uniforms(r, seed, stream, u1, u2):
    """The uniforms ``u1`` in ``(0, 1]`` and ``u2`` in ``[0, 1)`` of the counters of row ``r``
    (module docstring); a loop of integer arithmetic only, which the compiler
    vectorizes.  O(d)."""
    k0, k1 = seed & _MASK, seed >> _S32
    rl, rh = np.uint64(r) & _MASK, np.uint64(r) >> _S32
    st = np.uint64(stream)
    for q in range(u1.shape[0]):
        x0, x1, x2, x3 = _philox(np.uint64(q), rl, rh, st, k0, k1)
        # below 2^53: exact through int64, whose conversion to float vectorizes
        w1 = np.int64((x0 >> np.uint64(5)) * np.uint64(67108864) + (x1 >> np.uint64(6)))
        w2 = np.int64((x2 >> np.uint64(5)) * np.uint64(67108864) + (x3 >> np.uint64(6)))
        u1[q] = (float(w1) + 1.0) * _INV53
        u2[q] = float(w2) * _INV53


@njit(cache=True, inline="always")
def _normal_row(r, seed, stream, out, u1, u2):
    """Row ``r`` of the Gaussian stream into ``out`` (length ``d``); ``u1``, ``u2``:
    scratch of length ``(d + 1) // 2``.  O(d)."""
    d = out.shape[0]
    _uniforms(r, seed, stream, u1, u2)
    half = d // 2
    for q in range(half):
        rad = math.sqrt(-2.0 * math.log(u1[q]))
        ang = _TWO_PI * u2[q]
        out[2 * q] = rad * math.cos(ang)
        out[2 * q + 1] = rad * math.sin(ang)
    if d % 2:
        out[d - 1] = math.sqrt(-2.0 * math.log(u1[half])) * math.cos(_TWO_PI * u2[half])


@njit(cache=True, parallel=True)
def _normal_rows(seed, start, rows, out, chunks):
    """``out[k] = W(0)[start + rows[k]]`` (``rows`` empty: ``start + k``), rows in
    ``chunks`` parallel runs with their own scratch.  O(rows · d)."""
    s = np.uint64(seed)
    nr = out.shape[0]
    half = (out.shape[1] + 1) // 2
    for c in prange(chunks):
        u1 = np.empty(half)
        u2 = np.empty(half)
        for k in range(c * nr // chunks, (c + 1) * nr // chunks):
            r = start + (rows[k] if rows.shape[0] else k)
            _normal_row(r, s, STREAM_W, out[k], u1, u2)


_NO_ROWS = np.zeros(0, dtype=np.int64)


def normal_rows(seed: int, start: int, out: np.ndarray) -> np.ndarray:
    """``out[k] = W(0)[start + k]`` of generator ``seed`` (C-contiguous float64 ``out``).
    O(rows · d), rows in parallel."""
    _normal_rows(np.uint64(seed), start, _NO_ROWS, out, _chunks(out.shape[0]))
    return out


def normal_take(seed: int, offset: int, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[k] = W(0)[offset + rows[k]]`` of generator ``seed``.  O(len(rows) · d)."""
    _normal_rows(np.uint64(seed), offset, rows, out, _chunks(out.shape[0]))
    return out


def _chunks(rows: int) -> int:
    return max(1, min(rows, 8 * numba.get_num_threads()))


@njit(cache=True, parallel=True)
def _sign_rows(seed, start, out):
    s = seed
    k0, k1 = s & _MASK, s >> _S32
    K = out.shape[1]
    st = np.uint64(STREAM_A)
    for k in prange(out.shape[0]):
        r = np.uint64(start + k)
        rl, rh = r & _MASK, r >> _S32
        for blk in range((K + 127) // 128):
            x = _philox(np.uint64(blk), rl, rh, st, k0, k1)
            for i in range(blk * 128, min(K, blk * 128 + 128)):
                bit = (x[(i % 128) // 32] >> np.uint64(i % 32)) & np.uint64(1)
                out[k, i] = 1.0 if bit else -1.0


def sign_rows(seed: int, start: int, out: np.ndarray) -> np.ndarray:
    """``out[k, i] = a[start + k, i]`` in {-1.0, +1.0} from stream 1.  O(rows · K)."""
    _sign_rows(np.uint64(seed), start, out)
    return out


# -- the same generator over an array library (numpy or torch), int64 arithmetic -----------
def _mulhilo(xp, m: int, x):
    """``(hi, lo)`` of the 64-bit product of the 32-bit constant ``m`` and the 32-bit
    values ``x`` (int64 arrays), by 16-bit halves so that no product overflows int64."""
    lo16 = x & 0xFFFF
    hi16 = x >> 16
    a = m * lo16  # < 2^48
    b = m * hi16  # < 2^48
    mid = a + ((b & 0xFFFF) << 16)  # < 2^49
    lo = mid & 0xFFFFFFFF
    hi = (b >> 16) + (mid >> 32)
    return hi, lo


def philox_array(xp, c0, c1, c2, c3, k0: int, k1: int):
    """Philox-4×32-10 over int64 arrays ``c0..c3`` (32-bit values) with the key
    ``(k0, k1)``: the twin of the numba kernel, for numpy and torch."""
    for _ in range(_ROUNDS):
        hi0, lo0 = _mulhilo(xp, int(_M0), c0)
        hi1, lo1 = _mulhilo(xp, int(_M1), c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + int(_W0)) & 0xFFFFFFFF
        k1 = (k1 + int(_W1)) & 0xFFFFFFFF
    return c0, c1, c2, c3


def _as_float64(a):
    """int64 array → float64, numpy or torch (exact: the values have at most 53 bits)."""
    return a.astype(np.float64) if isinstance(a, np.ndarray) else a.double()


def normals_array(xp, seed: int, rows, d: int, like=None):
    """``W(0)[rows]`` (``rows``: int64 array of the library ``xp``) as a float64 array
    of ``xp``, shape ``(len(rows), d)``: the transform of the module docstring over
    :func:`philox_array`.  ``like`` gives the device (torch) of new arrays."""
    kw = {} if like is None else {"device": like.device}
    q = xp.arange((d + 1) // 2, dtype=xp.int64, **kw)[None, :]
    r = rows.reshape(-1, 1)
    zero = q * 0 + r * 0
    x0, x1, x2, x3 = philox_array(
        xp,
        q + r * 0,
        (r & 0xFFFFFFFF) + zero,
        (r >> 32) + zero,
        zero + STREAM_W,
        seed & 0xFFFFFFFF,
        seed >> 32,
    )
    u1 = _as_float64((x0 >> 5) * 67108864 + (x1 >> 6) + 1) * _INV53
    u2 = _as_float64((x2 >> 5) * 67108864 + (x3 >> 6)) * _INV53
    rad = xp.sqrt(-2.0 * xp.log(u1))
    ang = _TWO_PI * u2
    out = xp.stack((rad * xp.cos(ang), rad * xp.sin(ang)), 2).reshape(r.shape[0], -1)
    return out[:, :d]
