"""Reproductions of inputs and faults that used to crash, lose a run or give a silently
wrong model; each must now give the right result or a one-line error."""

import json
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from test_cli import CLI, EVERY, ITERS, assert_one_line_error, run, signal_mid_run

import corrtree as ct
from corrtree import _commands, cli, datasets


def _csv(path, X, y, header=None, bom=False):
    lines = [] if header is None else [",".join(header)]
    lines += [
        ",".join([*(f"{v:.6f}" for v in row), str(lab)]) for row, lab in zip(X, y, strict=True)
    ]
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def table():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 8))
    y = (X[:, 0] > 0).astype(int)
    return X, y


# -- 2. a checkpoint belongs to one run ------------------------------------------------


def test_resume_refuses_a_finished_run_and_a_checkpoint_of_another_run(tmp_path):
    out = tmp_path / "x"
    common = [
        "train",
        "--data",
        "breast_cancer",
        "--width",
        128,
        "--iters",
        4,
        "--method",
        "dense",
        "--out",
        out,
        "--quiet",
    ]
    run(*common, "--checkpoint-every", 2)
    stale = (out / "checkpoint.npz").read_bytes()  # run A's checkpoint
    run(*common, "--seed", 3)  # run B, different, to completion in the same folder
    newer = (out / "model.npz").read_bytes()
    (out / "checkpoint.npz").write_bytes(stale)
    assert_one_line_error(run("train", "--resume", out, check=False), 1, "finished")
    state = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**state, "finished": False}))
    assert_one_line_error(run("train", "--resume", out, check=False), 1, "another run")
    assert (out / "model.npz").read_bytes() == newer


def test_a_new_run_never_replaces_an_interrupted_one(tmp_path):
    """A new run in the folder of an interrupted run (unfinished, with its checkpoint) is
    refused in one line that names ``--resume``, and the folder stays as it was; once
    that run is resumed to its end, a new run takes the folder."""
    out = tmp_path / "x"
    common = ["train", "--data", "breast_cancer", "--width", 128, "--method", "dense"]
    common += ["--out", out, "--quiet"]
    run(*common, "--iters", 4, "--checkpoint-every", 2)
    state = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**state, "iters": 6, "finished": False}))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = run(*common, "--iters", 3, "--seed", 3, check=False)
    assert_one_line_error(proc, 1, f"--out {out} holds an interrupted run")
    assert f"corrtree train --resume {out}" in proc.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    run("train", "--resume", out)
    assert json.loads((out / "run.json").read_text())["finished"] is True
    run(*common, "--iters", 3, "--seed", 3)  # a finished run's folder takes a new one
    assert json.loads((out / "run.json").read_text())["seed"] == 3


@pytest.mark.parametrize("shards", [None, 2])
def test_an_interrupted_run_names_its_checkpoint_one_process_or_sharded(tmp_path, shards):
    """The line of an interrupted run says it can be resumed when the folder's checkpoint
    is its own, one-process or sharded (a sharded manifest is a checkpoint too), and
    that nothing was saved for another run's id."""
    ds = datasets.sphere(n=32, d=6, seed=0)
    model = ct.TwoLayerReLU.init(d=6, m=64, seed=0)
    ck = tmp_path / "checkpoint.npz"
    ct.train(model, ds.X_train, ds.y_train, method="lazy", iters=2, checkpoint=ck,
             checkpoint_every=1, run_id="abc", shards=shards)  # fmt: skip
    said = str(_commands._interrupted(KeyboardInterrupt("stop"), tmp_path, "abc"))
    assert f"continue with: corrtree train --resume {tmp_path}" in said
    other = str(_commands._interrupted(KeyboardInterrupt("stop"), tmp_path, "xyz"))
    assert "nothing was saved" in other


# -- 3. the CSV reader ------------------------------------------------------------------


