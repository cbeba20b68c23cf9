"""corrtree: exact sublinear-time training of two-layer ReLU networks with correlation trees."""

from ._threads import quiet_openblas as _quiet_openblas

_quiet_openblas()  # before numpy is imported

from . import datasets, theory  # noqa: E402
from .detector import FiringDetector, TooManyFiring  # noqa: E402
from .model import TwoLayerReLU, default_threshold  # noqa: E402
from .training import (  # noqa: E402
    METHODS,
    CheckpointError,
    History,
    TrainingDiverged,
    resume,
    train,
)
from .trees import CorrelationDTree, CorrelationWTree  # noqa: E402

__version__ = "0.1.0"

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
    "__version__",
    "datasets",
    "default_threshold",
    "resume",
    "theory",
    "train",
]
