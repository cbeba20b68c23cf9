"""Benchmarks of the lazy and kernel trainers against dense gradient descent.

Every timed run happens in a fresh process (so its peak RSS is its own) on
unit-norm synthetic data with ``lr="auto"``; runs that are compared share the
model, the data and the learning rate, and their trajectories are checked
equal (losses, and a random sketch ``W·Z`` of the final weights).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ..datasets import digits, sphere
from ..model import TwoLayerReLU
from ..training import train
from ._util import (
    in_child,
    loglog_plot,
    peak_rss_bytes,
    print_table,
    save_result,
    slope,
    warm_kernels,
)

__all__ = ["run_kernel", "run_lazy"]

SIZES: dict[str, dict[str, Any]] = {
    "small": {
        "m": 2**12,
        "ms": [2**10, 2**11, 2**12, 2**13],
        "ns": [128, 256, 512],
        "ds": [16, 64, 256],
        "n": 256,
        "d": 64,
        "iters": 20,
        "slow_iters": 2,
        "long_m": 2**11,
        "long_iters": 200,
        "digits_m": 2**10,
        "mem_m": 2**13,
        "d_m": 2**11,
    },
    "medium": {
        "m": 2**16,
        "ms": [2**12, 2**13, 2**14, 2**15, 2**16],
        "ns": [256, 512, 1024],
        "ds": [64, 256, 784],
        "n": 1024,
        "d": 256,
        "iters": 20,
        "slow_iters": 3,
        "long_m": 2**14,
        "long_iters": 500,
        "digits_m": 2**12,
        "mem_m": 2**17,
        "d_m": 2**14,
    },
    "large": {
        "m": 2**18,
        "ms": [2**14, 2**15, 2**16, 2**17, 2**18, 2**19, 2**20],
        "ns": [256, 512, 1024, 2048, 4096],
        "ds": [64, 256, 784, 3072],
        "n": 1024,
        "d": 784,
        "iters": 20,
        "slow_iters": 3,
        "long_m": 2**16,
        "long_iters": 1000,
        "digits_m": 2**16,
        "mem_m": 2**20,
        "d_m": 2**16,
    },
}


def _torch_run(
    model: TwoLayerReLU, X: np.ndarray, Y: np.ndarray, lr: float, iters: int
) -> dict[str, Any]:
    from .train import torch_dense_gd

    res = torch_dense_gd(model, X, Y, lr, iters)
    res.pop("W")
    return res


def run_one(
    method: str,
    data: str,
    n: int,
    m: int,
    d: int,
    iters: int,
    lr: Any,
    seed: int = 0,
    options: dict | None = None,
) -> dict[str, Any]:
    """One training run (meant for a child process): times, losses, sketch, peak RSS."""
    if data == "digits":
        ds = digits(test_size=0)
        X, Y, outputs = ds.X_train, ds.y_train, ds.outputs
    else:
        ds = sphere(n=n, d=d, seed=seed)
        X, Y, outputs = ds.X_train, ds.y_train, 1
    if method != "torch":
        warm_kernels(method, outputs, X, **(options or {}))
    model = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=outputs, seed=seed)
    if method == "torch":
        t0 = time.perf_counter()
        res = _torch_run(model, X, Y, lr, iters)
        res["total_s"] = time.perf_counter() - t0
        res["peak_rss_gib"] = peak_rss_bytes() / 2**30
        return res
    t0 = time.perf_counter()
    hist = train(model, X, Y, method=method, lr=lr, iters=iters, **(options or {}))
    total = time.perf_counter() - t0
    Z = np.random.default_rng(12345).standard_normal((X.shape[1], 4))
    times = hist.iteration_times
    return {
        "method": hist.method,
        "lr": hist.lr,
        "preprocess_s": hist.preprocess_time,
        "per_iter_s": float(np.median(times)) if iters else math.nan,
        "mean_iter_s": float(np.mean(times)) if iters else math.nan,
        "iteration_s": times.tolist(),
        "total_s": total,
        "loss": hist.loss,
        "final_loss": hist.final_loss,
        "sketch": (model.W @ Z).tolist(),
        "band_pairs": hist.band_pairs[-1] if iters else 0,
        "reanchored": int(np.sum(hist.reanchored)),
        "fired_pairs": hist.fired_pairs[:1],
        "peak_rss_gib": peak_rss_bytes() / 2**30,
        "info": hist.info,
    }


def _child(*args: Any, options: dict | None = None) -> dict[str, Any]:
    return in_child(run_one, *args, 0, options)


def _same(a: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """Largest relative differences of the losses and of the weight sketches."""
    k = min(len(a["loss"]), len(ref["loss"]))
    la, lr = np.asarray(a["loss"][:k]), np.asarray(ref["loss"][:k])
    out = {"max_rel_loss_diff": float(np.max(np.abs(la - lr) / np.maximum(lr, 1e-300)))}
    if "sketch" in a and "sketch" in ref and len(a["loss"]) == len(ref["loss"]):
        sa, sr = np.asarray(a["sketch"]), np.asarray(ref["sketch"])
        out["rel_W_sketch_diff"] = float(np.linalg.norm(sa - sr) / np.linalg.norm(sr))
    return out


def without_sketches(res: Any) -> Any:
    """``res`` without the weight sketches (m×4 each: compared in the run, not stored)."""
    if isinstance(res, dict):
        return {k: without_sketches(v) for k, v in res.items() if k != "sketch"}
    if isinstance(res, list):
        return [without_sketches(v) for v in res]
    return res


def _gemm_times(n: int, m: int, d: int) -> dict[str, float]:
    """One float64 and one float32 GEMM of n×d×m (the floor for all products)."""
    return {
        "gemm64_s": in_child(_gemm_job, n, m, d, "float64"),
        "gemm32_s": in_child(_gemm_job, n, m, d, "float32"),
    }


def _gemm_job(n: int, m: int, d: int, dtype: str) -> float:
    rng = np.random.default_rng(0)
    A = rng.standard_normal((m, d)).astype(dtype)
    B = rng.standard_normal((n, d)).astype(dtype)
    t0 = time.perf_counter()
    A @ B.T
    return time.perf_counter() - t0


def headline(method: str, p: dict[str, Any]) -> dict[str, Any]:
    """``method`` against dense numpy, PyTorch and the paper's trainers, one size."""
    n, m, d = p["n"], p["m"], p["d"]
    fast = _child(method, "sphere", n, m, d, p["iters"], "auto")
    lr = fast["lr"]
    res: dict[str, Any] = {"n": n, "m": m, "d": d, method: fast}
    check = _child(method, "sphere", n, m, d, p["slow_iters"], lr)
    for other in ("dense", "torch", "dtree", "wtree"):
        r = _child(other, "sphere", n, m, d, p["slow_iters"], lr)
        r["whole_run_20_s_extrapolated"] = r.get("preprocess_s", 0.0) + 20 * r["per_iter_s"]
        r.update(_same(check, r) if other != "torch" else _same(fast, r))
        res[other] = r
    best_tree = min(res["dtree"]["per_iter_s"], res["wtree"]["per_iter_s"])
    res["speedup_per_iter"] = {
        "vs_dense": res["dense"]["per_iter_s"] / fast["per_iter_s"],
        "vs_torch": res["torch"]["per_iter_s"] / fast["per_iter_s"],
        "vs_best_tree": best_tree / fast["per_iter_s"],
    }
    res["speedup_whole_run"] = {
        "vs_dense": res["dense"]["whole_run_20_s_extrapolated"] / fast["total_s"],
    }
    res["trajectories_agree"] = (
        res["dense"]["max_rel_loss_diff"] < 1e-9 and res["dense"]["rel_W_sketch_diff"] < 1e-9
    )
    res.update(_gemm_times(n, m, d))
    res["whole_run_vs_gemm64"] = fast["total_s"] / res["gemm64_s"]
    res["preprocess_vs_gemm64"] = fast["preprocess_s"] / res["gemm64_s"]
    return res


