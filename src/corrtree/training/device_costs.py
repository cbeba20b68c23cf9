"""The cost model behind ``method="auto"`` on a device, calibrated on that device.

The CPU model (:mod:`.costs`) counts flops and scattered operations at rates measured
once on a 2-core machine.  A device differs by orders of magnitude in each rate, and
on a GPU a small problem's step costs its kernel launches, not its arithmetic, so the
rates are measured on the device itself, once per device and process
(:func:`calibrate`: a float64 GEMM, a batched gather from a resident table, a streaming
pass and the time of one launched operation, about 0.1 s), and each method's run is
modelled as set-up plus ``iters`` steps:

- dense: two GEMMs of ``m·n·d`` a step;
- lazy: every row's values by GEMM a step, ``min(2·(n+1)², 4·(n+1)·d)`` flops a row
  (:meth:`.device_band.DeviceBand._gemm_values`), and the coefficients' ``m·Q·K``
  gathers (``Q`` tracked points a neuron), or with ``K > 1`` outputs the GEMM ``A·Eᵀ``
  and ``m·Q`` gathers where that costs less (:func:`.device_band.own_by_gemm`);
- kernel: the set-up GEMM and the count GEMM ``m·(nK)²``; a step streams ``H``
  (``(nK)²``) and the clocks (``m·Q·K`` gathers) and visits a share of the neurons (all
  in the first steps, then a share that grows with the data's coherence and the fired
  points, as the CPU kernel trainer measured), each re-anchored (its row rebuilt from
  ``W(0)`` and multiplied with every point: ``4·(n+1)·d`` flops); its flips
  change ``N`` by float32 GEMMs of the flipped rows (``4·(nK)²`` flops a row) or write
  ``Q·K²`` entries of ``N`` and ``H`` a flip (the CPU model's flips,
  :func:`.costs.expected_flips`), whichever costs less.

Launches are counted per step (:data:`~corrtree._config.DEVICE_LAZY_OPS`, and for the
kernel trainer :data:`~corrtree._config.DEVICE_KERNEL_OPS` a step and
:data:`~corrtree._config.DEVICE_VISIT_OPS` a step with a visit, whatever it visits).

Only the ratios matter for the choice; the modelled seconds go to ``History.info``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import _config
from .._device import free_bytes, synchronize
from .costs import expected_flips

__all__ = ["calibrate", "choose_device_method", "estimate_device"]

_RATES: dict[str, dict[str, float]] = {}


def calibrate(dev) -> dict[str, float]:
    """Measured rates of ``dev``: ``gemm`` (float64 flop/s), ``gather`` (gathered
    elements/s), ``stream`` (elements/s of an element-wise pass) and ``launch`` (seconds
    per launched operation, host synchronization included); cached per device, with
    the seconds the measurement took (``seconds``, 0 when cached)."""
    import torch

    key = str(dev)
    if key in _RATES:
        return {**_RATES[key], "seconds": 0.0}
    t_start = time.perf_counter()
    small = dev.type == "cpu"
    size = 256 if small else 2048
    gen = torch.Generator(device="cpu").manual_seed(0)
    A = torch.randn((size, size), generator=gen, dtype=torch.float64).to(dev)
    table = torch.randn((1024, 1024), generator=gen, dtype=torch.float64).to(dev)
    count = (1 << 18) if small else (1 << 24)
    idx = torch.randint(0, 1024, (count, 2), generator=gen).to(dev)
    one = torch.zeros(1, dtype=torch.float64, device=dev)

    def timed(op, reps: int) -> float:
        op()
        synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            op()
        synchronize(dev)
        return (time.perf_counter() - t0) / reps

    rates = {
        "gemm": 2.0 * size**3 / timed(lambda: A @ A, 3),
        "gather": count / timed(lambda: table[idx[:, 0], idx[:, 1]], 3),
        "stream": size * size / timed(lambda: A * 2.0, 5),
        "launch": timed(lambda: (one + 1.0).sum().item(), 20) / 3.0,
    }
    _RATES[key] = rates
    return {**rates, "seconds": time.perf_counter() - t_start}


def estimate_device(
    method: str,
    n: int,
    m: int,
    d: int,
    K: int,
    iters: int,
    q: float,
    q_band: float,
    coh: float,
    rates: dict[str, float],
    free: float = np.inf,
) -> float:
    """Modelled seconds of a run of ``method`` on the device of ``rates``
    (:func:`calibrate`); ``q``, ``q_band`` and ``coh`` as in :func:`.costs.estimate`;
    ``inf`` when the kernel's two ``nK × nK`` matrices do not fit in ``free`` bytes."""
    gemm = 2.0 * m * n * d / rates["gemm"]
    launch = rates["launch"]
    P = max(1.0, q * n)
    Q = max(P, q_band * n) * _config.DEVICE_PAD_FACTOR
    if method == "dense":
        return iters * (
            2.0 * gemm + 4.0 * m * n / rates["stream"] + _config.DEVICE_DENSE_OPS * launch
        )
    pre = gemm + m * n / rates["stream"]
    values = m * min(2.0 * (n + 1) ** 2, 4.0 * (n + 1) * d) / rates["gemm"]
    if method == "lazy":
        own = Q * K / rates["gather"]  # a row's errors at its places, K gathers a place
        if 1 < K and n + 1 <= Q * K:  # or by the GEMM A·Eᵀ and one gather a place
            own = min(own, 2.0 * (n + 1) * K / rates["gemm"] + Q / rates["gather"])
        return pre + iters * (values + m * own + _config.DEVICE_LAZY_OPS * launch)
    if method == "kernel":
        nK = n * K
        if 20.0 * nK * nK > free:
            return float("inf")
        pre += 2.0 * m * nK * nK / rates["gemm"]
        wave = min(iters, _config.DEVICE_VISIT_WAVE)
        later = min(_config.DEVICE_VISIT_MAX, _config.DEVICE_VISIT_SLOPE * coh * P)
        visited = wave + (iters - wave) * later  # steps' worth of visits to every neuron
        # a flip adds to N and rewrites H at K² entries for each tracked point of its
        # neuron (three gathers or scatters each), or its row joins the count GEMMs
        flips = expected_flips(m * P, coh, P)
        counts = min(
            3.0 * flips * Q * K * K / rates["gather"], 4.0 * flips * nK * nK / rates["gemm"]
        )
        step = nK * nK / rates["stream"] + m * Q * K / rates["gather"] + counts
        step += (_config.DEVICE_KERNEL_OPS + _config.DEVICE_VISIT_OPS) * launch
        # a visit re-anchors: the row rebuilt from W(0) and multiplied with every point
        rebuilt = m * (4.0 * (n + 1) * d / rates["gemm"] + d / rates["gather"])
        return pre + iters * step + visited * rebuilt
    raise ValueError(f"no device cost model for method {method!r}")


def choose_device_method(
    X: np.ndarray,
    G: np.ndarray,
    model: Any,
    iters: int,
    sgd: Any,
    dev,
    among: list[str],
) -> tuple[str, dict[str, float], float]:
    """The device method of ``among`` (those that take the model, the steps and the
    options: :func:`~._choice.runnable`) with the smallest modelled run time.  Returns
    it, the modelled seconds of each, and the calibration's seconds."""
    from .costs import coherence, fire_share

    rates = calibrate(dev)
    n, d = X.shape
    norms = np.linalg.norm(X, axis=1)
    q = fire_share(norms, model.b)
    q_band = fire_share(norms, model.b - _config.BAND)
    coh = coherence(G)
    free = free_bytes(dev)
    costs = {
        k: estimate_device(k, n, model.m, d, model.outputs, iters, q, q_band, coh, rates, free)
        for k in among
    }
    if sgd.batch_size is not None and "dense" in costs:
        costs["dense"] *= min(1.0, sgd.batch_size / n)
    return min(costs, key=costs.__getitem__), costs, rates["seconds"]
