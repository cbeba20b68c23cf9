"""The device path counted on the CPU and priced for an H200 (``bench_gpu.py --count`` and
``--count-widths``): whole runs of the device trainers step by step, the rows they find
due against the CPU trainers', and PyTorch's dense loop beside them.

The counter and its prices are :mod:`.op_counts` (:class:`OpCounter`, :class:`Counts`,
:func:`modelled_seconds`, :func:`streamed_seconds`, :data:`H200`; re-exported here).  The
model is validated on PyTorch's own dense loop, whose whole runs were measured on an
H200 (:data:`MEASURED_DENSE`): :func:`validate_dense` counts that loop here and compares.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from .. import _config
from .op_counts import H200, Counts, OpCounter, modelled_seconds, streamed_seconds

__all__ = [
    "H200",
    "MEASURED_DENSE",
    "Counts",
    "OpCounter",
    "count_dense_step",
    "count_train",
    "due_rows",
    "extrapolated_width",
    "modelled_seconds",
    "run_widths",
    "streamed_seconds",
    "validate_dense",
]


#: PyTorch dense float64 gradient descent measured on one H200 (explicit gradients, whole
#: runs synchronized; ``docs/design.md``): the workload, its shape (n, d, K, m,
#: iterations) and seconds.  ``"W1 at 2^20"`` and ``"W1 at 2^22"`` are seconds a step.
MEASURED_DENSE: dict[str, dict[str, Any]] = {
    "W1": {"n": 1024, "d": 784, "K": 1, "m": 2**17, "iters": 300, "seconds": 3.59},
    "W2": {"n": 2048, "d": 768, "K": 1, "m": 2**16, "iters": 200, "seconds": 2.15},
    "W3": {"n": 1797, "d": 64, "K": 10, "m": 2**17, "iters": 100, "seconds": 0.69},
    "W4": {"n": 4096, "d": 784, "K": 1, "m": 2**18, "iters": 50, "seconds": 4.52},
    "W5": {"n": 569, "d": 30, "K": 1, "m": 2**16, "iters": 300, "seconds": 0.33},
    "W1 at 2^20": {"n": 1024, "d": 784, "K": 1, "m": 2**20, "iters": 1, "seconds": 0.096},
    "W1 at 2^22": {"n": 1024, "d": 784, "K": 1, "m": 2**22, "iters": 1, "seconds": 0.393},
}


def count_dense_step(
    n: int, d: int, K: int, m: int, seed: int = 0, rates: dict[str, float] | None = None
) -> Counts:
    """The counts of one step of PyTorch's dense loop (:func:`~.gpu.torch_dense`, float64)
    at ``(n, d, K, m)``, on the CPU, its work priced with ``rates`` (:data:`H200` by
    default)."""
    import torch

    from .gpu import dense_step

    rng = np.random.default_rng(seed)
    X = torch.as_tensor(rng.standard_normal((n, d)))
    Y = torch.as_tensor(rng.standard_normal((n, K)))
    A = torch.as_tensor(rng.choice([-1.0, 1.0], size=(m, K)))
    W = torch.as_tensor(rng.standard_normal((m, d)))
    b = math.sqrt(0.4 * math.log(m))
    dense_step(W, X, Y, A, b, 1e-3)  # warm: the first call allocates
    with OpCounter(rates) as counter:
        dense_step(W, X, Y, A, b, 1e-3)
    return counter.counts


def validate_dense(count_m: int = 2**12) -> dict[str, dict[str, float]]:
    """The model against :data:`MEASURED_DENSE`: each workload's dense step counted at
    width ``count_m`` (dense's work is linear in ``m``; its launches and synchronizations
    do not depend on it), scaled to the workload's width, priced, times its iterations.
    Returns measured and modelled seconds and their ratio by workload."""
    out = {}
    for name, w in MEASURED_DENSE.items():
        step = count_dense_step(w["n"], w["d"], w["K"], count_m).scaled(w["m"] / count_m)
        modelled = modelled_seconds(step) * w["iters"]
        out[name] = {
            "measured_s": w["seconds"],
            "modelled_s": modelled,
            "ratio": modelled / w["seconds"],
            "launches_per_step": step.launches,
            "syncs_per_step": step.syncs,
        }
    return out


@contextmanager
def _h200_memory(free: float = 139.0 * 2**30) -> Iterator[None]:
    """The device trainers' chunk and bucket sizes as on an H200: their free-memory reads
    answer ``free`` (the counting sizes are chosen to fit this host); and their choices
    priced with its rates (:data:`~corrtree._config.DEVICE_RATES`: a counted ``cpu``
    tensor stands for a ``cuda`` one)."""
    from ..training import device_band, device_counts, device_dense, device_kernel

    modules = (device_band, device_counts, device_dense, device_kernel)
    saved = [m.free_bytes for m in modules]
    rates = _config.DEVICE_RATES["cpu"]
    for m in modules:
        m.free_bytes = lambda dev: free  # type: ignore[attr-defined]
    _config.DEVICE_RATES["cpu"] = _config.DEVICE_RATES["cuda"]
    try:
        yield
    finally:
        _config.DEVICE_RATES["cpu"] = rates
        for m, f in zip(modules, saved, strict=True):
            m.free_bytes = f  # type: ignore[attr-defined]


def count_train(
    train: Callable[..., Any],
    model: Any,
    X: np.ndarray,
    Y: np.ndarray,
    device: Any = "cpu",
    rates: dict[str, float] | None = None,
    as_h200: bool | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """``train(model, X, Y, device=device, **kwargs)`` counted step by step: the counts
    of the set-up with the first step, then of each later step (work priced with
    ``rates``, :data:`H200` by default), and the wall time.  With ``as_h200`` (the
    default on ``"cpu"``) the trainers size their chunks and price their choices as on
    an H200 (:func:`_h200_memory`); else as they do where they run."""
    steps: list[Counts] = []
    last = Counts()

    def mark(t: int, hist: Any) -> None:
        nonlocal last
        now = counter.counts.copy()
        steps.append(now - last)
        last = now

    real = str(device) != "cpu"
    as_h200 = not real if as_h200 is None else as_h200
    t0 = time.perf_counter()
    with (
        _h200_memory() if as_h200 else nullcontext(),
        OpCounter(rates, real=real) as counter,
    ):
        hist = train(model, X, Y, device=device, callback=mark, **kwargs)
    return {"steps": steps, "history": hist, "wall_s": time.perf_counter() - t0}


@contextmanager
def visited_rows() -> Iterator[dict[str, list[tuple[int, int, int]]]]:
    """Record the rows each step of the kernel trainers visits: ``"cpu"`` (the numba
    :class:`~corrtree.training.kernel.KernelTrainer`: the rows its clocks or heap make
    due) and ``"device"`` (:class:`~corrtree.training.device_kernel.DeviceKernelTrainer`:
    the rows its due mask marks), one ``(trainer, m, rows)`` a step (a step's passes
    summed; the trainer's serial number and width tell the run from the small ones that load
    kernels first, :func:`last_run`).  #46's target compares the
    two: on a device a visit's values come by GEMM for the whole row, so its cost is the
    rows it visits, not the values it needs."""
    from ..training.device_kernel import DeviceKernelTrainer
    from ..training.kernel import KernelTrainer

    got: dict[str, list[tuple[int, int, int]]] = {"cpu": [], "device": []}
    saved: list[tuple[Any, str, Any]] = []
    serial: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
    made = itertools.count()

    def wrap(cls: Any, kind: str, visit: str, rows_of: Callable[..., int]) -> None:
        advance, inner = cls.advance, getattr(cls, visit)

        def step(self, *args: Any, **kwargs: Any) -> Any:
            if self not in serial:  # not id(): a freed trainer's id may be reused
                serial[self] = next(made)
            got[kind].append((serial[self], self.m, 0))
            return advance(self, *args, **kwargs)

        def counted(self, *args: Any, **kwargs: Any) -> Any:
            who, m, rows = got[kind][-1]
            got[kind][-1] = (who, m, rows + rows_of(*args))
            return inner(self, *args, **kwargs)

        saved.extend(((cls, "advance", advance), (cls, visit, inner)))
        cls.advance = step
        setattr(cls, visit, counted)

    wrap(KernelTrainer, "cpu", "_visit", lambda rows, *rest: len(rows))
    wrap(DeviceKernelTrainer, "device", "_visit_due", lambda due, ndue, *rest: int(ndue))
    try:
        yield got
    finally:
        for cls, attr, original in saved:
            setattr(cls, attr, original)


def last_run(steps: list[tuple[int, int, int]], m: int) -> list[int]:
    """The rows a step of the last trainer of width ``m`` that :func:`visited_rows`
    recorded visited (loading the kernels runs small trainings first, some as wide)."""
    last = next((who for who, width, _ in reversed(steps) if width == m), None)
    return [rows for who, _, rows in steps if who == last]


#: #46's target: the device kernel trainer's due rows a step at most this many times the
#: CPU kernel trainer's visited rows, W2 and W3
DUE_RATIO_TARGET = 1.1


def due_rows(
    train: Callable[..., Any],
    X: np.ndarray,
    y: np.ndarray,
    m: int,
    iters: int,
    K: int,
    device: list[int] | None = None,
) -> dict[str, Any]:
    """The rows the kernel trainer visits each step on the CPU (numba) and on
    ``device="cpu"`` (the device trainer, as it runs on a GPU; ``device``: its rows
    recorded already, by :func:`visited_rows` around a counted run), from the same model,
    and the largest ratio of the two over the steps (a step where the CPU visits no row
    counts its device rows over one)."""
    from ..model import TwoLayerReLU

    runs = {} if device is None else {"device": list(device)}
    for kind, extra in (("cpu", {}), ("device", {"device": "cpu"})):
        if kind in runs:
            continue
        model = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=K, seed=7)
        with visited_rows() as got:
            train(model, X, y, method="kernel", iters=iters, **extra)
        runs[kind] = last_run(got[kind], m)
    steps = min(len(runs["cpu"]), len(runs["device"]))  # a run may converge early
    ratio = max(
        (v / max(c, 1) for v, c in zip(runs["device"][:steps], runs["cpu"][:steps], strict=True)),
        default=math.nan,
    )
    return {
        "m": m,
        "cpu": runs["cpu"],
        "device": runs["device"],
        "ratio": ratio,
        "target": DUE_RATIO_TARGET,
        "met": bool(ratio <= DUE_RATIO_TARGET),
    }


#: What ``bench_gpu.py --count`` counts: each workload's data at a width that a CPU
#: counts in minutes (``m``), the steps counted of its ``iters`` (the rest extrapolated
#: from the median of the last five counted), and the device methods.  ``small`` is the
#: tests' (seconds).
COUNT_SIZES: dict[str, dict[str, Any]] = {
    "small": {
        "scale_n": 1 / 8,
        "cases": {"W1": (2**10, 8), "W5": (2**10, 8)},
        "methods": ("dense", "lazy", "kernel"),
        "due": ("W5",),
    },
    "large": {
        "scale_n": 1.0,
        "cases": {"W1": (2**13, 30), "W2": (2**12, 8), "W3": (2**12, 8), "W5": (2**13, 30)},
        "methods": ("dense", "lazy", "kernel"),
        "due": ("W2", "W3"),
    },
}

#: #46's targets for a counted step of the device lazy and kernel trainers: the first
#: three steps (mass re-anchoring), the later ones, and a later step with nothing due.
STEP_TARGETS = {
    "first_three": {"syncs": 8, "launches": 300},
    "later": {"syncs": 2, "launches": 150},
    "nothing_due": {"syncs": 1, "launches": 40},
}


def _whole(
    steps: list[Counts],
    iters: int,
    rates: dict[str, float] | None = None,
    price: Callable[..., float] | None = None,
) -> tuple[float, bool]:
    """Modelled seconds of a whole run from its counted steps (the rest at the median of
    the last five counted), each priced by ``price`` (:func:`modelled_seconds` by
    default, or :func:`streamed_seconds`), and whether it was extrapolated."""
    price = modelled_seconds if price is None else price
    return _run_of([price(c, rates) for c in steps], iters)


def _run_figures(steps: list[Counts], iters: int, torch_s: float) -> dict[str, Any]:
    """A counted run's whole modelled seconds, by :func:`modelled_seconds` and by
    :func:`streamed_seconds`, each beside PyTorch dense's ``torch_s``."""
    whole, extrapolated = _whole(steps, iters)
    streamed, _ = _whole(steps, iters, price=streamed_seconds)
    return {
        "modelled_s": whole,
        "extrapolated": extrapolated,
        "vs_torch_dense": torch_s / whole,
        "modelled_streamed_s": streamed,
        "vs_torch_dense_streamed": torch_s / streamed,
    }


