"""Benchmark of the paper's trainers: dense, dtree and wtree, plus PyTorch dense GD.

Per-iteration time of each method side by side in one run on unit-norm
synthetic data (n, d fixed, several widths m) and on the digits data, the
share of neurons that move per iteration, and a check that the trajectories
agree.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from ..datasets import digits, sphere
from ..model import TwoLayerReLU
from ..training import train
from ._util import loglog_plot, print_table, save_result

SIZES: dict[str, dict[str, Any]] = {
    "small": {"n": 256, "d": 64, "ms": [2**10, 2**12], "iters": 3, "digits_m": 2**10},
    "medium": {"n": 512, "d": 256, "ms": [2**12, 2**14], "iters": 3, "digits_m": 2**12},
    "large": {"n": 1024, "d": 784, "ms": [2**14, 2**16, 2**18], "iters": 3, "digits_m": 2**14},
}
METHODS = ("dense", "dtree", "wtree")


def torch_dense_gd(
    model: TwoLayerReLU, X: np.ndarray, Y: np.ndarray, lr: float, iters: int
) -> dict[str, Any]:
    """The same GD with PyTorch (float64, autograd); per-iteration times and losses."""
    import torch

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    Xt = torch.from_numpy(X)
    Yt = torch.from_numpy(Y.reshape(X.shape[0], -1))
    A = torch.from_numpy(np.array(model.output_weights))
    W = torch.from_numpy(model.W.copy()).requires_grad_(True)
    times, losses = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = torch.relu(Xt @ W.T - model.b) @ A / math.sqrt(model.m)
        loss = 0.5 * ((out - Yt) ** 2).sum()
        (grad,) = torch.autograd.grad(loss, W)
        with torch.no_grad():
            W -= lr * grad
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return {
        "per_iter_s": float(np.median(times)),
        "times": times,
        "loss": losses,
        "W": W.detach().numpy(),
    }


def compare(
    X: np.ndarray, Y: np.ndarray, m: int, iters: int, outputs: int, seed: int = 0
) -> dict[str, Any]:
    """Every method (and PyTorch) on the same model, data and learning rate."""
    model0 = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=outputs, seed=seed)
    out: dict[str, Any] = {"m": m, "n": X.shape[0], "d": X.shape[1], "outputs": outputs}
    ref: Any = None  # the first method's row: its learning rate, losses and weights
    for method in METHODS:
        model = TwoLayerReLU(model0.W, model0.a, model0.b)
        lr = "auto" if ref is None else ref["lr"]
        hist = train(model, X, Y, method=method, lr=lr, iters=iters)
        row = {
            "preprocess_s": hist.preprocess_time,
            "per_iter_s": float(np.median(hist.iteration_times)),
            "loss": hist.loss,
            "moved_share": [k / m for k in hist.moved_neurons],
            "fired_pairs": hist.fired_pairs,
            "lr": hist.lr,
        }
        if ref is None:
            ref = row
            ref["W"] = model.W.copy()
        else:
            row["max_rel_loss_diff"] = float(
                np.max(np.abs(np.array(hist.loss) - ref["loss"]) / ref["loss"])
            )
            row["rel_W_diff"] = float(np.linalg.norm(model.W - ref["W"]) / np.linalg.norm(ref["W"]))
        out[method] = row
        del model
    try:
        tr = torch_dense_gd(model0, X, Y, ref["lr"], iters)
        out["torch"] = {
            "per_iter_s": tr["per_iter_s"],
            "loss": tr["loss"],
            "max_rel_loss_diff": float(
                np.max(np.abs(np.array(tr["loss"]) - ref["loss"]) / ref["loss"])
            ),
        }
    except ImportError:
        out["torch"] = None
    ref.pop("W")
    out["trajectories_agree"] = all(
        out[k]["max_rel_loss_diff"] < 1e-9 for k in METHODS[1:]
    ) and all(out[k]["rel_W_diff"] < 1e-9 for k in METHODS[1:])
    return out


def _rows(res: dict[str, Any]) -> list[list[Any]]:
    rows = []
    dense = res["dense"]["per_iter_s"]
    for k in (*METHODS, "torch"):
        if res.get(k) is None:
            continue
        t = res[k]["per_iter_s"]
        moved = res[k].get("moved_share")
        rows.append(
            [
                k,
                res[k].get("preprocess_s", float("nan")),
                t,
                dense / t,
                float(np.mean(moved)) if moved else float("nan"),
            ]
        )
    return rows


def run(size: str = "large", out_dir: str = "benchmarks/results") -> dict[str, Any]:
    """Run the suite at ``size``; print tables and write ``train_<size>.json``."""
    p = SIZES[size]
    ds = sphere(n=p["n"], d=p["d"], seed=0)
    header = ["method", "preprocess (s)", "per iteration (s)", "speed-up vs dense", "moved share"]
    synthetic = []
    for m in p["ms"]:
        res = compare(ds.X_train, ds.y_train, m, p["iters"], 1)
        synthetic.append(res)
        print_table(
            f"Unit-norm synthetic, n={p['n']}, d={p['d']}, m={m}: trajectories agree: "
            f"{res['trajectories_agree']}",
            header,
            _rows(res),
        )
    dg = digits(test_size=0)
    res_digits = compare(dg.X_train, dg.y_train, p["digits_m"], p["iters"], dg.outputs)
    print_table(
        f"digits, n={dg.X_train.shape[0]}, d=64, K=10, m={p['digits_m']}: trajectories "
        f"agree: {res_digits['trajectories_agree']}",
        header,
        _rows(res_digits),
    )
    result = {"size": size, "params": p, "synthetic": synthetic, "digits": res_digits}
    os.makedirs(out_dir, exist_ok=True)
    png = os.path.join(out_dir, f"train_{size}_per_iteration.png")
    ms = [r["m"] for r in synthetic]
    series = {
        k: (ms, [r[k]["per_iter_s"] for r in synthetic])
        for k in (*METHODS, "torch")
        if all(r.get(k) for r in synthetic)
    }
    loglog_plot(
        png,
        f"The paper's trainers against dense GD (n={p['n']}, d={p['d']})",
        series,
        "width m",
        "seconds per iteration (median)",
    )
    result["plot"] = os.path.basename(png)
    path = save_result(out_dir, f"train_{size}", result)
    print(f"wrote {path} and {png}")
    return result
