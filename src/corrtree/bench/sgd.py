"""Mini-batch SGD with momentum on natural-image patches: every method, PyTorch too.

Natural-image patches (16×16×3, ``datasets.image_patches``), batch 256,
momentum 0.9, 10 epochs, the same seeded batches for every method.  Each
method runs in a fresh process: set-up (``G = XXᵀ`` and its preprocessing)
and its first steps are measured; a run that would exceed the time budget is
extrapolated from the median of its measured steps (flagged), which is fair
for dense numpy and PyTorch (every step costs the same) and, for the other
methods, optimistic or pessimistic only as far as later steps differ from the
first ones.  The loss after every epoch (all training points) is part of
``train``'s History; its cost is reported apart and left out of the totals,
since PyTorch does not compute it.  Every method's batch losses must match
dense's (1e-9).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import numpy as np

from .._validation import available_memory
from ..datasets import image_patches
from ..model import TwoLayerReLU
from ..training import train
from ..training.optim import SGD, Optimizer
from ._util import in_child, peak_rss_bytes, print_table, save_result, warm_kernels

__all__ = ["SIZES", "run"]

WORKLOAD: dict[str, Any] = {
    "n": 16384,
    "size": 16,
    "m": 2**17,
    "batch_size": 256,
    "momentum": 0.9,
    "epochs": 10,
    "lr": 0.01,
    "target": 20.0,
}
SIZES: dict[str, dict[str, Any]] = {
    "small": {"n": 1024, "m": 2**12, "epochs": 2, "measured": 6, "budget_s": 30.0},
    "large": {"n": 16384, "m": 2**17, "epochs": 10, "measured": 6, "budget_s": 300.0},
}
METHODS = ("dense", "torch", "dtree", "wtree", "lazy", "kernel")


def _data(n: int) -> tuple[np.ndarray, np.ndarray]:
    ds = image_patches(n=n, size=WORKLOAD["size"], seed=0)
    return ds.X_train, ds.y_train.reshape(ds.X_train.shape[0], -1)


def torch_sgd(
    model: TwoLayerReLU,
    X: np.ndarray,
    Y: np.ndarray,
    lr: float,
    batches: list[np.ndarray | None],
) -> dict[str, Any]:
    """``torch.optim.SGD`` (float64, autograd) on the given batches: times and losses."""
    import os

    import torch

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    Xt, Yt = torch.from_numpy(X), torch.from_numpy(Y)
    A = torch.from_numpy(np.array(model.output_weights))
    W = torch.nn.Parameter(torch.from_numpy(model.W.copy()))
    opt = torch.optim.SGD([W], lr=lr, momentum=WORKLOAD["momentum"])
    times, losses = [], []
    for B in batches:
        t0 = time.perf_counter()
        Bt = torch.from_numpy(B)
        out = torch.relu(Xt[Bt] @ W.T - model.b) @ A / math.sqrt(model.m)
        loss = 0.5 * ((out - Yt[Bt]) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return {"times": times, "loss": losses}


def one_run(method: str, n: int, m: int, epochs: int, measured: int, budget: float) -> dict:
    """One run in this (fresh) process: set-up and steps until ``measured`` steps are
    done (dense, PyTorch, the trees) or the budget is spent (lazy, kernel)."""
    X, Y = _data(n)
    model = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=Y.shape[1], seed=7)
    sgd = SGD(WORKLOAD["batch_size"], epochs, WORKLOAD["momentum"])
    opt = Optimizer(sgd, X.shape[0], WORKLOAD["lr"], 0)
    steps = epochs * opt.per_epoch
    if method == "torch":
        need = 3 * 8.0 * model.m * model.d + 4 * 8.0 * WORKLOAD["batch_size"] * m
        if need > available_memory():
            raise MemoryError(f"PyTorch SGD needs about {need / 2**30:.0f} GiB here")
        res = torch_sgd(model, X, Y, WORKLOAD["lr"], [opt.batch(t) for t in range(measured)])
        step = float(np.median(res["times"][1:]))
        return {
            "setup_s": 0.0,
            "step_median_s": step,
            "total_s": float(sum(res["times"]) + (steps - measured) * step),
            "measured": measured,
            "extrapolated": True,
            "loss": res["loss"],
            "peak_rss_gib": peak_rss_bytes() / 2**30,
        }
    warm_kernels(method, Y.shape[1], X, batch_size=4, momentum=0.5)
    t0 = time.perf_counter()
    fixed = method in ("dense", "dtree", "wtree")
    ended = [t0]

    def within_budget(t: int, hist) -> bool:
        ended[0] = time.perf_counter()
        if fixed:
            return t + 1 < measured
        return ended[0] - t0 < budget

    hist = train(
        model,
        X,
        Y,
        method=method,
        lr=WORKLOAD["lr"],
        batch_size=WORKLOAD["batch_size"],
        epochs=epochs,
        momentum=WORKLOAD["momentum"],
        callback=within_budget,
    )
    wall = ended[0] - t0  # set-up and the steps (not the final loss)
    done = len(hist)
    times = hist.iteration_times
    step = float(np.median(times[1:])) if done > 1 else float(times[0])
    evals = hist.info.get("eval_s", 0.0)
    total = wall - evals + (steps - done) * step
    return {
        "setup_s": hist.preprocess_time,
        "step_median_s": step,
        "phase_s": {
            p: float(np.sum(getattr(hist, f"time_{p}")))
            for p in ("query", "forward", "backward", "update")
        },
        "total_s": float(total),
        "wall_s": wall,
        "measured": done,
        "extrapolated": done < steps,
        "epoch_eval_s": evals / max(1, len(hist.epoch_loss)) if hist.epoch_loss else None,
        "loss": hist.loss,
        "fired_pairs": hist.fired_pairs[:done],
        "flips": hist.flips[:done],
        "evaluated_pairs": hist.evaluated_pairs[:done],
        "steps_per_epoch": hist.info["steps_per_epoch"],
        "peak_rss_gib": peak_rss_bytes() / 2**30,
    }


def run(
    size: str = "large", out_dir: str = "benchmarks/results", only: str | None = None
) -> dict[str, Any]:
    """Every method (or ``only`` some, keeping the others' results) on the SGD workload;
    JSON to ``out_dir``."""
    p = SIZES[size]
    common = (p["n"], p["m"], p["epochs"], p["measured"], p["budget_s"])
    runs: dict[str, Any] = {}
    previous = os.path.join(out_dir, f"sgd_{size}.json")
    if only and os.path.exists(previous):
        with open(previous, encoding="utf-8") as fh:
            runs = json.load(fh)["runs"]
    for method in METHODS:
        if only and method not in only.split(","):
            continue
        try:
            runs[method] = in_child(one_run, method, *common)
        except RuntimeError as exc:  # e.g. the products or the NTK matrix do not fit
            runs[method] = {"error": str(exc)}
    if (not only or "torch" in only) and "total_s" in runs["torch"]:
        runs["torch"]["setup_s"] = runs["dense"]["setup_s"]  # the same G and data
        runs["torch"]["total_s"] += runs["dense"]["setup_s"]
    ok = {k: r for k, r in runs.items() if "total_s" in r}
    dense = runs["dense"]
    ref = dense["loss"]
    agree = {
        k: bool(np.allclose(r["loss"][: len(ref)], ref[: len(r["loss"])], rtol=1e-9))
        for k, r in ok.items()
    }
    exact = {k: r for k, r in ok.items() if k != "torch"}
    fastest = min(exact, key=lambda k: exact[k]["total_s"])
    speedup = {k: dense["total_s"] / r["total_s"] for k, r in ok.items()}
    payload = {
        "size": size,
        "workload": {**WORKLOAD, "n": p["n"], "m": p["m"], "epochs": p["epochs"]},
        "runs": runs,
        "speedup_vs_dense": speedup,
        "fastest_exact": fastest,
        "losses_agree_with_dense": agree,
        "update_share_of_dense_step": dense["phase_s"]["update"]
        / max(1e-300, sum(dense["phase_s"].values())),
    }
    rows = [
        [
            k,
            f"{r['total_s']:.4g}",
            "yes" if r.get("extrapolated") else "",
            f"{r['setup_s']:.3g}",
            f"{r['step_median_s']:.3g}",
            f"{r['step_median_s'] * r.get('steps_per_epoch', dense['steps_per_epoch']):.3g}",
            f"{speedup[k]:.3g}",
            f"{r['peak_rss_gib']:.2f}",
        ]
        if "total_s" in r
        else [k, r["error"][:60], "", "", "", "", "", ""]
        for k, r in runs.items()
    ]
    print_table(
        f"SGD, patches n={p['n']}, m={p['m']}, batch 256, momentum 0.9, {p['epochs']} epochs",
        ["method", "whole run s", "extrap.", "set-up s", "step s", "epoch s", "× dense", "RSS GiB"],
        rows,
    )
    save_result(out_dir, f"sgd_{size}", payload)
    return payload
