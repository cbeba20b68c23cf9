"""On one GPU: corrtree's array path against PyTorch dense gradient descent on that GPU.

For each workload (W1-W5 of :mod:`.workloads`, W1 at a wide width, and two variants of
W1 it was not tuned on: other labels, half the learning rate), in one process:

- PyTorch dense gradient descent with explicit gradients, the same data, model,
  learning rate and iterations: float64, float32 with TF32 off, and TF32; its first
  loss must equal corrtree's (1e-9, float64);
- corrtree on the device (``train(..., device=...)``): every method that has a device
  path, and ``auto``; whole runs with set-up and ``lr="auto"``; the first losses against
  PyTorch float64 (1e-9) and the final weights of the whole runs against each other (a
  sketch, 1e-9);
- corrtree's CPU trainers (the cost model's pick) and dense numpy, in fresh processes
  with all the machine's cores and with two, on some workloads (``cpu_cases``).

Dense runs (PyTorch, corrtree's device dense, dense numpy) cost the same every
iteration: they run ``measured`` iterations after a warm-up step and are extrapolated
(flagged); so are CPU runs past their budget.  The device is synchronized before every
clock reading.  JSON in ``benchmarks/results/gpu_SIZE.json``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from .._device import synchronize
from ..model import TwoLayerReLU
from ..training import train
from ._util import in_child, print_table, save_result
from .op_counts import H200
from .rates import measure_rates
from .workloads import WORKLOADS, load, one_run

__all__ = ["SIZES", "run"]

SIZES: dict[str, dict[str, Any]] = {
    # small: on the CPU, shrunk, to check the script (the tests run it)
    "small": {
        "device": "cpu",
        "scale_m": 1 / 64,
        "scale_n": 1 / 8,
        "iters": 6,
        "wide_m": 2**12,
        "measured": 2,
        "cpu_cases": ("W5",),
        "cpu_budget_s": 10.0,
        "device_budget_s": 8.0,
        "threads": (2, 1),
        "rates_size": "small",
        "model_steps": {"W1": 4, "W5": 4},
    },
    "large": {
        "device": "cuda",
        "scale_m": 1.0,
        "scale_n": 1.0,
        "iters": None,
        "wide_m": 2**22,
        "measured": 5,
        "cpu_cases": ("W1", "W2", "W5"),
        "cpu_budget_s": 8.0,
        "device_budget_s": 8.0,
        "threads": (None, 2),  # None: every core
        "rates_size": "large",
        # the steps a model check counts (:func:`_model_check`), by workload
        "model_steps": {"W1": 12, "W2": 8, "W3": 8, "W4": 6, "W5": 12},
    },
}
SEED = 7
#: The fewest steps a budgeted device run takes before it may stop and be extrapolated.
MIN_STEPS = 2


def _cases(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The suite's cases by name: W1 at its width and at ``wide_m``, W2–W5, W1 with other
    labels and with half its learning rate; a size that names ``cases`` keeps those
    alone, in the plan (:func:`plan`) as in the runs."""
    w1 = WORKLOADS["W1"]
    cases = {"W1": dict(w1), "W1 wide": {**w1, "m": int(cfg["wide_m"] / cfg["scale_m"])}}
    cases.update({k: dict(v) for k, v in WORKLOADS.items() if k != "W1"})
    cases["W1 other labels"] = {**w1, "labels_seed": 1}
    cases["W1 lr/2"] = {**w1, "lr_factor": 0.5}
    if cfg.get("cases"):  # a size that names its cases runs (and plans) those alone
        return {k: v for k, v in cases.items() if k in cfg["cases"]}
    return cases


def _data(case: dict[str, Any], scale_n: float) -> tuple[np.ndarray, np.ndarray]:
    X, Y = load(case["data"], case["args"], scale_n)
    if "labels_seed" in case:
        Y = np.random.default_rng(case["labels_seed"]).uniform(-1.0, 1.0, size=Y.shape)
    return X, Y


