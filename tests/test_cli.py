"""The corrtree command line: :func:`corrtree.cli.main` in the test's process, its output
and exit status captured as a subprocess's, and through real subprocesses where a fresh
process is the point (signals, start-up, the kernels' loading, environments)."""

import contextlib
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import corrtree as ct

CLI = [sys.executable, "-m", "corrtree.cli"]


def run(*args, check=True, process=False, **kw):
    """``corrtree ARGS``: :func:`in_process` unless ``process`` or an option of
    :func:`subprocess.run` other than ``cwd`` asks for ``python -m corrtree.cli``."""
    argv = list(map(str, args))
    if process or set(kw) - {"cwd"}:
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, **kw)
    else:
        proc = in_process(argv, kw.get("cwd"))
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def in_process(argv, cwd=None):
    """:func:`corrtree.cli.main` run here in ``cwd``, as a subprocess would be: its
    standard output and error captured, argparse's exit taken as the status; the
    working folder and the ``corrtree`` logger (``main`` points it at the captured
    stream) restored after.  An exception ``main`` does not report fails the test, as a
    traceback would."""
    from corrtree import cli

    out, err = io.StringIO(), io.StringIO()
    logger = logging.getLogger("corrtree")
    handlers, level, here = logger.handlers[:], logger.level, os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exc:  # argparse: --help, --version, bad options
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.chdir(here)
        logger.handlers[:] = handlers
        logger.setLevel(level)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def assert_one_line_error(proc, code, text):
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert text in lines[-1], proc.stderr


@pytest.mark.parametrize("command", ["demo", "train", "predict", "bench", "experiment"])
def test_help_is_complete(command):
    out = run(command, "--help").stdout
    assert "usage: corrtree " + command in out
    for word in {
        "demo": ["--width", "--iters", "--out"],
        "train": [
            "--data",
            "--width",
            "--method",
            "--iters",
            "--lr",
            "--seed",
            "--out",
            "--checkpoint-every",
            "--resume",
            "breast_cancer",
            "kernel",
        ],
        "predict": ["--model", "--data", "--out"],
        "bench": ["--size", "small", "large", "--suite"],
        "experiment": ["sparsity_init", "lower_bound", "--quick"],
    }[command]:
        assert word in out
    assert run("--help").stdout.count("demo") >= 1


def test_train_writes_everything_and_predict_reads_it(tmp_path):
    out = tmp_path / "run"
    proc = run(
        "train",
        "--data",
        "breast_cancer",
        "--width",
        512,
        "--iters",
        6,
        "--method",
        "lazy",
        "--out",
        out,
        "--quiet",
    )
    assert "test_accuracy" in proc.stdout
    for name in (
        "model.npz",
        "history.json",
        "history.csv",
        "summary.json",
        "report.html",
        "loss.png",
        "sparsity.png",
        "moved.png",
        "timing.png",
        "run.json",
    ):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "lazy" and summary["iterations"] == 6
    assert 0.5 < summary["test_accuracy"] <= 1
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4
    hist = ct.History.from_dict(json.loads((out / "history.json").read_text()))
    assert len(hist) == 6
    # predict on the user's own CSV (features only), then with the label column
    ds = ct.datasets.breast_cancer()
    np.savetxt(tmp_path / "x.csv", ds.X_test, delimiter=",")
    pred = run("predict", "--model", out / "model.npz", "--data", tmp_path / "x.csv").stdout
    values = np.array([float(v) for v in pred.split()])
    model = ct.TwoLayerReLU.load(out / "model.npz")
    np.testing.assert_allclose(values, model.predict(ds.X_test), rtol=1e-9)
    np.savez(tmp_path / "xy.npz", X=ds.X_test, y=ds.y_test)
    proc = run(
        "predict",
        "--model",
        out / "model.npz",
        "--data",
        tmp_path / "xy.npz",
        "--out",
        tmp_path / "p.csv",
    )
    assert "mean squared error" in proc.stderr
    assert len((tmp_path / "p.csv").read_text().splitlines()) == len(ds.X_test)


def test_train_on_user_csv_classification(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((90, 4))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0)  # three classes
    with open(tmp_path / "d.csv", "w") as fh:
        fh.write("a,b,c,d,label\n")
        np.savetxt(fh, np.column_stack([X, y]), delimiter=",")
    out = tmp_path / "o"
    run(
        "train", "--data", tmp_path / "d.csv", "--width", 256, "--iters", 3, "--out", out, "--quiet"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "multiclass" and summary["outputs"] == 3


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["train", "--width", "0"], 2, "expected a positive integer"),
        (["train", "--method", "sgd"], 2, "invalid choice"),
        (["train", "--lr", "fast", "--iters", "1"], 1, "--lr must be 'auto' or a number"),
        (["train", "--lr", "-1", "--iters", "1"], 1, "--lr must be a positive number"),
        (["train", "--data", "missing.csv"], 1, "does not exist"),
        (["predict", "--model", "missing.npz", "--data", "x.csv"], 1, "missing.npz"),
        (["experiment", "nope"], 2, "invalid choice"),
        (["bench", "--suite", "nope"], 1, "unknown suite"),
    ],
)
def test_bad_arguments(args, code, text, tmp_path):
    assert_one_line_error(run(*args, check=False, cwd=tmp_path), code, text)


