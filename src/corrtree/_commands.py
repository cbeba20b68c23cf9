"""The ``corrtree`` commands (demo, train, predict, bench, experiment, warmup) behind the
entry point of :mod:`corrtree.cli`, which loads this module once its stop signals are
installed."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, _config, datasets, theory
from ._cli_data import (
    CliError,
    accuracy_of,
    load_data,
    positive_float,
    predict_inputs,
    trained_loss,
)
from ._cli_parser import BUILTIN_DATA
from ._io import atomic_write_json, atomic_write_text
from ._progress import Progress
from .distributed import SHARDED_FORMAT, WorkerLost
from .model import TwoLayerReLU
from .preprocessing import load_transform
from .training import CheckpointError, History, TrainingDiverged, resume, train, warmup
from .training._choice import check_device
from .training.checkpoint import FORMAT, read_manifest
from .training.losses import get_loss
from .training.optim import SGD

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
        "loss": hist.info.get("loss", "squared"),
        "lr": hist.lr,
        "iterations": len(hist),
        "initial_loss": hist.loss[0] if len(hist) else float("nan"),
        "final_loss": hist.final_loss,
        "train_accuracy": accuracy_of(ds, ds.X_train, ds.y_train, model),
        "test_accuracy": accuracy_of(ds, ds.X_test, ds.y_test, model),
        "fired_per_point_at_init": per_point,
        "expected_m_Q_b": theory.expected_fired(hist.m, hist.b),
        "paper_m_4_5": theory.paper_sparsity(hist.m),
        "preprocess_s": hist.preprocess_time,
        "compile_s": hist.info.get("compile_s", 0.0),
        "kernels_compiled": hist.info.get("compiled", 0),
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
    """The number of steps of a run (for the progress bar; a new run's flags give at most
    one of ``iters`` and ``epochs``, :func:`_flags_before_the_data`)."""
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
        return _resume(Path(args.resume), args.quiet, args.workers, args.scheduler, args.device)
    out = Path(args.out or f"corrtree-out/{Path(args.data).stem}")
    _refuse_over_an_interrupted_run(out)
    run_id = uuid.uuid4().hex
    try:  # a signal once the folder is made says what it holds, whenever it comes
        return _new_run(args, output_dir(out, "--out"), run_id)
    except KeyboardInterrupt as exc:
        raise _interrupted(exc, out, run_id) from None
    except WorkerLost as exc:
        raise _lost(exc, out) from None


def _refuse_over_an_interrupted_run(out: Path) -> None:
    """A new run in ``out`` would replace the ``run.json`` of an interrupted run there at
    its first step, and its checkpoint at its first save: refused in one line while that
    run can be resumed (unfinished, with its own checkpoint).  A finished run's folder,
    or one whose checkpoint cannot be read, takes a new run."""
    saved = _saved_run_id(out)
    try:
        run = json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return
    if saved and isinstance(run, dict) and not run.get("finished") and saved == run.get("run_id"):
        raise CliError(
            f"--out {out} holds an interrupted run; continue it with: corrtree train "
            f"--resume {out} (or give another --out; deleting {out / 'checkpoint.npz'} "
            "starts over there)"
        )


def _saved_run_id(out: Path) -> str | None:
    """The run id in the manifest of ``out/checkpoint.npz`` (one process or sharded), or
    ``None`` where there is no readable checkpoint."""
    try:
        manifest = read_manifest(out / "checkpoint.npz", (FORMAT, SHARDED_FORMAT))
        run_id = manifest["meta"].get("run_id")
    except (CheckpointError, OSError, KeyError, TypeError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) else None


def _new_run(args: argparse.Namespace, out: Path, run_id: str) -> int:
    """``corrtree train`` without ``--resume``: load, train, write the results."""
    if args.data not in BUILTIN_DATA:  # so that --resume works from any folder
        args.data = str(Path(args.data).resolve())
    lr = _flags_before_the_data(args)
    ds = load_data(
        args.data,
        args.seed,
        args.test_size,
        not args.no_normalize,
        args.task,
        args.header,
        not args.no_standardize,
    )
    model = TwoLayerReLU.init(
        d=ds.X_train.shape[1],
        m=args.width,
        outputs=ds.outputs,
        seed=args.seed,
        implicit=args.implicit,
    )
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
    run = {**settings, "run_id": run_id}
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
            callback=_recording(out, run, progress),
            eval_set=eval_set if args.batch_size or args.epochs else None,
            **sgd,
            checkpoint=out / "checkpoint.npz",
            checkpoint_every=args.checkpoint_every,
            run_id=run_id,
            lr_retries=_config.LR_RETRIES if lr == "auto" else 0,
            client=client,
            device=args.device,
            loss=_loss_for(args.loss, ds),
        )
    return _finish(out, model, hist, ds, run, {})


def _flags_before_the_data(args: argparse.Namespace) -> str | float:
    """The flags of a new run that need no data, refused in one line before the data
    loads (and before a progress bar starts): ``--lr`` (returned, parsed), ``--iters``
    against ``--epochs``, the optimizer's, and ``--device`` (there, and taking the
    method, in one process).  What needs the data (the memory a run takes, ``--loss``
    against the labels) is checked once it is loaded, still before any kernel runs."""
    lr = "auto" if args.lr == "auto" else positive_float(args.lr, "--lr")
    if args.iters is not None and args.epochs is not None:
        raise CliError("give --iters or --epochs, not both")
    SGD(
        args.batch_size,
        args.epochs,
        args.momentum,
        args.nesterov,
        args.weight_decay,
        args.schedule,
        args.seed,
    )
    if args.device is not None:
        if args.workers is not None or args.scheduler is not None:
            raise CliError("--device runs in one process: leave out --workers and --scheduler")
        try:
            check_device(args.device, args.method, None, None)
        except ValueError as exc:
            raise CliError(f"--device: {exc}") from None
    return lr


def _loss_for(loss: str, ds: datasets.Dataset) -> str:
    """``--loss`` for the data: cross-entropy of two classes is the logistic loss of their
    one output (±1 labels); a classification loss needs classes."""
    if loss != "squared" and ds.task == "regression":
        raise CliError(f"--loss {loss} needs class labels; {ds.name} is a regression task")
    return "logistic" if loss == "cross_entropy" and ds.outputs == 1 else loss


def _recording(
    out: Path, run: dict[str, Any], progress: Callable[[int, History], Any]
) -> Callable[[int, History], Any]:
    """``progress``, writing ``out/run.json`` (unfinished) when the first step ends:
    everything that can refuse the run has run by then, so a refused run leaves the
    folder (an interrupted run's ``--resume`` state included) as it was."""
    written: list[bool] = []

    def callback(t: int, hist: History) -> Any:
        if not written:
            atomic_write_json(out / "run.json", {**run, "finished": False})
            written.append(True)
        return progress(t, hist)

    return callback


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


def _interrupted(exc: KeyboardInterrupt, out: Path, run_id: str | None) -> KeyboardInterrupt:
    """The one line of an interrupted run: whether it left a checkpoint to resume from
    (the file's run id, not the message, decides: a second signal may have replaced
    the message that said so)."""
    if run_id is not None and _saved_run_id(out) == run_id:
        said = str(exc) if "state saved" in str(exc) else "interrupted; state saved"
        return KeyboardInterrupt(f"{said}; continue with: corrtree train --resume {out}")
    return KeyboardInterrupt(
        "interrupted before the first checkpoint: nothing was saved, there is nothing to resume"
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


def _resume(
    out: Path, quiet: bool, workers: int | None, scheduler: str | None, device: str | None
) -> int:
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
    device = _resume_device(device, run.get("device"))
    run = {**run, "device": device}
    try:
        with cluster(workers, scheduler) as client, Progress(iters, "resuming", quiet) as progress:
            model, hist = resume(
                ck,
                ds.X_train,
                ds.y_train,
                callback=_recording(out, run, progress),
                run_id=run.get("run_id"),
                client=client,
                device=device,
                eval_set=(ds.X_test, ds.y_test)
                if ds.X_test.shape[0] and (run.get("batch_size") or run.get("epochs"))
                else None,
            )
    except KeyboardInterrupt as exc:
        raise _interrupted(exc, out, run.get("run_id")) from None
    except WorkerLost as exc:
        raise _lost(exc, out) from None
    return _finish(out, model, hist, ds, run, {"resumed": True})


def _resume_device(asked: str | None, recorded: Any) -> str | None:
    """Where a resumed run trains: ``--device`` when given (a checkpoint resumes on any
    device), else the run's own device, refused in one line naming ``--device`` when it
    is not here."""
    device = asked if asked is not None else recorded
    if device is None:
        return None
    from ._device import resolve

    try:
        resolve(device)
    except ValueError as exc:
        if asked is not None:
            raise CliError(f"--device: {exc}") from None
        raise CliError(
            f"the run trained on {device!r}, which is not here ({exc}); "
            "resume it on another device with --device (e.g. --device cpu)"
        ) from None
    return device


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
    print(_compile_line(hist, dense))
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


def _compile_line(*hists: History) -> str:
    """What loading the kernels took, apart from every time the runs report."""
    seconds = sum(h.info.get("compile_s", 0.0) for h in hists)
    compiled = sum(h.info.get("compiled", 0) for h in hists)
    if compiled:
        return (
            f"compiling kernels, once per install: {seconds:.1f} s ({compiled} functions; "
            "not part of any time below)"
        )
    return f"kernels loaded from the cache: {seconds:.1f} s (not part of any time below)"


def cmd_warmup(args: argparse.Namespace) -> int:
    try:  # every name checked before anything compiles; '' names no method
        took = warmup([name.strip() for name in args.methods.split(",")])
    except ValueError as exc:
        raise CliError(f"--methods {args.methods!r}: {exc}") from None
    if took.compiled:
        print(f"compiled {took.compiled} functions in {took.seconds:.1f} s, once per install")
    else:
        print(f"every kernel was compiled already (loaded from the cache in {took.seconds:.1f} s)")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    if args.out and Path(args.out).is_dir():
        raise CliError(f"--out {args.out} is a folder; give a file name for the predictions")
    if args.out:
        output_dir(Path(args.out).resolve().parent, "the folder of --out")
    model = TwoLayerReLU.load(args.model)
    transform = load_transform(args.model, model.d)
    X, y = predict_inputs(args.data, model.d, args.header)
    if transform is not None:  # the model's own: what its training saw
        X = transform(X)
    elif not args.no_normalize:
        X = datasets.unit_rows(X)
    pred = model.predict(X)
    if args.proba:
        pred = get_loss(trained_loss(Path(args.model))).probabilities(pred.reshape(len(X), -1))
    lines = [",".join(f"{v:.10g}" for v in np.atleast_1d(row)) for row in pred]
    text = "".join(line + "\n" for line in lines)
    if args.out:
        atomic_write_text(args.out, text)
        print(f"wrote {len(lines)} predictions to {args.out}")
    else:
        sys.stdout.write(text)
    if not args.proba and y is not None and y.dtype.kind == "f" and y.shape == pred.shape:
        print(f"mean squared error: {float(np.mean((pred - y) ** 2)):.6g}", file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import ddfn, fast, losses, wide, widths
    from .bench import distributed as bench_distributed
    from .bench import train as bench_train

    suites = {
        "ddfn": ddfn.run,
        "train": bench_train.run,
        "lazy": fast.run_lazy,
        "kernel": fast.run_kernel,
        "distributed": bench_distributed.run,
        "wide": wide.run,
        "widths": widths.run,
        "losses": losses.run,
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


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": cmd_demo,
    "train": cmd_train,
    "predict": cmd_predict,
    "bench": cmd_bench,
    "experiment": cmd_experiment,
    "warmup": cmd_warmup,
}


#: What a command reports as ``corrtree: error: ...`` (one line, exit status 1): bad input,
#: files, memory, a lost worker, a diverging run; anything else is a bug and shows its
#: traceback.
ERRORS: tuple[type[BaseException], ...] = (
    CliError,
    CheckpointError,
    TrainingDiverged,
    ValueError,
    MemoryError,
    FileNotFoundError,
    ImportError,
    OSError,
    WorkerLost,
)
