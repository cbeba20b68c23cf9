"""Which method runs a run, and whether it fits: checked in one line before any set-up.

A method may refuse a run for three reasons, each named here once: the model is
implicit and the method needs the stored matrix; the steps have momentum or weight
decay and the method takes plain gradient steps (the array path's lazy and kernel
trainers); an option the method does not take.  ``method="auto"`` chooses, by the cost
model of the CPU (:mod:`.costs`) or of the device (:mod:`.device_costs`), among the
methods that refuse nothing and fit in memory, and when none is left says why each was
ruled out.  Memory is modelled before anything large is allocated: the host's
(:func:`corrtree._validation.available_memory`, which reads cgroup limits) for the CPU
trainers and for each shard of a sharded run, the device's free memory for the array
path; a refusal names a width, and the methods, that would fit.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import _config, _validation
from .._validation import check_memory, widest_fitting
from ..model import TwoLayerReLU
from ._base import Trainer
from ._registry import DEVICE_TRAINERS, TRAINERS
from .costs import coherence, estimate, fire_share, memory_need
from .device_band import update_bytes
from .optim import SGD

__all__ = [
    "alternatives",
    "check_method",
    "check_run_memory",
    "choose_method",
    "fitting",
    "method_options",
    "runnable",
    "shard_need",
    "slices",
]


def _registry(on_device: bool) -> dict[str, type[Trainer]]:
    return DEVICE_TRAINERS if on_device else TRAINERS


def method_options(method: str, on_device: bool = False) -> tuple[str, ...]:
    """The options (``**options`` of :func:`~corrtree.train`) a method's trainer accepts:
    the parameters of its ``_prepare`` (where one forwards ``**options``, its parent's),
    less the private ones, which only the tests use (``on_device``: the array path's
    trainer, whose ``device`` is :func:`~corrtree.train`'s own argument)."""
    accepted: list[str] = []
    for cls in _registry(on_device)[method].__mro__:
        if "_prepare" not in vars(cls):
            continue
        params = list(inspect.signature(vars(cls)["_prepare"]).parameters.values())[2:]
        accepted += [p.name for p in params if p.kind is not p.VAR_KEYWORD and p.name != "device"]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return tuple(accepted)


def _refusal(method: str, model: TwoLayerReLU, sgd: SGD, on_device: bool) -> str | None:
    """Why ``method`` cannot train ``model`` with the steps of ``sgd`` (``None``: it can):
    ``"implicit"`` or ``"linear"``."""
    cls = _registry(on_device)[method]
    if model.implicit and not cls.implicit_ok:
        return "implicit"
    if sgd.linear and not cls.linear_ok:
        return "linear"
    return None


def _reason(method: str, refusal: str, on_device: bool) -> str:
    where = " on a device" if on_device else ""
    if refusal == "implicit":
        return f"method={method!r}{where} needs the stored weight matrix"
    return f"method={method!r}{where} takes plain gradient steps (no momentum or weight decay)"


def _unknown_option(method: str, options: dict[str, Any], accepted: Iterable[str]) -> None:
    accepted = tuple(accepted)
    for name in options:
        if name not in accepted:
            public = [k for k in accepted if not k.startswith("_")]
            known = ", ".join(public) if public else "none"
            raise TypeError(
                f"train() got an unknown option {name!r} for method={method!r}; "
                f"the options of method={method!r} are: {known}"
            )


def check_method(
    method: str, model: TwoLayerReLU, sgd: SGD, options: dict[str, Any], on_device: bool
) -> None:
    """One line when the named ``method`` cannot take this run (see the module's notes)."""
    _unknown_option(method, options, method_options(method, on_device))
    refusal = _refusal(method, model, sgd, on_device)
    if refusal is None:
        return
    able = " or ".join(map(repr, alternatives(model, sgd, on_device)))
    there = " there" if on_device else ""
    reason = _reason(method, refusal, on_device)
    if refusal == "implicit":
        instead = f"; an implicit model trains{there} with method={able}" if able else ""
        raise ValueError(reason + instead + " (or convert it: model.to_explicit())")
    raise ValueError(reason + (f": use method={able}{there}" if able else ""))


def alternatives(model: TwoLayerReLU, sgd: SGD, on_device: bool) -> list[str]:
    """The methods that take ``model`` and the steps of ``sgd`` (what a refusal may name
    instead of the method asked for)."""
    registry = _registry(on_device)
    return [k for k in registry if _refusal(k, model, sgd, on_device) is None]


def runnable(model: TwoLayerReLU, sgd: SGD, options: dict[str, Any], on_device: bool) -> list[str]:
    """The methods ``method="auto"`` may choose from: those that take the model, the
    steps and every option given.  One line naming each method's reason when none is
    left, or naming an option no method takes."""
    registry = _registry(on_device)
    union = dict.fromkeys(k for meth in registry for k in method_options(meth, on_device))
    _unknown_option("auto", options, union)
    reasons: dict[str, str | None] = {}
    for k in registry:
        refusal = _refusal(k, model, sgd, on_device)
        missing = [o for o in options if o not in method_options(k, on_device)]
        if refusal == "implicit":
            reasons[k] = _reason(k, refusal, on_device) + " (the model is implicit)"
        elif refusal is not None:
            reasons[k] = _reason(k, refusal, on_device)
        elif missing:
            reasons[k] = f"method={k!r} takes no option {missing[0]!r}"
        else:
            reasons[k] = None
    able = [k for k, why in reasons.items() if why is None]
    if not able:
        where = "on a device " if on_device else ""
        alternatives = " (or device=None: the CPU trainers)" if on_device else ""
        raise ValueError(
            f"method='auto' {where}has no method for this run: "
            + "; ".join(str(why) for why in reasons.values())
            + alternatives
        )
    return able


def choose_method(
    X: np.ndarray,
    G: np.ndarray,
    model: TwoLayerReLU,
    iters: int,
    sgd: SGD | None = None,
    among: Iterable[str] | None = None,
) -> tuple[str, dict[str, float]]:
    """The exact method with the smallest modelled run time (see :mod:`.costs`), among
    ``among`` (default: every method that takes the model).

    With mini-batches dense computes only the batch's products (its cost scales
    with ``batch_size/n``) while the other methods keep every output: they cost
    what a full-batch step costs; with momentum or weight decay the kernel
    method takes the lazy method's step.  Returns the method and the modelled
    seconds of each candidate.
    """
    n, d = X.shape
    norms = np.linalg.norm(X, axis=1)
    share = fire_share(norms, model.b)
    band_share = fire_share(norms, model.b - _config.BAND)
    coh = coherence(G)
    if among is None:
        implicit = getattr(model, "implicit", False)  # stand-in models have sizes only
        among = [k for k in TRAINERS if TRAINERS[k].implicit_ok or not implicit]
    costs = {
        k: estimate(k, n, model.m, d, model.outputs, iters, share, band_share, coh) for k in among
    }
    if sgd is not None and sgd.batch_size is not None and "dense" in costs:
        costs["dense"] *= min(1.0, sgd.batch_size / n)
    if sgd is not None and sgd.linear and "kernel" in costs and "lazy" in costs:
        costs["kernel"] = max(costs["kernel"], costs["lazy"])
    return min(costs, key=costs.__getitem__), costs


def _band_share(X: np.ndarray, model: TwoLayerReLU, options: dict[str, Any]) -> float:
    band = options.get("band")
    if isinstance(band, bool) or not isinstance(band, numbers.Real) or not float(band) >= 0:
        band = _config.BAND  # the trainer names a bad band itself
    return fire_share(np.linalg.norm(X, axis=1), model.b - float(band))


def shard_need(
    method: str, X: np.ndarray, model: TwoLayerReLU, linear: bool, options: dict[str, Any]
) -> Callable[[int], float]:
    """Modelled bytes of a run of ``method`` over ``width`` of ``model``'s neurons (a
    whole one-process run at ``model.m``, one shard's at its slice), beyond the model."""
    n, d = X.shape
    share = _band_share(X, model, options)

    def need(width: int) -> float:
        return memory_need(method, n, width, d, model.outputs, share, linear, model.implicit)

    return need


def _needs(
    X: np.ndarray,
    model: TwoLayerReLU,
    linear: bool,
    options: dict[str, Any],
    device: Any,
    shards: int,
) -> tuple[Callable[[str], Callable[[int], float]], float, str, float, dict[str, type[Trainer]]]:
    """Modelled bytes by method and width, the bytes free, whose they are, the bytes the
    model itself takes per neuron there, and the methods (host or device)."""
    n, d = X.shape
    K = model.outputs
    if device is not None:
        from .._device import free_bytes

        share = _band_share(X, model, options)

        def on_device(meth: str) -> Callable[[int], float]:
            cls = DEVICE_TRAINERS[meth]
            src = model.weight_source  # an implicit model's earlier run goes there too
            return lambda m: (
                cls.device_need(n, m, d, K, share, model.implicit, linear) + update_bytes(src, m, d)
            )

        return on_device, free_bytes(device), f" on {device}", 0.0, DEVICE_TRAINERS

    def on_host(meth: str) -> Callable[[int], float]:
        one = shard_need(meth, X, model, linear, options)
        return lambda m: sum(one(e - s) for s, e in slices(m, shards))

    stored = 8.0 * (K + (0 if model.implicit else d))  # the model's own W and a
    return on_host, float(_validation.available_memory()), "", stored, TRAINERS


def fitting(
    among: Iterable[str],
    X: np.ndarray,
    model: TwoLayerReLU,
    linear: bool,
    options: dict[str, Any],
    device: Any = None,
) -> list[str]:
    """The methods of ``among`` whose run fits in memory (all of them when none does:
    the memory check of the chosen one then says what would fit)."""
    among = list(among)
    need_of, free, *_ = _needs(X, model, linear, options, device, 1)
    fit = [k for k in among if need_of(k)(model.m) <= free]
    return fit or among


def check_run_memory(
    method: str,
    X: np.ndarray,
    model: TwoLayerReLU,
    linear: bool,
    options: dict[str, Any],
    device: Any = None,
    shards: int = 1,
    candidates: Iterable[str] | None = None,
) -> None:
    """One line before any large allocation when a run of ``method`` does not fit: in
    the host's available memory (CPU trainers; ``shards`` slices in this process), or in
    ``device``'s free memory (the array path).  It names the widest power-of-two width,
    and the other ``candidates`` methods, that would fit."""
    n, d = X.shape
    need_of, free, where, stored, registry = _needs(X, model, linear, options, device, shards)
    need = need_of(method)
    if need(model.m) <= free:
        return
    if candidates is None:
        candidates = [k for k in registry if registry[k].implicit_ok or not model.implicit]
    others = [k for k in candidates if k != method and need_of(k)(model.m) <= free]
    width = widest_fitting(lambda m: need(m) + stored * m, model.m, free)
    hints = [f"m={width} would fit"] if width else []
    hints += [f"method={k!r} would fit" for k in others]
    of = f" in {shards} shards" if shards > 1 else ""
    check_memory(
        need(model.m),
        f"method={method!r} at n={n}, m={model.m}, d={d}{of}",
        " or ".join(hints) if hints else "no method fits at this width",
        available=free,
        where=where,
    )


def slices(m: int, count: int) -> list[tuple[int, int]]:
    """``count`` contiguous slices of ``m`` neurons, sizes differing by at most one (the
    shards of :mod:`corrtree.distributed`)."""
    bounds = np.linspace(0, m, count + 1).round().astype(int)
    return [(int(bounds[k]), int(bounds[k + 1])) for k in range(count)]


def check_lr(lr: object) -> float | str:
    """``lr`` of a run: ``"auto"`` or a finite float > 0, or one line naming it."""
    if isinstance(lr, str):
        if lr != "auto":
            raise ValueError(f"lr must be a positive number or 'auto', got {lr!r}")
        return lr
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise ValueError(f"lr must be a positive number or 'auto', got {lr!r}")
    if not math.isfinite(float(lr)) or float(lr) <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    return float(lr)


def check_iters(iters: object, name: str = "iters") -> int:
    """A count of steps (``iters``, ``checkpoint_every``, ...): an integer >= 0."""
    if isinstance(iters, bool) or not isinstance(iters, numbers.Integral) or int(iters) < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {iters!r}")
    return int(iters)


def check_device(device: Any, method: str, client: Any, shards: Any) -> Any:
    """The device of a run with ``device=`` (resolved), or one line saying why the run
    cannot go there."""
    from .._device import resolve

    dev = resolve(device)
    if client is not None or shards is not None:
        raise ValueError("device= runs in one process: leave out client and shards")
    if method != "auto" and method not in DEVICE_TRAINERS:
        on = ", ".join(repr(k) for k in DEVICE_TRAINERS)
        raise ValueError(
            f"method={method!r} has no device path; on a device use method={on} "
            f"(or device=None for the CPU trainers)"
        )
    return dev
