"""Timing, memory and reporting helpers shared by the benchmark suites."""

from __future__ import annotations

import multiprocessing
import os
import platform
import queue as queue_module
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write_json

__all__ = [
    "in_child",
    "loglog_plot",
    "machine_info",
    "median_time",
    "peak_rss_bytes",
    "print_table",
    "rss_bytes",
    "save_result",
    "settle",
    "slope",
    "warm_kernels",
]


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numba
    import scipy

    mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "numba": numba.__version__,
        "scipy": scipy.__version__,
        "numba_threads": numba.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
    }


def median_time(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> tuple[float, list]:
    """Median wall time of ``fn()`` over ``repeat`` runs (after ``warmup`` runs)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), times


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child_entry(queue, func, args):
    try:
        queue.put(("ok", func(*args)))
    except BaseException as exc:  # report any failure to the parent
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


#: Before each benchmark child: at least ``SETTLE_S`` seconds, then until the free
#: memory has changed by at most ``SETTLE_PAGES`` pages in each of ``SETTLE_QUIET``
#: consecutive seconds, at most ``SETTLE_MAX_S`` in all.  On a virtual machine the
#: gigabytes a child freed go back to the host in chunks for several seconds (virtio
#: free page reporting: 6 GiB took about 13 s here); a child timed meanwhile ran
#: 10-20% slower (W1 kernel: 3.7-4.0 s after 5 s against 3.2-3.4 s after 30 s).
SETTLE_S = 5.0
SETTLE_PAGES = 512
SETTLE_QUIET = 3
SETTLE_MAX_S = 60.0


def _free_pages() -> int | None:
    """The kernel's count of free pages (``/proc/vmstat``), or ``None`` if unknown."""
    try:
        with open("/proc/vmstat", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("nr_free_pages "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def settle(
    read: Callable[[], int | None] = _free_pages,
    sleep: Callable[[float], Any] = time.sleep,
) -> float:
    """Wait until the machine's free memory is steady (see :data:`SETTLE_S`); returns
    the seconds waited.  Without a free-page count it waits ``SETTLE_S``."""
    waited = 0.0
    sleep(SETTLE_S)
    waited += SETTLE_S
    last = read()
    quiet = 0
    while last is not None and quiet < SETTLE_QUIET and waited < SETTLE_MAX_S:
        sleep(1.0)
        waited += 1.0
        now = read()
        quiet = quiet + 1 if now is not None and abs(now - last) <= SETTLE_PAGES else 0
        last = now
    return waited


def in_child(func: Callable[..., Any], *args: Any, settle_first: bool = True) -> Any:
    """Run ``func(*args)`` in a fresh process (so its peak RSS is its own), once the
    machine has settled (:func:`settle`; not if ``settle_first`` is false)."""
    if settle_first:
        settle()
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_entry, args=(queue, func, args))
    proc.start()
    while True:  # a child killed (e.g. out of memory) never answers: do not wait for it
        try:
            status, value = queue.get(timeout=2.0)
            break
        except queue_module.Empty:
            if not proc.is_alive():
                raise RuntimeError(
                    f"benchmark child died (exit code {proc.exitcode}; out of memory?)"
                ) from None
    proc.join()
    if status != "ok":
        raise RuntimeError(f"benchmark child failed: {value}")
    return value


def slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def save_result(out_dir: str | os.PathLike, name: str, payload: dict[str, Any]) -> Path:
    """Write ``payload`` plus the machine description to ``out_dir/name.json``."""
    payload = {"benchmark": name, "machine": machine_info(), **payload}
    return atomic_write_json(Path(out_dir) / f"{name}.json", payload)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print (and return) a plain-text table."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[k]) for r in cells)) for k, h in enumerate(header)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def loglog_plot(
    path: str | os.PathLike,
    title: str,
    series: dict[str, tuple[list, list]],
    xlabel: str,
    ylabel: str,
) -> None:
    """A log-log line plot of ``{label: (x, y)}`` written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, (x, y) in series.items():
        ax.loglog(x, y, "o-", label=label, base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def warm_kernels(
    method: str, outputs: int = 1, X: np.ndarray | None = None, **options: Any
) -> None:
    """Load the method's compiled kernels (:func:`corrtree.warmup`) and, given the
    run's inputs ``X``, measure the band trainers' exchange rate on them
    (:func:`~corrtree.training._calibrate.scatter_cost`), so that a timed run that follows
    includes neither, as :func:`corrtree.train` keeps both outside its clock; ``options``
    with ``momentum`` or ``weight_decay`` load the kernels of the linear steps, with
    ``implicit`` those of an implicit model.  ``outputs`` is accepted for the callers'
    sake: the kernels do not depend on it."""
    from ..training._calibrate import scatter_cost
    from ..training._train import train
    from ..training._warmup import ensure

    del outputs
    linear = bool(options.get("momentum") or options.get("weight_decay"))
    ensure(train, method, linear, bool(options.get("implicit")))
    if X is not None and method in ("lazy", "kernel", "auto"):
        scatter_cost(X @ X.T, X)