def test_bad_data_files(tmp_path):
    (tmp_path / "bad.csv").write_text("1,2,3\n4,x,6\n")
    assert_one_line_error(
        run("train", "--data", tmp_path / "bad.csv", check=False), 1, "row 2 is not numeric"
    )
    (tmp_path / "nan.csv").write_text("1,2,3\n4,nan,6\n")
    assert_one_line_error(
        run("train", "--data", tmp_path / "nan.csv", check=False), 1, "NaN or infinite"
    )
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not really a zip")
    assert_one_line_error(
        run("train", "--data", tmp_path / "broken.npz", check=False), 1, "cannot read data file"
    )
    model = ct.TwoLayerReLU.init(d=3, m=8)
    model.save(tmp_path / "m.npz")
    np.savez(tmp_path / "wide.npz", X=np.ones((2, 5)))
    assert_one_line_error(
        run("predict", "--model", tmp_path / "m.npz", "--data", tmp_path / "wide.npz", check=False),
        1,
        "has 5 features but the model expects 3",
    )
    (tmp_path / "junk.npz").write_bytes(b"junk")
    assert_one_line_error(
        run(
            "predict",
            "--model",
            tmp_path / "junk.npz",
            "--data",
            tmp_path / "wide.npz",
            check=False,
        ),
        1,
        "cannot read model file",
    )


ITERS = 300  # the signal comes after the first scheduled checkpoint, long before the end
EVERY = 20


def signal_mid_run(proc, out, sig):
    """Send ``sig`` to a ``train --checkpoint-every EVERY`` run once its first scheduled
    checkpoint exists (it is training), wait for it to stop; returns its stderr and the
    iteration after which it says it saved its state."""
    deadline = time.time() + 120
    while not (out / "checkpoint.npz").exists() and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "state saved" in err and "--resume" in err and "Traceback" not in err
    return err, int(re.search(r"interrupted after iteration (\d+)", err).group(1))


@pytest.mark.parametrize("method", ["dense", "kernel"])
def test_sigint_saves_a_checkpoint_and_resume_is_exact(tmp_path, method):
    ds = ct.datasets.sphere(n=200, d=16, seed=4)
    np.savez(tmp_path / "data.npz", X=ds.X_train, y=ds.y_train)
    common = [
        "train",
        "--data",
        tmp_path / "data.npz",
        "--width",
        4096,
        "--method",
        method,
        "--iters",
        ITERS,
        "--lr",
        "0.05",
        "--task",
        "regression",
        "--quiet",
    ]
    whole = tmp_path / "whole"
    run(*common, "--out", whole)
    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [*CLI, *map(str, common), "--checkpoint-every", str(EVERY), "--out", str(cut)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, t = signal_mid_run(proc, cut, signal.SIGINT)
    saved = np.load(cut / "checkpoint.npz", allow_pickle=False)
    done = len(json.loads(str(saved["manifest"]))["history"]["loss"])
    assert EVERY <= done == t + 1 < ITERS  # the state after the iteration it names
    run("train", "--resume", cut, "--quiet")
    a = ct.TwoLayerReLU.load(whole / "model.npz")
    b = ct.TwoLayerReLU.load(cut / "model.npz")
    np.testing.assert_array_equal(a.W, b.W)  # bit for bit
    ha = json.loads((whole / "history.json").read_text())
    hb = json.loads((cut / "history.json").read_text())
    assert ha["loss"] == hb["loss"]


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--lr", "-1"], "--lr must be a positive number"),
        (["--iters", "3", "--epochs", "2"], "give --iters or --epochs"),
        (["--momentum", "0.5", "--nesterov", "--weight-decay", "-1"], "weight_decay must be"),
        (["--batch-size", "8", "--nesterov"], "nesterov=True needs momentum > 0"),
        (["--device", "cuda:9"], "--device: device='cuda:9' is not there"),
        (["--device", "cpu", "--method", "dtree"], "method='dtree' has no device path"),
        (["--device", "cpu", "--workers", "2"], "--device runs in one process"),
    ],
)
def test_flags_are_refused_before_the_data_loads(args, text, tmp_path):
    """A flag that needs no data is named in one line before the data loads (here data
    that cannot load) and before a progress bar starts."""
    if "--device" in args:
        pytest.importorskip("torch")
    missing = tmp_path / "missing.csv"
    proc = run("train", "--data", missing, "--out", tmp_path / "o", *args, check=False)
    assert_one_line_error(proc, 1, text)
    assert proc.stdout == ""
    proc = run("train", "--data", missing, "--out", tmp_path / "o", check=False)
    assert_one_line_error(proc, 1, str(missing))  # the data's own error, without the flag


