"""The ``corrtree`` command line: demo, train, predict, bench, experiment."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, _config, datasets, theory
from ._io import atomic_write_json, atomic_write_text
from .distributed import WorkerLost
from .model import TwoLayerReLU
from .preprocessing import InputTransform, load_transform
from .training import METHODS, CheckpointError, History, TrainingDiverged, resume, train
from .training.optim import SCHEDULES

BUILTIN_DATA = ("digits", "breast_cancer", "sphere")
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------


def load_data(
    spec: str,
    seed: int,
    test_size: float,
    normalize: bool,
    task: str = "auto",
    header: bool | None = None,
    standardize: bool = True,
) -> datasets.Dataset:
    """A built-in data set by name, or the user's ``.npz``/``.csv`` file.

    A file's features are standardized with the training split's statistics
    (``standardize``) and its rows scaled to unit norm (``normalize``): the
    :class:`~corrtree.preprocessing.InputTransform` kept in the dataset.
    """
    if spec == "digits":
        return datasets.digits(test_size=test_size, seed=seed, standardize=standardize)
    if spec == "breast_cancer":
        return datasets.breast_cancer(test_size=test_size, seed=seed)
    if spec == "sphere":
        return datasets.sphere(n=1024, d=784, n_test=256, seed=seed)
    X, y = datasets.load_file(spec, header)
    y, task, classes = _targets(y, task)
    n = X.shape[0]
    n_test = round(test_size * n) if n > 1 else 0
    perm = np.random.default_rng(seed).permutation(n)
    te, tr = perm[:n_test], perm[n_test:]
    transform = InputTransform.fit(X[tr], standardize=standardize, unit_rows=normalize)
    X = transform(X)
    return datasets.Dataset(Path(spec).name, X[tr], y[tr], X[te], y[te], task, classes, transform)


def _targets(y: np.ndarray, task: str) -> tuple[np.ndarray, str, np.ndarray | None]:
    """Targets for the network: regression values, ±1 (two classes) or one-hot.

    Class labels (numbers or names) are mapped to classes as scikit-learn
    does: sorted, the larger of two is +1.
    """
    names = y.dtype.kind in "US"
    if y.ndim == 2:
        if task == "classification" or names:
            raise CliError(
                f"--task classification needs one label column, but y has shape "
                f"{y.shape}; use --task regression for several targets"
            )
        return y, "regression", None
    if names and task == "regression":
        raise CliError("the labels are not numbers; use --task classification or auto")
    if task == "regression":
        return y, "regression", None
    classes = np.unique(y)
    integral = names or np.array_equal(y, np.round(y))
    if task == "auto" and not (integral and 2 <= len(classes) <= 20):
        if names:
            raise CliError(
                f"the labels are {len(classes)} class names; auto takes 2 to 20 "
                "classes (use --task classification)"
            )
        return y, "regression", None
    if len(classes) < 2:
        raise CliError("classification needs at least two distinct labels")
    if len(classes) == 2:
        return np.where(y == classes[1], 1.0, -1.0), "binary", classes
    return (y[:, None] == classes[None, :]).astype(np.float64), "multiclass", classes


def _accuracy(
    ds: datasets.Dataset, X: np.ndarray, y: np.ndarray, model: TwoLayerReLU
) -> float | None:
    if ds.task == "regression" or len(y) == 0:
        return None
    return datasets.accuracy(y, model.predict(X))


# ---------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------


def _short(count: float) -> str:
    """A count or rate in at most 5 characters: 7.5, 999, 12.3k, 4.56M."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:.3g}" if count < 100 else f"{count:.0f}"


