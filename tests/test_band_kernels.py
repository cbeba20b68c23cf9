"""Each kernel of the band trainers against its brute-force twin in ``naive.py``.

The state is real: a BandState built from random data, then given random
coefficients (``kappa``, firing flags, cumulative error ``E``), so the implicit
weights ``W = W0 - C X`` are far from ``W0`` and every kernel has work to do.
"""

import numba
import numpy as np
import pytest
from naive import (
    band_widths,
    coefficients,
    gershgorin_sigma,
    ntk,
    outputs_from_values,
    products,
    sparse_step,
)

from corrtree import _config
from corrtree.training import _outputs, _pairs
from corrtree.training._anchors import BandState, pair_dots, report_above
from corrtree.training._clocks import own_clocks
from corrtree.training._flips import apply_flips, apply_flips_by_rows, is_symmetric
from corrtree.training._pool import (
    BETA,
    CNT,
    DRIFT,
    MINKEY,
    NFIRE,
    SIGMA,
    SIGMA_UNKNOWN,
    START,
    SUPP,
)
from corrtree.training._principal import principal_parts
from corrtree.training._reanchor import reanchor
from corrtree.training._records import Drifts, EvalScalars, FlipRecord, RowResults, VisitScalars
from corrtree.training._sparse import keys_to_csr, stepped_rows
from corrtree.training._visit import rough_copy, visit_rows

BAND = 0.4


def _state(seed, n=30, m=60, d=6, K=2, gemm="float64", anchor="float64", unit=True):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    if not unit:
        X *= rng.uniform(0.5, 2.0, (n, 1))
    W0 = rng.standard_normal((m, d))
    a = rng.choice([-1.0, 1.0], size=(m, K))
    b = 0.6
    st = BandState(W0, X, X @ X.T, a, b, BAND, anchor, gemm)
    return st, rng


def _perturb(st, rng, scale=0.05):
    """Random coefficients on the ever-fired prefixes, and a random cumulative error."""
    pool = st.pool.arrays
    for r in range(st.m):
        s0, ns = st.seg[r, START], st.seg[r, SUPP]
        pool.kappa[s0 : s0 + ns] = scale * rng.standard_normal(ns)
    st.E[...] = scale * rng.standard_normal(st.E.shape)
    return 0.7  # eta_s


def _evaluate(st, r, scratch, eta_s, f_j, f_v, f_on, scatter=0.0):
    """:func:`_pairs.evaluate_neuron` with the exact step (no error given); values from
    ``G`` (``scatter=0``) or rebuilt from the data (a large ``scatter``).  ``R = 0``:
    no neuron is due for re-anchoring, so every due pair is evaluated."""
    sc = EvalScalars(eta_s=eta_s, b=st.b, R=0.0, cert=1.0, scatter=scatter)
    rec = FlipRecord(start=np.zeros(1, dtype=np.int64), j=f_j, value=f_v, on=f_on)
    return _pairs.evaluate_neuron(
        r, st.seg, st.nf, st.pool.arrays, scratch, st.a, st.E, np.empty((0, st.K)), st.G, st.X,
        st.xnorm, sc, np.empty(st.X.shape[1]), rec, 0,
    )  # fmt: skip


def _entries(st, r):
    s0, cnt = st.seg[r, START], st.seg[r, CNT]
    return st.pool.arrays.j[s0 : s0 + cnt]


def _values(st, r):
    s0, cnt = st.seg[r, START], st.seg[r, CNT]
    return zip(_entries(st, r).tolist(), st.pool.arrays.val[s0 : s0 + cnt].tolist(), strict=True)


def _fires(st, r, j):
    s0, cnt = st.seg[r, START], st.seg[r, CNT]
    return bool(st.pool.arrays.fire[s0 : s0 + cnt][_entries(st, r) == j][0])


@pytest.mark.parametrize(("gemm", "anchor"), [("float64", "float64"), ("float32", "float32")])
@pytest.mark.parametrize("exponent", [0.0, 0.5, 3.0])  # one band; sqrt; clipped to [β/2, 2β]
def test_anchors_hold_the_band_and_exact_values(gemm, anchor, exponent, monkeypatch):
    monkeypatch.setattr(_config, "BAND_FIRE_EXPONENT", exponent)
    st, _ = _state(0, gemm=gemm, anchor=anchor)
    U = products(st.X, st.W0)
    beta = band_widths(U, st.b, BAND, exponent)
    if exponent == 0:
        assert (beta == BAND).all()
    else:  # the widths differ, and the steep exponent reaches both clips
        assert beta.min() < beta.max()
        assert exponent < 1 or (beta.min() == BAND / 2 and beta.max() == 2 * BAND)
    np.testing.assert_allclose(st.nf[:, BETA], beta, rtol=1e-12)
    pool = st.pool.arrays
    for r in range(st.m):
        s0, cnt, supp = st.seg[r, START], st.seg[r, CNT], st.seg[r, SUPP]
        j = pool.j[s0 : s0 + cnt]
        assert sorted(j) == sorted(np.flatnonzero(U[r] >= st.b - beta[r]))
        np.testing.assert_allclose(pool.uref[s0 : s0 + cnt], U[r, j], rtol=0, atol=1e-13)
        assert sorted(j[:supp]) == sorted(np.flatnonzero(U[r] >= st.b))
        assert pool.fire[s0 : s0 + supp].all() and not pool.fire[s0 + supp : s0 + cnt].any()
        assert st.seg[r, NFIRE] == supp
        # no coefficient yet; each part in increasing order of j, unless the float64
        # values moved a pair across b (reorder_after_exact swaps it)
        assert gemm == "float32" or (
            (np.diff(j[:supp]) > 0).all() and (np.diff(j[supp:]) > 0).all()
        )
        for name in ("kappa", "cref", "clast"):
            assert not getattr(pool, name)[s0 : s0 + cnt].any()