def dense_step(Wt: Any, Xt: Any, Yt: Any, At: Any, b: float, step: float) -> float:
    """One step of PyTorch dense gradient descent with explicit gradients (two matrix
    products and a mask), ``Wt`` updated in place; the loss before it (a host read, which
    synchronizes).  ``step`` is ``lr/sqrt(m)``."""
    import torch

    U = Wt @ Xt.T
    F = U >= b
    err = (torch.clamp(U - b, min=0.0).T @ At) / math.sqrt(Wt.shape[0]) - Yt
    Wt -= step * (((At @ err.T) * F) @ Xt)
    return 0.5 * float((err * err).sum())


def torch_dense(X, Y, model, lr, iters, measured, dev, precision: str) -> dict[str, Any]:
    """PyTorch dense GD with explicit gradients (no autograd): ``measured`` timed steps
    after one warm-up step, extrapolated to ``iters``; the first loss."""
    import torch

    dtype = torch.float64 if precision == "float64" else torch.float32
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        synchronize(dev)
        t0 = time.perf_counter()
        Xt = torch.as_tensor(X, dtype=dtype, device=dev)
        Yt = torch.as_tensor(Y, dtype=dtype, device=dev)
        At = torch.as_tensor(np.array(model.output_weights), dtype=dtype, device=dev)
        # a copy: the steps update Wt in place, and on the CPU in float64 as_tensor would
        # share the model's (read-only) W(0) with it
        Wt = torch.tensor(model.W, dtype=dtype, device=dev)
        synchronize(dev)
        setup = time.perf_counter() - t0
        step = lr / math.sqrt(model.m)
        losses, times = [], []
        for _ in range(measured + 1):
            t0 = time.perf_counter()
            loss = dense_step(Wt, Xt, Yt, At, model.b, step)
            times.append(time.perf_counter() - t0)
            losses.append(loss)
        per = float(np.median(times[1:]))
        return {
            "total_s": setup + times[0] + per * (iters - 1),
            "setup_s": setup,
            "iteration_s": per,
            "measured": measured,
            "extrapolated": iters > measured + 1,
            "first_loss": losses[0],
        }
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def device_run(X, Y, model, method, lr, iters, measured, device, budget_s) -> dict[str, Any]:
    """corrtree on the device: dense for ``measured`` steps (extrapolated), the others
    whole; the first loss and a sketch of the final weights."""
    dense = method == "dense"
    steps = min(iters, measured + 1) if dense else iters
    t0 = time.perf_counter()

    # past the budget the run stops and is extrapolated, but never before its second
    # step: the iteration time is the median of the steps after the first (which may
    # load kernels), and a model check compares at least two steps' counts
    floor = min(steps, MIN_STEPS)

    def within_budget(t: int, hist) -> bool:
        return t + 1 < floor or time.perf_counter() - t0 < budget_s or t + 1 >= steps

    hist = train(
        model, X, Y, method=method, lr=lr, iters=steps, device=device, callback=within_budget
    )
    steps = len(hist)
    times = hist.iteration_times
    per = float(np.median(times[1:])) if len(times) > 1 else float(times[0])
    total = hist.total_time + (iters - steps) * per
    return {
        "method": hist.method,
        "lr": hist.lr,
        "total_s": float(total),
        "setup_s": float(hist.preprocess_time),
        "iteration_s": per,
        "extrapolated": steps < iters,
        "first_loss": float(hist.loss[0]),
        "loss": [float(v) for v in hist.loss[:5]],
        "lr_s": float(hist.info.get("lr_s", 0.0)),
        # the first steps' times, against which a model check sets its prediction
        "iteration_times": [float(v) for v in times[:40]],
    }


def _threads_env(threads: int | None) -> dict[str, str | None]:
    keys = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    value = None if threads is None else str(threads)
    return dict.fromkeys(keys, value)