def _run_of(per: list[float], iters: int) -> tuple[float, bool]:
    """A whole run of ``iters`` steps from the modelled seconds ``per`` of its first
    ones (the rest at the median of the last five) and whether it was extrapolated."""
    rest = iters - len(per)
    return sum(per) + max(0, rest) * float(np.median(per[-5:])), rest > 0


#: #46's modelled targets at widths beyond what the CPU can count (the device trainers
#: on W1 at m = 2^22 hold 26 GB of rows; W2's kernel at 2^20 counted 8 steps at 2^16 in
#: 156 s and would take hours): workload -> (width, least ratio to PyTorch dense).
WIDE_TARGETS: dict[str, tuple[int, float]] = {"W1": (2**22, 30.0), "W2": (2**20, 10.0)}


def extrapolated_width(case: dict[str, Any], m: int, method: str = "kernel") -> dict[str, Any]:
    """A case of :func:`run_widths` carried to width ``m`` beyond those counted: each
    counted step's modelled seconds (and streamed seconds, where recorded) taken as
    affine in the width through the two widest counted widths (a step's work grows with
    the rows it reaches, its launches and synchronizations do not), never below the
    widest's, the run completed as :func:`_whole` does; PyTorch dense scaled linearly
    (its step is linear in ``m``).  An estimate of the model, not a count."""
    if len(case["widths"]) < 2 or m <= case["widths"][-1]["m"]:
        raise ValueError(
            f"m={m}: extrapolated_width needs two counted widths below it, "
            f"got {[p['m'] for p in case['widths']]}"
        )
    a, b = (p["runs"][method] for p in case["widths"][-2:])
    ma, mb = (p["m"] for p in case["widths"][-2:])
    out: dict[str, Any] = {"m": m, "from": [ma, mb], "method": method}
    torch_s = case["widths"][-1]["torch_dense_s"] * m / mb
    out["torch_dense_s"] = torch_s
    for key, name in (("modelled_per_step_s", ""), ("streamed_per_step_s", "_streamed")):
        if key not in a or key not in b:
            continue
        pa, pb = np.asarray(a[key]), np.asarray(b[key])
        per = np.maximum(pb + (pb - pa) * (m - mb) / (mb - ma), pb)
        whole, _ = _run_of(list(per), case["iters"])
        out[f"modelled{name}_s"] = whole
        out[f"vs_torch_dense{name}"] = torch_s / whole
    return out


