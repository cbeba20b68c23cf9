"""The kernel trainer's deferred band: the set-up makes float64 values only where a pair
may fire, and before the first step either makes the band's too or drops the band,
whose neurons the first step then re-anchors (``BandState.settle_band``)."""

import numpy as np
import pytest
from test_lazy_kernel import _problem, _run, assert_same_trajectory

import corrtree as ct
from corrtree.training import _anchors
from corrtree.training._pool import BETA, CNT, SUPP

# stored float32 anchors: the set-up that defers its band
KEEP = {"anchor_dtype": "float32", "gemm_dtype": "float32"}


@pytest.mark.parametrize("drop", [True, False])
@pytest.mark.parametrize(
    "outputs, sgd",
    [(1, {}), (3, {}), (1, {"batch_size": 20, "momentum": 0.5})],
)
def test_a_dropped_or_settled_band_keeps_the_trajectory(drop, outputs, sgd):
    X, y, model0 = _problem(60, 1500, 16, outputs, 2)
    ref = _run(model0, X, y, "dense", iters=15, lr=0.5, **sgd)
    hist, W = _run(model0, X, y, "kernel", iters=15, lr=0.5, _drop_band=drop, **KEEP, **sgd)
    assert hist.info["band_dropped"] is drop
    if sgd:  # a step's counts are its batch's, which dense and kernel count apart
        ref_hist, ref_W = ref
        np.testing.assert_allclose(hist.loss, ref_hist.loss, rtol=1e-9)
        assert np.linalg.norm(W - ref_W) <= 1e-9 * np.linalg.norm(ref_W)
    else:
        assert_same_trajectory(hist, W, *ref)


def test_no_deferral_without_stored_float32_anchors():
    X, y, model0 = _problem(60, 1500, 16, 1, 2)
    hist, _ = _run(model0, X, y, "kernel", iters=2, anchor_dtype="float64", gemm_dtype="float32")
    assert "band_dropped" not in hist.info
    lazy, _ = _run(model0, X, y, "lazy", iters=2, **KEEP)
    assert "band_dropped" not in lazy.info


def _firing_neurons(model0, X):
    U = model0.W @ X.T
    return int(np.count_nonzero((U >= model0.b).any(axis=1)))


@pytest.mark.parametrize(
    "problem, ahead, dropped",
    [
        ((1000, 2000, 128, 1, 3), None, True),
        ((800, 3000, 64, 1, 5), None, False),
        ((1000, 2000, 64, 1, 3), None, False),
        ((1000, 2000, 64, 1, 3), 10.0, True),  # steps like it still to come
    ],
)
def test_the_first_step_judges_the_band(problem, ahead, dropped, monkeypatch):
    """The share of the sample that the first step would move past its band, with the
    look-ahead the step applies, is the share of the firing neurons a run that keeps the
    band re-anchors at that step; the band is dropped where it is nearly all of them."""
    if ahead is not None:  # as if the errors contracted fast (W4's data)
        from corrtree.training import kernel

        monkeypatch.setattr(kernel, "lookahead", lambda after, before: ahead)
    X, y, model0 = _problem(*problem)
    kept, _ = _run(model0, X, y, "kernel", iters=2, _drop_band=False, **KEEP)
    judged, _ = _run(model0, X, y, "kernel", iters=2, **KEEP)
    firing = _firing_neurons(model0, X)
    share = judged.info["first_step_reanchors"]
    assert share == pytest.approx(kept.reanchored[0] / firing, abs=0.1)
    assert judged.info["band_dropped"] is dropped
    if dropped:  # every firing neuron is re-anchored by the first step
        assert judged.reanchored[0] == firing
    assert judged.loss == pytest.approx(kept.loss, rel=1e-12)


def test_dropped_neurons_get_their_band_back_when_re_anchored():
    X, y, model0 = _problem(60, 1500, 16, 1, 2)
    model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
    from corrtree.training.kernel import KernelTrainer

    trainer = KernelTrainer(model, X, y[:, None], X @ X.T, 0.5, _drop_band=True, **KEEP)
    st = trainer.store
    firing = st.seg[:, SUPP] > 0
    assert (st.nf[firing, BETA] == 0.0).all()
    assert (st.seg[firing, CNT] == st.seg[firing, SUPP]).all()
    widths = _anchors.band_widths(st.seg[firing, SUPP], st.band, st.mean_fire)
    trainer.advance(trainer.loss.errors(trainer.u, trainer.Y))
    assert (st.nf[firing, BETA] == widths).all()


def test_a_dropped_band_without_a_zero_width_misses_crossings(monkeypatch):
    """Dropping the band but keeping the neurons' widths leaves pairs untracked that the
    certificate says are tracked: the trajectory check fails."""

    def drop_but_keep_widths(self, drop):
        rows = np.flatnonzero(self.pending)
        self.seg[rows, CNT] = self.seg[rows, SUPP]
        self.pending = None

    monkeypatch.setattr(_anchors.BandState, "settle_band", drop_but_keep_widths)
    X, y, model0 = _problem(60, 1500, 16, 1, 2)
    ref = _run(model0, X, y, "dense", iters=30, lr=0.5)
    hist, W = _run(model0, X, y, "kernel", iters=30, lr=0.5, _drop_band=True, **KEEP)
    with pytest.raises(AssertionError):
        assert_same_trajectory(hist, W, *ref)
