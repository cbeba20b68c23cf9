"""The device's primitive rates, measured where the device path runs: what
:mod:`.device_count` prices counted steps with.

:func:`measure_rates` times, on a torch device, the primitives that the model's rates
name (:data:`corrtree._config.RATE_NAMES`): a float64 GEMM ``G = XXᵀ``, a float32 GEMM
of a set-up's shape, gathers from a resident ``G`` with a row sum, as many entries in
whole rows (``row_gathers_per_s``, :data:`corrtree._config.OPTIONAL_RATE_NAMES`), a deterministic
``index_add_`` of as many entries, a streaming copy, a stable sort (``sorts_per_s``,
optional too), a launch and a host
synchronization.  ``bench_gpu.py`` measures them first on its device and prices its
counted runs with them (:func:`corrtree.bench.gpu.run`); ``bench_gpu.py --set-rates
RESULT`` stores them in the package's ``device_rates.json`` (:func:`set_rates`), from
which the device trainers price their choices and the CPU count its modelled runs.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from .. import _config
from .._device import synchronize
from .._io import atomic_write_json

__all__ = ["HOW", "SIZES", "measure_rates", "set_rates"]

#: What each size times: ``G = XXᵀ`` for ``X`` of ``(n, d)``; a float32 GEMM of
#: ``gemm32 = (rows, d, cols)``; ``gathers`` entries of ``G`` at random places, summed
#: by row; as many accumulated by ``index_add_``; a copy of ``stream_bytes``; a stable
#: sort of ``sort_records`` float64 keys with their indices;
#: ``launches`` one-element additions; ``syncs`` additions each read back.  ``large`` is
#: the H200's (the shapes of the rates in ``device_rates.json``); ``small`` the tests'.
SIZES: dict[str, dict[str, Any]] = {
    "small": {
        "n": 256,
        "d": 96,
        "gemm32": (2**12, 96, 256),
        "gathers": 2**18,
        "stream_bytes": 2**24,
        "sort_records": 2**16,
        "launches": 200,
        "syncs": 50,
        "reps": 3,
    },
    "large": {
        "n": 2048,
        "d": 768,
        "gemm32": (2**16, 784, 4096),
        "gathers": 14 * 2**20,
        "stream_bytes": 2**31,
        "sort_records": 450_000,
        "launches": 2000,
        "syncs": 200,
        "reps": 20,
    },
}

#: The row length of the whole-row gathers that give ``row_gathers_per_s``
ROW_GATHER_RUN = 512

#: How :func:`measure_rates` measures (stored with the rates).
HOW = (
    "corrtree.bench.rates.measure_rates: median of {reps} (CUDA events on a GPU): G = XX^T "
    "at n = {n}, d = {d} in float64; a float32 GEMM {gemm32}; {gathers} gathers from "
    "the resident G with a row sum; as many in whole random rows of {row_run} of a "
    "resident matrix; a deterministic index_add_ of as many; a copy of "
    "{stream_bytes} bytes (read and written); a stable sort of {sort_records} float64 keys; "
    "{launches} one-element additions queued; "
    "{syncs} additions each read back (less a launch)"
)


def _median_s(torch: Any, dev: Any, fn: Any, reps: int) -> float:
    """Median seconds of ``fn()`` on ``dev`` after two warm-up calls: by CUDA events on
    a GPU, else by the clock around a synchronized call."""
    for _ in range(2):
        fn()
    synchronize(dev)
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            synchronize(dev)
            times.append(time.perf_counter() - t0)
    times.sort()
    return float(times[len(times) // 2])


def measure_rates(device: Any = "cpu", size: str = "large") -> dict[str, Any]:
    """The primitive rates of ``device`` (:data:`SIZES` ``[size]``): ``{"rates": by the
    names of :data:`corrtree._config.RATE_NAMES`, "timings_s": each primitive's median
    seconds, "device", "device_name", "torch", "how", "date"}``.  Seconds on an H200
    (``large``): about ten.  ``gathers_by_source_per_s``: as many gathers from a table
    of ``n + 1`` entries and from each row's own row, beside the resident ``G``'s (the
    model prices every gather at the latter; a device run shows how far the others are
    from it)."""
    import torch

    from .._device import resolve

    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    dev = resolve(device)
    cfg = SIZES[size]
    reps = cfg["reps"]
    gen = torch.Generator(device=dev).manual_seed(0)
    f64, f32 = torch.float64, torch.float32

    def randn(*shape: int, dtype: Any = f64) -> Any:
        return torch.randn(*shape, generator=gen, dtype=dtype, device=dev)

    n, d = cfg["n"], cfg["d"]
    rows, inner, cols = cfg["gemm32"]
    per = max(1, min(n // 2, cfg["gathers"]))
    k = max(1, cfg["gathers"] // per)
    entries = k * per

    def timed(fn: Any, times: int = reps) -> float:
        return _median_s(torch, dev, fn, times)

    def gram() -> float:
        X = randn(n, d)
        return timed(lambda: X @ X.T)

    def gemm32() -> float:
        A, B = randn(rows, inner, dtype=f32), randn(cols, inner, dtype=f32)
        return timed(lambda: A @ B.T)

    def gathers() -> float:
        X = randn(n, d)
        G = X @ X.T
        at = torch.randint(0, n, (k, 1), generator=gen, device=dev)
        cols_j = torch.randint(0, n, (k, per), generator=gen, device=dev)
        return timed(lambda: G[at, cols_j].sum(dim=1))

    # the same number of gathers from other sources, timed beside the rate (not yet
    # priced by the model): a table of n + 1 entries (the error vector, the norms: what
    # the device kernel's clocks and visits gather from), and each row's entries from
    # its own row of n + 1 (a visit's values at its places)
    def gathers_table() -> float:
        table = randn(n + 1)
        at = torch.randint(0, n + 1, (k, per), generator=gen, device=dev)
        return timed(lambda: table[at].sum(dim=1))

    def gathers_rows() -> float:
        M = randn(k, n + 1)
        at = torch.randint(0, n + 1, (k, per), generator=gen, device=dev)
        return timed(lambda: torch.gather(M, 1, at).sum(dim=1))

    def gathers_whole_rows() -> float:
        # as many entries in whole rows of 512 (the run of a visit's packed places, of a
        # row of W(0)) from a resident matrix of twice the entries: row_gathers_per_s
        run = ROW_GATHER_RUN
        M = randn(max(2, 2 * entries // run), run)
        at = torch.randint(0, M.shape[0], (max(1, entries // run),), generator=gen, device=dev)
        return timed(lambda: M[at])

    def scatters() -> float:
        places = torch.randint(0, n * n, (entries,), generator=gen, device=dev)
        values = randn(entries)
        target = torch.zeros(n * n, dtype=f64, device=dev)
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            return timed(lambda: target.index_add_(0, places, values))
        finally:
            torch.use_deterministic_algorithms(was)

    def stream() -> float:
        src = torch.zeros(cfg["stream_bytes"] // 8, dtype=f64, device=dev)
        dst = torch.empty_like(src)
        return timed(lambda: dst.copy_(src))

    def sort() -> float:
        keys = randn(cfg["sort_records"])
        return timed(lambda: torch.sort(keys, stable=True))

    one = torch.zeros(1, dtype=f64, device=dev)

    def queued() -> None:
        for _ in range(cfg["launches"]):
            one.add_(1.0)

    def round_trips() -> None:
        for _ in range(cfg["syncs"]):
            one.add_(1.0)
            float(one.item())

    t: dict[str, float] = {
        "gram64": gram(),
        "gemm32": gemm32(),
        "gathers": gathers(),
        "gathers_table": gathers_table(),
        "gathers_rows": gathers_rows(),
        "gathers_whole_rows": gathers_whole_rows(),
        "scatters": scatters(),
        "stream": stream(),
        "sort": sort(),
        "launch": timed(queued, max(3, reps // 4)) / cfg["launches"],
    }
    t["sync"] = max(timed(round_trips, max(3, reps // 4)) / cfg["syncs"] - t["launch"], 1e-9)
    rates = {
        "flops64_per_s": 2.0 * n * n * d / t["gram64"],
        "flops32_per_s": 2.0 * rows * inner * cols / t["gemm32"],
        "gathers_per_s": entries / t["gathers"],
        "row_gathers_per_s": ROW_GATHER_RUN
        * max(1, entries // ROW_GATHER_RUN)
        / t["gathers_whole_rows"],
        "scatters_per_s": entries / t["scatters"],
        "bytes_per_s": 2.0 * cfg["stream_bytes"] / t["stream"],
        "sorts_per_s": cfg["sort_records"] / t["sort"],
        "launch_s": t["launch"],
        "sync_s": t["sync"],
    }
    return {
        "rates": rates,
        # gathered entries a second by source, to set against gathers_per_s (a resident G)
        "gathers_by_source_per_s": {
            "resident_G": rates["gathers_per_s"],
            "table_of_n": entries / t["gathers_table"],
            "within_rows": entries / t["gathers_rows"],
            "whole_rows": rates["row_gathers_per_s"],
        },
        "timings_s": t,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
        "torch": torch.__version__,
        "how": HOW.format(**cfg, row_run=ROW_GATHER_RUN),
        "date": time.strftime("%Y-%m-%d"),
    }


def set_rates(
    result: str | Path, rates_file: str | Path = _config.DEVICE_RATES_FILE, kind: str = "cuda"
) -> dict[str, Any]:
    """Store the rates that a ``bench_gpu.py`` run measured (its JSON ``result``, key
    ``rates_measured``) as the ``kind`` rates of ``rates_file`` (by default the
    package's), with where and how they were measured; the file's other kinds stay.
    Written atomically and read back; a result without measured rates, or with rates
    that are not positive and finite, is refused in one line.  Returns the file's
    contents."""
    with open(result, encoding="utf-8") as fh:
        payload = json.load(fh)
    got = payload.get("rates_measured")
    if not isinstance(got, dict) or "rates" not in got:
        reason = got.get("error") if isinstance(got, dict) else "no key rates_measured"
        raise ValueError(f"result: {result} holds no measured rates ({reason})")
    rates = got["rates"]
    bad = [
        k
        for k in _config.RATE_NAMES
        if not (isinstance(rates.get(k), int | float) and math.isfinite(rates[k]) and rates[k] > 0)
    ]
    if bad:
        raise ValueError(f"result: {result}: rates {', '.join(bad)} missing or not positive")
    current = _config.device_rates(rates_file) if Path(rates_file).exists() else {}
    out = {
        **current,
        kind: {
            **{k: float(rates[k]) for k in _config.RATE_NAMES},
            **{
                k: float(rates[k])
                for k in _config.OPTIONAL_RATE_NAMES
                if isinstance(rates.get(k), int | float)
                and math.isfinite(rates[k])
                and rates[k] > 0
            },
            "measured_on": f"{got.get('device_name', '?')} (PyTorch {got.get('torch', '?')})",
            "how": got.get("how", ""),
            "date": got.get("date", time.strftime("%Y-%m-%d")),
        },
    }
    atomic_write_json(rates_file, out)
    return _config.device_rates(rates_file)