def cpu_run(case, cfg, method: str, threads: int | None, lr) -> dict[str, Any]:
    """A CPU run of ``method`` in a fresh process with ``threads`` threads (all: None)."""
    saved = {k: os.environ.get(k) for k in _threads_env(None)}
    for k, v in _threads_env(threads).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        m = max(256, int(case["m"] * cfg["scale_m"]))
        iters = cfg["iters"] or case["iters"]
        measured = 1 if method == "dense" else cfg["measured"]
        data = (case["data"], case["args"], cfg["scale_n"], m, iters, measured)
        return in_child(one_run, method, *data, cfg["cpu_budget_s"], lr, settle_first=False)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: Seconds a plan allows the whole suite on the device (the device's lease is 15 minutes,
#: start-up and idle time included).
PLAN_LIMIT_S = 480.0
#: Planned seconds beyond a run's budget: a device run's set-up and ``lr="auto"``, a CPU
#: run's fresh process (imports, the kernels loaded from the cache, ``G``, the set-up).
DEVICE_SETUP_S = 2.0
CPU_SETUP_S = 10.0
#: Planned seconds of measuring the device's rates, and of one counted run of a model
#: check (:func:`_model_check`: a set-up and a few steps, each operation counted).
RATES_S = 20.0
MODEL_CHECK_S = 4.0


def plan(cfg: dict[str, Any]) -> dict[str, Any]:
    """The suite's planned time, a bound printed before anything runs: every device run
    at its budget plus its set-up, PyTorch's three precisions at ``measured + 1`` steps
    priced by the validated model (:mod:`.device_count`), every CPU run at its budget
    plus a fresh process.  Past :data:`PLAN_LIMIT_S` the device runs' budget shrinks
    (to 3 s at least), then CPU cases are dropped from the end; the plan says which."""
    from .device_count import count_dense_step
    from .op_counts import modelled_seconds

    cfg = dict(cfg)
    cases = _cases(cfg)
    torch_s = 0.0
    for case in cases.values():
        n = int(case["args"].get("n", 1797 if case["data"] == "digits" else 569) * cfg["scale_n"])
        d = case["args"].get("d", {"patches": 768, "digits": 64}.get(case["data"], 30))
        K = 10 if case["data"] == "digits" else 1
        m = max(256, int(case["m"] * cfg["scale_m"]))
        step = count_dense_step(max(16, n), d, K, 1024).scaled(m / 1024)
        torch_s += 3 * (cfg["measured"] + 1) * modelled_seconds(step)
    methods = 4  # dense, lazy, kernel, auto

    checks = len(cfg.get("model_steps", {})) * (methods - 1) * MODEL_CHECK_S

    def total(c: dict[str, Any]) -> float:
        device = len(cases) * methods * (c["device_budget_s"] + DEVICE_SETUP_S)
        device += RATES_S + checks
        cpu = len(c["cpu_cases"]) * len(c["threads"]) * 2 * (c["cpu_budget_s"] + CPU_SETUP_S)
        return device + cpu + torch_s

    while total(cfg) > PLAN_LIMIT_S and cfg["device_budget_s"] > 3.0:
        cfg["device_budget_s"] = max(3.0, cfg["device_budget_s"] - 1.0)
    dropped = []
    while total(cfg) > PLAN_LIMIT_S and cfg["cpu_cases"]:
        dropped.append(cfg["cpu_cases"][-1])
        cfg["cpu_cases"] = tuple(cfg["cpu_cases"][:-1])
    return {"cfg": cfg, "planned_s": total(cfg), "torch_s": torch_s, "dropped_cpu": dropped}


def run(size: str = "large", out_dir: str = "benchmarks/results") -> dict[str, Any]:
    from .._device import resolve

    planned = plan(SIZES[size])
    cfg = planned["cfg"]
    print(
        f"planned: at most {planned['planned_s']:.0f} s (device runs {cfg['device_budget_s']:.0f} s"
        f" each, CPU cases {', '.join(cfg['cpu_cases']) or 'none'})",
        flush=True,
    )
    dev = resolve(cfg["device"])
    from ..training._registry import DEVICE_TRAINERS

    methods = [*DEVICE_TRAINERS, "auto"]
    # the device's start-up (context, libraries) and the kernels: outside every figure
    warm_X, warm_Y = _data(WORKLOADS["W5"], 1 / 8)
    for method in methods:
        tiny = TwoLayerReLU.init(d=warm_X.shape[1], m=256, outputs=warm_Y.shape[1], seed=SEED)
        train(tiny, warm_X, warm_Y, method=method, iters=3, device=dev)
    torch_dense(warm_X, warm_Y, tiny, 0.1, 3, 1, dev, "float64")
    results: dict[str, Any] = {}
    # the device's own rates first: the model checks price their counts with them
    measured = _guarded(measure_rates, dev, cfg["rates_size"])
    print("rates measured:", measured.get("rates", measured), flush=True)
    payload = {
        "size": size,
        "device": str(dev),
        "device_name": _device_name(dev),
        "plan": {k: v for k, v in planned.items() if k != "cfg"},
        "rates_stored": H200,
        "rates_measured": measured,
    }
    cases = _cases(cfg)
    for name, case in cases.items():  # the device first; saved after every workload
        t0 = time.perf_counter()
        rates = measured.get("rates")
        results[name] = _guarded(_on_device, name, case, cfg, dev, methods, rates)
        results[name]["bench_s"] = time.perf_counter() - t0
        save_result(out_dir, f"gpu_{size}", {**payload, "results": results})
    for name in results:  # then the CPU's threads, slower, on some workloads
        if name not in cfg["cpu_cases"] or "error" in results[name]:
            continue
        lr = results[name]["runs"]["dense"].get("lr")
        fast = "kernel" if name in ("W1", "W2", "W4") else "lazy"
        results[name]["cpu"] = {
            "all" if threads is None else str(threads): {
                meth: cpu_run(cases[name], cfg, meth, threads, lr if meth == "dense" else None)
                for meth in ("dense", fast)
            }
            for threads in cfg["threads"]
        }
        save_result(out_dir, f"gpu_{size}", {**payload, "results": results})
    rows = []
    for name, r in results.items():
        if "error" in r:
            continue
        f64 = r["runs"]["torch float64"].get("total_s", np.inf)
        best = min((r["runs"][k].get("total_s", np.inf), k) for k in methods)
        f32 = r["runs"]["torch float32"].get("total_s", np.inf)
        rows.append([name, r["m"], r["iters"], f64, f32, best[0], best[1], f64 / best[0]])
    print_table(
        f"corrtree on {dev} against PyTorch dense on {dev}",
        ["workload", "m", "iters", "torch f64 s", "torch f32 s", "corrtree s", "method", "vs f64"],
        rows,
    )
    return {**payload, "results": results}


def _guarded(fn, *args) -> dict[str, Any]:
    """``fn(*args)``, or the one line of a run that failed (device memory, a device
    error, a bug) as ``{"error": ...}``: the other runs still go on."""
    try:
        return fn(*args)
    except Exception as exc:  # a failed run is recorded; the suite goes on
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}


