"""Sharded training: in this process, and on a Dask LocalCluster of worker processes.

Every method must follow the single-process trajectory (weights within 1e-9),
for one and three outputs; checkpoints resume bit for bit on the same shards
and within rounding on another number of them; a worker killed mid-run stops
the run with a one-line error that names the checkpoint, from which the run
finishes with the same weights.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import corrtree as ct
from corrtree.distributed import WorkerLost, local_client

ALL = ["dense", "dtree", "wtree", "lazy", "kernel"]
ON_DASK = ["dense", "wtree", "lazy", "kernel"]


def _problem(outputs, seed=3, n=50, m=1500, d=8):
    ds = ct.datasets.sphere(n=n, d=d, outputs=outputs, seed=seed)
    return ds.X_train, ds.y_train, ct.TwoLayerReLU.init(d=d, m=m, outputs=outputs, seed=seed + 1)


def _train(model0, X, y, **kw):
    model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
    hist = ct.train(model, X, y, **kw)
    return model, hist


def _close(W, ref):
    return np.linalg.norm(W - ref) <= 1e-9 * np.linalg.norm(ref)


@pytest.fixture(scope="module")
def client():
    c = local_client(2)
    yield c
    cluster = c.cluster
    c.close()
    cluster.close()


@pytest.mark.parametrize("outputs", [1, 3])
@pytest.mark.parametrize("method", ALL)
def test_shards_in_process_follow_one_process(method, outputs):
    X, y, model0 = _problem(outputs)
    ref, ref_hist = _train(model0, X, y, method=method, iters=15)
    got, hist = _train(model0, X, y, method=method, iters=15, shards=3)
    assert _close(got.W, ref.W)
    np.testing.assert_allclose(hist.loss, ref_hist.loss, rtol=1e-9)
    assert hist.fired_pairs == ref_hist.fired_pairs and hist.info["shards"] == 3


@pytest.mark.parametrize("outputs", [1, 3])
@pytest.mark.parametrize("method", ON_DASK)
def test_dask_workers_follow_one_process(client, method, outputs):
    X, y, model0 = _problem(outputs)
    ref, ref_hist = _train(model0, X, y, method=method, iters=12)
    got, hist = _train(model0, X, y, method=method, iters=12, client=client)
    assert _close(got.W, ref.W)
    assert hist.lr == pytest.approx(ref_hist.lr, rel=1e-9)
    assert hist.fired_pairs == ref_hist.fired_pairs
    assert len(hist.info["worker_peak_rss"]) == 2 and min(hist.info["worker_peak_rss"]) > 0


@pytest.mark.parametrize("method", ["wtree", "kernel"])
def test_checkpoints_resume_on_the_same_and_other_shards(client, tmp_path, method):
    # two shards named, not one per worker the scheduler lists at each call: "the same
    # shards" must not depend on a worker that is slow to answer on a loaded machine
    X, y, model0 = _problem(1)
    stop = {"checkpoint_every": 4, "callback": lambda t, h: t < 8}
    # in one process the same shards continue bit for bit
    whole, _ = _train(model0, X, y, method=method, iters=16, shards=2)
    _train(model0, X, y, method=method, iters=16, shards=2, checkpoint=tmp_path / "p.npz", **stop)
    here, _ = ct.resume(tmp_path / "p.npz", X, y, shards=2)
    np.testing.assert_array_equal(here.W, whole.W)
    # on Dask workers: the same shards, the same rate; the weights to 1e-9 (in full suites
    # under xdist a resumed kernel run has differed from the uninterrupted one in the last
    # bit of 50 of 12 000 weights, cause not found: docs/distributed.md)
    whole, first = _train(model0, X, y, method=method, iters=16, client=client, shards=2)
    path = tmp_path / "c.npz"
    _train(model0, X, y, method=method, iters=16, client=client, shards=2, checkpoint=path, **stop)
    same, hist = ct.resume(path, X, y, client=client, shards=2)
    assert len(hist) == 16 and first.info["shards"] == hist.info["shards"] == 2
    assert hist.lr == first.lr
    assert _close(same.W, whole.W), f"on {first.info['workers']}, resumed on {hist.info['workers']}"
    for shards in (1, 3):  # other shards start from W(t): the same trajectory up to rounding
        other, _ = ct.resume(path, X, y, shards=shards)
        assert _close(other.W, whole.W)
    assert len(list(tmp_path.glob("c.t*.shard*.npz"))) == 2  # only the latest shard files


def test_a_killed_worker_stops_with_the_checkpoint_to_resume_from(client, tmp_path):
    X, y, model0 = _problem(1, n=60, m=3000)
    whole, _ = _train(model0, X, y, method="lazy", iters=14)
    pids = client.run(os.getpid)
    path = tmp_path / "c.npz"

    def kill(t, hist):
        if t == 6:
            os.kill(next(iter(pids.values())), signal.SIGKILL)

    model = ct.TwoLayerReLU(model0.W, model0.a, model0.b)
    with pytest.raises(WorkerLost, match="resume from the checkpoint") as info:
        ct.train(
            model,
            X,
            y,
            method="lazy",
            iters=14,
            client=client,
            checkpoint=path,
            checkpoint_every=3,
            callback=kill,
        )
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    np.testing.assert_array_equal(model.W, model0.W)  # nothing written
    client.wait_for_workers(2, timeout=60)  # the nanny restarts the worker
    done, hist = ct.resume(path, X, y, client=client)
    assert len(hist) == 14 and _close(done.W, whole.W)


def test_the_command_line_with_workers(tmp_path):
    out = tmp_path / "o"
    cli = [sys.executable, "-m", "corrtree.cli"]
    common = [
        "train",
        "--data",
        "breast_cancer",
        "--width",
        512,
        "--iters",
        6,
        "--method",
        "kernel",
        "--out",
        out,
        "--quiet",
    ]
    proc = subprocess.run(
        [*cli, *map(str, common), "--workers", "2", "--checkpoint-every", "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "worker_peak_rss_gib" in proc.stdout
    one = subprocess.run(
        [*cli, *map(str, common), "--out", tmp_path / "one"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr
    a = ct.TwoLayerReLU.load(out / "model.npz").W
    b = ct.TwoLayerReLU.load(tmp_path / "one" / "model.npz").W
    assert _close(a, b)
    both = subprocess.run(
        [*cli, *map(str, common), "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert both.returncode == 1 and "not both" in both.stderr


@pytest.mark.parametrize("level", ["default", "WARNING"])
def test_dask_log_lines_stay_off_the_terminal_by_default(level):
    """An error that a worker logs (as Dask does when a heartbeat meets a scheduler
    that has closed) reaches stderr only when the caller asks for Dask's logs; two
    clusters at once do not compete for a port (Dask warns when they do)."""
    arg = "" if level == "default" else ", silence_logs=logging.WARNING"
    code = (
        "import logging\nfrom corrtree.distributed import local_client\n"
        f"c = local_client(1{arg})\nother = local_client(1{arg})\n"
        "c.run(lambda: logging.getLogger('distributed.worker').error('HEARTBEAT-LOST'))\n"
        "for k in (other, c):\n    cluster = k.cluster\n    k.close()\n    cluster.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("HEARTBEAT-LOST" in proc.stderr) == (level == "WARNING"), proc.stderr
    assert "already in use" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"workers": 0}, "workers"),
        ({"threads": 0}, "threads"),
        ({"silence_logs": "loud"}, "silence_logs"),
    ],
)
def test_local_client_refuses_bad_arguments_before_starting(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name) as err:
        local_client(**{"workers": 1, **kwargs})
    assert "\n" not in str(err.value)


def test_lr_auto_on_shards_beyond_the_formed_matrix(monkeypatch):
    """Lanczos on the summed shares of the sparse products (warm start included)
    gives the single-process lr within its tolerance."""
    from corrtree import _config

    monkeypatch.setattr(_config, "NTK_DENSE_EIG_LIMIT", 10)
    monkeypatch.setattr(_config, "NTK_DENSE_MATVEC_LIMIT", 10)
    monkeypatch.setattr(_config, "NTK_WARM_NEURONS", 300)
    X, y, model0 = _problem(3)
    _, ref = _train(model0, X, y, method="lazy", iters=0)
    _, hist = _train(model0, X, y, method="lazy", iters=0, shards=3)
    assert hist.lr == pytest.approx(ref.lr, rel=1e-6)


def test_the_core_does_not_import_dask():
    code = (
        "import sys, corrtree as ct; ds = ct.datasets.sphere(n=20, d=4); "
        "ct.train(ct.TwoLayerReLU.init(d=4, m=64), ds.X_train, ds.y_train, iters=2); "
        "print(any(k == 'dask' or k.startswith(('dask.', 'distributed')) "
        "for k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_damaged_sharded_checkpoint_is_refused(tmp_path):
    import json

    X, y, model0 = _problem(1)
    path = tmp_path / "c.npz"
    _train(model0, X, y, method="lazy", iters=6, shards=2, checkpoint=path, checkpoint_every=3)
    shard = sorted(tmp_path.glob("c.t*.shard1.npz"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ct.CheckpointError):
        ct.resume(path, X, y)
    shard.write_bytes(data)
    with np.load(path, allow_pickle=False) as z:
        manifest = json.loads(str(z["manifest"]))
        arrays = {k: np.array(z[k]) for k in z.files if k != "manifest"}
    for damage in (
        {"shards": []},
        {"lr": "x"},
        {"method": "nope"},
        {"shards": [{"start": 0, "stop": 5, "file": "../x.npz"}]},
    ):
        np.savez(
            tmp_path / "bad.npz", manifest=np.array(json.dumps({**manifest, **damage})), **arrays
        )
        with pytest.raises(ct.CheckpointError) as info:
            ct.resume(tmp_path / "bad.npz", X, y)
        assert "\n" not in str(info.value)
    np.savez(
        tmp_path / "bad.npz",
        manifest=np.array(json.dumps(manifest)),
        **{**arrays, "model_W": arrays["model_W"] * 2},
    )
    with pytest.raises(ct.CheckpointError, match="digest"):
        ct.resume(tmp_path / "bad.npz", X, y)


def test_sgd_with_momentum_on_dask_workers(client, tmp_path):
    X, y, model0 = _problem(2)
    kw = {"lr": 0.5, "batch_size": 8, "epochs": 2, "momentum": 0.9, "weight_decay": 0.01}
    for method in ("dense", "lazy", "kernel"):
        ref, ref_hist = _train(model0, X, y, method=method, **kw)
        got, hist = _train(model0, X, y, method=method, client=client, **kw)
        assert _close(got.W, ref.W), method
        np.testing.assert_allclose(hist.epoch_loss, ref_hist.epoch_loss, rtol=1e-9)
    path = tmp_path / "c.npz"
    stop = {"checkpoint": path, "checkpoint_every": 3, "callback": lambda t, h: t < 5}
    _train(model0, X, y, method="lazy", client=client, **kw, **stop)
    same, hist = ct.resume(path, X, y, client=client)
    np.testing.assert_array_equal(same.W, got.W)  # the same shards: bit for bit
    with pytest.raises(ValueError, match="momentum resumes on its own 2 shards"):
        ct.resume(path, X, y, shards=3)


def test_sgd_with_weight_decay_resumes_on_other_shards(tmp_path):
    X, y, model0 = _problem(1)
    kw = {"lr": 0.5, "batch_size": 8, "epochs": 2, "weight_decay": 0.02, "schedule": "cosine"}
    whole, whole_hist = _train(model0, X, y, method="kernel", shards=2, **kw)
    path = tmp_path / "c.npz"
    stop = {"checkpoint": path, "checkpoint_every": 3, "callback": lambda t, h: t < 5}
    _train(model0, X, y, method="kernel", shards=2, **kw, **stop)
    other, hist = ct.resume(path, X, y, shards=3)
    assert _close(other.W, whole.W) and len(hist) == len(whole_hist)