def nothing_due(hist: Any) -> list[bool]:
    """Which steps of a counted run of a device band trainer visited nothing: evaluated
    no pair and re-anchored no neuron (the kernel trainer with no neuron due; the lazy
    trainer evaluates every tracked pair every step, so never)."""
    return [v == 0 and r == 0 for v, r in zip(hist.evaluated_pairs, hist.reanchored, strict=True)]


def _targets(steps: list[Counts], idle: list[bool]) -> dict[str, Any]:
    """The worst counts of the first three steps, the later ones and the later ones that
    visited nothing (``idle``, by step), against :data:`STEP_TARGETS`."""
    later = steps[3:]
    quiet = [c for c, q in zip(later, idle[3:], strict=True) if q]
    out: dict[str, Any] = {}
    for key, group in (("first_three", steps[:3]), ("later", later), ("nothing_due", quiet)):
        if not group:
            continue
        worst = {"syncs": max(c.syncs for c in group), "launches": max(c.launches for c in group)}
        limit = STEP_TARGETS[key]
        out[key] = {
            **worst,
            "target": limit,
            "met": all(worst[k] <= limit[k] for k in limit),
        }
    return out


def run_count(
    size: str = "large",
    out_dir: str = "benchmarks/results",
    only: str | None = None,
    methods: str | None = None,
) -> dict[str, Any]:
    """``bench_gpu.py --count``: the model validated on PyTorch dense, then each workload's
    device methods counted step by step on the CPU and priced for an H200, beside PyTorch
    dense at the same width.  JSON in ``out_dir/gpu_count_SIZE.json``; with ``only`` (some
    workloads, comma-separated) or ``methods`` (some methods), the other counts stored
    there are kept, and each recounted run records ``counted_on`` (its date)."""
    from ..model import TwoLayerReLU
    from ..training import train
    from ._util import print_table, save_result
    from .workloads import WORKLOADS, load

    cfg = COUNT_SIZES[size]
    payload: dict[str, Any] = {"size": size, "rates": H200, "step_targets": STEP_TARGETS}
    payload["dense_validation"] = validate_dense()
    results: dict[str, Any] = {}
    previous = os.path.join(out_dir, f"gpu_count_{size}.json")
    if (only or methods) and os.path.exists(previous):
        with open(previous, encoding="utf-8") as fh:
            results = json.load(fh)["results"]
    for name, (m, counted) in cfg["cases"].items():
        if only and name not in only.split(","):
            continue
        w = WORKLOADS[name]
        X, Y = load(w["data"], w["args"], cfg["scale_n"])
        y = Y if Y.shape[1] > 1 else Y[:, 0]
        iters = w["iters"]
        torch_step = count_dense_step(X.shape[0], X.shape[1], Y.shape[1], m)
        torch_s = modelled_seconds(torch_step) * iters
        case: dict[str, Any] = {
            "n": X.shape[0],
            "d": X.shape[1],
            "K": Y.shape[1],
            "m": m,
            "iters": iters,
            "steps_counted": counted,
            "torch_dense": {"step": torch_step.as_dict(), "modelled_s": torch_s},
            "runs": dict(results.get(name, {}).get("runs", {})),
        }
        if "due_rows" in results.get(name, {}):  # kept unless the kernel is counted again
            case["due_rows"] = results[name]["due_rows"]
        for method in cfg["methods"]:
            if methods and method not in methods.split(","):
                continue
            tiny = TwoLayerReLU.init(d=X.shape[1], m=256, outputs=Y.shape[1], seed=7)
            train(tiny, X[:64], y[:64], method=method, iters=3, device="cpu")  # compile
            model = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=Y.shape[1], seed=7)
            with visited_rows() as visits:
                got = count_train(train, model, X, y, method=method, iters=counted)
            hist = got["history"]
            if method == "kernel" and name in cfg["due"]:
                seen = last_run(visits["device"], m)
                case["due_rows"] = due_rows(train, X, y, m, counted, Y.shape[1], seen)
            case["runs"][method] = {
                **_run_figures(got["steps"], iters, torch_s),
                "counted_wall_s": got["wall_s"],
                "steps": [
                    c.as_dict()
                    | {"modelled_s": modelled_seconds(c), "streamed_s": streamed_seconds(c)}
                    for c in got["steps"]
                ],
                "moved_neurons": list(hist.moved_neurons),
                "targets": (
                    _targets(got["steps"], nothing_due(hist)) if method != "dense" else None
                ),
                "counted_on": time.strftime("%Y-%m-%d"),
            }
        results[name] = case
        save_result(out_dir, f"gpu_count_{size}", {**payload, "results": results})
    rows = [
        [k, v["measured_s"], v["modelled_s"], v["ratio"]]
        for k, v in payload["dense_validation"].items()
    ]
    print_table(
        "PyTorch dense float64 on an H200: measured and modelled",
        ["run", "measured s", "modelled s", "ratio"],
        rows,
    )
    rows = []
    for name, case in results.items():
        for method, r in case["runs"].items():
            later = (r["targets"] or {}).get("later", {})
            rows.append([
                name, case["m"], method, r["modelled_s"], case["torch_dense"]["modelled_s"],
                r["vs_torch_dense"], later.get("launches", "-"), later.get("syncs", "-"),
            ])  # fmt: skip
    print_table(
        "Modelled H200 whole runs (counted on the CPU)",
        ["workload", "m", "method", "modelled s", "torch dense s", "vs torch", "launches", "syncs"],
        rows,
    )
    rows = [
        [name, due["m"], max(due["device"], default=0), max(due["cpu"], default=0), due["ratio"]]
        for name, case in results.items()
        if (due := case.get("due_rows"))
    ]
    if rows:
        print_table(
            "Kernel trainer: rows due a step, device against CPU (target: ratio <= 1.1)",
            ["workload", "m", "device, most", "CPU, most", "worst ratio"],
            rows,
        )
    return {**payload, "results": results}