def _on_device(
    name: str, case: dict[str, Any], cfg: dict[str, Any], dev, methods, rates=None
) -> dict:
    """One workload on the device: corrtree's methods and PyTorch dense, side by side;
    then the model's predictions of them (:func:`_model_check`, priced with the
    device's measured ``rates``, the stored ones when ``None``)."""
    X, Y = _data(case, cfg["scale_n"])
    m = max(256, int(case["m"] * cfg["scale_m"]))
    iters = cfg["iters"] or case["iters"]
    base = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=Y.shape[1], seed=SEED)
    runs: dict[str, Any] = {}
    # lr="auto" in every whole run; a variant's other rate is given (from a first
    # run's) and PyTorch takes the rate corrtree found
    factor = case.get("lr_factor", 1.0)
    lr: Any = "auto"
    if factor != 1.0:
        probe = train(TwoLayerReLU(base.W, base.a, base.b), X, Y, iters=1, device=dev)
        lr = probe.lr * factor
    budget = cfg["device_budget_s"]
    for method in methods:
        model = TwoLayerReLU(base.W, base.a, base.b)
        runs[method] = _guarded(
            device_run, X, Y, model, method, lr, iters, cfg["measured"], dev, budget
        )
        if "error" not in runs[method]:
            runs[method]["sketch"] = _sketch(model)
        del model
    done = {k: v for k, v in runs.items() if "error" not in v}
    if not done:  # nothing fitted: PyTorch alone, at the rate corrtree would take
        lr = lr if lr != "auto" else None
    else:
        lr = next(v["lr"] for v in done.values())
    whole = [k for k, v in done.items() if not v["extrapolated"]]
    for k in whole:  # the whole runs end at the same weights: recorded, never fatal
        ref = np.array(runs[whole[0]]["sketch"])
        gap = float(np.abs(np.array(runs[k]["sketch"]) - ref).max())
        runs[k]["weights_agree"] = gap <= 1e-9 * max(1.0, float(np.abs(ref).max()))
        runs[k]["weights_gap"] = gap
    for precision in ("float64", "float32", "tf32"):
        runs[f"torch {precision}"] = (
            _guarded(torch_dense, X, Y, base, lr, iters, cfg["measured"], dev, precision)
            if lr is not None
            else {"error": "no learning rate: no corrtree run fitted"}
        )
    ref = runs["torch float64"].get("first_loss")
    for method in done:
        if ref is not None:
            gap = abs(runs[method]["first_loss"] - ref) / max(1.0, abs(ref))
            runs[method]["first_loss_agrees"] = gap <= 1e-9
            runs[method]["first_loss_gap"] = gap
    print(name, {k: round(v.get("total_s", np.nan), 3) for k, v in runs.items()}, flush=True)
    steps = cfg.get("model_steps", {}).get(name)
    check = (
        _guarded(_model_check, X, Y, base, runs, iters, steps, dev, rates)
        if steps and lr is not None
        else {}
    )
    return {"m": m, "n": X.shape[0], "iters": iters, "runs": runs, "cpu": {}, "model": check}