def test_csv_with_bom_numeric_header_and_class_names(tmp_path, table):
    X, y = table
    names = np.where(y == 1, "cat", "dog")
    for kw in ({"bom": True}, {"header": [str(k) for k in range(9)]}, {}):
        path = _csv(tmp_path / "d.csv", X, names, **kw)
        Xr, yr = datasets.load_file(path)
        assert Xr.shape == (200, 8) and list(yr) == list(names)
        np.testing.assert_allclose(Xr, np.round(X, 6))
    num = _csv(tmp_path / "n.csv", X, y, header=[str(k) for k in range(9)])
    Xr, yr = datasets.load_file(num)
    assert Xr.shape == (200, 8) and set(yr) == {0.0, 1.0}  # no class made of the header
    with pytest.raises(ValueError, match="row 1 is not numeric"):
        datasets.load_file(_csv(tmp_path / "h.csv", X, y, header=["a"] * 9), header=False)


def test_train_and_predict_keep_every_row(tmp_path, table):
    X, y = table
    path = _csv(
        tmp_path / "d.csv",
        X,
        np.where(y == 1, "true", "false"),
        bom=True,
        header=[f"f{k}" for k in range(8)] + ["label"],
    )
    out = tmp_path / "o"
    run(
        "train",
        "--data",
        path,
        "--width",
        64,
        "--iters",
        3,
        "--out",
        out,
        "--quiet",
        "--test-size",
        0,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_train"] == 200 and summary["task"] == "binary"
    for data in (path, _csv(tmp_path / "f.csv", X, y)):
        pred = run("predict", "--model", out / "model.npz", "--data", data).stdout
        assert len(pred.splitlines()) == 200
    (tmp_path / "bad.csv").write_text("a,b,c\n1,2,x\n3,4,5\n1,zz,0\n")
    assert_one_line_error(
        run("train", "--data", tmp_path / "bad.csv", check=False), 1, "row 4 is not numeric"
    )


def test_string_labels_cannot_be_regression(tmp_path, table):
    X, y = table
    path = _csv(tmp_path / "d.csv", X, np.where(y == 1, "cat", "dog"))
    assert_one_line_error(
        run("train", "--data", path, "--task", "regression", "--quiet", check=False),
        1,
        "not numbers",
    )


# -- 4. divergence ----------------------------------------------------------------------


def test_divergence_is_an_error_at_any_length(tmp_path, table):
    X, y = table
    path = _csv(tmp_path / "d.csv", X, y)
    out = tmp_path / "o"
    assert_one_line_error(
        run(
            "train",
            "--data",
            path,
            "--lr",
            1000,
            "--iters",
            5,
            "--out",
            out,
            "--quiet",
            check=False,
        ),
        1,
        "lr",
    )
    assert not (out / "model.npz").exists()
    model = ct.TwoLayerReLU.init(d=8, m=64, seed=0)
    W0 = model.W.copy()
    with pytest.raises(ct.TrainingDiverged):
        ct.train(model, datasets.unit_rows(X), y * 1.0, lr=1e6, iters=3)
    np.testing.assert_array_equal(model.W, W0)  # a diverged run leaves the model alone
    with pytest.raises(ct.TrainingDiverged):
        ct.train(model, datasets.unit_rows(X), y * 1.0, lr=1e6, iters=1)


def test_lr_auto_halves_on_integer_regression_labels(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((120, 5))
    y = rng.integers(0, 25, 120)
    path = _csv(tmp_path / "d.csv", X, y)
    out = tmp_path / "o"
    run(
        "train",
        "--data",
        path,
        "--width",
        32,
        "--iters",
        60,
        "--out",
        out,
        "--quiet",
        "--task",
        "regression",
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lr_halvings"] >= 1 and np.isfinite(summary["final_loss"])


# -- 5. huge values ---------------------------------------------------------------------


def test_huge_values_are_scaled_or_refused(tmp_path, table):
    X, y = table
    X = X.copy()
    X[3, 2] = 1e308
    path = _csv(tmp_path / "d.csv", X, y)
    Xr, _ = datasets.load_file(path)
    U = datasets.unit_rows(Xr)
    assert np.isfinite(U).all() and U[3, 2] == pytest.approx(1.0)
    model = ct.TwoLayerReLU.init(d=8, m=16)
    with pytest.raises(ValueError, match="would overflow"):
        model.predict(Xr)
    assert_one_line_error(
        run("train", "--data", path, "--no-normalize", "--no-standardize", "--quiet", check=False),
        1,
        "would overflow",
    )


# -- 6. and 8. one-line errors and clear messages --------------------------------------


def test_output_folders_are_checked_before_any_work(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    for args, text in (
        (["train", "--data", "breast_cancer", "--out", afile], "not a folder"),
        (["train", "--data", "breast_cancer", "--out", afile / "sub"], "not a writable"),
        (["demo", "--out", afile], "not a folder"),
    ):
        t0 = time.perf_counter()
        assert_one_line_error(run(*args, "--quiet", check=False), 1, text)
        assert time.perf_counter() - t0 < 30  # refused before training
    model = ct.TwoLayerReLU.init(d=3, m=8)
    model.save(tmp_path / "m.npz")
    np.savez(tmp_path / "x.npz", X=np.ones((2, 3)))
    assert_one_line_error(
        run(
            "predict",
            "--model",
            tmp_path / "m.npz",
            "--data",
            tmp_path / "x.npz",
            "--out",
            tmp_path,
            check=False,
        ),
        1,
        "folder",
    )


def test_bad_files_give_one_line(tmp_path):
    np.savez(tmp_path / "scalar_y.npz", X=np.ones((3, 2)), y=np.array(1.0))
    assert_one_line_error(
        run("train", "--data", tmp_path / "scalar_y.npz", check=False), 1, "one row per point"
    )
    np.savez(
        tmp_path / "model.npz",
        format=np.array("corrtree.TwoLayerReLU/1"),
        W=np.ones((4, 2)),
        a=np.ones(4),
        b=np.ones(3),
    )
    np.savez(tmp_path / "x.npz", X=np.ones((2, 2)))
    assert_one_line_error(
        run(
            "predict", "--model", tmp_path / "model.npz", "--data", tmp_path / "x.npz", check=False
        ),
        1,
        "b must be one number",
    )
    assert_one_line_error(run("train", "--data", tmp_path, check=False), 1, "directory")
    np.savez(tmp_path / "flat.npz", X=np.ones(8))
    ct.TwoLayerReLU.init(d=8, m=4).save(tmp_path / "m8.npz")
    assert_one_line_error(
        run(
            "predict", "--model", tmp_path / "m8.npz", "--data", tmp_path / "flat.npz", check=False
        ),
        1,
        "2-D",
    )
    (tmp_path / "seven.csv").write_text("1,2,3,4,5,6,7\n")
    ct.TwoLayerReLU.init(d=5, m=4).save(tmp_path / "m5.npz")
    assert_one_line_error(
        run(
            "predict", "--model", tmp_path / "m5.npz", "--data", tmp_path / "seven.csv", check=False
        ),
        1,
        "has 7 columns",
    )


def test_arguments_and_summaries(tmp_path):
    assert_one_line_error(run("train", "--seed", "-1", check=False), 2, "integer >= 0")
    assert_one_line_error(run("train", "--test-size", "nan", check=False), 2, "[0, 1)")
    out = tmp_path / "o"
    run("train", "--data", "breast_cancer", "--iters", 0, "--width", 16, "--out", out, "--quiet")
    summary = json.loads((out / "summary.json").read_text())  # strict JSON: no NaN
    assert summary["final_loss"] is not None and summary["initial_loss"] is None
    d1 = ct.TwoLayerReLU.init(d=1, m=8)
    d1.save(tmp_path / "d1.npz")
    (tmp_path / "one.csv").write_text("0.5\n-1\n2\n")
    pred = run("predict", "--model", tmp_path / "d1.npz", "--data", tmp_path / "one.csv")
    assert len(pred.stdout.splitlines()) == 3
    np.savez(tmp_path / "y2.npz", X=np.ones((5, 3)), y=np.ones((5, 2)))
    assert_one_line_error(
        run("train", "--data", tmp_path / "y2.npz", "--task", "classification", check=False),
        1,
        "one label column",
    )


# -- 7. signals -------------------------------------------------------------------------


def _start(tmp_path, *extra):
    ds = ct.datasets.sphere(n=200, d=16, seed=4)
    np.savez(tmp_path / "data.npz", X=ds.X_train, y=ds.y_train)
    out = tmp_path / "o"
    args = [
        "train",
        "--data",
        tmp_path / "data.npz",
        "--width",
        4096,
        "--method",
        "dense",
        "--lr",
        "0.05",
        "--task",
        "regression",
        "--quiet",
        "--out",
        out,
        *extra,
    ]
    proc = subprocess.Popen(
        [*CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, out


def test_sigterm_saves_like_sigint(tmp_path):
    proc, out = _start(tmp_path, "--iters", ITERS, "--checkpoint-every", EVERY)
    _, t = signal_mid_run(proc, out, signal.SIGTERM)
    assert EVERY <= t + 1 < ITERS
    run("train", "--resume", out, "--quiet")
    assert (out / "model.npz").exists()


def test_an_interrupt_once_the_output_folder_is_made_says_nothing_was_saved(
    tmp_path, monkeypatch, capsys
):
    """Ctrl-C right after ``--out`` is made (while it is checked for writing, before the
    run starts) says that nothing was saved, as any signal before the first checkpoint
    does, not a bare "interrupted"."""

    out = tmp_path / "o"
    make = tempfile.TemporaryFile

    def interrupted(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == out:  # the check of --out, not numba's cache
            raise KeyboardInterrupt("interrupted")
        return make(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", interrupted)
    code = cli.main(["train", "--data", "sphere", "--iters", "2", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INTERRUPTED and out.is_dir(), err
    assert err.startswith("corrtree: interrupted before the first checkpoint: nothing was saved")


def test_sigint_before_the_first_iteration_promises_nothing(tmp_path):
    proc, out = _start(tmp_path, "--iters", 5, "--width", 2**17)
    deadline = time.time() + 120
    while not out.exists() and time.time() < deadline:  # the output folder is checked first
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    if "state saved" not in err:  # the signal came before the first checkpoint
        assert "nothing was saved" in err
        # run.json is written once the first step has ended: before, the folder holds no run
        proc = run("train", "--resume", out, check=False)
        why = "no checkpoint" if (out / "run.json").exists() else "no run.json"
        assert_one_line_error(proc, 1, why)


def test_a_killed_checkpoint_write_leaves_no_temporary(tmp_path):
    ds = ct.datasets.sphere(n=30, d=4, seed=1)
    path = tmp_path / "c.npz"
    stale = tmp_path / ".c.npz.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    ct.train(
        ct.TwoLayerReLU.init(d=4, m=64),
        ds.X_train,
        ds.y_train,
        iters=2,
        checkpoint=path,
        checkpoint_every=1,
    )
    assert not stale.exists() and path.exists()


def _one_row(**row):
    """A History of one iteration; columns not given are 0."""
    from corrtree.training.history import COLUMNS

    hist = ct.History(method="kernel", lr=1.0, n=1, m=1, d=1, outputs=1, b=1.0)
    hist.append(**{k: row.get(k, 0) for k in COLUMNS})
    return hist


# -- 9. progress bars -------------------------------------------------------------------


@pytest.mark.parametrize("width", [60, 80, 120])
def test_progress_bar_fits_the_terminal(width):
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    hist = _one_row(loss=94.78123, fired_pairs=12_345_678, moved_neurons=1)
    with _commands.Progress(1000, "kernel", console=console) as progress:
        progress(499, hist)
    line = buf.getvalue().rstrip("\n")
    assert len(line) <= width and "\n" not in line
    for part in ("kernel", "━", "500/1000", "loss 9.478e+01", "it/s", "--:--"):
        assert part in line, line
    assert ("fired 12.3M" in line) == (width >= 70), line
    assert "…" not in line


def test_check_divergence_uses_the_final_loss():
    from corrtree.training._train import check_divergence

    hist = _one_row(loss=1.0)
    hist.final_loss = 1e30
    with pytest.raises(ct.TrainingDiverged, match="after the last iteration"):
        check_divergence(hist, 1.0, 5)
