"""Figures and a self-contained HTML report for a training run.

Needs matplotlib (``pip install 'corrtree[plot]'``); figures are drawn with
the Agg backend, so no display is needed.
"""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path
from typing import Any

import numpy as np

from . import theory
from ._io import atomic_write_json, atomic_write_text
from .training.history import History

__all__ = ["FIGURES", "training_figures", "write_report"]

FIGURES = ("loss", "sparsity", "moved", "timing", "epochs")


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("plots need matplotlib: pip install 'corrtree[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def training_figures(history: History, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``loss.png``, ``sparsity.png``, ``moved.png`` and ``timing.png``.

    * loss per iteration (log scale);
    * fired neurons per data point (``Σ_i k_{i,t} / n``) over the iterations,
      next to the expected ``m·Q(b)`` and the paper's ``m^(4/5)``;
    * neurons moved per iteration (``|∪_i S_{i,fire}(t)|``) out of ``m``;
    * wall time per iteration, by phase;
    * mini-batch runs: ``epochs.png``, the loss after each epoch.
    """
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t = np.arange(len(history))
    paths = {}
    title = f"{history.method}: n={history.n}, m={history.m}, d={history.d}"

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    loss = np.asarray([*history.loss, history.final_loss])
    ax.semilogy(np.arange(len(loss)), np.maximum(loss, 1e-300), "o-", ms=3)
    ax.set_xlabel("iteration t")
    ax.set_ylabel(f"loss {loss_label(history)}")
    ax.set_title(f"Training loss ({title})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    paths["loss"] = _save(fig, out / "loss.png", plt)

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    per_point = np.asarray(history.fired_pairs, dtype=float) / max(history.n, 1)
    ax.plot(t, per_point, "o-", ms=3, label="measured: Σ_i k_{i,t} / n")
    ax.axhline(
        theory.expected_fired(history.m, history.b),
        ls="--",
        c="k",
        label="m·Q(b) (unit-norm data, at init)",
    )
    ax.axhline(theory.paper_sparsity(history.m), ls=":", c="r", label="m^(4/5) (paper)")
    ax.set_yscale("log")
    ax.set_xlabel("iteration t")
    ax.set_ylabel("neurons firing per data point")
    ax.set_title(f"Sparsity ({title})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    paths["sparsity"] = _save(fig, out / "sparsity.png", plt)

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(t, history.moved_neurons, "o-", ms=3, label="neurons moved")
    ax.axhline(history.m, ls="--", c="k", label=f"m = {history.m}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("iteration t")
    ax.set_ylabel("|∪_i S_i,fire(t)|")
    ax.set_title(f"Neurons moved per iteration ({title})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    paths["moved"] = _save(fig, out / "moved.png", plt)

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    bottom = np.zeros(len(history))
    for phase in ("query", "forward", "backward", "update"):
        vals = 1e3 * np.asarray(getattr(history, f"time_{phase}"))
        ax.bar(t, vals, bottom=bottom, label=phase)
        bottom += vals
    ax.set_xlabel("iteration t")
    ax.set_ylabel("milliseconds")
    ax.set_title(f"Time per iteration by phase ({title})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    paths["timing"] = _save(fig, out / "timing.png", plt)
    if history.epoch_loss:
        paths["epochs"] = _epoch_figure(history, out, title, plt)
    return paths


#: How each loss is written on the figures' axes.
LOSS_LABELS = {
    "squared": "½ Σ ||f(x_i) - y_i||²",
    "logistic": "Σ log(1 + e^f(x_i)) − y_i f(x_i) (logistic)",
    "cross_entropy": "Σ −log softmax(f(x_i))_{y_i} (cross-entropy)",
}


def loss_label(history: History) -> str:
    """The formula of the loss a run trained (``History.info["loss"]``)."""
    return LOSS_LABELS.get(history.info.get("loss", "squared"), history.info.get("loss", ""))


def _epoch_figure(history: History, out: Path, title: str, plt) -> Path:
    """Mini-batch runs: the loss of each step's batch and, after every epoch, the loss
    on all training points and on the held-out data (per point, so the three compare);
    beside it the flips per step."""
    per_epoch = history.info.get("steps_per_epoch", 1)
    size = history.info.get("batch_size", history.n)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    steps = np.arange(len(history))
    points = np.minimum(size, history.n - (steps % per_epoch) * size)  # the last is shorter
    ax.semilogy(steps, np.asarray(history.loss) / points, lw=0.8, alpha=0.6, label="batch")
    ends = np.minimum((np.arange(len(history.epoch_loss)) + 1) * per_epoch, len(history)) - 1
    ax.semilogy(ends, np.asarray(history.epoch_loss) / history.n, "o-", label="train (epoch)")
    test = np.asarray(history.epoch_test_loss, dtype=float)
    if np.isfinite(test).any() and "test_points" in history.info:
        ax.semilogy(ends, test / history.info["test_points"], "s-", label="held-out (epoch)")
    ax.set_xlabel("step")
    ax.set_ylabel(f"loss per point ({history.info.get('loss', 'squared')})")
    ax.set_title(f"SGD loss ({title})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax2.plot(steps, history.flips, lw=0.8, label="flips")
    ax2.plot(steps, history.fired_pairs, lw=0.8, label="fired pairs")
    ax2.set_yscale("symlog")
    ax2.set_xlabel("step")
    ax2.set_title("Fired pairs and flips per step", fontsize=10)
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    return _save(fig, out / "epochs.png", plt)


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
    plt.close(fig)
    return path


def write_report(
    out_dir: str | os.PathLike,
    history: History,
    summary: dict[str, Any],
    title: str = "corrtree training report",
) -> Path:
    """Write the figures, ``summary.json`` and a self-contained ``report.html``.

    ``summary`` holds the headline numbers (accuracy, speed-up, ...); they are
    shown as a table above the figures, which are embedded as base64 PNGs.
    """
    out = Path(out_dir)
    paths = training_figures(history, out)
    atomic_write_json(out / "summary.json", summary)
    rows = "\n".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in summary.items()
    )
    imgs = "\n".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode(paths[name].read_bytes()).decode()}"></figure>'
        for name in FIGURES
        if name in paths
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}th,td{{border:1px solid #ccc;padding:4px 10px;text-align:left}}
figure{{display:inline-block;margin:8px}}img{{max-width:460px}}</style></head>
<body><h1>{html.escape(title)}</h1>
<table>{rows}</table>
<h2>Figures</h2>
{imgs}
</body></html>
"""
    return atomic_write_text(out / "report.html", page)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)
