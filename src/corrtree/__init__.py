"""corrtree: exact sublinear-time training of two-layer ReLU networks with correlation trees.

The public names below load their modules on first use (PEP 562), so that ``import
corrtree`` is quick and the command line (:mod:`corrtree.cli`) installs its stop signals
before numpy, numba and scipy load.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ._threads import quiet_openblas as _quiet_openblas
from ._version import __version__

_quiet_openblas()  # before numpy is imported

if TYPE_CHECKING:
    from . import datasets, theory
    from .detector import FiringDetector, TooManyFiring
    from .model import TwoLayerReLU, default_threshold
    from .training import (
        METHODS,
        CheckpointError,
        History,
        TrainingDiverged,
        Warmup,
        resume,
        train,
        warmup,
    )
    from .trees import CorrelationDTree, CorrelationWTree

#: Where each public name lives: ``None`` for a submodule of its own name (any other
#: submodule, such as ``corrtree.training``, loads on first use too).
_WHERE: dict[str, str | None] = {
    "METHODS": ".training",
    "CheckpointError": ".training",
    "CorrelationDTree": ".trees",
    "CorrelationWTree": ".trees",
    "FiringDetector": ".detector",
    "History": ".training",
    "TooManyFiring": ".detector",
    "TrainingDiverged": ".training",
    "TwoLayerReLU": ".model",
    "Warmup": ".training",
    "datasets": None,
    "default_threshold": ".model",
    "resume": ".training",
    "theory": None,
    "train": ".training",
    "warmup": ".training",
}

__all__ = [
    "METHODS",
    "CheckpointError",
    "CorrelationDTree",
    "CorrelationWTree",
    "FiringDetector",
    "History",
    "TooManyFiring",
    "TrainingDiverged",
    "TwoLayerReLU",
    "Warmup",
    "__version__",
    "datasets",
    "default_threshold",
    "resume",
    "theory",
    "train",
    "warmup",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name, "")
    if where is None or (where == "" and importlib.util.find_spec(f"{__name__}.{name}")):
        return importlib.import_module(f".{name}", __name__)  # a submodule, as once imported
    if where == "":
        raise AttributeError(f"module 'corrtree' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
