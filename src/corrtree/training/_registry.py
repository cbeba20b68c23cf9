"""The training methods by name."""

from __future__ import annotations

from ._base import Trainer
from .dense import DenseTrainer
from .device_dense import DeviceDenseTrainer
from .device_kernel import DeviceKernelTrainer
from .device_lazy import DeviceLazyTrainer
from .dtree import DTreeTrainer
from .kernel import KernelTrainer
from .lazy import LazyTrainer
from .wtree import WTreeTrainer

__all__ = ["DEVICE_TRAINERS", "METHODS", "TRAINERS"]

TRAINERS: dict[str, type[Trainer]] = {
    "dense": DenseTrainer,
    "dtree": DTreeTrainer,
    "wtree": WTreeTrainer,
    "lazy": LazyTrainer,
    "kernel": KernelTrainer,
}
METHODS = ("auto", *TRAINERS)
#: The methods of the array path (``device=``): the same names, tensors on a torch device.
DEVICE_TRAINERS: dict[str, type[Trainer]] = {
    "dense": DeviceDenseTrainer,
    "lazy": DeviceLazyTrainer,
    "kernel": DeviceKernelTrainer,
}
