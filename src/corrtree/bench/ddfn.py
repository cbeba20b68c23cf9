"""Benchmark of the correlation trees and the firing detector (DDFN).

Dynamic workload: ``rounds`` rounds of (move ``moves`` random weights by a
small random step, then report every firing pair), with the firing detector,
numpy brute force (``X @ Y.T`` then threshold) and FAISS
``IndexFlatIP.range_search`` side by side, the three answers checked against
each other every round.  Also: init time of each structure next to one BLAS
GEMM of the same shape, peak memory, and query time against output size.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from scipy.special import ndtri

from ..detector import FiringDetector
from ..trees import CorrelationDTree, CorrelationWTree
from ._util import (
    in_child,
    loglog_plot,
    median_time,
    peak_rss_bytes,
    print_table,
    rss_bytes,
    save_result,
    slope,
)

SIZES: dict[str, dict[str, int]] = {
    "small": {"n": 128, "m": 4096, "d": 32, "rounds": 8, "moves": 16, "mem_m": 8192},
    "medium": {"n": 512, "m": 16384, "d": 64, "rounds": 20, "moves": 64, "mem_m": 2**16},
    "large": {"n": 1024, "m": 65536, "d": 128, "rounds": 50, "moves": 64, "mem_m": 2**18},
}
FIRE_SHARE = 0.01  # b is chosen so that about this share of the pairs fire
STEP = 0.1  # standard deviation of a weight move, per coordinate


def instance(n: int, m: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """Unit-norm points, standard normal weights, and ``b`` for ~1% firing pairs."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Y = rng.standard_normal((m, d))
    return X, Y, float(-ndtri(FIRE_SHARE))  # <x, y> ~ N(0, 1) for unit x


def _numpy_pairs(X: np.ndarray, Y: np.ndarray, b: float) -> np.ndarray:
    i, j = np.nonzero(X @ Y.T >= b)
    return np.column_stack((i, j))


class _Faiss:
    """FAISS exact inner-product range search, rebuilt or edited every round."""

    def __init__(self, Y: np.ndarray, b: float, mode: str) -> None:
        import faiss

        self.faiss, self.b, self.mode = faiss, b, mode
        self.Y32 = np.ascontiguousarray(Y, dtype=np.float32)
        d = Y.shape[1]
        self.index: Any
        if mode == "rebuild":
            self.index = faiss.IndexFlatIP(d)
        else:
            self.index = faiss.IndexIDMap2(faiss.IndexFlatIP(d))
            self.index.add_with_ids(self.Y32, np.arange(Y.shape[0], dtype=np.int64))

    def update(self, js: np.ndarray, Z: np.ndarray) -> None:
        Z32 = np.ascontiguousarray(Z, dtype=np.float32)
        self.Y32[js] = Z32
        if self.mode == "idmap":
            self.index.remove_ids(js.astype(np.int64))
            self.index.add_with_ids(Z32, js.astype(np.int64))

    def query(self, X32: np.ndarray) -> np.ndarray:
        if self.mode == "rebuild":
            self.index.reset()
            self.index.add(self.Y32)
        lims, _, ids = self.index.range_search(X32, self.b)  # reports IP > b, float32
        counts = np.diff(lims).astype(np.int64)
        return np.column_stack((np.repeat(np.arange(X32.shape[0]), counts), ids))


def _same_pairs(a: np.ndarray, b: np.ndarray, U: np.ndarray, thr: float, tol: float) -> bool:
    """Equal pair sets, except pairs whose product is within ``tol`` of ``thr``."""
    m = U.shape[1]
    ka, kb = a[:, 0] * m + a[:, 1], b[:, 0] * m + b[:, 1]
    diff = np.setxor1d(ka, kb)
    return bool(np.all(np.abs(U.ravel()[diff] - thr) <= tol))