def test_checkpoint_every_and_corrupted_checkpoint(tmp_path):
    out = tmp_path / "o"
    run(
        "train",
        "--data",
        "digits",
        "--width",
        256,
        "--iters",
        4,
        "--checkpoint-every",
        2,
        "--method",
        "dense",
        "--out",
        out,
        "--quiet",
    )
    ck = out / "checkpoint.npz"
    assert ck.stat().st_size > 0
    data = ck.read_bytes()
    ck.write_bytes(data[: len(data) // 2])  # truncated
    assert_one_line_error(run("train", "--resume", out, check=False), 1, "checkpoint")
    ck.write_bytes(b"garbage")
    assert_one_line_error(run("train", "--resume", out, check=False), 1, "checkpoint")
    assert_one_line_error(run("train", "--resume", tmp_path, check=False), 1, "no run.json")


def test_demo_runs(tmp_path):
    proc = run("demo", "--width", 1024, "--iters", 5, "--out", tmp_path / "d", "--quiet")
    assert "accuracy: train" in proc.stdout and "faster" in proc.stdout
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["same_losses_as_dense"] is True


def test_experiment_and_bench_commands(tmp_path):
    run("experiment", "lower_bound", "--quick", "--out", tmp_path)
    assert (tmp_path / "lower_bound.png").exists()
    proc = run("bench", "--size", "small", "--suite", "ddfn", "--out", tmp_path)
    assert "DDFN dynamic workload" in proc.stdout
    result = json.loads((tmp_path / "ddfn_small.json").read_text())
    assert result["dynamic"]["all_agree"] is True
    assert any(Path(tmp_path).glob("ddfn_small*.png"))


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("corrtree")
    assert exe.exists()
    assert subprocess.run(
        [str(exe), "--version"], capture_output=True, text=True, env={**os.environ}
    ).stdout.startswith("corrtree ")


def test_predict_applies_the_training_transform(tmp_path):
    from corrtree.preprocessing import load_transform

    rng = np.random.default_rng(3)
    X = rng.standard_normal((120, 5)) * [1, 10, 100, 1000, 0.1] + 50
    y = X[:, 0] + 0.01 * X[:, 2]
    np.savez(tmp_path / "d.npz", X=X, y=y)
    out = tmp_path / "o"
    run(
        "train",
        "--data",
        tmp_path / "d.npz",
        "--width",
        64,
        "--iters",
        3,
        "--out",
        out,
        "--quiet",
        "--task",
        "regression",
        "--test-size",
        0,
    )
    model = ct.TwoLayerReLU.load(out / "model.npz")
    transform = load_transform(out / "model.npz", 5)
    assert transform is not None and transform.standardize
    pred = run("predict", "--model", out / "model.npz", "--data", tmp_path / "d.npz").stdout
    got = np.array([float(v) for v in pred.split()])
    np.testing.assert_allclose(got, model.predict(transform(X)), rtol=1e-9)


def test_train_with_sgd_flags_records_epochs_and_resumes_exactly(tmp_path):
    ds = ct.datasets.sphere(n=120, d=12, seed=6)
    np.savez(tmp_path / "data.npz", X=ds.X_train, y=ds.y_train)
    common = [
        "train",
        "--data",
        tmp_path / "data.npz",
        "--width",
        512,
        "--method",
        "lazy",
        "--lr",
        "0.3",
        "--task",
        "regression",
        "--batch-size",
        16,
        "--epochs",
        3,
        "--momentum",
        0.9,
        "--weight-decay",
        0.001,
        "--schedule",
        "cosine",
        "--quiet",
    ]
    whole = tmp_path / "whole"
    run(*common, "--out", whole)
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["optimizer"]["momentum"] == 0.9 and summary["steps_per_epoch"] == 6
    hist = json.loads((whole / "history.json").read_text())
    assert len(hist["loss"]) == 18 and len(hist["epoch_loss"]) == 3
    assert all(np.isfinite(hist["epoch_test_loss"]))  # the held-out split, every epoch
    assert (whole / "epochs.png").stat().st_size > 0
    cut = tmp_path / "cut"
    run(*common, "--out", cut, "--checkpoint-every", 7)
    (cut / "run.json").write_text(
        json.dumps({**json.loads((cut / "run.json").read_text()), "finished": False})
    )
    run("train", "--resume", cut, "--quiet")
    a = ct.TwoLayerReLU.load(whole / "model.npz")
    b = ct.TwoLayerReLU.load(cut / "model.npz")
    np.testing.assert_array_equal(a.W, b.W)


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--iters", "3", "--epochs", "2"], "give --iters or --epochs"),
        (["--momentum", "1.5", "--iters", "1"], "momentum must be a number in [0, 1)"),
        (["--nesterov", "--iters", "1"], "nesterov=True needs momentum > 0"),
        (["--weight-decay", "-1", "--iters", "1"], "weight_decay must be"),
    ],
)
def test_bad_sgd_flags(args, text, tmp_path):
    proc = run("train", "--width", 64, *args, "--out", tmp_path / "o", check=False, cwd=tmp_path)
    assert_one_line_error(proc, 1, text)
