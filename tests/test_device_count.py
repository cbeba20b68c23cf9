"""The device path's counter and its H200 model (``corrtree.bench.device_count``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import corrtree as ct  # noqa: E402
from corrtree.bench import device_count as dc  # noqa: E402


def test_counter_counts_launches_syncs_and_work_exactly():
    A = torch.ones((8, 5), dtype=torch.float64)
    B = torch.ones((5, 3), dtype=torch.float64)
    with dc.OpCounter() as counter:
        C = A @ B  # one launch: 2·8·3·5 flops
        V = C.reshape(-1)[1:]  # views: nothing (C.T.reshape would copy: a launch)
        total = float(V.sum()) + 5.0  # a launch and a scalar read
        mask = A[:, 0] > 0  # a launch
        rows = A[mask]  # boolean indexing: a launch and a synchronization
        picked = A[torch.as_tensor(np.array([0, 2]))]  # an upload, then a gather of 10
        host = C.numpy()  # a download
    c = counter.counts
    assert total == 120.0 and rows.shape == (8, 5) and picked.shape == (2, 5)
    assert host.shape == (8, 3)
    assert c.flops64 == 2 * 8 * 3 * 5 and c.flops32 == 0
    assert c.syncs == 3  # the scalar read, the boolean index, the download
    assert c.uploads == 1 and c.upload_bytes == 16
    assert c.gathers == 8 * 5 + 2 * 5  # the masked rows and the picked ones
    assert c.launches == 1 + 1 + 1 + 1 + 1 + 1 + 1  # mm, sum, gt, index, upload, index, numpy
    assert dc.modelled_seconds(c) > 7 * dc.H200["launch_s"] + 4 * dc.H200["sync_s"]


def test_counter_restores_what_it_wraps():
    numpy, as_tensor = torch.Tensor.numpy, torch.as_tensor
    with dc.OpCounter():
        pass
    assert torch.Tensor.numpy is numpy and torch.as_tensor is as_tensor


def test_dense_step_is_one_synchronization_and_linear_in_m():
    small = dc.count_dense_step(64, 16, 1, 256)
    large = dc.count_dense_step(64, 16, 1, 1024)
    assert small.syncs == large.syncs == 1
    assert small.launches == large.launches <= 16
    assert large.flops64 == pytest.approx(4 * small.flops64, rel=1e-12)
    assert large.bytes == pytest.approx(4 * small.bytes, rel=0.01)  # X is shared
    assert small.scaled(4).flops64 == pytest.approx(large.flops64, rel=1e-12)


def test_model_reproduces_pytorch_dense_on_an_h200():
    """The validation: PyTorch dense float64's counted steps, priced, within 1.5× of its
    whole runs (and W1-shaped steps at 2^20 and 2^22) measured on an H200."""
    for name, r in dc.validate_dense(count_m=1024).items():
        assert 1 / 1.5 <= r["ratio"] <= 1.5, (name, r)


def test_model_reacts_to_each_rate():
    c = dc.count_dense_step(64, 16, 1, 256)
    base = dc.modelled_seconds(c)
    slow = {**dc.H200, "launch_s": 10 * dc.H200["launch_s"]}
    assert dc.modelled_seconds(c, slow) > base
    slow = {**dc.H200, "sync_s": 10 * dc.H200["sync_s"]}
    assert dc.modelled_seconds(c, slow) - base == pytest.approx(9 * dc.H200["sync_s"] * c.syncs)


def test_counted_device_run_is_the_uncounted_one():
    """Counting changes nothing: the counted run's weights are the plain run's, and its
    steps are really counted (the device kernel synchronizes in every step today)."""
    ds = ct.datasets.sphere(n=48, d=8, seed=3)
    plain = ct.TwoLayerReLU.init(d=8, m=512, seed=3)
    ct.train(plain, ds.X_train, ds.y_train, method="kernel", iters=5, device="cpu")
    model = ct.TwoLayerReLU.init(d=8, m=512, seed=3)
    got = dc.count_train(ct.train, model, ds.X_train, ds.y_train, method="kernel", iters=5)
    assert len(got["steps"]) == 5
    np.testing.assert_allclose(model.W, plain.W, rtol=0, atol=1e-12)
    assert all(c.launches > 0 and c.syncs > 0 for c in got["steps"])
    targets = dc._targets(got["steps"], list(got["history"].moved_neurons))
    assert set(targets) >= {"first_three", "later"}
    whole, extrapolated = dc._whole(got["steps"], 20)
    per = [dc.modelled_seconds(c) for c in got["steps"]]
    assert extrapolated and whole == pytest.approx(sum(per) + 15 * float(np.median(per)))
    assert math.isfinite(whole)
