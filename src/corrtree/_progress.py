"""The command line's live progress bar (rich), with a plain fallback."""

from __future__ import annotations

import time
from typing import Any

from .training import History

__all__ = ["Progress", "progress_bar"]


def _short(count: float) -> str:
    """A count or rate in at most 5 characters: 7.5, 999, 12.3k, 4.56M."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:.3g}" if count < 100 else f"{count:.0f}"


def progress_bar(console=None):
    """A rich progress bar that fits the terminal: the bar takes what the label,
    ``done/total``, the statistics and the time left leave."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as RichProgress

    return RichProgress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=None),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeRemainingColumn(compact=True),
        console=console,
        expand=True,
        transient=False,
    )


class Progress:
    """A live progress bar (rich) showing loss, fired pairs and iterations/s."""

    def __init__(self, total: int, label: str, quiet: bool = False, console=None) -> None:
        self.total, self.label, self.quiet, self.console = total, label, quiet, console
        self._bar: Any = None
        self._t0: float | None = None  # when the run's first iteration started
        self._done = 0  # iterations before it (a resumed run)

    def __enter__(self) -> Progress:
        if not self.quiet:
            try:
                self._bar = progress_bar(self.console)
            except ImportError:  # pragma: no cover - rich is in the cli extra
                return self
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, stats="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def rate(self, t: int, hist: History) -> float:
        """Iterations per second after iteration ``t``, counted from the start of the
        first iteration this bar saw: the set-up and the loading of the kernels before it
        are not iterations."""
        now = time.perf_counter()
        if self._t0 is None:
            last = (hist.time_query, hist.time_forward, hist.time_backward, hist.time_update)
            self._t0 = now - sum(p[-1] for p in last if p)
            self._done = t
        return (t + 1 - self._done) / max(now - self._t0, 1e-9)

    def __call__(self, t: int, hist: History) -> None:
        rate = self.rate(t, hist)
        parts = [
            f"loss {hist.loss[-1]:.3e}",
            f"fired {_short(hist.fired_pairs[-1])}",
            f"{_short(rate)} it/s",
        ]
        rss = hist.info.get("worker_peak_rss")
        if rss:  # sharded: the largest worker's peak memory
            parts.insert(2, f"mem {_short(max(rss))}B")
        if self._bar is not None:
            if self._bar.console.width < 70:  # narrow terminals: the essentials only
                del parts[1]
            self._bar.update(self._task, completed=t + 1, stats="  ".join(parts))
        elif not self.quiet and (t + 1) % max(1, self.total // 10) == 0:
            print(f"{self.label} {t + 1}/{self.total}  {'  '.join(parts)}", flush=True)
