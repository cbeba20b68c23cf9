"""corrtree: exact sublinear-time training of two-layer ReLU networks with correlation trees."""

from ._threads import quiet_openblas as _quiet_openblas
from ._version import __version__

_quiet_openblas()  # before numpy is imported

from . import datasets, theory  # noqa: E402
from .detector import FiringDetector, TooManyFiring  # noqa: E402
from .model import TwoLayerReLU, default_threshold  # noqa: E402
from .training import (  # noqa: E402
    METHODS,
    CheckpointError,
    History,
    TrainingDiverged,
    Warmup,
    resume,
    train,
    warmup,
)
from .trees import CorrelationDTree, CorrelationWTree  # noqa: E402

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
