"""Training 2NN(m, b) by gradient descent: full batch or mini-batch SGD."""

from ._resume import resume
from ._train import METHODS, TrainingDiverged, Warmup, train, warmup
from .checkpoint import CheckpointError
from .history import History

__all__ = [
    "METHODS",
    "CheckpointError",
    "History",
    "TrainingDiverged",
    "Warmup",
    "resume",
    "train",
    "warmup",
]