def progress_bar(console=None):
    """A rich progress bar that fits the terminal: the bar takes what the label,
    ``done/total``, the statistics and the time left leave."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as RichProgress

    return RichProgress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=None),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeRemainingColumn(compact=True),
        console=console,
        expand=True,
        transient=False,
    )


class Progress:
    """A live progress bar (rich) showing loss, fired pairs and iterations/s."""

    def __init__(self, total: int, label: str, quiet: bool = False, console=None) -> None:
        self.total, self.label, self.quiet, self.console = total, label, quiet, console
        self._bar = None
        self._t0 = time.perf_counter()

    def __enter__(self) -> Progress:
        if not self.quiet:
            try:
                self._bar = progress_bar(self.console)
            except ImportError:  # pragma: no cover - rich is in the cli extra
                return self
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, stats="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, t: int, hist: History) -> None:
        rate = (t + 1) / max(time.perf_counter() - self._t0, 1e-9)
        parts = [
            f"loss {hist.loss[-1]:.3e}",
            f"fired {_short(hist.fired_pairs[-1])}",
            f"{_short(rate)} it/s",
        ]
        rss = hist.info.get("worker_peak_rss")
        if rss:  # sharded: the largest worker's peak memory
            parts.insert(2, f"mem {_short(max(rss))}B")
        if self._bar is not None:
            if self._bar.console.width < 70:  # narrow terminals: the essentials only
                del parts[1]
            self._bar.update(self._task, completed=t + 1, stats="  ".join(parts))
        elif not self.quiet and (t + 1) % max(1, self.total // 10) == 0:
            print(f"{self.label} {t + 1}/{self.total}  {'  '.join(parts)}", flush=True)


# ---------------------------------------------------------------------------
# outputs of a run
# ---------------------------------------------------------------------------


def write_outputs(
    out: Path, model: TwoLayerReLU, hist: History, ds: datasets.Dataset, extra: dict[str, Any]
) -> dict[str, Any]:
    """model.npz, history.json/.csv, summary.json, figures and report.html."""
    from .plots import write_report

    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "model.npz", ds.transform)
    hist.to_json(out / "history.json")
    hist.to_csv(out / "history.csv")
    per_point = hist.fired_pairs[0] / max(hist.n, 1) if len(hist) else float("nan")
    summary = {
        "data": ds.name,
        "task": ds.task,
        "n_train": int(ds.X_train.shape[0]),
        "n_test": int(ds.X_test.shape[0]),
        "d": hist.d,
        "width_m": hist.m,
        "outputs": hist.outputs,
        "method": hist.method,
        "lr": hist.lr,
        "iterations": len(hist),
        "initial_loss": hist.loss[0] if len(hist) else float("nan"),
        "final_loss": hist.final_loss,
        "train_accuracy": _accuracy(ds, ds.X_train, ds.y_train, model),
        "test_accuracy": _accuracy(ds, ds.X_test, ds.y_test, model),
        "fired_per_point_at_init": per_point,
        "expected_m_Q_b": theory.expected_fired(hist.m, hist.b),
        "paper_m_4_5": theory.paper_sparsity(hist.m),
        "preprocess_s": hist.preprocess_time,
        "per_iteration_s_median": float(np.median(hist.iteration_times)) if len(hist) else 0,
        **extra,
    }
    write_report(out, hist, summary, title=f"corrtree: {ds.name}, m={hist.m}, {hist.method}")
    return summary


def _print_summary(summary: dict[str, Any]) -> None:
    width = max(len(k) for k in summary)
    for k, v in summary.items():
        if v is None:
            continue
        print(
            f"  {k.ljust(width)}  {v:.6g}" if isinstance(v, float) else f"  {k.ljust(width)}  {v}"
        )


# ---------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------


def _steps(n: int, iters: int | None, batch_size: int | None, epochs: int | None) -> int:
    """The number of steps of a run (for the progress bar)."""
    if iters is not None and epochs is not None:
        raise CliError("give --iters or --epochs, not both")
    if epochs is None:
        return 100 if iters is None else iters
    return epochs * -(-n // min(batch_size or n, n))


def output_dir(path: Path, option: str) -> Path:
    """``path`` as a folder that exists and takes files, checked before any work."""
    if path.exists() and not path.is_dir():
        raise CliError(f"{option} {path} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise CliError(f"{option} {path} is not a writable folder ({exc.strerror})") from None
    return path


def cmd_train(args: argparse.Namespace) -> int:
    if args.resume:
        return _resume(Path(args.resume), args.quiet, args.workers, args.scheduler)
    out = output_dir(Path(args.out or f"corrtree-out/{Path(args.data).stem}"), "--out")
    if args.data not in BUILTIN_DATA:  # so that --resume works from any folder
        args.data = str(Path(args.data).resolve())
    ds = load_data(
        args.data,
        args.seed,
        args.test_size,
        not args.no_normalize,
        args.task,
        args.header,
        not args.no_standardize,
    )
    lr = "auto" if args.lr == "auto" else _positive_float(args.lr, "--lr")
    model = TwoLayerReLU.init(
        d=ds.X_train.shape[1], m=args.width, outputs=ds.outputs, seed=args.seed
    )
    run_id = uuid.uuid4().hex
    sgd = {
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "momentum": args.momentum,
        "nesterov": args.nesterov,
        "weight_decay": args.weight_decay,
        "schedule": args.schedule,
        "shuffle_seed": args.seed,
    }
    steps = _steps(ds.X_train.shape[0], args.iters, args.batch_size, args.epochs)
    eval_set = (ds.X_test, ds.y_test) if ds.X_test.shape[0] else None
    settings = {k: v for k, v in vars(args).items() if k not in ("func", "resume")}
    atomic_write_json(out / "run.json", {**settings, "run_id": run_id, "finished": False})
    try:
        with (
            cluster(args.workers, args.scheduler) as client,
            Progress(steps, args.method, args.quiet) as progress,
        ):
            hist = train(
                model,
                ds.X_train,
                ds.y_train,
                method=args.method,
                lr=lr,
                iters=args.iters,
                callback=progress,
                eval_set=eval_set if args.batch_size or args.epochs else None,
                **sgd,
                checkpoint=out / "checkpoint.npz",
                checkpoint_every=args.checkpoint_every,
                run_id=run_id,
                lr_retries=_config.LR_RETRIES if lr == "auto" else 0,
                client=client,
            )
    except KeyboardInterrupt as exc:
        raise _interrupted(exc, out) from None
    except WorkerLost as exc:
        raise _lost(exc, out) from None
    return _finish(out, model, hist, ds, {**settings, "run_id": run_id}, {})


@contextlib.contextmanager
def cluster(workers: int | None, scheduler: str | None):
    """A Dask client for ``--workers N`` (a LocalCluster on 127.0.0.1, no dashboard)
    or ``--scheduler ADDRESS`` (an existing cluster); ``None`` without either."""
    if workers is None and scheduler is None:
        yield None
        return
    if workers is not None and scheduler is not None:
        raise CliError("give --workers or --scheduler, not both")
    try:
        from dask.distributed import Client
    except ImportError:
        raise CliError(
            "--workers and --scheduler need dask.distributed: pip install 'corrtree[distributed]'"
        ) from None
    from .distributed import local_client

    try:
        client = local_client(workers) if workers is not None else Client(scheduler, timeout=30)
    except OSError as exc:
        raise CliError(f"cannot reach the Dask scheduler {scheduler}: {exc}") from None
    try:
        yield client
    finally:
        cluster_ = client.cluster
        client.close()
        if workers is not None and cluster_ is not None:
            cluster_.close()


def _lost(exc: Exception, out: Path) -> CliError:
    has = (out / "checkpoint.npz").is_file()
    hint = f"; continue with: corrtree train --resume {out}" if has else ""
    return CliError(f"{exc}{hint}")


def _interrupted(exc: KeyboardInterrupt, out: Path) -> KeyboardInterrupt:
    if "state saved" in str(exc):
        return KeyboardInterrupt(f"{exc}; continue with: corrtree train --resume {out}")
    return KeyboardInterrupt(
        "interrupted before the first iteration ended: nothing was "
        "saved, there is nothing to resume"
    )


def _finish(
    out: Path,
    model: TwoLayerReLU,
    hist: History,
    ds: datasets.Dataset,
    run: dict[str, Any],
    extra: dict[str, Any],
) -> int:
    """Write the results of a finished run and retire its checkpoint."""
    extra = {
        **extra,
        "lr_halvings": hist.info.get("lr_halvings", 0),
        "whole_run_s": hist.total_time,
    }
    if "costs" in hist.info:  # method="auto": what the model expected, next to the measurement
        extra["cost_model_s"] = hist.info["costs"]
    if hist.epoch_loss:  # mini-batch SGD
        extra["optimizer"] = {
            k: run.get(k)
            for k in ("batch_size", "epochs", "momentum", "nesterov", "weight_decay", "schedule")
        }
        extra["steps_per_epoch"] = hist.info.get("steps_per_epoch")
        extra["epoch_train_loss"] = hist.epoch_loss[-1]
    if hist.info.get("worker_peak_rss"):
        extra["workers"] = len(hist.info["worker_peak_rss"])
        extra["worker_peak_rss_gib"] = [r / 2**30 for r in hist.info["worker_peak_rss"]]
    summary = write_outputs(out, model, hist, ds, extra)
    atomic_write_json(out / "run.json", {**run, "finished": True})
    print(f"wrote {out}/ (model.npz, history.json, history.csv, report.html, figures)")
    _print_summary(summary)
    return 0


def _resume(out: Path, quiet: bool, workers: int | None, scheduler: str | None) -> int:
    run_file = out / "run.json"
    if not run_file.is_file():
        raise CliError(f"{out} has no run.json: not a folder written by corrtree train")
    try:
        run = json.loads(run_file.read_text())
        # runs written before standardization existed did not standardize
        args = argparse.Namespace(**{"header": None, "no_standardize": True, **run})
        data, seed, test_size = args.data, args.seed, args.test_size
        normalize, task = not args.no_normalize, args.task
    except (ValueError, TypeError, AttributeError) as exc:
        raise CliError(f"{run_file} is damaged ({exc})") from None
    if run.get("finished"):
        raise CliError(f"the run in {out} finished; its model is {out / 'model.npz'}")
    ck = out / "checkpoint.npz"
    if not ck.is_file():
        raise CliError(f"{out} has no checkpoint: the run stopped before its first one")
    ds = load_data(data, seed, test_size, normalize, task, args.header, not args.no_standardize)
    iters = _steps(
        ds.X_train.shape[0],
        args.iters,
        getattr(args, "batch_size", None),
        getattr(args, "epochs", None),
    )
    if workers is None and scheduler is None:  # the run's own cluster, unless told otherwise
        workers, scheduler = run.get("workers"), run.get("scheduler")
    try:
        with cluster(workers, scheduler) as client, Progress(iters, "resuming", quiet) as progress:
            model, hist = resume(
                ck,
                ds.X_train,
                ds.y_train,
                callback=progress,
                run_id=run.get("run_id"),
                client=client,
                eval_set=(ds.X_test, ds.y_test)
                if ds.X_test.shape[0] and (run.get("batch_size") or run.get("epochs"))
                else None,
            )
    except KeyboardInterrupt as exc:
        raise _interrupted(exc, out) from None
    except WorkerLost as exc:
        raise _lost(exc, out) from None
    return _finish(out, model, hist, ds, run, {"resumed": True})


def cmd_demo(args: argparse.Namespace) -> int:
    out = output_dir(Path(args.out), "--out")
    ds = datasets.digits(test_size=0.25, seed=0)
    X, y = ds.X_train, ds.y_train
    print(
        f"corrtree {__version__} demo: scikit-learn's digits ({X.shape[0]} training and "
        f"{ds.X_test.shape[0]} test images, 64 pixels, 10 classes), m = {args.width} "
        f"neurons, b = sqrt(0.4 ln m)"
    )
    model = TwoLayerReLU.init(d=X.shape[1], m=args.width, outputs=10, seed=0)
    dense_model = TwoLayerReLU(model.W, model.a, model.b)
    with Progress(args.iters, "training (fastest exact method)", args.quiet) as progress:
        hist = train(model, X, y, method="auto", iters=args.iters, callback=progress)
    with Progress(args.dense_iters, "dense GD, same start and lr", args.quiet) as progress:
        dense = train(
            dense_model, X, y, method="dense", lr=hist.lr, iters=args.dense_iters, callback=progress
        )
    k = min(len(dense), len(hist))
    same = bool(np.allclose(dense.loss[:k], hist.loss[:k], rtol=1e-9, atol=0))
    speedup = float(np.median(dense.iteration_times) / np.median(hist.iteration_times))
    # dense's whole run: its set-up, the same lr computation, every iteration at its median
    dense_whole = (
        dense.preprocess_time
        + hist.info.get("lr_s", 0.0)
        + args.iters * float(np.median(dense.iteration_times))
    )
    whole = dense_whole / hist.total_time
    summary = write_outputs(
        out,
        model,
        hist,
        ds,
        {
            "whole_run_s": hist.total_time,
            "dense_whole_run_s_extrapolated": dense_whole,
            "speedup_whole_run_vs_dense": whole,
            "dense_per_iteration_s_median": float(np.median(dense.iteration_times)),
            "speedup_per_iteration_vs_dense": speedup,
            "same_losses_as_dense": same,
            "cost_model": hist.info.get("costs"),
        },
    )
    print(
        f"\nfastest exact method (cost model): {hist.method}; whole run (set-up, lr and "
        f"{len(hist)} iterations) {hist.total_time:.2f} s vs dense {dense_whole:.2f} s "
        f"(extrapolated from {len(dense)} iterations): {whole:.1f}x faster (per iteration "
        f"{speedup:.1f}x); same losses as dense for {k} iterations: {same}"
    )
    print(
        f"fired neurons per image at init: {summary['fired_per_point_at_init']:.0f} of "
        f"{args.width} (m·Q(b) = {summary['expected_m_Q_b']:.0f}, paper m^(4/5) = "
        f"{summary['paper_m_4_5']:.0f}); neurons moved in the last iteration: "
        f"{hist.moved_neurons[-1]}"
    )
    print(
        f"accuracy: train {summary['train_accuracy']:.3f}, test {summary['test_accuracy']:.3f}"
        f" (loss {summary['initial_loss']:.4g} -> {summary['final_loss']:.4g})"
    )
    print(f"report: {out / 'report.html'}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    if args.out and Path(args.out).is_dir():
        raise CliError(f"--out {args.out} is a folder; give a file name for the predictions")
    if args.out:
        output_dir(Path(args.out).resolve().parent, "the folder of --out")
    model = TwoLayerReLU.load(args.model)
    transform = load_transform(args.model, model.d)
    X, y = _predict_inputs(args.data, model.d, args.header)
    if transform is not None:  # the model's own: what its training saw
        X = transform(X)
    elif not args.no_normalize:
        X = datasets.unit_rows(X)
    pred = model.predict(X)
    lines = [",".join(f"{v:.10g}" for v in np.atleast_1d(row)) for row in pred]
    text = "".join(line + "\n" for line in lines)
    if args.out:
        atomic_write_text(args.out, text)
        print(f"wrote {len(lines)} predictions to {args.out}")
    else:
        sys.stdout.write(text)
    if y is not None and y.dtype.kind == "f" and y.shape == pred.shape:
        print(f"mean squared error: {float(np.mean((pred - y) ** 2)):.6g}", file=sys.stderr)
    return 0


def _predict_inputs(path: str, d: int, header: bool | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows of ``d`` features from a .npz (X, optional y) or a .csv file (``d``
    columns, or ``d + 1`` with the label last)."""
    p = Path(path)
    if p.suffix.lower() == ".npz":
        if p.is_dir() or not p.is_file():
            raise CliError(f"data file {path} {'is a folder' if p.is_dir() else 'does not exist'}")
        try:
            with np.load(p, allow_pickle=False) as data:
                if "X" not in data.files:
                    raise CliError(f"{path} has no array X")
                X = np.asarray(data["X"])
                y = np.asarray(data["y"]) if "y" in data.files else None
        except CliError:
            raise
        except Exception as exc:
            raise CliError(f"cannot read data file {path}: {exc}") from exc
        if X.ndim != 2 or X.dtype.kind not in "biuf":
            raise CliError(
                f"X in {path} must be a 2-D numeric array (one row of {d} features "
                f"per point), got shape {X.shape} and dtype {X.dtype}"
            )
        if X.shape[1] != d:
            raise CliError(f"X in {path} has {X.shape[1]} features but the model expects {d}")
        if y is not None and (y.dtype.kind not in "biuf" or y.shape[:1] != X.shape[:1]):
            y = None
    elif p.suffix.lower() == ".csv":
        try:
            table = datasets.read_csv(p, header)
        except ValueError as exc:
            raise CliError(f"cannot read data file {path}: {exc}") from None
        cols = table.values.shape[1]
        if cols not in (d, d + 1):
            raise CliError(
                f"{path} has {cols} columns; the model expects {d} features (or "
                f"{d + 1} columns with a label last)"
            )
        try:
            X = table.numeric(stop=d)
        except ValueError as exc:
            raise CliError(f"cannot read data file {path}: {exc}") from None
        y = table.labels(d) if cols == d + 1 else None
    else:
        raise CliError(f"data file {path}: unknown format (use .npz or .csv)")
    X = X.astype(np.float64)
    if X.shape[0] == 0:
        raise CliError(f"{path} has no rows")
    if not np.isfinite(X).all():
        raise CliError(f"{path} contains NaN or infinite values")
    return X, None if y is None else y.astype(np.float64) if y.dtype.kind in "biuf" else y


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import ddfn, fast
    from .bench import distributed as bench_distributed
    from .bench import train as bench_train

    suites = {
        "ddfn": ddfn.run,
        "train": bench_train.run,
        "lazy": fast.run_lazy,
        "kernel": fast.run_kernel,
        "distributed": bench_distributed.run,
    }
    for name in args.suite.split(","):
        if name not in suites:
            raise CliError(f"unknown suite {name!r}; choose from {', '.join(suites)}")
    for name in args.suite.split(","):
        print(f"== {name} ({args.size}) ==", flush=True)
        suites[name](args.size, args.out)
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from . import experiments

    result = experiments.run(args.name, quick=args.quick, out_dir=args.out)
    print(result["summary"])
    print(f"wrote {args.out}/{args.name}.json, .png and .md")
    return 0


