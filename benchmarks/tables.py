"""Markdown tables of the benchmark results: ``benchmarks/README.md`` and the results
table of the top-level ``README.md`` are generated from the JSON files by this script.

Usage: python benchmarks/tables.py [--size large] [--results benchmarks/results] [--write]
(``--write`` rewrites both files; without it the tables are printed).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np


def _load(results: str, name: str) -> dict | None:
    path = os.path.join(results, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header, rows) -> str:
    return "\n".join([_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)])


def _ms(s: float) -> str:
    return f"{1e3 * s:.3g} ms" if s < 1 else f"{s:.3g} s"


def _x(v: float) -> str:
    return f"{v:.0f}×" if v >= 100 else f"{v:.3g}×"


def machine(res: dict) -> str:
    m = res["machine"]
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; numpy {m['numpy']}, "
        f"numba {m['numba']}; measured {m['date']}"
    )


def ddfn(res: dict) -> str:
    dyn = res["dynamic"]
    med = dyn["median_round_s"]
    out = [
        f"Dynamic workload: n={dyn['n']}, m={dyn['m']}, d={dyn['d']}, {dyn['rounds']} "
        f"rounds of {dyn['moves']} moved weights then a full query, about "
        f"{dyn['median_pairs']:.0f} firing pairs (1%); all three answers agree: "
        f"{dyn['all_agree']}.",
        "",
        _table(
            ["method", "median round", "vs FiringDetector"],
            [[k, _ms(v), f"{v / med['detector']:.1f}×"] for k, v in med.items()],
        ),
        "",
    ]
    init = res["init"]
    out += [
        _table(
            ["structure", "init", "vs one GEMM"],
            [[k, _ms(v["seconds"]), f"{v['vs_gemm']:.2f}×"] for k, v in init.items()],
        ),
        "",
    ]
    mem = res["memory"]
    p = res["params"]
    out += [
        _table(
            [
                f"structure (n={p['n']}, m={p['mem_m']}, d={p['d']})",
                "held / 8nm",
                "peak RSS increase / 8nm",
            ],
            [
                [k, f"{v['structure_vs_products']:.3f}", f"{v['peak_rss_vs_products']:.3f}"]
                for k, v in mem.items()
            ],
        ),
        "",
    ]
    qo = res["query_vs_output"]
    out += [
        _table(
            ["firing pairs", "DTree.query_all", "FiringDetector.query"],
            [
                [r["pairs"], _ms(r["dtree_query_all_s"]), _ms(r["detector_query_s"])]
                for r in qo["rows"]
            ],
        )
    ]
    return "\n".join(out)


def train(res: dict) -> str:
    rows = []
    for r in [*res["synthetic"], res["digits"]]:
        dense = r["dense"]["per_iter_s"]
        label = f"m={r['m']}" + (" (digits, K=10)" if r is res["digits"] else "")
        for k in ("dense", "dtree", "wtree", "torch"):
            if r.get(k):
                moved = r[k].get("moved_share")
                rows.append(
                    [
                        label,
                        k,
                        _ms(r[k]["per_iter_s"]),
                        f"{dense / r[k]['per_iter_s']:.2f}×",
                        f"{sum(moved) / len(moved):.3f}" if moved else "",
                    ]
                )
    return _table(["size", "method", "per iteration", "speed-up vs dense", "moved share"], rows)


def fast(res: dict, method: str) -> str:
    h = res["headline"]
    rows = []
    for k in (method, "lazy" if method == "kernel" else None, "dense", "torch", "dtree", "wtree"):
        if k and k in h:
            r = h[k]
            whole = r.get("whole_run_20_s_extrapolated", r.get("total_s"))
            pre = f"{r['preprocess_s']:.3g} s" if "preprocess_s" in r else "—"
            rows.append(
                [
                    k,
                    pre,
                    _ms(r["per_iter_s"]),
                    _x(h["dense"]["per_iter_s"] / r["per_iter_s"]),
                    f"{whole:.3g} s",
                    f"{r['peak_rss_gib']:.2f} GiB",
                ]
            )
    out = [
        f"n={h['n']}, d={h['d']}, m={h['m']}: one float64 GEMM of n×d×m takes "
        f"{h['gemm64_s']:.3g} s, float32 {h['gemm32_s']:.3g} s; the whole {method} run "
        f"(preprocessing + 20 iterations) is {h['whole_run_vs_gemm64']:.2f}× the float64 GEMM "
        f"and its preprocessing {h['preprocess_vs_gemm64']:.2f}×; trajectories agree: "
        f"{h['trajectories_agree']} (losses within "
        f"{h['dense']['max_rel_loss_diff']:.1g}, weights within "
        f"{h['dense']['rel_W_sketch_diff']:.1g}).",
        "",
        _table(
            [
                "method",
                "preprocess",
                "per iteration (median)",
                "speed-up vs dense",
                "whole run (20 it.)",
                "peak RSS",
            ],
            rows,
        ),
        "",
    ]
    sm = res["scaling_m"]
    r0 = sm["rows"][0]
    out += [
        f"Scaling in m at n={r0['n']}, d={r0['d']} (slope of log time against log m: "
        f"{sm['slope']:.2f}):",
        "",
        _table(
            ["m", "per iteration", "preprocess", "peak RSS"],
            [
                [
                    r["m"],
                    _ms(r["per_iter_s"]),
                    f"{r['preprocess_s']:.3g} s",
                    f"{r['peak_rss_gib']:.2f} GiB",
                ]
                for r in sm["rows"]
            ],
        ),
        "",
    ]
    for key in ("d", "n"):
        sc = res.get(f"scaling_{key}")
        if sc:
            fixed = ", ".join(f"{k}={sc['rows'][0][k]}" for k in ("n", "m", "d") if k != key)
            out += [
                f"Scaling in {key} at {fixed} (slope {sc['slope']:.2f}, max/min "
                f"{sc['max_over_min']:.3g}):",
                "",
                _table(
                    [key, "per iteration"], [[r[key], _ms(r["per_iter_s"])] for r in sc["rows"]]
                ),
                "",
            ]
    if "long_run" in res:
        lr = res["long_run"]
        out += [
            f"Long run ({lr['iters']} iterations at lr = {lr['lr']:.3g}):",
            "",
            _table(
                ["method", "total", "per iteration (median)"],
                [
                    [
                        k + (" (extrapolated from 5 iterations)" if k == "dense" else ""),
                        f"{lr[k]['total_s']:.3g} s",
                        _ms(lr[k]["per_iter_s"]),
                    ]
                    for k in ("kernel", "lazy", "dense")
                ],
            ),
            "",
        ]
    dg = res["digits"]
    out += [
        f"digits (n=1797, K=10, m={dg['m']}): {method} {_ms(dg[method]['per_iter_s'])} per "
        f"iteration, dense {_ms(dg['dense']['per_iter_s'])}, PyTorch "
        f"{_ms(dg['torch']['per_iter_s'])}: {method} runs at "
        f"{dg['speedup_vs_dense']:.2g}× the speed of dense GD.",
        "",
    ]
    for run in res.get("earlier_headline_runs", []):
        out += [
            f"An earlier run of the same suite on the same machine measured {method} "
            f"{_x(run['speedup_per_iter']['vs_dense'])} faster than dense per iteration "
            f"(median) and a whole run of {run['whole_run_vs_gemm64']:.2f}× one float64 GEMM "
            f"({run['gemm64_s']:.3g} s then).",
            "",
        ]
    mem = res["memory"]
    out += [
        f"Peak RSS at m={res['params']['mem_m']}, n={res['params']['n']}, "
        f"d={res['params']['d']}: {mem['peak_rss_gib']:.2f} GiB."
    ]
    return "\n".join(out)


#: The workloads' whole-run targets against dense numpy (the JSON keeps those of its run).
WORKLOAD_TARGETS = {"W1": 300.0, "W2": 30.0, "W3": 30.0, "W4": 60.0, "W5": 30.0}
#: The whole run at most this many set-ups on these workloads.
SETUP_TARGET, SETUP_TARGETED = 4.0, ("W2", "W3", "W5")


def _over_setup(runs: dict, name: str) -> str:
    """The fastest method's whole run over its set-up (``G``, GEMM, scans; not the
    learning rate): how many set-ups the whole run costs."""
    ok = {k: v for k, v in runs.items() if "setup_s" in v and k != "torch" and v["setup_s"] > 0}
    if not ok:
        return "–"
    k = min(ok, key=lambda k: ok[k]["total_s"])
    ratio = ok[k]["total_s"] / ok[k]["setup_s"]
    verdict = ""
    if name in SETUP_TARGETED:
        verdict = f", ≤ {SETUP_TARGET:.0f} " + ("met" if ratio <= SETUP_TARGET else "**missed**")
    return f"{ratio:.3g} ({k}{verdict})"


def widths(res: dict) -> str:
    """Whole runs against width, and on held-out data beside the workload of its kind
    (with the dates of cases measured on another day than the last, each case's
    ``measured``)."""
    rows = []
    ratio_at = {
        (name, e["m"]): e["speedup_vs_dense"]
        for name, r in res["results"].items()
        for e in r["runs"]
        if "error" not in e
    }
    for name, r in res["results"].items():
        c = r["case"]
        for e in r["runs"]:
            if "error" in e:
                rows.append([name, f"d={_dims(c)}", _pow2(e["m"]), str(c["iters"]), "", ""])
                rows[-1] += [f"did not run: {e['error']}"] + [""] * 5
                continue
            k = e["methods"][e["best"]]
            beside = c.get("beside")
            other = ratio_at.get((beside, e["m"]))
            if beside in res["results"] and _when(res["results"][beside]) != _when(r):
                other = None  # measured in another run: no ratio against it
            scaled = e.get("dense_scaled_from_m")
            rows.append(
                [
                    name,
                    f"d={_dims(c)}",
                    _pow2(e["m"]),
                    str(c["iters"]),
                    _ms(e["dense_total_s"]) + ("†" if scaled else "*"),
                    f"{_ms(k['total_s'])} ({e['best']}{', implicit' if e.get('implicit') else ''})",
                    _ms(k["setup_s"]),
                    _ms(k["lr_s"]),
                    f"{e['whole_over_setup']:.3g}",
                    _x(e["speedup_vs_dense"]),
                    f"{e['speedup_vs_dense'] / other:.2f} of {beside}" if other else "",
                    "yes" if e["exact"] else "**no**",
                ]
            )
    text = _table(
        [
            "data",
            "shape",
            "m",
            "iterations",
            "dense numpy",
            "fastest whole run",
            "its set-up",
            "its lr",
            "whole run / set-up",
            "vs dense",
            "vs dense, against (target ≥ 0.7)",
            "exact (1e-9)",
        ],
        rows,
    )
    dates = measured_apart(res, "a case of the same run")
    return (
        text + "\n\n\\* extrapolated from the first iterations. † dense does not fit (its "
        "products and a stored `W` take 11 GiB and more): the dense run of the widest stored "
        "width of the same run, times the ratio of widths (every part of a dense run grows "
        "linearly in m); the trainer runs an implicit model. `exact`: every trainer's first "
        "losses equal dense's and its final loss the loss of its final weights (†: the "
        "second only)." + dates
    )


def _when(case: dict) -> tuple:
    """The day and machine a widths case was measured on."""
    return case.get("measured"), case.get("measured_on")


def _dims(case: dict) -> str:
    a = case["args"]
    if case["data"] == "patches":
        return str(3 * a["size"] ** 2)
    return {"diabetes": "10", "breast_cancer": "30", "digits": "64"}.get(case["data"], "?")


def measured_apart(res: dict, against: str) -> str:
    """Sentences naming the cases measured on another day or machine than the file's last
    run (each case's ``measured``, ``measured_on``; empty when all agree), each ratio
    being against ``against``."""
    last, cpu = res["machine"]["date"], res["machine"]["cpu"]
    earlier: dict[tuple[str, str], list[str]] = {}
    for name, r in res["results"].items():
        when = (r.get("measured", last), r.get("measured_on", cpu))
        if when != (last, cpu):
            earlier.setdefault(when, []).append(name)
    return "".join(
        f" Measured on {day}, "
        + ("the same machine" if on == cpu else f"on {on} (2 cores)")
        + f": {', '.join(names)} (each ratio against {against})."
        for (day, on), names in sorted(earlier.items())
    )


def workloads(res: dict) -> str:
    """The headline: whole runs of every method on the five workloads."""
    head = [
        "workload",
        "m, iterations",
        "dense numpy",
        "PyTorch",
        "dtree",
        "wtree",
        "lazy",
        "kernel",
        "auto (its pick)",
        "best vs dense",
        "target",
        "best's whole run / set-up",
    ]
    rows, detail = [], []
    for name, r in res["results"].items():
        w, runs = r["workload"], r["runs"]

        def cell(k, runs=runs):
            v = runs.get(k, {})
            if "total_s" not in v:
                return "does not fit" if "NTK" in v.get("error", "") else "–"
            return f"{v['total_s']:.3g} s" + ("*" if v.get("extrapolated") else "")

        best = max((v for k, v in r["speedup_vs_dense"].items() if k != "torch"), default=0)
        target = WORKLOAD_TARGETS.get(name, w["target"])
        met = "met" if best >= target else "**missed**"
        data = {
            "sphere": f"sphere n={w['args'].get('n')}",
            "patches": "image patches n=2048",
            "digits": "digits (std.), K=10",
            "breast_cancer": "breast cancer (std.)",
        }
        rows.append(
            [
                f"{name} {data[w['data']]}",
                f"2^{int(np.log2(w['m']))}, {w['iters']}",
                *(cell(k) for k in ("dense", "torch", "dtree", "wtree", "lazy", "kernel")),
                f"{r['auto']['total_s']:.3g} s ({r['auto']['method']})",
                _x(best),
                f"≥ {target:.0f}× {met}",
                _over_setup(runs, name),
            ]
        )
        fast = {k: v for k, v in runs.items() if k in ("lazy", "kernel") and "total_s" in v}
        for k, v in fast.items():
            ph = v["phase_s"]
            detail.append(
                [
                    name,
                    k,
                    f"{v['setup_s']:.3g}",
                    f"{v['lr_s']:.3g}",
                    f"{ph['forward']:.3g}",
                    f"{ph['query']:.3g}",
                    f"{ph['update']:.3g}",
                    f"{v['second_half_median_s'] * 1e3:.3g}",
                    f"{v['evaluated_per_flip']:.3g}" if v["evaluated_per_flip"] else "–",
                    f"{runs['dense']['iteration_median_s']:.3g}",
                ]
            )
    checks = [r.get("final_loss_is_the_weights_loss", {}) for r in res["results"].values()]
    repeated = [
        f"{name} {k} " + " / ".join(f"{t:.3g}" for t in v["repeat_totals_s"]) + " s"
        for name, r in res["results"].items()
        for k, v in r["runs"].items()
        if len(v.get("repeat_totals_s", [])) > 1
    ]
    out = [
        _table(head, rows),
        "",
        "\\* extrapolated from the first iterations (dense numpy and PyTorch always; the tree "
        "methods and a fast method past its time budget when marked)."
        + measured_apart(res, "dense of the same run"),
        "",
        *(
            [
                "Whole runs shorter than 30 s ran three times, each in a fresh process; the "
                "median is shown. The three totals: " + "; ".join(repeated) + ".",
                "",
            ]
            if repeated
            else []
        ),
        "Exactness: every method's first losses equal dense's (1e-9) on every workload: "
        f"{all(all(r['losses_agree_with_dense'].values()) for r in res['results'].values())}; "
        "lazy's and kernel's final weights agree: "
        f"{all(r['final_weights_agree'] for r in res['results'].values())}; the final loss "
        "of every whole run equals a dense forward pass of its final weights (1e-9): "
        f"{all(all(c.values()) for c in checks) and all(checks)} ({sum(map(len, checks))} runs).",
        "",
        "Where the time of the fast methods goes (seconds of the whole run; `forward` is the "
        "kernel's nK×nK mat-vec or the lazy outputs, `query` the certificate work, `update` "
        "the flips and re-anchoring):",
        "",
        _table(
            [
                "workload",
                "method",
                "set-up",
                "lr",
                "forward",
                "query",
                "update",
                "late iteration (ms)",
                "pairs evaluated per flip",
                "dense iteration (s)",
            ],
            detail,
        ),
    ]
    return "\n".join(out)


def distributed(res: dict) -> str:
    p = res["params"]
    rows = []
    for method, r in res["time"].items():
        rows.append(
            [
                method,
                f"{r['one_process']['total_s']:.3g} s",
                f"{r['cluster']['total_s']:.3g} s",
                f"{r['time_ratio']:.2f}×",
                f"{r['bytes_per_iteration'] / 1e3:.1f} kB",
                f"{r['bytes_vs_2x8nK_per_worker']:.2f}",
                r["same_weights"],
            ]
        )
    out = [
        f'Whole runs (set-up, `lr="auto"`, {p["iters"]} iterations), n={p["n"]}, d={p["d"]}, '
        f"m={p['m']}: a LocalCluster of {res['workers']} workers × 1 thread against one "
        f"process with {res['workers']} threads.",
        "",
        _table(
            [
                "method",
                "one process",
                "cluster",
                "cluster / one",
                "bytes per iteration",
                "÷ (2·8·nK·workers)",
                "same W (1e-9)",
            ],
            rows,
        ),
        "",
        f"Peak RSS at n={p['mem_n']}, m={p['mem_m']}:",
        "",
        _table(
            ["method", "one process", "each worker", "worst worker / one process"],
            [
                [
                    k,
                    f"{v['one_process_peak_gib']:.2f} GiB",
                    ", ".join(f"{w:.2f}" for w in v["worker_peak_gib"]) + " GiB",
                    f"{v['worst_worker_vs_one']:.2f}",
                ]
                for k, v in res["memory"].items()
            ],
        ),
    ]
    return "\n".join(out)


def sgd(res: dict) -> str:
    w = res["workload"]
    rows = []
    for method, r in res["runs"].items():
        if "total_s" not in r:
            rows.append([method, r["error"][:70], "", "", "", "", "", ""])
            continue
        per_epoch = r["step_median_s"] * res["runs"]["dense"].get("steps_per_epoch", 1)
        rows.append(
            [
                method,
                _ms(r["total_s"]) + (" (extrapolated)" if r.get("extrapolated") else ""),
                f"{r['measured']}",
                _ms(r["setup_s"]),
                _ms(r["step_median_s"]),
                _ms(per_epoch),
                _x(res["speedup_vs_dense"][method]),
                f"{r['peak_rss_gib']:.2f} GiB",
            ]
        )
    agree = all(res["losses_agree_with_dense"].values())
    return "\n".join(
        [
            f"Image patches n={w['n']} (16×16×3, d=768), m={w['m']}, batch {w['batch_size']}, "
            f"momentum {w['momentum']}, lr {w['lr']}, {w['epochs']} epochs; the same batches "
            f"for every method; batch losses equal dense's to 1e-9 on every measured step: "
            f"{agree}. Fastest exact method: {res['fastest_exact']}.",
            "",
            _table(
                [
                    "method",
                    "whole run",
                    "steps measured",
                    "set-up",
                    "step (median)",
                    "epoch",
                    "vs dense numpy",
                    "peak RSS",
                ],
                rows,
            ),
        ]
    )


#: Each suite: its script, title, and what it measures (the tables say how it came out).
def _pow2(m: int) -> str:
    k = int(m).bit_length() - 1
    return f"2^{k}" if 1 << k == m else str(m)


def wide_runs(res: dict) -> str:
    """The implicit runs by width (the README's table)."""
    rows = []
    for r in res["runs"]:
        if "error" in r:
            rows.append([_pow2(r["m"]), f"failed: {r['error']}", *[""] * 7])
            continue
        rows.append(
            [
                _pow2(r["m"]),
                f"{8 * r['m'] * res['d'] / 2**30:.1f} GiB",
                _ms(r["total_s"]),
                _ms(r["generate_s"]),
                _ms(r["gemm_s"]),
                _ms(r["scan_s"] + r["exact_s"]),
                _ms(r["iterations_s"]),
                f"{r['peak_rss_gib']:.1f} GiB",
                f"{r['pairs_ever_fired'] / 1e6:.1f} M",
            ]
        )
    return _table(
        [
            "m",
            "W if stored",
            "whole run",
            "generate W(0)",
            "float32 GEMM",
            "scans + float64 near b",
            f"{res['iters']} iterations",
            "peak RSS",
            "pairs that ever fired",
        ],
        rows,
    )


def wide(res: dict) -> str:
    out = [
        f"Sphere data n={res['n']}, d={res['d']}, kernel trainer, {res['iters']} iterations, "
        "each width in a fresh process; every final loss equals the loss of a streamed dense "
        "forward pass of the final implicit weights (1e-9).",
        "",
        wide_runs(res),
        "",
    ]
    saved = [r for r in res["runs"] if "file_bytes" in r]
    if saved:
        r = saved[-1]
        beyond = (r["file_bytes"] - 9 * r["m"] - 8 * res["n"] * res["d"]) / r["pairs_ever_fired"]
        out += [
            f"Saved at m={_pow2(r['m'])}: {r['file_bytes'] / 2**30:.2f} GiB for "
            f"{r['pairs_ever_fired'] / 1e6:.1f} M pairs that ever fired: "
            f"{beyond:.1f} bytes a pair beyond 9 bytes a neuron and the training points "
            f"({r['file_bytes_per_pair']:.1f} with them), against "
            f"{r['matrix_bytes'] / 2**30:.0f} GiB for the matrix.",
            "",
        ]
    p = res.get("predict", {})
    if "seconds" in p:
        out += [
            f"`predict` of that model, loaded in a fresh process, on {p['points']} points: "
            f"{_ms(p['seconds'])}, peak RSS {p['peak_rss_gib']:.2f} GiB.",
            "",
        ]
    if res.get("side_by_side"):
        rows = [
            [
                _pow2(s["m"]),
                _ms(s["implicit"]["total_s"]),
                _ms(s["explicit"]["total_s"]),
                _ms(s["implicit"]["iterations_s"]),
                _ms(s["explicit"]["iterations_s"]),
                _ms(s["dense_total_s"]) + "*",
                _x(s["dense_total_s"] / s["implicit"]["total_s"]),
                f"{s['max_weight_gap']:.1e}",
                f"{s['sharded_setup_ratio']:.2f}",
            ]
            for s in res["side_by_side"]
        ]
        out += [
            "Side by side in one process, from the same W(0): implicit and explicit models, "
            "and dense numpy (its first iterations, extrapolated); set-up on two Dask "
            "workers of one thread each against one process.",
            "",
            _table(
                [
                    "m",
                    "implicit",
                    "explicit",
                    "implicit iterations",
                    "explicit iterations",
                    "dense numpy",
                    "implicit vs dense",
                    "max abs ΔW(T)",
                    "2-worker set-up / 1 process",
                ],
                rows,
            ),
        ]
    return "\n".join(out).rstrip()


#: Targets against PyTorch float64 dense on the same GPU (the variants have none).
GPU_TARGETS = {"W1": 10.0, "W2": 2.0, "W3": 2.0, "W4": 2.0, "W5": 2.0, "W1 wide": 30.0}
GPU_METHODS = ("dense", "lazy", "kernel")


def gpu_runs(res: dict) -> str:
    """Whole runs on one GPU against PyTorch dense there, and the CPU trainers' scaling
    with the machine's cores."""

    def cell(v: dict) -> str:
        if "total_s" not in v:
            return "does not fit" if "memory" in v.get("error", "").lower() else "failed"
        return f"{v['total_s']:.3g} s" + ("*" if v.get("extrapolated") else "")

    def total(v: dict) -> float:
        return v.get("total_s", np.inf)

    rows, cpu_rows = [], []
    for name, r in res["results"].items():
        runs = r["runs"]
        best = min(total(runs[k]) for k in (*GPU_METHODS, "auto") if k in runs)
        f64, f32 = total(runs["torch float64"]), total(runs["torch float32"])
        target = GPU_TARGETS.get(name)
        verdict = "–"
        if target is not None and np.isfinite(best):
            met = f64 / best >= target and f32 / best >= 1.0
            verdict = f"≥ {target:.0f}× and ≥ 1× {'met' if met else '**missed**'}"
        rows.append(
            [
                name,
                f"{_pow2(r['m'])}, {r['iters']}",
                *(cell(runs[f"torch {p}"]) for p in ("float64", "float32", "tf32")),
                *(cell(runs[k]) if k in runs else "–" for k in GPU_METHODS),
                f"{cell(runs['auto'])} ({runs['auto'].get('method', '–')})",
                _x(f64 / best),
                _x(f32 / best),
                verdict,
            ]
        )
        for threads, by in sorted(r.get("cpu", {}).items()):
            (_, d), (fast, f) = sorted(by.items(), key=lambda kv: kv[0] != "dense")
            cpu_rows.append(
                [name, threads, cell(d), f"{cell(f)} ({fast})", _x(d["total_s"] / f["total_s"])]
            )
    out = [
        _table(
            [
                "workload",
                "m, iterations",
                "torch f64",
                "torch f32",
                "torch TF32",
                "dense",
                "lazy",
                "kernel",
                "auto (its pick)",
                "best vs f64",
                "best vs f32",
                "target",
            ],
            rows,
        )
    ]
    if cpu_rows:
        out += [
            "",
            "The CPU trainers with every core of the GPU's host and with two (fresh processes):",
            "",
            _table(["workload", "threads", "dense numpy", "corrtree", "vs dense"], cpu_rows),
        ]
    return "\n".join(out + gpu_model(res))


def gpu_model(res: dict) -> list[str]:
    """The device's measured rates beside the stored ones, and the model's predictions
    of the runs measured (``bench_gpu.py``'s model checks), as lines of text."""
    got = res.get("rates_measured") or {}
    if "rates" not in got:
        why = got.get("error", "not measured") if got else "not measured"
        return ["", f"Rates of the device: {why}."]
    stored = res.get("rates_stored", {})
    names = {
        "flops64_per_s": "float64 GEMM flop/s",
        "flops32_per_s": "float32 GEMM flop/s",
        "gathers_per_s": "gathered entries/s",
        "scatters_per_s": "accumulated entries/s",
        "bytes_per_s": "bytes streamed/s",
        "launch_s": "a launch (s)",
        "sync_s": "a synchronization (s)",
    }
    rows = [
        [label, f"{got['rates'][k]:.3g}", f"{stored[k]:.3g}" if k in stored else "–"]
        for k, label in names.items()
    ]
    out = [
        "",
        f"The device's primitive rates measured in this run ({got.get('how', '')}) beside "
        "those the package prices with (`device_rates.json`; `bench_gpu.py --set-rates` "
        "stores the measured ones):",
        "",
        _table(["rate", "measured", "stored"], rows),
    ]
    rows = []
    for name, r in res["results"].items():
        check = r.get("model") or {}
        for method, v in check.items():
            if not isinstance(v, dict):
                continue
            what = f"first {v['steps']} steps with set-up" if "steps" in v else "whole run"
            rows.append(
                [
                    name,
                    method,
                    what,
                    f"{v['measured_s']:.3g} s",
                    f"{v['predicted_s']:.3g} s",
                    f"{v['ratio']:.2f}" if v.get("ratio") is not None else "–",
                ]
            )
    if rows:
        out += [
            "",
            "The model against the device: each run counted again operation by operation "
            "and priced with the measured rates (`corrtree.bench.device_count`), against "
            "what the same steps took in the run above (PyTorch: its step counted on the "
            "host, scaled to the width):",
            "",
            _table(
                ["workload", "method", "steps", "measured", "predicted", "predicted / measured"],
                rows,
            ),
        ]
    return out


def losses(res: dict) -> str:
    """The classification losses: speed beside the squared loss, then quality."""
    speed = res.get("speed", {})
    rows = []
    for r in speed.values():
        runs = r["runs"]
        ratio = r.get("vs_squared_speedup")
        verdict = "" if ratio is None else "met" if ratio >= 0.8 else "**missed**"
        rows.append(
            [
                r["workload"],
                r["loss"],
                f"{_pow2(r['m'])}, {r['iters']}",
                f"{runs['dense']['total_s']:.3g} s*",
                _secs(runs.get("lazy")),
                _secs(runs.get("kernel")),
                f"{_x(r['speedup_vs_dense'])} ({r['best']})",
                "" if ratio is None else f"{ratio:.2f}× ({verdict})",
            ]
        )
    agree = all(r["losses_agree_with_dense"] for r in speed.values())
    # dense does the same arithmetic for either loss: its spread between the two is noise,
    # which the ratio of speed-ups carries; the best method's own times beside it
    spreads = []
    for r in speed.values():
        sq = speed.get(f"{r['workload']} squared")
        if r["loss"] == "squared" or sq is None:
            continue
        dense = r["runs"]["dense"]["total_s"] / sq["runs"]["dense"]["total_s"]
        own = r["runs"][r["best"]]["total_s"] / sq["runs"][r["best"]]["total_s"]
        spreads.append(
            f"{r['workload']}: dense {dense:.2f}×, {r['best']} {own:.2f}× "
            f"(so {dense / own:.2f}× by the speed-ups, {1 / own:.2f}× by {r['best']}'s times)"
        )
    out = [
        _table(
            [
                "workload",
                "loss",
                "m, iterations",
                "dense numpy",
                "lazy",
                "kernel",
                "best vs dense",
                "vs the squared loss's (target ≥ 0.8×)",
            ],
            rows,
        ),
        "",
        "\\* extrapolated from the first iterations. Every method's first losses equal "
        f"dense's with the same loss (1e-9): {agree}.",
    ]
    if spreads:
        out += [
            "",
            "Whole run with the classification loss over the same method's with the squared "
            "loss, in this session (dense numpy does the same arithmetic for both, so its "
            "spread is this machine's noise): " + "; ".join(spreads) + ".",
        ]
    quality = res.get("quality")
    if quality:
        settings = res["quality_settings"]
        out += [
            "",
            f"{settings['folds']}-fold stratified cross-validation (mean ± standard deviation "
            f"over the folds): corrtree with {settings['width']} neurons and "
            f'{settings["iters"]} full-batch steps of cross-entropy (`lr="auto"`), '
            "MLPClassifier with one hidden layer of the same width (its defaults otherwise), "
            "LogisticRegression; both on standardized features.",
            "",
            _table(
                ["data", "model", "accuracy", "log-loss", "fit (s)"],
                [
                    [
                        f"{r['data']} (n={r['n']}, {r['classes']} classes)",
                        r["model"],
                        f"{r['accuracy_mean']:.3f} ± {r['accuracy_std']:.3f}",
                        f"{r['log_loss_mean']:.3f} ± {r['log_loss_std']:.3f}",
                        f"{r['fit_s_mean']:.2g}",
                    ]
                    for r in quality.values()
                ],
            ),
        ]
    return "\n".join(out)


def _secs(run: dict | None) -> str:
    if run is None:
        return "–"
    return f"{run['total_s']:.3g} s{'*' if run.get('extrapolated') else ''}"


def gpu(res: dict) -> str:
    return f"Device: {res['device_name']} ({res['device']}).\n\n{gpu_runs(res)}"


def gpu_count(res: dict) -> str:
    """The model's validation on PyTorch dense, then the device methods' modelled whole
    runs and their worst step counts beside #46's step targets."""
    rows = [
        [name, f"{v['measured_s']:.3g} s", f"{v['modelled_s']:.3g} s", f"{v['ratio']:.2f}"]
        for name, v in res["dense_validation"].items()
    ]
    out = [
        "PyTorch dense float64 on an H200, measured there and modelled from its counted "
        "step (scaled to the width; `W1 at 2^k`: one step):",
        "",
        _table(["run", "measured", "modelled", "modelled / measured"], rows),
        "",
        "The device methods counted here, priced for an H200 (modelled, not measured), "
        "beside PyTorch dense float64 modelled at the same width; counts are the worst "
        "step after the first three (launches / host synchronizations; targets 150 / 2):",
        "",
    ]
    rows = []
    for name, case in res["results"].items():
        for method, r in case["runs"].items():
            later = (r.get("targets") or {}).get("later")
            worst = f"{later['launches']} / {later['syncs']}" if later else "–"
            star = "*" if r["extrapolated"] else ""
            rows.append(
                [
                    f"{name} n={case['n']} d={case['d']} K={case['K']}",
                    _pow2(case["m"]),
                    method,
                    f"{r['modelled_s']:.3g} s{star}",
                    f"{case['torch_dense']['modelled_s']:.3g} s",
                    _x(r["vs_torch_dense"]),
                    _streamed(r),
                    worst,
                    r.get("counted_on", "–"),
                ]
            )
    out.append(_table(["workload", "m", "method", *_MODELLED, "counted"], rows))
    out += [
        "",
        f"\\* the steps past the {_counted(res)} counted at the median of the last five. "
        + STREAMED,
    ]
    due = [(name, case["due_rows"]) for name, case in res["results"].items() if "due_rows" in case]
    if due:
        rows = [
            [
                name,
                _pow2(v["m"]),
                str(len(v["device"])),
                f"{min(v['device'])}-{max(v['device'])}",
                f"{min(v['cpu'])}-{max(v['cpu'])}",
                f"{v['ratio']:.2f}",
                "met" if v["met"] else "**missed**",
            ]
            for name, v in due
        ]
        out += [
            "",
            "Rows the kernel trainer visits a step: the device trainer (its due mask, counted "
            "on the CPU) against the numba trainer on the CPU (its clocks), from the same "
            "model; on a device a visit's values come by GEMM for the whole row, so its rows "
            f"are its cost (target: at most {due[0][1]['target']:g}× the CPU's every step):",
            "",
            _table(
                ["workload", "m", "steps", "device", "CPU", "worst device / CPU", "target"],
                rows,
            ),
        ]
    return "\n".join(out)


def gpu_widths(res: dict) -> str:
    """The device trainers' modelled whole runs by width, beside PyTorch dense
    modelled at the same width, and the width at which it passes PyTorch."""
    out = []
    for name, case in res["results"].items():
        rows = []
        for point in case["widths"]:
            for method, r in point["runs"].items():
                worst = r["worst_later"]
                star = "*" if r["extrapolated"] else ""
                rows.append(
                    [
                        _pow2(point["m"]),
                        method,
                        f"{r['modelled_s']:.3g} s{star}",
                        f"{point['torch_dense_s']:.3g} s",
                        _x(r["vs_torch_dense"]),
                        _streamed(r),
                        f"{worst['launches']} / {worst['syncs']}",
                    ]
                )
        if beyond := case.get("beyond"):
            least = beyond["target"]
            met = "met" if beyond["vs_torch_dense"] >= least else "**missed**"
            rows.append(
                [
                    f"{_pow2(beyond['m'])} †",
                    beyond["method"],
                    f"{beyond['modelled_s']:.3g} s",
                    f"{beyond['torch_dense_s']:.3g} s",
                    f"{_x(beyond['vs_torch_dense'])} (target ≥ {least:g}×: {met})",
                    _streamed(beyond),
                    "–",
                ]
            )
        passes = case["passes_torch_dense_at"]
        where = ", ".join(f"{k} from {_pow2(v)}" for k, v in passes.items()) or "none"
        out += [
            f"{name} (n={case['n']}, d={case['d']}, K={case['K']}, {case['iters']} "
            f"iterations; passes PyTorch dense: {where}):",
            "",
            _table(["m", "method", *_MODELLED], rows),
            "",
        ]
    out.append(
        f"\\* the steps past the {_counted(res)} counted at the median of the last five. "
        "† not counted (beyond what this host can run): each counted step's modelled "
        "seconds taken as affine in the width through the two widest counted, PyTorch "
        "dense scaled linearly; an estimate of the model. " + STREAMED
    )
    return "\n".join(out)


#: the columns of a modelled device run, beside PyTorch dense modelled at its width
_MODELLED = ["modelled", "PyTorch dense", "vs PyTorch", "rows streamed", "worst step"]
#: what the "rows streamed" column of the device tables is
STREAMED = (
    "`rows streamed`: the same counts with every indexed access that moves whole rows (a "
    "row of `W(0)` or of the rows' state gathered or written back) priced at the memory "
    "bandwidth instead of the measured rate of scattered gathers: the model's other "
    "bound until a device measures its rate of row gathers."
)


def _streamed(r: dict) -> str:
    """The run's ratio to PyTorch dense with whole-row accesses streamed, where counted."""
    v = r.get("vs_torch_dense_streamed")
    return "–" if v is None else _x(v)


def _counted(res: dict) -> str:
    counted = sorted({c["steps_counted"] for c in res["results"].values()})
    return " or ".join(str(c) for c in counted)


SUITES = {
    "workloads": (
        "bench_workloads.py",
        "Whole runs where users train",
        'Whole runs -- set-up (`G = XXᵀ` and the method\'s preprocessing), `lr="auto"` and '
        "every iteration -- of every method on five workloads, against dense numpy and "
        "PyTorch (CPU) on the same data, model and learning rate. Every method's first "
        "losses match dense's to 1e-9 and each whole run's final loss equals a dense forward "
        "pass of its final weights (computed outside the timed run). One-time compilation "
        "is loaded before each timed run and is in no figure.",
    ),
    "widths": (
        "bench_widths.py",
        "Whole runs against width on real data",
        'The fastest exact trainer\'s whole run (set-up, `lr="auto"`, every iteration) on '
        "W2's image patches as the width grows (the kernel trainer), and, side by side in "
        "the same run, on data of the same kinds that the workloads do not use (other "
        "patches: other positions, 12×12 crops; scikit-learn's diabetes regression set, "
        "standardized and scaled to unit rows as every workload is) beside W2's patches and "
        "W5's breast cancer at the same width (the "
        "lazy and kernel trainers), against dense numpy (its first iterations, "
        "extrapolated), each run in a fresh process. A set-up is `G`, the float32 GEMM and "
        "the scans; the learning rate is apart.",
    ),
    "losses": (
        "bench_losses.py",
        "Classification losses",
        "The workloads whose labels are classes trained with their classification loss "
        "(W3: cross-entropy over ten outputs; W5: the logistic loss of one output) beside "
        "the squared loss: whole runs of the exact methods against dense numpy with the same "
        "loss, in one session; then held-out accuracy and log-loss beside scikit-learn's "
        "MLPClassifier and LogisticRegression.",
    ),
    "wide": (
        "bench_wide.py",
        "Widths beyond memory",
        "The kernel trainer on an implicit model: `W(0)` regenerated by blocks from a "
        "counter-based generator, never stored, the trained model kept as one coefficient "
        'per pair that ever fired. The whole run (set-up, `lr="auto"`, every iteration) '
        "split into its phases, with the peak RSS of the process.",
    ),
    "gpu": (
        "bench_gpu.py",
        "On one GPU",
        "corrtree's array path (`device=`) on one GPU against PyTorch dense gradient descent "
        "with explicit gradients on that GPU (float64, float32 with TF32 off, TF32), on the "
        'same data, model, learning rate and iterations; whole runs with `lr="auto"`; first '
        "losses equal to PyTorch float64's to 1e-9 and final weights of the whole runs to each "
        "other's (recorded: a disagreement does not end the suite).",
    ),
    "gpu_count": (
        "bench_gpu.py --count",
        "The device path counted on the CPU, modelled for an H200",
        'Each step of the device trainers run on `device="cpu"` and counted by a torch '
        "dispatch mode (launches, host synchronizations, uploads, gathered entries, flops, "
        "bytes; `corrtree.bench.device_count`), priced with primitive rates measured on an "
        "H200 and its datasheet bandwidth. The model is checked first on PyTorch's own dense "
        "loop, whose whole runs were measured on the H200.",
    ),
    "gpu_widths": (
        "bench_gpu.py --count-widths",
        "The device trainers against width, modelled for an H200",
        "The device trainers counted on the CPU as above at each width up to the workload's "
        "own, priced for an H200 (modelled, not measured), beside PyTorch dense float64 "
        "modelled at the same width from its counted step; worst step: the worst after the "
        "first three (launches / host synchronizations).",
    ),
    "sgd": (
        "bench_sgd.py",
        "Mini-batch SGD",
        "Image patches, batch 256, momentum 0.9: every method against dense numpy and "
        "`torch.optim.SGD` on the same batches.",
    ),
    "distributed": (
        "bench_distributed.py",
        "More than one machine",
        "Whole runs on a Dask LocalCluster against one process, the bytes each iteration "
        "moves, and each worker's peak memory.",
    ),
    "ddfn": (
        "bench_ddfn.py",
        "The firing detector (DDFN)",
        "Dynamic detection of firing pairs against recomputing the products, and what each "
        "structure costs to build and hold.",
    ),
    "train": (
        "bench_train.py",
        "Per-iteration time of the paper's trainers",
        "Per-iteration medians of dense, dtree and wtree as the width grows.",
    ),
    "lazy": (
        "bench_lazy.py",
        "The lazy trainer as the width grows",
        "Per-iteration medians and whole runs of the lazy trainer against dense.",
    ),
    "kernel": (
        "bench_kernel.py",
        "The kernel trainer as the width grows",
        "Per-iteration medians and whole runs of the kernel trainer against dense.",
    ),
}

FORMATS = {
    "ddfn": ddfn,
    "train": train,
    "lazy": lambda r: fast(r, "lazy"),
    "kernel": lambda r: fast(r, "kernel"),
    "distributed": distributed,
    "workloads": workloads,
    "losses": losses,
    "widths": widths,
    "sgd": sgd,
    "wide": wide,
    "gpu": gpu,
    "gpu_count": gpu_count,
    "gpu_widths": gpu_widths,
}

BEGIN, END = "<!-- results-table -->", "<!-- /results-table -->"
WIDE_BEGIN, WIDE_END = "<!-- wide-table -->", "<!-- /wide-table -->"
GPU_BEGIN, GPU_END = "<!-- gpu-table -->", "<!-- /gpu-table -->"


def benchmarks_readme(results: str, size: str) -> str:
    """The text of ``benchmarks/README.md``: every suite with results, its machine and
    tables."""
    out = [
        "# Benchmarks",
        "",
        "Generated by `python benchmarks/tables.py --write` from the JSON files in "
        "`benchmarks/results/`; do not edit by hand. Reproduce a suite with `python "
        "benchmarks/bench_NAME.py --size large` (10-60 minutes each on 2 cores) or "
        "`--size small` (a few minutes). Each method runs in a fresh process, started once "
        "the machine's free memory has been steady for 3 s; the machines are shared and "
        "their timings vary by up to 2x between runs, so ratios are measured side by side "
        "in one run. `*` marks a figure extrapolated from the first iterations.",
        "",
    ]
    for name, (script, title, what) in SUITES.items():
        res = _load(results, f"{name}_{size}")
        if res is None:
            continue
        out += [f"## {title} (`{script}`)", "", what, "", f"Measured on: {machine(res)}.", ""]
        out += [FORMATS[name](res), ""]
    return "\n".join(out).rstrip() + "\n"


def results_table(results: str, size: str) -> str:
    """The README's results table: the workloads' whole runs, without their details."""
    res = _load(results, f"workloads_{size}")
    if res is None:
        return "No workload results yet: run `python benchmarks/bench_workloads.py`.\n"
    table = workloads(res).split("\n\n", 1)[0]
    apart = measured_apart(res, "dense of the same run")
    return f"Measured on: {machine(res)}.{apart}\n\n{table}\n"


def wide_table(results: str, size: str) -> str:
    """The README's table of widths beyond memory."""
    res = _load(results, f"wide_{size}")
    if res is None:
        return "No results yet: run `python benchmarks/bench_wide.py`.\n"
    return f"Measured on: {machine(res)}.\n\n{wide_runs(res)}\n"


def gpu_table(results: str, size: str) -> str:
    """The README's table of whole runs on one GPU."""
    res = _load(results, f"gpu_{size}")
    if res is None:
        return (
            "No GPU results yet: `PYTHONPATH=src python3 benchmarks/bench_gpu.py --size large` "
            "on a CUDA machine writes them.\n"
        )
    return f"Measured on: {machine(res)}; {gpu(res)}\n"


def with_results(readme: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """``readme`` with the text between the markers ``begin`` and ``end`` replaced by
    ``table``."""
    head, rest = readme.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}{end}{tail}"


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="large")
    parser.add_argument("--results", default=os.path.join(here, "results"))
    parser.add_argument("--write", action="store_true", help="rewrite the two README files")
    args = parser.parse_args()
    text = benchmarks_readme(args.results, args.size)
    if not args.write:
        print(text)
        return
    with open(os.path.join(here, "README.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    top = os.path.join(os.path.dirname(here), "README.md")
    with open(top, encoding="utf-8") as fh:
        readme = fh.read()
    with open(top, "w", encoding="utf-8") as fh:
        readme = with_results(readme, results_table(args.results, args.size))
        readme = with_results(readme, wide_table(args.results, args.size), WIDE_BEGIN, WIDE_END)
        fh.write(with_results(readme, gpu_table(args.results, args.size), GPU_BEGIN, GPU_END))


if __name__ == "__main__":
    main()