def test_eval_ever_gives_current_products_and_distance():
    st, rng = _state(1)
    eta_s = _perturb(st, rng)
    C = coefficients(st.seg, st.pool.arrays, st.a, st.E, eta_s, st.m, st.n)
    W = st.W0 - C @ st.X
    U = products(st.X, W)
    scratch = np.empty((2, st.pool.capacity))
    pool = st.pool.arrays
    for r in range(st.m):
        since, _ = _pairs.eval_ever(r, st.seg, pool, scratch, st.a, st.E, st.G, eta_s, False)
        s0, ns = st.seg[r, START], st.seg[r, SUPP]
        j = pool.j[s0 : s0 + ns]
        np.testing.assert_allclose(pool.val[s0 : s0 + ns], U[r, j], rtol=0, atol=1e-12)
        dist = np.linalg.norm(W[r] - st.W0[r])
        assert dist <= since <= dist * (1 + 1e-9) + 1e-9


def test_eval_ever_from_the_data_gives_the_same_values_and_bounds():
    st, rng = _state(5)
    eta_s = _perturb(st, rng)
    C = coefficients(st.seg, st.pool.arrays, st.a, st.E, eta_s, st.m, st.n)
    W = st.W0 - C @ st.X
    U = products(st.X, W)
    scratch = np.empty((2, st.pool.capacity))
    pool = st.pool.arrays
    # a last evaluation at other coefficients, its values with it (as the pool keeps them)
    pool.clast[:] = 0.05 * rng.standard_normal(pool.clast.shape[0])
    clast = pool.clast.copy()
    dw = np.empty(st.X.shape[1])
    for r in range(st.m):
        s0, ns = st.seg[r, START], st.seg[r, SUPP]
        j = pool.j[s0 : s0 + ns]
        before = st.W0[r] - clast[s0 : s0 + ns] @ st.X[j]
        pool.val[s0 : s0 + ns] = st.X[j] @ before
        since, step = _pairs.eval_ever_data(
            r, st.seg, pool, scratch, st.a, st.E, st.X, st.xnorm, eta_s, dw, False
        )
        np.testing.assert_allclose(pool.val[s0 : s0 + ns], U[r, j], rtol=0, atol=1e-12)
        dist = np.linalg.norm(W[r] - st.W0[r])
        assert dist <= since <= dist * (1 + 1e-9) + 1e-9
        moved = np.linalg.norm(W[r] - before)
        assert moved <= step <= moved * (1 + 1e-9) + 1e-9
        np.testing.assert_allclose(pool.clast[s0 : s0 + ns], C[r, j], rtol=0, atol=1e-15)
    assert since > 0


@pytest.mark.parametrize("want_step", [False, True])
def test_the_data_step_follows_an_evaluation_from_g(want_step):
    """The data route reads the step from the values the last evaluation left, whichever
    route made them: after one from ``G`` (the lazy trainer's σ-bounded step, or an
    exact one), the next exact step is the distance moved since it."""
    st, rng = _state(6)
    eta_s = _perturb(st, rng)
    scratch = np.empty((2, st.pool.capacity))
    pool = st.pool.arrays
    dw = np.empty(st.X.shape[1])
    C1 = coefficients(st.seg, pool, st.a, st.E, eta_s, st.m, st.n)
    for r in range(st.m):
        _pairs.eval_ever(r, st.seg, pool, scratch, st.a, st.E, st.G, eta_s, want_step)
    st.E += 0.02 * rng.standard_normal(st.E.shape)  # the error of later steps
    C2 = coefficients(st.seg, pool, st.a, st.E, eta_s, st.m, st.n)
    moved = np.linalg.norm((C2 - C1) @ st.X, axis=1)
    for r in range(st.m):
        _, step = _pairs.eval_ever_data(
            r, st.seg, pool, scratch, st.a, st.E, st.X, st.xnorm, eta_s, dw, False
        )
        assert moved[r] <= step <= moved[r] * (1 + 1e-9) + 1e-9
    assert moved.max() > 0