def dynamic_workload(n: int, m: int, d: int, rounds: int, moves: int, seed: int = 0) -> dict:
    """Time the rounds of the three methods side by side and check they agree."""
    X, Y, b = instance(n, m, d, seed)
    rng = np.random.default_rng(seed + 1)
    X32 = np.ascontiguousarray(X, dtype=np.float32)
    det = FiringDetector(X, Y, b, limit=None)
    faiss_modes = {mode: _Faiss(Y, b, mode) for mode in ("rebuild", "idmap")}
    times: dict[str, list[float]] = {"detector": [], "numpy": []}
    times.update({f"faiss_{mode}": [] for mode in faiss_modes})
    agree = True
    pairs_per_round = []
    for _ in range(rounds):
        js = rng.choice(m, size=moves, replace=False)
        Z = Y[js] + STEP * rng.standard_normal((moves, d))
        Y[js] = Z

        t0 = time.perf_counter()
        det.update_many(js, Z)
        q_det = det.query()
        times["detector"].append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        q_np = _numpy_pairs(X, Y, b)
        times["numpy"].append(time.perf_counter() - t0)

        U = X @ Y.T
        agree &= _same_pairs(q_det, q_np, U, b, 1e-12)
        for mode, fx in faiss_modes.items():
            t0 = time.perf_counter()
            fx.update(js, Z)
            q_fx = fx.query(X32)
            times[f"faiss_{mode}"].append(time.perf_counter() - t0)
            agree &= _same_pairs(q_det, q_fx, U, b, 1e-4)
        pairs_per_round.append(int(q_det.shape[0]))
    med = {k: float(np.median(v)) for k, v in times.items()}
    faiss_best = min(med["faiss_rebuild"], med["faiss_idmap"])
    return {
        "n": n,
        "m": m,
        "d": d,
        "b": b,
        "rounds": rounds,
        "moves": moves,
        "median_pairs": float(np.median(pairs_per_round)),
        "median_round_s": med,
        "all_agree": bool(agree),
        "speedup_vs_numpy": med["numpy"] / med["detector"],
        "speedup_vs_faiss": faiss_best / med["detector"],
        "speedup_vs_best_baseline": min(med["numpy"], faiss_best) / med["detector"],
    }


def init_times(n: int, m: int, d: int, seed: int = 0) -> dict:
    """Init time of each structure next to one GEMM ``X @ Y.T`` of the same shape."""
    X, Y, b = instance(n, m, d, seed)
    res = {"gemm": median_time(lambda: X @ Y.T, repeat=3)[0]}
    res["CorrelationDTree"] = median_time(lambda: CorrelationDTree(X, Y), repeat=3)[0]
    res["CorrelationWTree"] = median_time(lambda: CorrelationWTree(X, Y), repeat=3)[0]
    res["FiringDetector"] = median_time(lambda: FiringDetector(X, Y, b, limit=None), repeat=3)[0]
    return {k: {"seconds": v, "vs_gemm": v / res["gemm"]} for k, v in res.items()}


def _peak_memory_child(kind: str, n: int, m: int, d: int) -> dict:
    X, Y, b = instance(n, m, d)
    before = rss_bytes()
    if kind == "gemm":
        obj: Any = X @ Y.T
        held = obj.nbytes
    elif kind == "FiringDetector":
        obj = FiringDetector(X, Y, b, limit=None)
        held = obj.nbytes
    else:
        obj = {"CorrelationDTree": CorrelationDTree, "CorrelationWTree": CorrelationWTree}[kind](
            X, Y
        )
        held = obj.nbytes
    peak = peak_rss_bytes() - before
    products = 8.0 * n * m
    return {
        "structure_bytes": held,
        "structure_vs_products": held / products,
        "peak_rss_increase_bytes": peak,
        "peak_rss_vs_products": peak / products,
        "copies_of_X_and_Y_bytes": 8 * (n + m) * d,
    }


def peak_memory(n: int, m: int, d: int, settle_first: bool = True) -> dict:
    """Peak RSS increase of building each structure, each in a fresh process (started
    once the machine has settled, if ``settle_first``)."""
    kinds = ("gemm", "CorrelationDTree", "CorrelationWTree", "FiringDetector")
    return {k: in_child(_peak_memory_child, k, n, m, d, settle_first=settle_first) for k in kinds}