def _positive_float(text: str, name: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise CliError(f"{name} must be 'auto' or a number, got {text!r}") from None
    if not np.isfinite(v) or v <= 0:
        raise CliError(f"{name} must be a positive number, got {text!r}")
    return v


def _number(kind: type, low: float, high: float | None = None, what: str = "") -> Callable:
    """An argparse type: a finite ``kind`` number in ``[low, high)``."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(v) or v < low or (high is not None and v >= high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v

    return parse


_positive_int = _number(int, 1, what="a positive integer")
_count = _number(int, 0, what="an integer >= 0")
_fraction = _number(float, 0.0, 1.0, what="a number in [0, 1)")


def build_parser() -> argparse.ArgumentParser:
    from .experiments import EXPERIMENTS

    parser = argparse.ArgumentParser(
        prog="corrtree",
        description="Exact sublinear-time training of two-layer ReLU networks with "
        "weight-data correlation trees.",
    )
    parser.add_argument("--version", action="version", version=f"corrtree {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "demo",
        help="train on scikit-learn's digits and compare with dense GD",
        description="Train 2NN(m, b) on the digits data shipped with "
        "scikit-learn, with the fastest exact method (cost model) and with "
        "dense gradient descent for a few iterations; print accuracy, the "
        "per-iteration speed-up and the fire statistics; write a report.",
    )
    p.add_argument(
        "--width",
        type=_positive_int,
        default=2**14,
        help="number of hidden neurons m (default 16384)",
    )
    p.add_argument(
        "--iters",
        type=_positive_int,
        default=100,
        help="gradient steps of the fast run (default 100)",
    )
    p.add_argument(
        "--dense-iters",
        type=_positive_int,
        default=3,
        help="gradient steps of the dense comparison (default 3)",
    )
    p.add_argument(
        "--out", default="corrtree-demo", help="folder for the report (default ./corrtree-demo)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "train",
        help="train on built-in data or your own file",
        description="Train 2NN(m, b) by exact full-batch gradient descent. "
        "Writes model.npz, history.json, history.csv, summary.json, figures "
        "and report.html to --out.  Ctrl-C saves a checkpoint; continue with "
        "--resume DIR.",
    )
    p.add_argument(
        "--data",
        default="digits",
        help=f"{', '.join(BUILTIN_DATA)}, or a .npz file with arrays X and y, or a "
        ".csv file whose last column is the label (header optional)",
    )
    p.add_argument(
        "--width",
        type=_positive_int,
        default=4096,
        help="number of hidden neurons m (default 4096)",
    )
    p.add_argument(
        "--method",
        choices=METHODS,
        default="auto",
        help="training method (default auto: cheapest by the cost model)",
    )
    p.add_argument(
        "--iters", type=_count, default=None, help="gradient steps (default 100; or --epochs)"
    )
    p.add_argument(
        "--lr",
        default="auto",
        help="learning rate, or 'auto' for 1/λ_max of the NTK matrix (default)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help="mini-batch SGD with batches of N training points (default: full batch)",
    )
    p.add_argument(
        "--epochs", type=_count, default=None, help="passes over the data (instead of --iters)"
    )
    p.add_argument("--momentum", type=float, default=0.0, help="momentum μ in [0, 1) (default 0)")
    p.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    p.add_argument(
        "--weight-decay", type=float, default=0.0, help="weight decay λ >= 0 (default 0)"
    )
    p.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="constant",
        help="learning-rate schedule: constant, step (×0.1 at 1/2 and 3/4 of the epochs) "
        "or cosine (default constant)",
    )
    p.add_argument(
        "--seed",
        type=_count,
        default=0,
        help="seed of weights and split, an integer >= 0 (default 0)",
    )
    p.add_argument(
        "--test-size",
        type=_fraction,
        default=0.25,
        help="held-out share of the data (default 0.25)",
    )
    p.add_argument(
        "--task",
        choices=("auto", "regression", "classification"),
        default="auto",
        help="for your own file: auto treats 2-20 integer labels as classes",
    )
    p.add_argument(
        "--no-normalize",
        action="store_true",
        help="keep your file's rows as they are (default: scale to unit norm)",
    )
    p.add_argument(
        "--no-standardize",
        action="store_true",
        help="do not standardize the features (default: centre and scale each feature with "
        "the training split's mean and deviation, before the rows are scaled; the model "
        "file keeps the transform and predict applies it)",
    )
    p.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CSV: the first row is (--header) or is not (--no-header) a header "
        "(default: detected)",
    )
    p.add_argument("--out", help="output folder (default ./corrtree-out/<data>)")
    p.add_argument(
        "--checkpoint-every",
        type=_count,
        default=0,
        help="write the full training state every N iterations (default: only on Ctrl-C)",
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run saved in DIR (other options are read from DIR; --workers or "
        "--scheduler may change where it runs)",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help="shard the neurons over N local worker processes (Dask LocalCluster "
        "on 127.0.0.1, no dashboard); needs corrtree[distributed]",
    )
    p.add_argument(
        "--scheduler",
        metavar="tcp://HOST:PORT",
        default=None,
        help="shard the neurons over the workers of an existing Dask cluster",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "predict",
        help="predict with a saved model",
        description="Print (or write) the outputs of a saved model, one line per input row.",
    )
    p.add_argument("--model", required=True, help="model.npz written by corrtree train")
    p.add_argument(
        "--data",
        required=True,
        help=".npz with array X (and optionally y), or .csv with one row per "
        "point (an extra last column is taken as the label)",
    )
    p.add_argument("--out", help="write the predictions to this CSV file instead of stdout")
    p.add_argument(
        "--no-normalize",
        action="store_true",
        help="for a model file without a stored input transform: do not scale rows to unit "
        "norm (a model written by corrtree train applies its own transform)",
    )
    p.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CSV: the first row is (--header) or is not (--no-header) a header "
        "(default: detected)",
    )
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser(
        "bench",
        help="run the benchmark suites",
        description="Run benchmark suites side by side; print tables and "
        "write JSON and PNG files.  large is the size reported in README "
        "(tens of minutes); small runs in about 10 minutes.",
    )
    p.add_argument(
        "--size",
        choices=("small", "medium", "large"),
        default="small",
        help="problem sizes (default small)",
    )
    p.add_argument(
        "--suite",
        default="ddfn,train,lazy,kernel",
        help="comma-separated suites: ddfn, train, lazy, kernel, distributed (default: all but "
        "distributed, which needs corrtree[distributed])",
    )
    p.add_argument(
        "--out",
        default="benchmarks/results",
        help="folder for JSON and PNG (default benchmarks/results)",
    )
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "experiment",
        help="run one of the paper's claims as an experiment",
        description="Measure one statement of the paper; write NAME.json, "
        "NAME.png and NAME.md (a paragraph comparing measurement and claim).",
    )
    p.add_argument("name", choices=sorted(EXPERIMENTS), help="experiment")
    p.add_argument("--quick", action="store_true", help="small version (seconds)")
    p.add_argument("--out", default="experiments", help="output folder (default ./experiments)")
    p.set_defaults(func=cmd_experiment)
    return parser


def _terminate(signum, frame):  # SIGTERM stops like Ctrl-C (training saves a checkpoint)
    raise KeyboardInterrupt("terminated")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _terminate) if _main_thread() else None
    try:
        return args.func(args)
    except KeyboardInterrupt as exc:
        msg = str(exc) or "interrupted"
        print(f"corrtree: {msg}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (
        CliError,
        CheckpointError,
        TrainingDiverged,
        ValueError,
        MemoryError,
        FileNotFoundError,
        ImportError,
        OSError,
        WorkerLost,
    ) as exc:
        print(f"corrtree: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