#: ``bench_gpu.py --count-widths``: the device trainers' modelled whole runs as the width
#: grows, up to each workload's own width: per case the widths, the steps counted at each
#: (the rest extrapolated as :func:`run_count` does) and the methods.  ``small`` is the
#: tests' (seconds).
COUNT_WIDTHS: dict[str, dict[str, Any]] = {
    "small": {"scale_n": 1 / 8, "cases": {"W1": ((2**10, 2**11), 6, ("kernel",))}},
    "large": {
        "scale_n": 1.0,
        "cases": {
            "W1": ((2**13, 2**14, 2**15, 2**16, 2**17), 30, ("kernel",)),
            "W2": ((2**12, 2**13, 2**14, 2**15, 2**16), 8, ("kernel",)),
            # the kernel trainer's H has (nK)^2 = 3.2e8 entries at W3's ten outputs: its
            # modelled run is 36x the lazy one's at 2^12 (8.7 s), and counting it takes
            # minutes a step on the CPU
            "W3": ((2**12, 2**13, 2**14, 2**15, 2**16, 2**17), 8, ("lazy",)),
            "W5": ((2**13, 2**14, 2**15, 2**16), 30, ("kernel", "lazy")),
        },
    },
}


def run_widths(
    size: str = "large", out_dir: str = "benchmarks/results", only: str | None = None
) -> dict[str, Any]:
    """``bench_gpu.py --count-widths``: each case's device methods counted at each width
    (:data:`COUNT_WIDTHS`) and priced for an H200, beside PyTorch dense modelled at the
    same width, with the first width at which each passes it.  JSON in
    ``out_dir/gpu_widths_SIZE.json``, saved after every width; with ``only`` (some
    cases, comma-separated) the other cases stored there are kept."""
    from ..model import TwoLayerReLU
    from ..training import train
    from ._util import print_table, save_result
    from .workloads import WORKLOADS, load

    cfg = COUNT_WIDTHS[size]
    payload: dict[str, Any] = {"size": size, "rates": H200, "step_targets": STEP_TARGETS}
    results: dict[str, Any] = {}
    previous = os.path.join(out_dir, f"gpu_widths_{size}.json")
    if only and os.path.exists(previous):
        with open(previous, encoding="utf-8") as fh:
            results = {k: v for k, v in json.load(fh)["results"].items() if k in cfg["cases"]}
    rows = []
    for name, (widths, counted, methods) in cfg["cases"].items():
        if only and name not in only.split(","):
            continue
        w = WORKLOADS[name]
        X, Y = load(w["data"], w["args"], cfg["scale_n"])
        y = Y if Y.shape[1] > 1 else Y[:, 0]
        iters = w["iters"]
        case: dict[str, Any] = {
            "n": X.shape[0], "d": X.shape[1], "K": Y.shape[1], "iters": iters,
            "steps_counted": counted, "widths": [], "passes_torch_dense_at": {},
        }  # fmt: skip
        results[name] = case
        for method in methods:
            tiny = TwoLayerReLU.init(d=X.shape[1], m=256, outputs=Y.shape[1], seed=7)
            train(tiny, X[:64], y[:64], method=method, iters=3, device="cpu")  # compile
        for m in widths:
            torch_s = modelled_seconds(count_dense_step(X.shape[0], X.shape[1], Y.shape[1], m))
            torch_s *= iters
            point: dict[str, Any] = {"m": m, "torch_dense_s": torch_s, "runs": {}}
            for method in methods:
                model = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=Y.shape[1], seed=7)
                got = count_train(train, model, X, y, method=method, iters=counted)
                figures = _run_figures(got["steps"], iters, torch_s)
                whole = figures["modelled_s"]
                later = got["steps"][3:]
                point["runs"][method] = {
                    **figures,
                    "worst_later": {
                        "launches": max(c.launches for c in later),
                        "syncs": max(c.syncs for c in later),
                    },
                    "syncs_per_step": [c.syncs for c in got["steps"]],
                    "modelled_per_step_s": [modelled_seconds(c) for c in got["steps"]],
                    "streamed_per_step_s": [streamed_seconds(c) for c in got["steps"]],
                    "launches_per_step": [c.launches for c in got["steps"]],
                    "evaluated_pairs": list(got["history"].evaluated_pairs),
                    "counted_wall_s": got["wall_s"],
                }
                if torch_s >= whole:
                    case["passes_torch_dense_at"].setdefault(method, m)
                rows.append([name, m, method, whole, torch_s, torch_s / whole])
            case["widths"].append(point)
            if name in WIDE_TARGETS and len(case["widths"]) >= 2:  # #46's wide target
                wide, least = WIDE_TARGETS[name]
                beyond = extrapolated_width(case, wide, methods[-1])
                case["beyond"] = beyond | {"target": least}
            payload["counted_on"] = time.strftime("%Y-%m-%d")
            save_result(out_dir, f"gpu_widths_{size}", {**payload, "results": results})
    print_table(
        "Modelled H200 whole runs against width (counted on the CPU)",
        ["workload", "m", "method", "modelled s", "torch dense s", "vs torch"],
        rows,
    )
    return {**payload, "results": results}