def scaling(method: str, key: str, values: list[int], p: dict[str, Any]) -> dict[str, Any]:
    """Per-iteration time of ``method`` over a range of m, n or d."""
    rows = []
    for v in values:
        kw = {"n": p["n"], "m": p["m"], "d": p["d"], key: v}
        r = _child(method, "sphere", kw["n"], kw["m"], kw["d"], p["iters"], "auto")
        rows.append(
            {
                key: v,
                "per_iter_s": r["per_iter_s"],
                "mean_iter_s": r["mean_iter_s"],
                "preprocess_s": r["preprocess_s"],
                "peak_rss_gib": r["peak_rss_gib"],
                "band_pairs": r["band_pairs"],
                "n": kw["n"],
                "m": kw["m"],
                "d": kw["d"],
            }
        )
    xs = [r[key] for r in rows]
    return {
        "rows": rows,
        "slope": slope(xs, [r["per_iter_s"] for r in rows]),
        "max_over_min": max(r["per_iter_s"] for r in rows) / min(r["per_iter_s"] for r in rows),
    }


def _for(key: str, p: dict[str, Any]) -> dict[str, Any]:
    """The sizes of a scaling run over ``key``: the scaling in d is at width ``d_m``."""
    return {**p, "m": p["d_m"]} if key == "d" else p


