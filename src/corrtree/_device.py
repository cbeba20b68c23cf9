"""Devices for the array path (``device=`` of :func:`corrtree.train`): PyTorch, optional.

The core never imports torch; a run with ``device=`` does, here, and every check a
device needs happens before any tensor is made: torch is installed (``corrtree[gpu]``),
the device is one torch knows and is there, and the run's tensors fit in its free memory.
"""

from __future__ import annotations

from typing import Any

from . import _validation

__all__ = [
    "Staging",
    "check_device_memory",
    "devices_found",
    "free_bytes",
    "resolve",
    "synchronize",
]


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError(
            "device= needs PyTorch, which is not installed: pip install 'corrtree[gpu]' "
            "(or leave device=None for the CPU trainers)"
        ) from None
    return torch


def devices_found() -> list[str]:
    """The devices torch can use here, e.g. ``["cpu", "cuda:0"]``."""
    torch = _torch()
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    return found


def resolve(device: Any):
    """``device`` as a ``torch.device`` that is there; ``ValueError`` in one line naming the
    devices found otherwise."""
    torch = _torch()
    if not isinstance(device, str | torch.device):
        raise ValueError(f"device must be a string such as 'cuda' or 'cpu', got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(
            f"device={device!r} is not a device torch knows; "
            f"devices found: {', '.join(devices_found())}"
        ) from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if dev.index is None else dev.index
        if index < count:
            return torch.device("cuda", index)
    elif dev.type == "mps" and "mps" in devices_found():
        return dev
    raise ValueError(f"device={device!r} is not there; devices found: {', '.join(devices_found())}")


def free_bytes(dev) -> float:
    """Free memory of ``dev`` in bytes: on a GPU what the driver reports free plus what
    torch's caching allocator holds reserved and unused (``mem_get_info`` counts those
    cached blocks as used, though torch hands them out again); the host's available
    memory (cgroup limits included) for the CPU."""
    torch = _torch()
    if dev.type == "cuda":
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return float(torch.cuda.mem_get_info(dev)[0] + max(cached, 0))
    return _validation.available_memory()


def synchronize(dev) -> None:
    """Wait for ``dev``'s queued work (a clock reading is then the work's time)."""
    if dev.type == "cuda":
        _torch().cuda.synchronize(dev)


def check_device_memory(nbytes: float, dev, what: str, hint: str = "") -> None:
    """``MemoryError`` in one line when ``nbytes`` do not fit in ``dev``'s free memory
    (ending with ``hint``, what would fit instead, if given)."""
    _validation.check_memory(nbytes, what, hint, available=free_bytes(dev), where=f" on {dev}")


class Staging:
    """Uploads of host arrays through buffers made once per shape (pinned on a GPU), so
    that each copy is queued without waiting for the device.

    The caller must read something back from the device (a synchronizing download)
    before it uploads through the same shape again: the host writes a buffer only
    after the copy out of it has run.  Each trainer step ends in such a download.
    """

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device
        self._buffers: dict[tuple[tuple[int, ...], str], Any] = {}

    def upload(self, host: Any, out: Any = None, dtype: Any = None) -> Any:
        """``host`` on the device as ``dtype`` (numpy's; float64 by default): into
        ``out`` when given, else a new tensor; returns it."""
        import numpy as np

        torch = self.torch
        host = np.ascontiguousarray(host, dtype=np.float64 if dtype is None else dtype)
        key = (host.shape, host.dtype.str)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.from_numpy(np.empty(host.shape, dtype=host.dtype))
            if self.device.type == "cuda":
                buf = buf.pin_memory()
            self._buffers[key] = buf
        buf.copy_(torch.from_numpy(host))
        if out is None:
            out = torch.empty(buf.shape, dtype=buf.dtype, device=self.device)
        out.copy_(buf, non_blocking=True)
        return out
