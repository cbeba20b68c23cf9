"""Whole runs against width on real data: where the iterations, not the set-up, are the run.

The fastest exact trainer's whole run (the kernel trainer on patches; the lazy one too on
the held-out sets) (set-up, ``lr="auto"``, every iteration) on W2's image
patches from m = 2^14 up, beside dense numpy's (its first iterations measured, the rest
extrapolated: its iterations all cost the same), each in a fresh process.  From
``implicit_from`` on (m = 2^19: a stored ``W`` and dense's products would take 11 GiB and
more) the model is implicit and dense does not fit: its whole run is the one measured at
the widest stored width, times the ratio of widths (every part of a dense run -- the
copy of ``W``, ``lr="auto"``'s mat-vecs over the fired pairs, each iteration's GEMMs --
grows linearly in m), and the trainer's exactness rests on its final loss, which must
equal the loss of its final weights from a forward pass.  Then data of
the same kinds that the workloads do not use (other patches: other positions, 12×12
crops; a tabular regression set: scikit-learn's diabetes), at the workloads' widths, so
that their ratios can be set beside W2's and W5's.  Reported per run: the whole run, its
set-up (``G``, the float32 GEMM, the scans; ``lr="auto"`` apart), their ratio, and the
speed-up over dense.  Every trainer's first losses must equal dense's (1e-9) and its
final loss the loss of its final weights from a dense forward pass.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

import numpy as np

from ._util import machine_info, print_table, save_result
from .workloads import final_consistent, median_run, same_losses

__all__ = ["CASES", "SIZES", "run"]

#: name -> data, its arguments, the widths (log2), iterations, the case whose ratio it is
#: set beside (measured in the same run), and the trainers run.
CASES: dict[str, dict[str, Any]] = {
    "W2 patches": {
        "data": "patches",
        "args": {"n": 2048, "size": 16},
        "log2m": (14, 15, 16, 17, 18, 19, 20),
        "iters": 100,
        "beside": None,
        "methods": ("kernel",),
        "implicit_from": 19,
    },
    "other patches": {
        "data": "patches",
        "args": {"n": 2048, "size": 12, "seed": 1},
        "log2m": (16,),
        "iters": 100,
        "beside": "W2 patches",
        "methods": ("lazy", "kernel"),
    },
    "W5 breast cancer": {
        "data": "breast_cancer",
        "args": {},
        "log2m": (16,),
        "iters": 300,
        "beside": "W5",
        "methods": ("lazy", "kernel"),
    },
    "diabetes (tabular)": {
        "data": "diabetes",
        "args": {},
        "log2m": (16,),
        "iters": 300,
        "beside": "W5 breast cancer",
        "methods": ("lazy", "kernel"),
    },
}
SIZES: dict[str, dict[str, Any]] = {
    "small": {"scale_m": 1 / 64, "scale_n": 1 / 8, "iters": 10, "measured": 3, "widths": 2},
    "large": {"scale_m": 1.0, "scale_n": 1.0, "iters": None, "measured": 3, "widths": None},
}
#: The kernel trainer runs whole: no wall-clock budget.
NO_BUDGET = 1e9


def _agree(kernel: dict[str, Any], dense: dict[str, Any] | None) -> bool:
    """First losses as dense's and the final loss as the final weights' (without a dense
    run, the second only, its floor set by the run's own first loss)."""
    if dense is None:
        return final_consistent(kernel, kernel["loss"][0])
    ref = dense["loss"]
    return same_losses(kernel, ref) and final_consistent(kernel, ref[0])


def _scaled_dense(dense: dict[str, Any], m: int) -> dict[str, Any]:
    """Dense's run measured at ``dense["m"]``, scaled linearly to width ``m``."""
    f = m / dense["m"]
    return {
        "total_s": dense["total_s"] * f,
        "iteration_median_s": dense["iteration_median_s"] * f,
        "from_m": dense["m"],
    }


def run(
    size: str = "large", out_dir: str = "benchmarks/results", only: str | None = None
) -> dict[str, Any]:
    """Every case (or ``only`` some, comma-separated: the others stored are kept) at every
    width; JSON to ``out_dir/widths_{size}.json`` after each run."""
    p = SIZES[size]
    results: dict[str, Any] = {}
    previous = os.path.join(out_dir, f"widths_{size}.json")
    if only and os.path.exists(previous):
        with open(previous, encoding="utf-8") as fh:
            results = json.load(fh)["results"]
    rows = []
    for name, c in CASES.items():
        if only and name not in only.split(","):
            continue
        widths = c["log2m"][: p["widths"]] if p["widths"] else c["log2m"]
        iters = p["iters"] or c["iters"]
        results[name] = {
            "case": {**c, "iters": iters},
            "runs": [],
            "measured": datetime.date.today().isoformat(),
            "measured_on": machine_info()["cpu"],  # cases re-run alone keep their own
        }
        stored: dict[str, Any] | None = None  # dense at the widest stored width so far
        for k in widths:
            m = max(256, int(2**k * p["scale_m"]))
            implicit = k >= c.get("implicit_from", np.inf)
            common = (c["data"], c["args"], p["scale_n"], m, iters, p["measured"], NO_BUDGET)
            try:
                if implicit:
                    if stored is None:
                        raise RuntimeError("no dense run at a stored width to scale")
                    dense, measured = _scaled_dense(stored, m), None
                else:
                    dense = measured = {**median_run("dense", *common, None), "m": m}
                    stored = dense
                runs = {
                    method: median_run(method, *common, None, "squared", implicit)
                    for method in c["methods"]
                }
            except Exception as exc:  # recorded; the other widths go on
                results[name]["runs"].append({"m": m, "error": f"{type(exc).__name__}: {exc}"})
                print(f"{name} at m = {m}: {exc}")
                save_result(out_dir, f"widths_{size}", {"size": size, "results": results})
                continue
            best = min(runs, key=lambda k: runs[k]["total_s"])
            whole, setup = runs[best]["total_s"], runs[best]["setup_s"]
            entry = {
                "m": m,
                "implicit": bool(implicit),
                "dense_total_s": dense["total_s"],
                "dense_iteration_s": dense["iteration_median_s"],
                "dense_scaled_from_m": dense.get("from_m"),
                "methods": {
                    k: {key: v for key, v in r.items() if key != "loss"} for k, r in runs.items()
                },
                "best": best,
                "whole_over_setup": whole / setup,
                "speedup_vs_dense": dense["total_s"] / whole,
                "exact": all(_agree(r, measured) for r in runs.values()),
            }
            results[name]["runs"].append(entry)
            rows.append(
                [
                    name,
                    f"2^{int(np.log2(m))}" if m & (m - 1) == 0 else m,
                    f"{dense['total_s']:.3g}" + (" (scaled)" if implicit else ""),
                    f"{whole:.3g} ({best}{', implicit' if implicit else ''})",
                    f"{setup:.3g}",
                    f"{whole / setup:.3g}",
                    f"{dense['total_s'] / whole:.3g}",
                    entry["exact"],
                ]
            )
            ordered = {k: results[k] for k in CASES if k in results}
            save_result(out_dir, f"widths_{size}", {"size": size, "results": ordered})
    print_table(
        "whole runs against width (dense extrapolated)",
        ["data", "m", "dense (s)", "best (s)", "set-up (s)", "run/set-up", "vs dense", "exact"],
        rows,
    )
    return {"size": size, "results": results}