def test_pair_dots_are_the_products_of_the_pairs():
    rng = np.random.default_rng(4)
    W, X = rng.standard_normal((10, 37)), rng.standard_normal((14, 37))
    # point j gets j pairs (none, fewer than a group of four, groups of eight and of
    # four and a remainder), in shuffled order, some neurons repeated
    xj = rng.permutation(np.repeat(np.arange(14), np.arange(14)))
    wi = rng.integers(0, 10, xj.shape[0])
    out = np.full(xj.shape[0], np.nan)
    pair_dots(W, wi, X, xj, out)
    np.testing.assert_allclose(out, np.einsum("pi,pi->p", W[wi], X[xj]), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_report_above_lists_the_points_at_or_above_in_order(dtype):
    rng = np.random.default_rng(5)
    row = rng.standard_normal(301).astype(dtype)
    row[[3, 77]] = dtype(0.25)  # at the threshold: reported
    for thr in (0.25, -np.inf, np.inf, float(row.max()), 1.5):
        want = np.flatnonzero(row >= thr)
        out = np.full(7 + row.shape[0], -1, dtype=np.int64)  # room for pos + n
        end = report_above(row, thr, out, 7)
        assert end == 7 + want.shape[0]
        np.testing.assert_array_equal(out[7:end], want)
        assert (out[:7] == -1).all()  # nothing before pos is touched


@pytest.mark.parametrize("K", [1, 3])
def test_coefficients_are_kappa_plus_the_summed_errors_while_firing(K):
    """``C_rl = κ_rl + η_s·<a_r, E_l>`` while (r, l) fires, else ``κ_rl``: both forms
    (:func:`_pairs.coef_eager` forms the dot product for every entry), bit for bit; an
    infinite ``E_l`` at a point where no pair fires reaches no coefficient."""
    st, rng = _state(8, K=K)
    eta_s = _perturb(st, rng)
    pool = st.pool.arrays
    fire = pool.fire.copy()
    quiet = pool.j[st.seg[0, START]]  # no pair fires at this point; E there is infinite
    fire[pool.j == quiet] = False
    st.E[quiet] = np.inf
    seen = [0, 0]
    for r in range(st.m):
        s0, ns = st.seg[r, START], st.seg[r, SUPP]
        for q in range(s0, s0 + ns):
            j = int(pool.j[q])
            want = pool.kappa[q]
            if fire[q]:
                dot = 0.0
                for k in range(K):  # dot_row's order
                    dot += st.a[r, k] * st.E[j, k]
                want += eta_s * dot
            for f in (_pairs.coef, _pairs.coef_eager):
                assert f(q, r, pool.kappa, fire, pool.j, st.a, st.E, eta_s) == want
            seen[bool(fire[q])] += 1
    assert min(seen) > 10 and np.isfinite(st.E).sum() < st.E.size


def test_gram_sum_is_the_gram_weighted_sum():
    rng = np.random.default_rng(2)
    G = rng.standard_normal((9, 9))
    ej = rng.integers(0, 9, 7).astype(np.int32)
    dc = rng.standard_normal(7)
    for ns in range(8):
        want = sum(dc[p] * G[3, ej[p]] for p in range(ns))
        assert _pairs.gram_sum(G, 3, ej, dc, 0, ns) == pytest.approx(want, abs=1e-12)


def test_move_norm_bounds_the_norm_of_the_formed_move():
    """From the move formed in floating point, a bound on the exact ``||Σ dc_l x_l||``
    within rounding of it: for random moves, and for moves that nearly cancel (the same
    point twice, coefficients ``c`` and ``-c(1 + δ)``: the exact norm is ``|c + c'|·||x||``,
    with ``c + c'`` exact, and the formed one errs by far more than it)."""
    rng = np.random.default_rng(8)
    X = rng.standard_normal((30, 17))
    xmax = np.linalg.norm(X, axis=1).max()
    dw = np.empty(17)
    for ns in (0, 1, 5, 30):
        ej = rng.permutation(30)[:ns].astype(np.int32)
        dc = rng.standard_normal(ns)
        _pairs.form_move(dw, X, ej, dc, 0, ns)
        true = float(np.linalg.norm(dc @ X[ej])) if ns else 0.0
        bound = _pairs.move_norm(dw, float(np.abs(dc).sum()), xmax, ns)
        assert true * (1 - 1e-12) <= bound <= true * (1 + 1e-9) + 1e-12
    ej = np.array([3, 3], dtype=np.int32)
    for _ in range(200):
        c = rng.uniform(1.0, 2.0) * 1e6
        dc = np.array([c, -c * (1.0 + 1e-13 * rng.uniform(0.5, 1.0))])
        _pairs.form_move(dw, X, ej, dc, 0, 2)
        true = abs(dc[0] + dc[1]) * float(np.linalg.norm(X[3]))
        l1 = float(np.abs(dc).sum())
        bound = _pairs.move_norm(dw, l1, xmax, 2)
        assert true <= bound <= true + 1e-6 * l1 * xmax


def test_gram_block_is_the_gram_weighted_sum_of_each_point():
    """Every prefix length (the passes of four rows and the rest), a prefix that starts
    inside the pool, and a G that is not symmetric: row ``ej[p]``, column ``js[t]``."""
    rng = np.random.default_rng(3)
    G = rng.standard_normal((12, 12))
    ej = rng.integers(0, 12, 13).astype(np.int32)
    dc = rng.standard_normal(10)
    js = rng.integers(0, 12, 6)
    for ns in range(11):
        acc = np.full(8, np.nan)  # stale values: only the first count are written
        _pairs.gram_block(G, ej, dc, 3, ns, js, 5, acc)
        want = G[ej[3 : 3 + ns]][:, js[:5]].T @ dc[:ns]
        np.testing.assert_allclose(acc[:5], want, rtol=1e-13, atol=1e-13)
        assert np.isnan(acc[5:]).all()


def test_sigma_is_a_gershgorin_bound_of_the_fire_set():
    st, _ = _state(3)
    pool = st.pool.arrays
    for r in range(st.m):
        s0, ns = st.seg[r, START], st.seg[r, SUPP]
        S = pool.j[s0 : s0 + ns][pool.fire[s0 : s0 + ns]]
        sig = _pairs.sigma(r, st.seg, pool, st.G)
        assert sig == pytest.approx(gershgorin_sigma(st.G, S), rel=1e-12)
        trace = _pairs.trace_sigma(r, st.seg, pool, st.xnorm)
        assert trace**2 == pytest.approx(np.trace(st.G[np.ix_(S, S)]), rel=1e-12, abs=1e-300)
        if len(S):
            top = np.linalg.eigvalsh(st.G[np.ix_(S, S)]).max()
            assert sig**2 >= top - 1e-12 and trace**2 >= top - 1e-12


@pytest.mark.parametrize("scatter", [0.0, 1e9])  # values from G, or from the data
def test_evaluate_neuron_flips_exactly_the_crossed_pairs(scatter):
    st, rng = _state(4)
    eta_s = _perturb(st, rng, scale=0.2)
    C = coefficients(st.seg, st.pool.arrays, st.a, st.E, eta_s, st.m, st.n)
    U = products(st.X, st.W0 - C @ st.X)
    st.nf[:, MINKEY] = 0.0  # every tracked pair is due
    scratch = np.empty((2, st.pool.capacity))
    none = np.empty(0, dtype=np.int64)
    total = 0
    for r in range(st.m):
        pos, _, _ = _evaluate(
            st, r, scratch, eta_s, none, np.empty(0), np.empty(0, np.bool_), scatter
        )
        total += pos
        j = _entries(st, r)
        s0, cnt = st.seg[r, START], st.seg[r, CNT]
        fire = st.pool.arrays.fire[s0 : s0 + cnt]
        np.testing.assert_array_equal(fire, U[r, j] >= st.b)
    assert total > 0  # the coefficients moved some pairs across b


@numba.njit
def _hint_every_segment(rows, seg, pool, G):
    for r in rows:
        _pairs.prefetch_segment(r, seg, pool, True)
        _pairs.prefetch_block(r, seg, pool.j, G)


def test_prefetch_hints_change_nothing_even_past_the_arrays_end():
    """The hints of the trainers' evaluations (the next neuron's entries of the pool,
    its reads of G) leave every array as it was, also where a hint's last cache line
    lies past an array's end (the pool cut where the last segment ends)."""
    st, rng = _state(3)
    _perturb(st, rng)
    last = st.seg[:, START] + st.seg[:, CNT]
    cut = type(st.pool.arrays)(*(f[: int(last.max())] for f in st.pool.arrays))
    before = [f.copy() for f in cut]
    _hint_every_segment(np.arange(st.m)[::-1], st.seg, cut, st.G)
    for f, g in zip(cut, before, strict=True):
        np.testing.assert_array_equal(f, g)


def _visit(st, rows, eta_s, parts, anchor_drift, res_drift, full, gram_cost, scatter):
    """:func:`visit_rows` on ``rows`` with flip records; ``R = 1``, ``P = 0``."""
    X32, x32_err = rough_copy(st.X)
    n = rows.shape[0]
    fbuf = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(st.seg[rows, CNT], out=fbuf[1:])
    f_j = np.zeros(fbuf[-1], dtype=np.int32)
    f_v, f_on = np.zeros(fbuf[-1]), np.zeros(fbuf[-1], dtype=np.bool_)
    nflips, nevals = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    again = np.zeros(n, dtype=np.bool_)
    sc = VisitScalars(
        eta_s=eta_s, b=st.b, R=1.0, cert=1.0, scatter=scatter, gram_cost=gram_cost,
        full=full, ahead=0.0, P=0.0, per_p=0.4, x32_err=x32_err,
    )  # fmt: skip
    visit_rows(
        rows, st.seg, st.nf, st.pool.arrays, st.a, st.E, st.G, st.X, X32, st.xnorm, parts, sc,
        Drifts(anchor=anchor_drift, residual=res_drift),
        FlipRecord(start=fbuf, j=f_j, value=f_v, on=f_on),
        RowResults(nflips=nflips, nevals=nevals, again=again),
    )  # fmt: skip
    return nflips, nevals, again


@pytest.mark.parametrize("gram_cost", [0.0, 1e9])  # due values from G, or from the data
# the ever-fired values and exact steps from G, or from the data (a visit whose values are
# mostly due then forms its move and evaluates the due ones only, while they cost less)
@pytest.mark.parametrize("scatter", [0.0, 1e9])
# the move bound's principal part: partial, exact, none (every direction within the gain)
@pytest.mark.parametrize(("rank", "gain"), [(1, 1.0), (6, 1.0), (3, 1e9)])
def test_visit_finds_every_crossing_and_evaluates_fewer(gram_cost, scatter, rank, gain):
    """After each small step, a visit leaves every tracked pair's fire flag equal to the
    brute-force ``U >= b``, with exact values where it evaluated, a drift that grew by
    at least the neuron's true move, and fewer values computed than there are entries:
    with every direction principal, the screen leaves about the flips to evaluate."""
    st, rng = _state(11, n=40, m=80)
    eta_s = _perturb(st, rng, scale=0.2)
    st.nf[:, BETA] = 1e9  # no re-anchoring: every crossing is the visit's to find
    pool = st.pool.arrays
    rows = np.arange(st.m)
    anchor_drift, res_drift = np.zeros(st.m), np.zeros(st.m)
    parts = principal_parts(st.X, st.G, rank, gain)
    assert parts[0].shape[1] == (0 if gain > 1 else rank)
    _visit(st, rows, eta_s, parts, anchor_drift, res_drift, True, gram_cost, scatter)  # all current
    flips = evaluated = 0
    for _ in range(12):
        C0 = coefficients(st.seg, pool, st.a, st.E, eta_s, st.m, st.n)
        st.E += 0.02 * rng.standard_normal(st.E.shape)  # a step: fire sets constant
        C = coefficients(st.seg, pool, st.a, st.E, eta_s, st.m, st.n)
        true = np.linalg.norm((C - C0) @ st.X, axis=1)
        U = products(st.X, st.W0 - C @ st.X)
        drift0 = st.nf[:, DRIFT].copy()
        before = {(r, j): v for r in rows for j, v in _values(st, r)}
        step = _visit(st, rows, eta_s, parts, anchor_drift, res_drift, False, gram_cost, scatter)
        nflips, nevals, again = step
        assert not again.any()
        assert (st.nf[:, DRIFT] - drift0 >= true * (1 - 1e-9)).all()
        Cref = np.zeros_like(C)
        for r in rows:
            s0, ns = st.seg[r, START], st.seg[r, SUPP]
            Cref[r, pool.j[s0 : s0 + ns]] = pool.cref[s0 : s0 + ns]
        # D_r - anchor_drift[r] bounds the distance from the anchor (moves formed from X's
        # float32 copy included: their norms carry its error)
        since = np.linalg.norm((C - Cref) @ st.X, axis=1)
        assert (st.nf[:, DRIFT] - anchor_drift >= since * (1 - 1e-12)).all()
        if parts[0].shape[1]:  # the screen's residual drift bounds the residual move
            dc, Z, delta = C - Cref, parts[0], parts[5]
            quad = np.einsum("ri,ij,rj->r", dc, st.G - Z @ Z.T, dc) + delta * (dc * dc).sum(1)
            assert (np.sqrt(np.maximum(quad, 0.0)) <= res_drift * (1 + 1e-12)).all()
        for r in rows:
            s0, cnt = st.seg[r, START], st.seg[r, CNT]
            j = pool.j[s0 : s0 + cnt]
            np.testing.assert_array_equal(pool.fire[s0 : s0 + cnt], U[r, j] >= st.b)
            for jj, v in _values(st, r):  # where a value changed, it is the current one
                if v != before[r, jj]:
                    assert abs(v - U[r, jj]) <= 1e-9
        flips += int(nflips.sum())
        evaluated += int(nevals.sum())
    assert flips > 0  # the steps moved some pairs across b
    assert evaluated < 12 * int(st.seg[:, CNT].sum())  # keys spared some values
    if parts[0].shape[1] == st.X.shape[1]:  # no residual: the screen evaluates the flips
        assert evaluated < 2 * flips


@pytest.mark.parametrize(("n", "d"), [(40, 12), (10, 30)])  # from XᵀX; from G
def test_principal_parts_bound_every_combination(n, d):
    """``||Σ c_l x_l|| <= ||Σ c_l z_l|| + min(ρ, ||residuals||)·||c||`` for random subsets
    and coefficients, ``ρ`` at least the (k+1)-th singular value (from numpy's SVD)."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((n, d)) @ np.diag(np.linspace(3.0, 0.1, d))  # decaying spectrum
    G = X @ X.T
    s = np.linalg.svd(X, compute_uv=False)
    k = 4
    Z, resid, rho, *_ = principal_parts(X, G, k, 1.0)
    assert Z.shape == (n, k) and rho >= s[k] and rho <= s[k] * 1.001 + 1e-6
    np.testing.assert_allclose(np.linalg.norm(Z, axis=0), s[:k], rtol=1e-9)
    # no directions when ||X||_2 is within the gain of the rank-k ρ
    Z, *_ = principal_parts(X, G, k, 0.99 * s[0] / s[k])
    assert Z.shape == (n, k)
    Z, resid, rho, *_ = principal_parts(X, G, k, 1.01 * s[0] / s[k])
    assert Z.shape == (n, 0) and rho >= s[0] and rho <= s[0] * 1.001 + 1e-6
    for _ in range(50):
        S = rng.random(n) < 0.5
        c = rng.standard_normal(S.sum())
        lhs = np.linalg.norm(c @ X[S])
        res = min(rho, np.sqrt((resid[S] ** 2).sum()))
        assert lhs <= np.linalg.norm(c @ Z[S]) + res * np.linalg.norm(c) + 1e-12


@pytest.mark.parametrize("move", [False, True])
@pytest.mark.parametrize("K", [1, 3])
def test_own_clocks_bound_each_step_and_mark_the_due(K, move):
    """A neuron's own clock grows by at least its true step, ``eta_s·||Σ_S <a_r, err_l>
    x_l||`` (and by no more than the smaller of ``σ_r·||e_S||``, where ``σ_r`` is known,
    and ``Σ_S |e_l|·||x_l||``, and with ``move`` the true step with its rounding, below
    the other two for most neurons); a neuron that fires nowhere keeps its clock; a
    neuron is due exactly when its clock reaches its smallest key or its band, always
    with an infinite clock."""
    st, rng = _state(4, n=36, m=90, d=5, K=K, unit=False)
    pool, nf, seg = st.pool.arrays, st.nf, st.seg
    for r in range(0, st.m, 7):  # some neurons fire nowhere
        s0 = seg[r, START]
        pool.fire[s0 : s0 + seg[r, SUPP]] = False
        seg[r, NFIRE] = 0
    fires = [
        pool.j[seg[r, START] : seg[r, START] + seg[r, SUPP]][
            pool.fire[seg[r, START] : seg[r, START] + seg[r, SUPP]]
        ]
        for r in range(st.m)
    ]
    sig = np.array([gershgorin_sigma(st.G, f) for f in fires])
    known = rng.random(st.m) < 0.5
    nf[:, SIGMA] = np.where(known, sig, SIGMA_UNKNOWN)
    nf[:, MINKEY] = rng.uniform(0.0, 0.3, st.m)
    nf[:, BETA] = rng.uniform(0.0, 0.5, st.m)
    anchor_drift = rng.uniform(0.0, 0.2, st.m)
    clock = rng.uniform(0.0, 0.2, st.m)
    clock[5] = np.inf
    err = 0.1 * rng.standard_normal((st.n, K))
    eta_s, cert = 0.3, 1.5
    before = clock.copy()
    due = np.zeros(st.m, dtype=np.bool_)
    sc = VisitScalars(
        eta_s=eta_s, b=st.b, R=st.R, cert=cert, scatter=0.0, gram_cost=0.0, full=False,
        ahead=0.0, P=0.0, per_p=0.0, x32_err=np.inf,
    )  # fmt: skip
    own_clocks(seg, nf, pool, st.a, err, st.xnorm, sc, anchor_drift, clock, due, st.X, move)
    tighter = 0
    for r in range(st.m):
        e = err[fires[r]] @ st.a[r]
        true = eta_s * np.linalg.norm(e @ st.X[fires[r]])
        bound = np.sum(np.abs(e) * st.xnorm[fires[r]])
        if known[r]:
            bound = min(bound, sig[r] * np.linalg.norm(e))
        if move:
            tighter += eta_s * bound > true * (1 + 1e-6)
            bound = min(bound, true / eta_s * (1 + 1e-9) + 1e-12 * bound)
        if np.isfinite(before[r]):
            grew = clock[r] - before[r]
            assert cert * true * (1 - 1e-12) <= grew <= cert * eta_s * bound * (1 + 1e-9) + 1e-300
        if not len(fires[r]):
            assert clock[r] == before[r]
        limit = min(nf[r, MINKEY], anchor_drift[r] + nf[r, BETA] / st.R)
        assert due[r] == (clock[r] >= limit)
    assert due[5] and 0 < due.sum() < st.m
    assert not move or tighter > st.m // 2


@pytest.mark.parametrize(("n", "d"), [(40, 12), (10, 30), (30, 4)])  # XᵀX; G; no residual
def test_principal_parts_screen_bounds_every_gram_sum(n, d):
    """``G - Z Zᵀ + δI`` is positive semidefinite (numpy's eigenvalues), and for random
    coefficients ``|cᵀ G e_j - <Zᵀc, z_j>| <= min(ρ_g, sqrt(Σ g_l²))·||c||·g_j + δ·||c||_1``,
    the bound :func:`visit`'s screen relies on, with ``g`` and ``ρ_g`` close to the exact
    residual norms and ``λ_{k+1}``."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((n, d)) @ np.diag(np.linspace(3.0, 0.1, d))
    G = X @ X.T
    k = min(4, d)
    Z, _, _, g, rho_g, delta = principal_parts(X, G, k, 1.0)
    res = G - Z @ Z.T
    assert np.linalg.eigvalsh(res).min() >= -delta
    assert 0 < delta < 1e-9 * np.linalg.norm(G, 2)
    lam = np.linalg.eigvalsh(X.T @ X)[::-1]
    rest = lam[k] if k < d else 0.0
    np.testing.assert_allclose(rho_g, np.sqrt(rest), rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(g, np.sqrt(np.maximum(np.diag(res), 0)), rtol=1e-6, atol=1e-4)
    worst = 0.0
    for _ in range(200):
        S = rng.random(n) < 0.5
        c = np.where(S, rng.standard_normal(n), 0.0)
        j = int(rng.integers(n))
        lhs = abs(c @ G[:, j] - (c @ Z) @ Z[j])
        rhs = min(rho_g, np.sqrt((g[S] ** 2).sum())) * np.linalg.norm(c) * g[j]
        rhs += delta * np.abs(c).sum()
        assert lhs <= rhs
        worst = max(worst, lhs / rhs)
    assert worst > 0.1 or k == d  # the bound is not vacuous


def test_weights_forward_and_firing_csr_against_brute_force():
    st, rng = _state(5)
    eta_s = _perturb(st, rng)
    C = coefficients(st.seg, st.pool.arrays, st.a, st.E, eta_s, st.m, st.n)
    np.testing.assert_allclose(st.weights(0, st.m, eta_s), st.W0 - C @ st.X, atol=1e-13)
    np.testing.assert_allclose(st.weights(7, 19, eta_s), (st.W0 - C @ st.X)[7:19], atol=1e-13)
    pool = st.pool.arrays
    firing = [
        (r, pool.j[q], pool.val[q])
        for r in range(st.m)
        for q in range(st.seg[r, START], st.seg[r, START] + st.seg[r, SUPP])
        if pool.fire[q]
    ]
    u = _outputs.forward(np.arange(st.m), st.seg, pool, st.a, st.b, 1 / np.sqrt(st.m), st.n)
    want_u = outputs_from_values(firing, st.a, st.b, st.n, st.m)
    np.testing.assert_allclose(u, want_u, atol=1e-13)
    # the lazy trainer's way: shares of two sets of neurons in fixed chunks, summed
    first, rest = np.arange(0, st.m, 2), np.arange(1, st.m, 2)
    parts = _outputs.firing_sums(first, st.seg, pool, st.a, st.b, st.n)
    more = _outputs.firing_sums(rest, st.seg, pool, st.a, st.b, st.n)
    assert parts.shape == (min(first.shape[0], 64), st.n, st.a.shape[1])
    u2 = _outputs.sum_parts(parts, more, 1 / np.sqrt(st.m))
    np.testing.assert_allclose(u2, want_u, atol=1e-13)
    none = _outputs.firing_sums(first[:0], st.seg, pool, st.a, st.b, st.n)
    assert none.shape[0] == 1 and not none.any()
    indptr, idx = st.firing_csr()
    keys = np.sort([r * st.n + j for r, j, _ in firing]).astype(np.int64)
    want = keys_to_csr(keys, st.m, st.n)
    np.testing.assert_array_equal(indptr, want[0])
    np.testing.assert_array_equal(idx, want[1])


@pytest.mark.parametrize(
    ("gemm", "anchor", "gain", "safe"),
    [
        ("float64", "float64", 0.0, 1e26),  # every row from its float64 anchor (Gram identity)
        ("float64", "float64", 1e9, 1e26),  # every row that moved: w_r(t)·Xᵀ
        ("float32", "float32", 0.0, 1e26),  # float32 anchors: w_r(t)·Xᵀ in float32
        ("float32", "float32", 0.0, 0.0),  # as if float32 could overflow: in float64
    ],
)
@pytest.mark.parametrize("block_bytes", [64 * 2**20, 1])  # one block, or a row per block
@pytest.mark.parametrize("m", [60, 600])  # 200 rows in one block: rebuilt in parallel runs
def test_reanchor_recomputes_rows_and_bands(gemm, anchor, gain, safe, block_bytes, m, monkeypatch):
    monkeypatch.setattr(_config, "FLOAT32_SAFE_ERROR", safe)
    monkeypatch.setattr(_config, "REANCHOR_GEMM_GAIN", gain)
    monkeypatch.setattr(_config, "REANCHOR_BLOCK_BYTES", block_bytes)
    st, rng = _state(6, m=m, gemm=gemm, anchor=anchor)
    eta_s = _perturb(st, rng, scale=0.2)
    C = coefficients(st.seg, st.pool.arrays, st.a, st.E, eta_s, st.m, st.n)
    U = products(st.X, st.W0 - C @ st.X)
    ever = {r: set(_entries(st, r)[: st.seg[r, SUPP]]) for r in range(st.m)}
    beta = st.nf[:, BETA].copy()
    assert beta.min() < beta.max()  # each neuron keeps its own band
    rows = np.arange(0, st.m, 3, dtype=np.int64)
    fired = {(r, j) for r in rows for j in _entries(st, r).tolist() if _fires(st, r, j)}
    crossed = [(r, j) for r in rows for j in range(st.n) if ((r, j) in fired) != (U[r, j] >= st.b)]
    assert crossed  # the stale flags disagree somewhere: the rebuild must flip them
    fr, fj, fv, fo = reanchor(st, rows, eta_s)
    assert sorted(zip(fr.tolist(), fj.tolist(), strict=True)) == sorted(crossed)
    assert (np.diff(fr) >= 0).all()  # in the order of rows
    np.testing.assert_array_equal(fo, U[fr, fj] >= st.b)
    np.testing.assert_allclose(fv, U[fr, fj], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(st.nf[:, BETA], beta)
    pool = st.pool.arrays
    for r in rows:
        s0, cnt = st.seg[r, START], st.seg[r, CNT]
        j = pool.j[s0 : s0 + cnt]
        assert set(j) == ever[r] | set(np.flatnonzero(U[r] >= st.b - beta[r]))
        np.testing.assert_allclose(pool.uref[s0 : s0 + cnt], U[r, j], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(pool.fire[s0 : s0 + cnt], U[r, j] >= st.b)
        if anchor == "float64":  # kept for the Gram identity; float32 rows are not kept
            np.testing.assert_allclose(st.V[r], U[r], rtol=0, atol=1e-12)
    assert (st.V is None) == (anchor == "float32")
    # the implicit weights did not change
    C2 = coefficients(st.seg, st.pool.arrays, st.a, st.E, eta_s, st.m, st.n)
    np.testing.assert_allclose(C2, C, atol=1e-14)


def _fire_matrix(st):
    F = np.zeros((st.m, st.n), dtype=bool)
    indptr, idx = st.firing_csr()
    for r in range(st.m):
        F[r, idx[indptr[r] : indptr[r + 1]]] = True
    return F


def _flips(st, rng):
    """Every neuron evaluated after a large random move: the flips (grouped by neuron,
    applied to the pool) and the NTK of the fire sets before them."""
    H = ntk(_fire_matrix(st), st.G, st.a)
    eta_s = _perturb(st, rng, scale=0.3)
    scratch = np.empty((2, st.pool.capacity))
    fr, fj, fv, fo = [], [], [], []
    st.nf[:, MINKEY] = 0.0
    for r in range(st.m):
        cap = st.seg[r, CNT]
        f_j, f_v, f_on = np.empty(cap, np.int64), np.empty(cap), np.empty(cap, np.bool_)
        pos, _, _ = _evaluate(st, r, scratch, eta_s, f_j, f_v, f_on)
        fr += [r] * pos
        fj += list(f_j[:pos])
        fv += list(f_v[:pos])
        fo += list(f_on[:pos])
    flips = (np.array(fr, np.int64), np.array(fj, np.int64), np.array(fv), np.array(fo, np.bool_))
    return flips, H


def test_apply_flips_keeps_h_the_ntk_of_the_fire_sets(monkeypatch):
    st, rng = _state(7)
    flips, H = _flips(st, rng)
    fr, fj, fv, fo = flips
    assert len(fr) > 0
    u = np.zeros((st.n, st.K))
    # the same additions in the same order on one thread as on two, and on the calling
    # thread (few flips): equal bits
    H1, u1, H0, u0 = H.copy(), u.copy(), H.copy(), u.copy()
    args = (st.a, st.G, st.b, 1 / np.sqrt(st.m), float(st.m))
    monkeypatch.setattr(_config, "SERIAL_WORK", 0)  # the parallel kernel
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one = apply_flips(*flips, st.seg, st.pool.arrays, u1, H1, *args)
    finally:
        numba.set_num_threads(threads)
    many = apply_flips(*flips, st.seg, st.pool.arrays, u, H, *args)
    monkeypatch.setattr(_config, "SERIAL_WORK", len(fr) + 1)  # on the calling thread
    serial = apply_flips(*flips, st.seg, st.pool.arrays, u0, H0, *args)
    assert one == many == serial
    np.testing.assert_array_equal(H, H1)
    np.testing.assert_array_equal(H, H0)
    np.testing.assert_array_equal(H, H.T)
    np.testing.assert_array_equal(u, u1)
    np.testing.assert_array_equal(u, u0)
    np.testing.assert_allclose(H, ntk(_fire_matrix(st), st.G, st.a), atol=1e-12)
    sign = np.where(fo, 1.0, -1.0)
    want = outputs_from_values(
        zip(fr, fj, sign * (fv - st.b) + st.b, strict=True), st.a, st.b, st.n, st.m
    )
    np.testing.assert_allclose(u, want, atol=1e-12)


@pytest.mark.parametrize("K", [1, 3])
def test_apply_flips_by_rows_equals_the_writes_in_place(monkeypatch, K):
    st, rng = _state(11, K=K)
    flips, H = _flips(st, rng)
    fr, fj, _, fo = flips
    assert len(fr) > 0 and (np.diff(fr) == 0).any() and not fo.all()  # a neuron flips twice
    monkeypatch.setattr(_config, "FLIP_TILE", 8)  # several tiles, the last ones partial
    args = (st.a, st.G, st.b, 1 / np.sqrt(st.m), float(st.m))
    points = np.unique(fj)
    runs = []
    for threads in (1, numba.get_num_threads()):
        Hr, ur, T = H.copy(), np.zeros((st.n, K)), np.zeros_like(H)
        saved = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            counts = apply_flips_by_rows(*flips, st.seg, st.pool.arrays, ur, Hr, T, *args, points)
        finally:
            numba.set_num_threads(saved)
        assert not T.any()  # the scratch is zero again
        runs.append((counts, Hr, ur))
    (counts, Hr, ur), (counts2, Hr2, ur2) = runs
    np.testing.assert_array_equal(Hr, Hr2)  # whatever the number of threads
    np.testing.assert_array_equal(ur, ur2)
    np.testing.assert_array_equal(Hr, Hr.T)
    H0, u0 = H.copy(), np.zeros((st.n, K))
    assert counts == counts2 == apply_flips(*flips, st.seg, st.pool.arrays, u0, H0, *args)
    np.testing.assert_allclose(Hr, H0, rtol=0, atol=1e-13)
    np.testing.assert_allclose(Hr, ntk(_fire_matrix(st), st.G, st.a), rtol=0, atol=1e-12)
    np.testing.assert_allclose(ur, u0, rtol=0, atol=1e-13)


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 130])
def test_is_symmetric_is_array_equal_with_the_transpose(n):
    rng = np.random.default_rng(n)
    X = rng.standard_normal((n, 5))
    G = X @ X.T  # symmetric to the bit
    assert is_symmetric(G) and np.array_equal(G, G.T)
    cells = [(n - 1, 0), (0, n - 1), (n // 2, n // 3), (n - 1, n - 1)] + [
        tuple(rng.integers(0, n, 2)) for _ in range(10)
    ]
    for i, j in cells:  # one value a bit off, or NaN (unequal to itself)
        for bad in (np.nextafter(G[i, j], np.inf), np.nan):
            H = G.copy()
            H[i, j] = bad
            assert is_symmetric(H) == np.array_equal(H, H.T), (i, j, bad)


def test_stepped_rows_is_the_sparse_gradient_step():
    rng = np.random.default_rng(8)
    m, n, d, K = 40, 25, 7, 3
    W, X = rng.standard_normal((m, d)), rng.standard_normal((n, d))
    a, err = rng.choice([-1.0, 1.0], (m, K)), rng.standard_normal((n, K))
    F = rng.random((m, n)) < 0.2
    indptr, idx = keys_to_csr(np.flatnonzero(F), m, n)
    rows = np.flatnonzero(F.any(axis=1)).astype(np.int64)
    got = stepped_rows(W[rows], rows, indptr, idx, X, a, err, 0.3)
    np.testing.assert_allclose(got, sparse_step(W, F, X, a, err, 0.3)[rows], atol=1e-13)


def test_rough_copy_bounds_its_rows():
    """The float32 copy's error bound holds for every row (values float32 rounds, its
    subnormals, zeros) and is tight; data float32 cannot hold gives no copy."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((50, 7)) * np.logspace(-42, 30, 50)[:, None]
    X[3] = 0.0
    X32, err = rough_copy(X)
    assert X32.dtype == np.float32 and X32.shape == X.shape
    gaps = np.linalg.norm(X32.astype(np.float64) - X, axis=1)
    assert (gaps <= err).all() and err <= 1.01 * gaps.max() + 1e-290
    X[7, 2] = 1e39  # beyond float32's range
    X32, err = rough_copy(X)
    assert X32.shape == (0, 7) and err == np.inf


def test_due_dots_are_the_points_products_with_the_move():
    """Every count (the passes of four points and the rest); only the first ``count``
    entries of ``out`` are written."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((9, 13))
    w = rng.standard_normal(13)
    js = rng.integers(0, 9, 7)
    for count in range(8):
        out = np.full(8, np.nan)
        _pairs.due_dots(X, js, count, w, out)
        np.testing.assert_allclose(out[:count], X[js[:count]] @ w, rtol=1e-13, atol=1e-13)
        assert np.isnan(out[count:]).all()
