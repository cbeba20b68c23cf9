"""Training 2NN(m, b) by full-batch gradient descent."""

from ._train import METHODS, TrainingDiverged, train
from .history import History

__all__ = ["METHODS", "History", "TrainingDiverged", "train"]