def on_digits(method: str, p: dict[str, Any]) -> dict[str, Any]:
    """Coherent data, where the certificates expire every step (the fast trainers lose).

    The kernel trainer is measured at a 16x smaller width and for ``slow_iters``
    iterations: on digits each of its iterations takes tens of seconds.
    """
    m = p["digits_m"] // 16 if method == "kernel" else p["digits_m"]
    iters = p["slow_iters"] if method == "kernel" else p["iters"]
    fast = _child(method, "digits", 0, m, 0, iters, "auto")
    dense = _child("dense", "digits", 0, m, 0, p["slow_iters"], fast["lr"])
    torch_r = _child("torch", "digits", 0, m, 0, p["slow_iters"], fast["lr"])
    return {
        "m": m,
        method: fast,
        "dense": dense,
        "torch": torch_r,
        "speedup_vs_dense": dense["per_iter_s"] / fast["per_iter_s"],
        **_same(fast, dense),
    }


def _table(title: str, res: dict[str, Any], method: str) -> None:
    rows = []
    for k in (method, "dense", "torch", "dtree", "wtree", "lazy", "kernel"):
        if k in res and isinstance(res[k], dict) and "per_iter_s" in res[k]:
            r = res[k]
            rows.append(
                [
                    k,
                    r.get("preprocess_s", float("nan")),
                    r["per_iter_s"],
                    res["dense"]["per_iter_s"] / r["per_iter_s"],
                    r.get("whole_run_20_s_extrapolated", r.get("total_s")),
                    r.get("peak_rss_gib", float("nan")),
                ]
            )
    print_table(
        title,
        [
            "method",
            "preprocess (s)",
            "per iteration (s, median)",
            "speed-up vs dense",
            "whole run, 20 its (s)",
            "peak RSS (GiB)",
        ],
        rows,
    )


def run_lazy(size: str = "large", out_dir: str = "benchmarks/results") -> dict[str, Any]:
    """The lazy trainer's suite (issue targets: 100x, slope in m <= 0.7, ...)."""
    return _suite("lazy", size, out_dir)


def run_kernel(size: str = "large", out_dir: str = "benchmarks/results") -> dict[str, Any]:
    """The kernel trainer's suite, with the lazy trainer alongside."""
    return _suite("kernel", size, out_dir)


