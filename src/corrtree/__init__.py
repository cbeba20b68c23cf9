"""corrtree: exact sublinear-time training of two-layer ReLU networks with correlation trees."""

from .detector import FiringDetector, TooManyFiring
from .trees import CorrelationDTree, CorrelationWTree

__version__ = "0.1.0"

__all__ = [
    "CorrelationDTree",
    "CorrelationWTree",
    "FiringDetector",
    "TooManyFiring",
    "__version__",
]
