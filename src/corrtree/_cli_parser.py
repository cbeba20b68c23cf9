"""The command line's parser: its commands, options and their checks (the commands
themselves are in :mod:`corrtree.cli`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ._version import __version__
from .training._registry import METHODS
from .training._warmup import WARM_METHODS
from .training.optim import SCHEDULES

__all__ = ["BUILTIN_DATA", "build_parser", "positive_int"]

BUILTIN_DATA = ("digits", "breast_cancer", "sphere")


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


positive_int = _number(int, 1, what="a positive integer")
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
        type=positive_int,
        default=2**14,
        help="number of hidden neurons m (default 16384)",
    )
    p.add_argument(
        "--iters",
        type=positive_int,
        default=100,
        help="gradient steps of the fast run (default 100)",
    )
    p.add_argument(
        "--dense-iters",
        type=positive_int,
        default=3,
        help="gradient steps of the dense comparison (default 3)",
    )
    p.add_argument(
        "--out", default="corrtree-demo", help="folder for the report (default ./corrtree-demo)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(command="demo")

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
        type=positive_int,
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
        "--loss",
        choices=("squared", "logistic", "cross_entropy"),
        default="squared",
        help="training loss (default squared, the paper's): logistic for two classes, "
        "cross_entropy (softmax) for classes; with two classes cross_entropy trains the "
        "logistic loss of one output",
    )
    p.add_argument(
        "--device",
        default=None,
        help="train on this torch device (cuda, cuda:1, cpu, ...; needs corrtree[gpu]); "
        "default: the CPU trainers",
    )
    p.add_argument(
        "--implicit",
        action="store_true",
        help="never store W: regenerate W(0) from the seed (counter-based generator) and "
        "keep only the coefficients of the pairs that ever fired; for widths beyond "
        "memory (methods lazy and kernel)",
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
        type=positive_int,
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
        type=positive_int,
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
    p.set_defaults(command="train")

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
        "--proba",
        action="store_true",
        help="class probabilities instead of the outputs, one column per class (a model "
        "trained with --loss logistic or cross_entropy: the summary.json beside it says)",
    )
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
    p.set_defaults(command="predict")

    p = sub.add_parser(
        "bench",
        help="run the benchmark suites",
        description="Run benchmark suites side by side; print tables and "
        "write JSON and PNG files.  large is the size reported in "
        "benchmarks/README.md (tens of minutes); small runs in minutes.",
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
        help="comma-separated suites: ddfn, train, lazy, kernel, distributed, wide, widths, losses "
        "(default: ddfn, train, lazy and kernel)",
    )
    p.add_argument(
        "--out",
        default="benchmarks/results",
        help="folder for JSON and PNG (default benchmarks/results)",
    )
    p.set_defaults(command="bench")

    p = sub.add_parser(
        "experiment",
        help="run one of the paper's claims as an experiment",
        description="Measure one statement of the paper; write NAME.json, "
        "NAME.png and NAME.md (a paragraph comparing measurement and claim).",
    )
    p.add_argument("name", choices=sorted(EXPERIMENTS), help="experiment")
    p.add_argument("--quick", action="store_true", help="small version (seconds)")
    p.add_argument("--out", default="experiments", help="output folder (default ./experiments)")
    p.set_defaults(command="experiment")

    p = sub.add_parser(
        "warmup",
        help="compile the kernels now (once per install), so that later runs start at once",
        description="Compile numba kernels of the given methods into the cache (the package "
        "folder, or numba's user cache folder when that is read-only). Every run also "
        "does this for its own method before its clock starts.",
    )
    p.add_argument(
        "--methods",
        default=",".join(WARM_METHODS),
        help=f"comma-separated methods (default {','.join(WARM_METHODS)})",
    )
    p.set_defaults(command="warmup")
    return parser
