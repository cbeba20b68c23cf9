"""Sharded training on a Dask LocalCluster against one process on the same cores.

Every timed run happens in a fresh process: one process with every core, and
a driver with a LocalCluster of 2 workers × 1 thread (cluster start and the
loading of compiled kernels, on both sides, not timed; shard set-up with the
transfer of W, ``lr="auto"``, every iteration and the return of W timed).  Both runs
start from the same model and must end with the same weights (1e-9).
Reported: whole-run times and their ratio, the serialized bytes that cross
the network per iteration against ``8·nK`` per worker and direction, and the
peak RSS of each worker against the single process's.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..datasets import sphere
from ..model import TwoLayerReLU
from ..training import train
from ._util import in_child, peak_rss_bytes, print_table, save_result

__all__ = ["SIZES", "run"]

SIZES: dict[str, dict[str, Any]] = {
    "small": {
        "n": 256,
        "d": 64,
        "m": 2**12,
        "iters": 10,
        "mem_n": 256,
        "mem_m": 2**13,
        "mem_iters": 3,
    },
    "medium": {
        "n": 512,
        "d": 256,
        "m": 2**15,
        "iters": 20,
        "mem_n": 1024,
        "mem_m": 2**17,
        "mem_iters": 3,
    },
    "large": {
        "n": 1024,
        "d": 784,
        "m": 2**17,
        "iters": 50,
        "mem_n": 2048,
        "mem_m": 2**19,
        "mem_iters": 3,
    },
}
WORKERS = 2


def _problem(n: int, d: int, m: int) -> tuple[np.ndarray, np.ndarray, TwoLayerReLU]:
    ds = sphere(n=n, d=d, seed=0)
    return ds.X_train, ds.y_train, TwoLayerReLU.init(d=d, m=m, seed=1)


def _job(kind: str, method: str, n: int, d: int, m: int, iters: int) -> dict[str, Any]:
    """One whole run in this (fresh) process: ``kind`` is "one" or "cluster"."""
    X, y, model = _problem(n, d, m)
    client = None
    if kind == "cluster":
        from ..distributed import local_client

        client = local_client(WORKERS)
    # load the compiled kernels outside the timed run, on every process that runs them
    tiny = sphere(n=16, d=4, seed=2)
    train(
        TwoLayerReLU.init(d=4, m=64, seed=3),
        tiny.X_train,
        tiny.y_train,
        method=method,
        iters=2,
        client=client,
    )
    t0 = time.perf_counter()
    hist = train(model, X, y, method=method, iters=iters, client=client)
    total = time.perf_counter() - t0
    out = {
        "total_s": total,
        "preprocess_s": hist.preprocess_time,
        "lr_s": hist.info.get("lr_s"),
        "lr": hist.lr,
        "iteration_median_s": float(np.median(hist.iteration_times)),
        "final_loss": hist.final_loss,
        "W_digest": float(np.abs(model.W).sum()),
        "W_head": model.W[:64].tolist(),
        "peak_rss_gib": peak_rss_bytes() / 2**30,
        "worker_peak_rss_gib": [r / 2**30 for r in hist.info.get("worker_peak_rss", [])],
        "bytes_per_iteration": hist.info.get("bytes_per_iteration"),
    }
    if client is not None:
        cluster = client.cluster
        client.close()
        cluster.close()
    return out


def run(size: str = "large", out_dir: str = "benchmarks/results") -> dict[str, Any]:
    """Time, traffic and memory of sharded runs against one process; JSON to ``out_dir``."""
    p = SIZES[size]
    n, d, m, iters = p["n"], p["d"], p["m"], p["iters"]
    rows, results = [], {}
    for method in ("lazy", "kernel"):
        one = in_child(_job, "one", method, n, d, m, iters)
        sharded = in_child(_job, "cluster", method, n, d, m, iters)
        a, b = np.array(one["W_head"]), np.array(sharded["W_head"])
        same = bool(np.linalg.norm(a - b) <= 1e-9 * np.linalg.norm(a))
        budget = 2 * 8 * n * WORKERS  # err out and a share of u back, per worker, float64
        res = {
            "one_process": one,
            "cluster": sharded,
            "same_weights": same,
            "time_ratio": sharded["total_s"] / one["total_s"],
            "bytes_per_iteration": sharded["bytes_per_iteration"],
            "bytes_vs_2x8nK_per_worker": sharded["bytes_per_iteration"] / budget,
        }
        for r in (one, sharded):
            r.pop("W_head")
        results[method] = res
        rows.append(
            [
                method,
                f"{one['total_s']:.2f}",
                f"{sharded['total_s']:.2f}",
                f"{res['time_ratio']:.2f}",
                f"{sharded['bytes_per_iteration']}",
                f"{res['bytes_vs_2x8nK_per_worker']:.2f}",
                same,
            ]
        )
    print_table(
        f"Sharded vs one process: n={n}, d={d}, m={m}, {iters} iterations, "
        f"{WORKERS} workers x 1 thread vs 1 process x {WORKERS} threads",
        [
            "method",
            "one process (s)",
            "cluster (s)",
            "ratio",
            "bytes/iteration",
            "bytes / (2·8·nK·workers)",
            "same W",
        ],
        rows,
    )
    mn, mm, mi = p["mem_n"], p["mem_m"], p["mem_iters"]
    memory = {}
    mem_rows = []
    for method in ("lazy", "kernel"):
        one = in_child(_job, "one", method, mn, d, mm, mi)
        sharded = in_child(_job, "cluster", method, mn, d, mm, mi)
        worst = max(sharded["worker_peak_rss_gib"])
        memory[method] = {
            "one_process_peak_gib": one["peak_rss_gib"],
            "worker_peak_gib": sharded["worker_peak_rss_gib"],
            "driver_peak_gib": sharded["peak_rss_gib"],
            "worst_worker_vs_one": worst / one["peak_rss_gib"],
        }
        mem_rows.append(
            [
                method,
                f"{one['peak_rss_gib']:.2f}",
                ", ".join(f"{w:.2f}" for w in sharded["worker_peak_rss_gib"]),
                f"{sharded['peak_rss_gib']:.2f}",
                f"{worst / one['peak_rss_gib']:.2f}",
            ]
        )
    print_table(
        f"Peak memory: n={mn}, d={d}, m={mm}",
        ["method", "one process (GiB)", "workers (GiB)", "driver (GiB)", "worst worker / one"],
        mem_rows,
    )
    payload = {"size": size, "params": p, "workers": WORKERS, "time": results, "memory": memory}
    path = save_result(out_dir, f"distributed_{size}", payload)
    print(f"wrote {path}")
    return payload