def _suite(method: str, size: str, out_dir: str) -> dict[str, Any]:
    import os

    p = SIZES[size]
    result: dict[str, Any] = {"size": size, "params": p, "method": method}
    head = headline(method, p)
    if method == "kernel":
        head["lazy"] = _child(
            "lazy", "sphere", p["n"], p["m"], p["d"], p["iters"], head["kernel"]["lr"]
        )
    result["headline"] = head
    _table(
        f"{method}: n={p['n']}, d={p['d']}, m={p['m']}; trajectories agree: "
        f"{head['trajectories_agree']}; one float64 GEMM {head['gemm64_s']:.3g} s, "
        f"float32 {head['gemm32_s']:.3g} s; whole {method} run / GEMM64 = "
        f"{head['whole_run_vs_gemm64']:.2f}",
        head,
        method,
    )
    result["scaling_m"] = scaling(method, "m", p["ms"], p)
    rows_m = result["scaling_m"]["rows"]
    print_table(
        f"{method}: scaling in m (n={rows_m[0]['n']}, d={rows_m[0]['d']}), slope "
        f"{result['scaling_m']['slope']:.2f}",
        ["m", "per iteration (s)", "preprocess (s)", "peak RSS (GiB)"],
        [[r["m"], r["per_iter_s"], r["preprocess_s"], r["peak_rss_gib"]] for r in rows_m],
    )
    other = "ds" if method == "lazy" else "ns"
    key = "d" if method == "lazy" else "n"
    result[f"scaling_{key}"] = sc = scaling(method, key, p[other], _for(key, p))
    print_table(
        f"{method}: scaling in {key}, slope {sc['slope']:.2f}, max/min {sc['max_over_min']:.2f}",
        [key, "per iteration (s)", "preprocess (s)"],
        [[r[key], r["per_iter_s"], r["preprocess_s"]] for r in sc["rows"]],
    )
    if method == "kernel":
        result["scaling_d"] = scd = scaling(method, "d", p["ds"], _for("d", p))
        print_table(
            f"kernel: scaling in d, max/min {scd['max_over_min']:.2f}",
            ["d", "per iteration (s)"],
            [[r["d"], r["per_iter_s"]] for r in scd["rows"]],
        )
        result["long_run"] = lr_res = long_run(p)
        print_table(
            f"long run: m={p['long_m']}, n={p['n']}, {p['long_iters']} iterations at "
            "lr = 0.1 x auto",
            ["method", "total (s)", "per iteration (s, median)"],
            [
                [k, lr_res[k]["total_s"], lr_res[k]["per_iter_s"]]
                for k in ("kernel", "lazy", "dense")
            ],
        )
    result["digits"] = dg = on_digits(method, p)
    print_table(
        f"digits (n=1797, K=10, m={dg['m']}): speed-up vs dense {dg['speedup_vs_dense']:.1f}",
        ["method", "per iteration (s)"],
        [[k, dg[k]["per_iter_s"]] for k in (method, "dense", "torch")],
    )
    result["memory"] = mem = _child(method, "sphere", p["n"], p["mem_m"], p["d"], 3, "auto")
    print(
        f"{method} at m={p['mem_m']}, n={p['n']}, d={p['d']}: peak RSS "
        f"{mem['peak_rss_gib']:.2f} GiB"
    )
    os.makedirs(out_dir, exist_ok=True)
    png = os.path.join(out_dir, f"{method}_{size}_scaling.png")
    series = {
        f"{method} (slope {result['scaling_m']['slope']:.2f})": (
            [r["m"] for r in rows_m],
            [r["per_iter_s"] for r in rows_m],
        )
    }
    loglog_plot(
        png,
        f"{method}: per-iteration time against width m (n={rows_m[0]['n']}, d={rows_m[0]['d']})",
        series,
        "width m",
        "seconds per iteration (median)",
    )
    result["plot"] = os.path.basename(png)
    path = save_result(out_dir, f"{method}_{size}", without_sketches(result))
    print(f"wrote {path} and {png}")
    return result


def long_run(p: dict[str, Any]) -> dict[str, Any]:
    """Many iterations at a small learning rate: kernel and lazy measured, dense extrapolated."""
    n, m, d, T = p["n"], p["long_m"], p["d"], p["long_iters"]
    probe = _child("dense", "sphere", n, m, d, 0, "auto")
    lr = 0.1 * probe["lr"]
    out: dict[str, Any] = {"lr": lr, "iters": T}
    for method in ("kernel", "lazy"):
        out[method] = _child(method, "sphere", n, m, d, T, lr)
    dense = _child("dense", "sphere", n, m, d, 5, lr)
    dense["total_s"] = dense["preprocess_s"] + T * dense["per_iter_s"]
    dense["extrapolated_from_iterations"] = 5
    out["dense"] = dense
    out["kernel_vs_lazy_losses"] = _same(out["kernel"], out["lazy"])
    return out