def _model_check(X, Y, base, runs, iters, steps, dev, rates) -> dict[str, Any]:
    """What the model predicts for the runs just measured, against what they took.

    Each device method that ran is run again for its first ``steps`` steps with every
    operation counted (:func:`~.device_count.count_train`, at the run's learning rate)
    and priced with ``rates`` (the device's measured ones; the stored
    :data:`~.op_counts.H200` when ``None``); the prediction of those steps, set-up
    included, against their measured time in the run (its set-up without ``lr="auto"``,
    and its first ``steps`` iterations).  PyTorch dense float64: one step counted on the
    host at width 1024, scaled to the width (as :func:`~.device_count.validate_dense`),
    times the iterations, against its run.  Returns ``{method: {"predicted_s",
    "measured_s", "ratio", ...}}``."""
    from .device_count import count_dense_step, count_train
    from .op_counts import modelled_seconds

    priced = rates if rates is not None else H200
    out: dict[str, Any] = {"rates": "measured" if rates is not None else "stored"}
    for method in ("dense", "lazy", "kernel"):
        run = runs.get(method, {})
        times = run.get("iteration_times")
        if "error" in run or not times:
            continue
        k = min(steps, len(times))
        model = TwoLayerReLU(base.W, base.a, base.b)
        got = count_train(
            train, model, X, Y, device=dev, rates=priced, as_h200=False, method=method,
            lr=run["lr"], iters=k,
        )  # fmt: skip
        del model
        predicted = sum(modelled_seconds(c, priced) for c in got["steps"][:k])
        measured = run["setup_s"] - run.get("lr_s", 0.0) + sum(times[:k])
        out[method] = {
            "steps": k,
            "predicted_s": predicted,
            "measured_s": measured,
            "ratio": predicted / measured if measured > 0 else None,
            "launches": [c.launches for c in got["steps"][:k]],
            "syncs": [c.syncs for c in got["steps"][:k]],
        }
    ref = runs.get("torch float64", {})
    if "total_s" in ref:
        n, d = X.shape
        K = Y.shape[1] if Y.ndim > 1 else 1
        step = count_dense_step(n, d, K, 1024, rates=priced).scaled(base.m / 1024)
        predicted = modelled_seconds(step, priced) * iters
        out["torch float64"] = {
            "predicted_s": predicted,
            "measured_s": ref["total_s"],
            "ratio": predicted / ref["total_s"],
        }
    return out


def _sketch(model: TwoLayerReLU) -> list[float]:
    """``W(T)·v`` summed over blocks of 64 neurons for a fixed ``v``: the final weights
    compared across methods without keeping them."""
    v = np.random.default_rng(0).standard_normal(model.d)
    proj = model.W @ v
    pad = -len(proj) % 64
    return np.concatenate((proj, np.zeros(pad))).reshape(-1, 64).sum(axis=1).tolist()[:4096]


def _device_name(dev) -> str:
    import torch

    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return "cpu"
