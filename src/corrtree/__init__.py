"""corrtree: exact sublinear-time training of two-layer ReLU networks with correlation trees."""

import os as _os

# OpenBLAS worker threads spin for ~0.1 s after each call and then starve the
# numba threads that run next; a short spin keeps the two from fighting.  It
# only takes effect if numpy was not imported before corrtree.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from . import datasets, theory
from .detector import FiringDetector, TooManyFiring
from .model import TwoLayerReLU, default_threshold
from .training import METHODS, CheckpointError, History, TrainingDiverged, resume, train
from .trees import CorrelationDTree, CorrelationWTree

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