def query_vs_output(n: int, m: int, d: int, seed: int = 0) -> dict:
    """Query time of ``DTree.query_all`` and ``FiringDetector.query`` against output size."""
    X, Y, _ = instance(n, m, d, seed)
    tree = CorrelationDTree(X, Y)
    rows = []
    for share in (1e-5, 1e-4, 1e-3, 1e-2, 5e-2):
        tau = float(-ndtri(share))

        def query(tau: float = tau) -> Any:
            return tree.query_all(tau)

        t_tree = median_time(query, repeat=5)[0]
        det = FiringDetector(X, Y, tau, limit=None)
        t_det = median_time(det.query, repeat=5)[0]
        rows.append(
            {
                "share": share,
                "tau": tau,
                "pairs": det.count(),
                "dtree_query_all_s": t_tree,
                "detector_query_s": t_det,
            }
        )
    big = [r for r in rows if r["pairs"] >= 10 * n]  # past the O(n) per-tree floor
    return {
        "rows": rows,
        "slope_dtree": slope([r["pairs"] for r in big], [r["dtree_query_all_s"] for r in big]),
        "slope_detector": slope([r["pairs"] for r in big], [r["detector_query_s"] for r in big]),
    }


def run(size: str = "large", out_dir: str = "benchmarks/results") -> dict:
    """Run the whole suite at ``size``; print tables and write ``ddfn.json``."""
    p = SIZES[size]
    n, m, d = p["n"], p["m"], p["d"]
    dyn = dynamic_workload(n, m, d, p["rounds"], p["moves"])
    med = dyn["median_round_s"]
    print_table(
        f"DDFN dynamic workload: n={n}, m={m}, d={d}, {p['rounds']} rounds of {p['moves']} "
        f"moves, ~{dyn['median_pairs']:.0f} firing pairs; all agree: {dyn['all_agree']}",
        ["method", "median round (ms)", "vs FiringDetector"],
        [[k, 1e3 * v, v / med["detector"]] for k, v in med.items()],
    )
    init = init_times(n, m, d)
    print_table(
        f"Init, n={n}, m={m}, d={d}",
        ["structure", "seconds", "vs one GEMM"],
        [[k, v["seconds"], v["vs_gemm"]] for k, v in init.items()],
    )
    mem = peak_memory(n, p["mem_m"], d, settle_first=size != "small")  # small: a check
    print_table(
        f"Memory, n={n}, m={p['mem_m']}, d={d} (products: {8 * n * p['mem_m'] / 2**20:.0f} MiB)",
        ["structure", "structure / products", "peak RSS increase / products"],
        [[k, v["structure_vs_products"], v["peak_rss_vs_products"]] for k, v in mem.items()],
    )
    qo = query_vs_output(n, m, d)
    print_table(
        f"Query time vs output size, n={n}, m={m}, d={d} (log-log slopes: DTree "
        f"{qo['slope_dtree']:.2f}, detector {qo['slope_detector']:.2f})",
        ["pairs", "DTree.query_all (ms)", "FiringDetector.query (ms)"],
        [
            [r["pairs"], 1e3 * r["dtree_query_all_s"], 1e3 * r["detector_query_s"]]
            for r in qo["rows"]
        ],
    )
    result = {
        "size": size,
        "params": p,
        "dynamic": dyn,
        "init": init,
        "memory": mem,
        "query_vs_output": qo,
    }
    os.makedirs(out_dir, exist_ok=True)
    png = os.path.join(out_dir, f"ddfn_{size}_query.png")
    pairs = [r["pairs"] for r in qo["rows"]]
    loglog_plot(
        png,
        f"Query time against output size (n={n}, m={m}, d={d})",
        {
            f"CorrelationDTree.query_all (slope {qo['slope_dtree']:.2f})": (
                pairs,
                [r["dtree_query_all_s"] for r in qo["rows"]],
            ),
            f"FiringDetector.query (slope {qo['slope_detector']:.2f})": (
                pairs,
                [r["detector_query_s"] for r in qo["rows"]],
            ),
        },
        "firing pairs reported",
        "seconds",
    )
    result["plot"] = os.path.basename(png)
    path = save_result(out_dir, f"ddfn_{size}", result)
    print(f"wrote {path} and {png}")
    return result
