"""The device path counted on the CPU and priced for an H200 (``bench_gpu.py --count``).

A GPU step costs its launches, its host synchronizations and its work; all three can be
counted with torch on ``device="cpu"``, where the same code runs.  :class:`OpCounter`
sees every aten operation a step dispatches (``TorchDispatchMode``) and counts

- *launches*: every operation that would be a CUDA kernel (not views, reshapes,
  allocations or other metadata);
- *host synchronizations*: a scalar read (``item``, ``int``/``float``/``bool`` of a
  tensor), ``nonzero``, boolean-mask indexing (it calls ``nonzero``), ``masked_select``,
  ``unique``, ``bincount``, ``segment_reduce``'s checks, ``repeat_interleave`` by a tensor,
  and a device-to-host transfer (``numpy()``, ``tolist()``);
- *uploads*: host-to-device copies of host data (``torch.as_tensor(..., device=)``, a
  host tensor written into or read by a device operation), with their bytes; a pageable
  upload synchronizes, so it is priced as one, a queued one (``non_blocking=True`` from
  pinned memory) is not;
- *work*: matrix-product flops by precision, gathered entries (an indexed write of
  distinct places counts as one), scattered entries (accumulated: ``index_add_``,
  ``scatter_add``, ``index_put_(accumulate=True)``), records sorted (``sort``, priced at
  ``sorts_per_s`` where the rates give it), and the bytes every other operation reads
  and writes.

:func:`modelled_seconds` prices counts with :data:`H200`, primitive rates measured on an
NVIDIA H200 (float64 and float32 GEMMs, gathers from a resident matrix, launches and
synchronizations, a sort) and its memory bandwidth from the datasheet, each operation at the
slower of its arithmetic and its memory traffic (a roofline), plus its launch.  The
model is validated on PyTorch's own dense loop, whose whole runs were measured there
(:data:`MEASURED_DENSE`): :func:`validate_dense` counts that loop here and compares.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import _config

__all__ = [
    "H200",
    "MEASURED_DENSE",
    "Counts",
    "OpCounter",
    "count_dense_step",
    "count_train",
    "due_rows",
    "extrapolated_width",
    "modelled_seconds",
    "run_widths",
    "streamed_seconds",
    "validate_dense",
]

#: Primitive rates of one NVIDIA H200, as the device trainers price their choices with
#: them (:func:`corrtree._config.device_rates`, the package's ``device_rates.json``,
#: which says how they were measured; ``bench_gpu.py`` measures them again on its device,
#: :func:`~.rates.measure_rates`, and ``--set-rates`` stores what it found): float64 and
#: float32 GEMM flops, gathered entries from a resident matrix and accumulated ones
#: (a deterministic ``index_add_``), bytes streamed, each a second; the seconds of a
#: launch and of a host synchronization.
H200: dict[str, float] = {
    name: float(value)
    for name, value in _config.device_rates()["cuda"].items()
    if name in _config.RATE_NAMES or name in _config.OPTIONAL_RATE_NAMES
}

#: PyTorch dense float64 gradient descent measured on one H200 (explicit gradients, whole
#: runs synchronized; ``docs/design.md``): the workload, its shape (n, d, K, m,
#: iterations) and seconds.  ``"W1 at 2^20"`` and ``"W1 at 2^22"`` are seconds a step.
MEASURED_DENSE: dict[str, dict[str, Any]] = {
    "W1": {"n": 1024, "d": 784, "K": 1, "m": 2**17, "iters": 300, "seconds": 3.59},
    "W2": {"n": 2048, "d": 768, "K": 1, "m": 2**16, "iters": 200, "seconds": 2.15},
    "W3": {"n": 1797, "d": 64, "K": 10, "m": 2**17, "iters": 100, "seconds": 0.69},
    "W4": {"n": 4096, "d": 784, "K": 1, "m": 2**18, "iters": 50, "seconds": 4.52},
    "W5": {"n": 569, "d": 30, "K": 1, "m": 2**16, "iters": 300, "seconds": 0.33},
    "W1 at 2^20": {"n": 1024, "d": 784, "K": 1, "m": 2**20, "iters": 1, "seconds": 0.096},
    "W1 at 2^22": {"n": 1024, "d": 784, "K": 1, "m": 2**22, "iters": 1, "seconds": 0.393},
}

# operations that move no data and launch nothing (views, shapes, allocations)
_METADATA = frozenset(
    {
        "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "t",
        "transpose", "expand", "slice", "select", "unsqueeze", "squeeze", "permute",
        "detach", "alias", "unbind", "split", "split_with_sizes", "chunk", "narrow",
        "diagonal", "empty", "empty_strided", "empty_like", "lift_fresh",
        "_local_scalar_dense", "resize_", "set_", "is_nonzero", "sym_size", "sym_stride",
        "view_as_real", "view_as_complex", "_nested_tensor_from_mask", "unfold",
        "expand_as", "movedim", "squeeze_", "unsqueeze_", "t_", "transpose_",
        # a Python number wrapped for an operation (``torch.where(m, x, 0.0)``): a host
        # 0-dim tensor that a CUDA kernel reads as an argument, not a launch
        "scalar_tensor",
    }
)  # fmt: skip
_SYNC = frozenset(
    {
        "_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique",
        "_unique2", "unique_dim", "unique_consecutive", "bincount", "segment_reduce",
        "nonzero_numpy", "argwhere", "masked_scatter",
    }
)  # fmt: skip
_GEMM = frozenset({"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "vdot"})
_GATHER = frozenset({"index", "gather", "index_select", "take", "embedding", "take_along_dim"})
_SCATTER = frozenset(
    {"index_put", "index_put_", "scatter", "scatter_", "scatter_add", "scatter_add_",
     "index_add", "index_add_", "scatter_reduce", "scatter_reduce_", "index_copy_",
     "index_copy", "masked_fill_"}
)  # fmt: skip
_SORT = frozenset({"sort", "argsort"})
_ACCUMULATE = frozenset(
    {"scatter_add", "scatter_add_", "index_add", "index_add_", "scatter_reduce", "scatter_reduce_"}
)


@dataclass
class Counts:
    """What a stretch of device code costs, by kind (see the module docs)."""

    launches: int = 0
    syncs: int = 0
    #: uploads that synchronize (pageable host memory) and those queued without waiting
    #: (``copy_(..., non_blocking=True)`` from pinned memory)
    uploads: int = 0
    queued_uploads: int = 0
    upload_bytes: float = 0.0
    flops64: float = 0.0
    flops32: float = 0.0
    gathers: float = 0.0
    #: of ``gathers``, the entries read or written in runs of whole rows (an indexed
    #: access of leading dimensions moving at least ``ROW_RUN`` contiguous entries a place)
    row_gathers: float = 0.0
    scatters: float = 0.0
    #: records sorted (keys with their indices; ``sort``, ``argsort``)
    sorted: float = 0.0
    bytes: float = 0.0
    #: modelled seconds of the work alone, op by op (the roofline), filled as counted
    work_s: float = 0.0
    #: the indexed accesses that move whole rows (runs of at least ``ROW_RUN`` entries a
    #: place, whatever the rates): their entries, the seconds ``work_s`` charged them,
    #: and the seconds they would take streamed at the memory bandwidth
    #: (:func:`streamed_seconds`, the model's other bound while no row rate is measured)
    row_runs: float = 0.0
    row_runs_s: float = 0.0
    row_runs_streamed_s: float = 0.0
    ops: dict[str, int] = field(default_factory=dict)
    #: modelled seconds by operation (its work, launches, synchronizations and uploads,
    #: priced with the counter's rates as counted; transfers under ``cpu()``,
    #: ``numpy()``, ``to()``, ...): where a step's modelled time goes
    op_s: dict[str, float] = field(default_factory=dict)

    def __sub__(self, other: Counts) -> Counts:
        ops = {k: v - other.ops.get(k, 0) for k, v in self.ops.items()}
        op_s = {k: v - other.op_s.get(k, 0.0) for k, v in self.op_s.items()}
        diff = {f: getattr(self, f) - getattr(other, f) for f in _FIELDS}
        return Counts(
            **diff,
            ops={k: v for k, v in ops.items() if v},
            op_s={k: v for k, v in op_s.items() if v},
        )

    def scaled(self, factor: float) -> Counts:
        """The work (flops, entries, bytes) times ``factor``; launches and syncs kept:
        a dense step at ``factor`` times the width (``op_s``, which mixes both, dropped)."""
        out = Counts(**{f: getattr(self, f) for f in _FIELDS}, ops=dict(self.ops))
        for f in (
            "upload_bytes", "flops64", "flops32", "gathers", "row_gathers", "scatters",
            "sorted", "bytes", "work_s", "row_runs", "row_runs_s", "row_runs_streamed_s",
        ):  # fmt: skip
            setattr(out, f, getattr(out, f) * factor)
        return out

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers (JSON), the ten most frequent operations and the ten costliest
        (modelled seconds) beside them."""
        out = asdict(self)
        top = sorted(self.ops.items(), key=lambda kv: -kv[1])[:10]
        out["ops"] = dict(top)
        out["op_s"] = dict(sorted(self.op_s.items(), key=lambda kv: -kv[1])[:10])
        return out

    def copy(self) -> Counts:
        return Counts(
            **{f: getattr(self, f) for f in _FIELDS}, ops=dict(self.ops), op_s=dict(self.op_s)
        )


_FIELDS = (
    "launches", "syncs", "uploads", "queued_uploads", "upload_bytes", "flops64", "flops32",
    "gathers", "row_gathers", "scatters", "sorted", "bytes", "work_s", "row_runs",
    "row_runs_s", "row_runs_streamed_s",
)  # fmt: skip


def _tensors(tree: Any) -> Iterator[Any]:
    import torch

    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, list | tuple):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


_HOST = "_corrtree_counted_on_host"


def _is_host(t: Any) -> bool:
    return bool(getattr(t, _HOST, False))


def _is_device(target: Any) -> bool:
    """Whether ``Tensor.to``'s first argument names a device (not a dtype)."""
    import torch

    return isinstance(target, torch.device | str)


def _mark_host(t: Any) -> None:
    setattr(t, _HOST, True)


def _nbytes(t: Any) -> float:
    return float(t.numel() * t.element_size())


def _gemm_flops(name: str, args: tuple, out: Any) -> float:
    """Multiply-adds × 2 of a matrix product from its operands' shapes."""
    a = args[1] if name in ("addmm", "baddbmm", "addmv") else args[0]
    if name in ("dot", "vdot"):
        return 2.0 * a.numel()
    k = a.shape[-1]
    return 2.0 * out.numel() * k


def _row_run(name: str, args: tuple) -> int:
    """The contiguous entries an indexed access moves a place: the size of the trailing
    dimensions after the indexed ones (``t[rows]``, ``t[rows] = v``, ``index_select``
    along a leading dimension of a contiguous tensor), 1 for one entry a place
    (``gather``, ``scatter_``, indices on the last dimension)."""
    import torch

    src = args[0] if args else None
    if not isinstance(src, torch.Tensor) or not src.is_contiguous():
        return 1
    if name == "index_select" and len(args) > 1:
        after = int(args[1]) % max(src.dim(), 1) + 1
    elif name in ("index", "index_put", "index_put_") and len(args) > 1:
        after, dim = 0, 0
        for ix in args[1]:
            width = ix.dim() if isinstance(ix, torch.Tensor) and ix.dtype == torch.bool else 1
            dim += width
            if ix is not None:
                after = dim
    else:
        return 1
    return math.prod(src.shape[after:])


def _places(indices: Any) -> float:
    """The places an ``index_put_`` with integer ``indices`` writes (their broadcast
    size; 0 with a boolean mask, whose places are its values')."""
    import torch

    tensors = [ix for ix in indices if ix is not None]
    if not tensors or any(ix.dtype == torch.bool for ix in tensors):
        return 0.0
    return float(math.prod(torch.broadcast_shapes(*(ix.shape for ix in tensors))))


class OpCounter:
    """Counts what the device code inside ``with OpCounter() as c:`` dispatches, into
    ``c.counts`` (:class:`Counts`); ``rates`` prices each operation's work as it is
    counted (:func:`modelled_seconds` adds launches and synchronizations).

    On the CPU a host tensor and a device tensor look alike, so the counter keeps the
    distinction itself: a tensor made from host data without ``device=``
    (``torch.from_numpy``, ``torch.as_tensor(x)``) or brought back by ``Tensor.cpu()`` is
    a *host* tensor (marked), and so is whatever an operation makes from host tensors
    only; such operations run on the host and are not counted.  A download (``cpu()``,
    ``numpy()``, ``tolist()`` of a device tensor) is a launch and a synchronization; an
    upload is ``torch.as_tensor``/``torch.tensor`` with ``device=``, or a host tensor
    read by a device operation or sent by ``Tensor.to(device)`` (queued, without a
    synchronization, when ``non_blocking=True``).  These calls are wrapped for the
    duration.
    """

    def __init__(self, rates: dict[str, float] | None = None, real: bool = False) -> None:
        self.rates = H200 if rates is None else rates
        #: counting on a real device: a host tensor is a CPU tensor (a 0-dim one is an
        #: operation's argument, not an upload), and transfers are the library's own
        self.real = real
        self.counts = Counts()
        self._charged = 0.0  # modelled seconds charged to operations (op_s)
        self._mode: Any = None
        self._saved: list[tuple[Any, str, Any]] = []

    def _priced(self) -> tuple[float, float]:
        """The modelled seconds counted so far and those already charged to an
        operation in ``counts.op_s``."""
        return modelled_seconds(self.counts, self.rates), self._charged

    def _charge(self, name: str, before: tuple[float, float]) -> None:
        """Charge ``name`` with the modelled seconds counted since ``before``
        (:meth:`_priced`) that no operation inside it was charged with."""
        now, charged = self._priced()
        cost = (now - before[0]) - (charged - before[1])
        if cost:
            op_s = self.counts.op_s
            op_s[name] = op_s.get(name, 0.0) + cost
            self._charged += cost

    def _op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        before = self._priced()
        self._count_op(func, args, kwargs, out)
        self._charge(func.overloadpacket.__name__, before)

    def _count_op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        import torch

        name = func.overloadpacket.__name__
        c, r = self.counts, self.rates
        inputs = list(_tensors((args, kwargs)))
        if self.real:  # a host operation touches no device tensor
            if not any(t.device.type != "cpu" for t in (*inputs, *_tensors(out))):
                return
            inputs = [t for t in inputs if t.device.type != "cpu" or t.dim() > 0]
            host = [t for t in inputs if t.device.type == "cpu"]
        else:
            host = [t for t in inputs if _is_host(t)]
        if host and len(host) == len(inputs):  # the host's own arithmetic
            for t in _tensors(out):
                _mark_host(t)
            return
        queued = name == "copy_" and bool(kwargs.get("non_blocking", args[2:3] == (True,)))
        for t in host:  # host data read by a device operation: an upload
            if queued:  # from pinned memory (the trainers pin what they copy so)
                c.queued_uploads += 1
            else:
                c.uploads += 1
            c.launches += 1
            c.upload_bytes += _nbytes(t)
        c.ops[name] = c.ops.get(name, 0) + 1
        if name in _SYNC or (
            name in ("index", "index_put", "index_put_")
            and any(t.dtype == torch.bool for t in _tensors(args[1]))
        ):
            c.syncs += 1
        if name == "repeat_interleave" and isinstance(args[0], torch.Tensor) and len(args) > 1:
            c.syncs += int(isinstance(args[1], torch.Tensor))
        if name in _METADATA:
            return
        c.launches += 1
        outs = list(_tensors(out))
        moved = sum(_nbytes(t) for t in _tensors(args)) + sum(_nbytes(t) for t in outs)
        if name in _GEMM and outs:
            flops = _gemm_flops(name, args, outs[0])
            if outs[0].dtype == torch.float64:
                c.flops64 += flops
                compute = flops / r["flops64_per_s"]
            else:
                c.flops32 += flops
                compute = flops / r["flops32_per_s"]
            c.bytes += moved
            c.work_s += max(compute, moved / r["bytes_per_s"])
        elif name in _GATHER and outs:
            entries = float(outs[0].numel())
            c.gathers += entries
            c.bytes += 2 * _nbytes(outs[0])
            rate = self._gather_rate(name, args, entries)
            streamed = 2 * _nbytes(outs[0]) / r["bytes_per_s"]
            work = max(entries / rate, streamed)
            c.work_s += work
            self._row_runs(name, args, entries, work, streamed)
        elif name in _SCATTER:
            src = list(_tensors(args[2:] if len(args) > 2 else args[1:]))
            entries = float(max((t.numel() for t in src), default=0))
            if name.startswith("index_put"):  # a value broadcast over the places it writes
                entries = max(entries, _places(args[1]) * _row_run(name, args))
            accumulated = name in _ACCUMULATE or (
                name.startswith("index_put")
                and bool(kwargs.get("accumulate", args[3:4] == (True,)))
            )
            if accumulated:  # a deterministic accumulation: the measured index_add_ rate
                c.scatters += entries
                c.work_s += entries / r["scatters_per_s"]
            else:  # each place written once: an indexed access, at the gathers' rate
                c.gathers += entries
                work = entries / self._gather_rate(name, args, entries)
                c.work_s += work
                size = args[0].element_size() if isinstance(args[0], torch.Tensor) else 8
                self._row_runs(name, args, entries, work, 2 * size * entries / r["bytes_per_s"])
        elif name in _SORT and "sorts_per_s" in r and args:
            records = float(args[0].numel())
            c.sorted += records
            c.bytes += moved
            c.work_s += max(records / r["sorts_per_s"], moved / r["bytes_per_s"])
        else:
            c.bytes += moved
            c.work_s += moved / r["bytes_per_s"]

    def _row_runs(
        self, name: str, args: tuple, entries: float, work: float, streamed: float
    ) -> None:
        """Record an indexed access that moves whole rows (:func:`_row_run` at least
        :data:`~corrtree._config.ROW_RUN`): its entries, the seconds charged and the
        seconds streamed at the bandwidth (``streamed``, at most ``work``)."""
        if entries and _row_run(name, args) >= _config.ROW_RUN:
            c = self.counts
            c.row_runs += entries
            c.row_runs_s += work
            c.row_runs_streamed_s += min(work, streamed)

    def _gather_rate(self, name: str, args: tuple, entries: float) -> float:
        """The rate of an indexed access of ``entries`` entries: ``row_gathers_per_s``
        where the rates give it and the access moves whole rows (:func:`_row_run` at
        least :data:`~corrtree._config.ROW_RUN`), else ``gathers_per_s``."""
        r = self.rates
        if "row_gathers_per_s" in r and entries and _row_run(name, args) >= _config.ROW_RUN:
            self.counts.row_gathers += entries
            return r["row_gathers_per_s"]
        return r["gathers_per_s"]

    def _wrap_real(self, owner: Any, attr: str, kind: str) -> None:
        """:meth:`_wrap` on a real device: the call itself, counted where it crosses
        between the host and the device."""
        original = getattr(owner, attr)
        counter = self

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            from torch.utils._python_dispatch import _disable_current_modes

            c = counter.counts
            with _disable_current_modes():
                out = original(*args, **kwargs)
            if kind in ("download", "to_host"):
                if args[0].device.type != "cpu":
                    c.syncs += 1
                    c.launches += 1
            elif kind == "to":
                if args[0].device.type == "cpu" and out.device.type != "cpu":
                    if kwargs.get("non_blocking", False):
                        c.queued_uploads += 1
                    else:
                        c.uploads += 1
                    c.launches += 1
                    c.upload_bytes += _nbytes(out)
            elif kind == "upload":
                for t in _tensors(out):
                    if t.device.type != "cpu":
                        c.uploads += 1
                        c.launches += 1
                        c.upload_bytes += _nbytes(t)
            return out

        self._install(owner, attr, original, wrapped)

    def _install(self, owner: Any, attr: str, original: Any, wrapped: Any) -> None:
        """Put ``wrapped`` in place of ``owner.attr`` (``original``, restored on exit),
        what it counts charged to ``attr()`` in ``op_s``."""
        counter = self

        def charged(*args: Any, **kwargs: Any) -> Any:
            before = counter._priced()
            out = wrapped(*args, **kwargs)
            counter._charge(f"{attr}()", before)
            return out

        self._saved.append((owner, attr, original))
        setattr(owner, attr, charged)

    def _wrap(self, owner: Any, attr: str, kind: str) -> None:
        if self.real:
            self._wrap_real(owner, attr, kind)
            return
        original = getattr(owner, attr)
        counter = self

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            from torch.utils._python_dispatch import _disable_current_modes

            c = counter.counts
            if kind == "to":  # Tensor.to: an upload when host data goes to a device
                source = args[0]
                target = kwargs.get("device", args[1] if len(args) > 1 else None)
                if not (_is_host(source) and _is_device(target)):
                    return original(*args, **kwargs)
                with _disable_current_modes():  # on the CPU to(cpu) is the tensor itself
                    out = original(*args, **kwargs).detach().clone()
                if kwargs.get("non_blocking", False):
                    c.queued_uploads += 1
                else:
                    c.uploads += 1
                c.launches += 1
                c.upload_bytes += _nbytes(out)
                return out
            if kind in ("download", "to_host"):
                source = args[0]
                if not _is_host(source):
                    c.syncs += 1
                    c.launches += 1
                if kind == "download":
                    return original(*args, **kwargs)
                with _disable_current_modes():  # on the CPU cpu() is the tensor itself
                    out = source.detach().clone()
                _mark_host(out)
                return out
            with _disable_current_modes():
                out = original(*args, **kwargs)
            uploaded = kind == "upload" and kwargs.get("device") is not None
            for t in _tensors(out):
                if uploaded:
                    c.uploads += 1
                    c.launches += 1
                    c.upload_bytes += _nbytes(t)
                else:
                    _mark_host(t)
            return out

        self._install(owner, attr, original, wrapped)

    def __enter__(self) -> OpCounter:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                counter._op(func, args, kwargs, out)
                return out

        self._wrap(torch.Tensor, "numpy", "download")
        self._wrap(torch.Tensor, "tolist", "download")
        self._wrap(torch.Tensor, "cpu", "to_host")
        self._wrap(torch.Tensor, "to", "to")
        for name in ("as_tensor", "tensor"):
            self._wrap(torch, name, "upload")
        self._wrap(torch, "from_numpy", "host")
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)
        self._saved.clear()


def modelled_seconds(c: Counts, rates: dict[str, float] | None = None) -> float:
    """Modelled device seconds of counts ``c``: the work's roofline, every launch and every
    synchronization (a pageable upload synchronizes), and the uploads' bytes over PCIe at
    the bandwidth of the host link (about 50 GB/s)."""
    r = H200 if rates is None else rates
    return (
        c.work_s
        + c.launches * r["launch_s"]
        + (c.syncs + c.uploads) * r["sync_s"]
        + c.upload_bytes / 50e9
    )


def streamed_seconds(c: Counts, rates: dict[str, float] | None = None) -> float:
    """:func:`modelled_seconds` with every indexed access that moves whole rows priced at
    the memory bandwidth instead (its bytes read and written), as a GPU may stream
    such runs: the model's other bound on the device trainers, where the rates hold no
    measured ``row_gathers_per_s`` (``bench_gpu.py`` measures it on a device).  The work
    is priced as it was counted; ``rates`` price the launches and synchronizations, as
    in :func:`modelled_seconds`."""
    return modelled_seconds(c, rates) - c.row_runs_s + c.row_runs_streamed_s


def count_dense_step(
    n: int, d: int, K: int, m: int, seed: int = 0, rates: dict[str, float] | None = None
) -> Counts:
    """The counts of one step of PyTorch's dense loop (:func:`~.gpu.torch_dense`, float64)
    at ``(n, d, K, m)``, on the CPU, its work priced with ``rates`` (:data:`H200` by
    default)."""
    import torch

    from .gpu import dense_step

    rng = np.random.default_rng(seed)
    X = torch.as_tensor(rng.standard_normal((n, d)))
    Y = torch.as_tensor(rng.standard_normal((n, K)))
    A = torch.as_tensor(rng.choice([-1.0, 1.0], size=(m, K)))
    W = torch.as_tensor(rng.standard_normal((m, d)))
    b = math.sqrt(0.4 * math.log(m))
    dense_step(W, X, Y, A, b, 1e-3)  # warm: the first call allocates
    with OpCounter(rates) as counter:
        dense_step(W, X, Y, A, b, 1e-3)
    return counter.counts


def validate_dense(count_m: int = 2**12) -> dict[str, dict[str, float]]:
    """The model against :data:`MEASURED_DENSE`: each workload's dense step counted at
    width ``count_m`` (dense's work is linear in ``m``; its launches and synchronizations
    do not depend on it), scaled to the workload's width, priced, times its iterations.
    Returns measured and modelled seconds and their ratio by workload."""
    out = {}
    for name, w in MEASURED_DENSE.items():
        step = count_dense_step(w["n"], w["d"], w["K"], count_m).scaled(w["m"] / count_m)
        modelled = modelled_seconds(step) * w["iters"]
        out[name] = {
            "measured_s": w["seconds"],
            "modelled_s": modelled,
            "ratio": modelled / w["seconds"],
            "launches_per_step": step.launches,
            "syncs_per_step": step.syncs,
        }
    return out


@contextmanager
def _h200_memory(free: float = 139.0 * 2**30) -> Iterator[None]:
    """The device trainers' chunk and bucket sizes as on an H200: their free-memory reads
    answer ``free`` (the counting sizes are chosen to fit this host); and their choices
    priced with its rates (:data:`~corrtree._config.DEVICE_RATES`: a counted ``cpu``
    tensor stands for a ``cuda`` one)."""
    from ..training import device_band, device_dense, device_kernel

    modules = (device_band, device_dense, device_kernel)
    saved = [m.free_bytes for m in modules]
    rates = _config.DEVICE_RATES["cpu"]
    for m in modules:
        m.free_bytes = lambda dev: free  # type: ignore[attr-defined]
    _config.DEVICE_RATES["cpu"] = _config.DEVICE_RATES["cuda"]
    try:
        yield
    finally:
        _config.DEVICE_RATES["cpu"] = rates
        for m, f in zip(modules, saved, strict=True):
            m.free_bytes = f  # type: ignore[attr-defined]


def count_train(
    train: Callable[..., Any],
    model: Any,
    X: np.ndarray,
    Y: np.ndarray,
    device: Any = "cpu",
    rates: dict[str, float] | None = None,
    as_h200: bool | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """``train(model, X, Y, device=device, **kwargs)`` counted step by step: the counts
    of the set-up with the first step, then of each later step (work priced with
    ``rates``, :data:`H200` by default), and the wall time.  With ``as_h200`` (the
    default on ``"cpu"``) the trainers size their chunks and price their choices as on
    an H200 (:func:`_h200_memory`); else as they do where they run."""
    steps: list[Counts] = []
    last = Counts()

    def mark(t: int, hist: Any) -> None:
        nonlocal last
        now = counter.counts.copy()
        steps.append(now - last)
        last = now

    real = str(device) != "cpu"
    as_h200 = not real if as_h200 is None else as_h200
    t0 = time.perf_counter()
    with (
        _h200_memory() if as_h200 else nullcontext(),
        OpCounter(rates, real=real) as counter,
    ):
        hist = train(model, X, Y, device=device, callback=mark, **kwargs)
    return {"steps": steps, "history": hist, "wall_s": time.perf_counter() - t0}


@contextmanager
def visited_rows() -> Iterator[dict[str, list[tuple[int, int, int]]]]:
    """Record the rows each step of the kernel trainers visits: ``"cpu"`` (the numba
    :class:`~corrtree.training.kernel.KernelTrainer`: the rows its clocks or heap make
    due) and ``"device"`` (:class:`~corrtree.training.device_kernel.DeviceKernelTrainer`:
    the rows its due mask marks), one ``(trainer, m, rows)`` a step (a step's passes
    summed; the trainer's serial number and width tell the run from the small ones that load
    kernels first, :func:`last_run`).  #46's target compares the
    two: on a device a visit's values come by GEMM for the whole row, so its cost is the
    rows it visits, not the values it needs."""
    from ..training.device_kernel import DeviceKernelTrainer
    from ..training.kernel import KernelTrainer

    got: dict[str, list[tuple[int, int, int]]] = {"cpu": [], "device": []}
    saved: list[tuple[Any, str, Any]] = []
    serial: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
    made = itertools.count()

    def wrap(cls: Any, kind: str, visit: str, rows_of: Callable[..., int]) -> None:
        advance, inner = cls.advance, getattr(cls, visit)

        def step(self, *args: Any, **kwargs: Any) -> Any:
            if self not in serial:  # not id(): a freed trainer's id may be reused
                serial[self] = next(made)
            got[kind].append((serial[self], self.m, 0))
            return advance(self, *args, **kwargs)

        def counted(self, *args: Any, **kwargs: Any) -> Any:
            who, m, rows = got[kind][-1]
            got[kind][-1] = (who, m, rows + rows_of(*args))
            return inner(self, *args, **kwargs)

        saved.extend(((cls, "advance", advance), (cls, visit, inner)))
        cls.advance = step
        setattr(cls, visit, counted)

    wrap(KernelTrainer, "cpu", "_visit", lambda rows, *rest: len(rows))
    wrap(DeviceKernelTrainer, "device", "_visit_due", lambda due, ndue, *rest: int(ndue))
    try:
        yield got
    finally:
        for cls, attr, original in saved:
            setattr(cls, attr, original)


def last_run(steps: list[tuple[int, int, int]], m: int) -> list[int]:
    """The rows a step of the last trainer of width ``m`` that :func:`visited_rows`
    recorded visited (loading the kernels runs small trainings first, some as wide)."""
    last = next((who for who, width, _ in reversed(steps) if width == m), None)
    return [rows for who, _, rows in steps if who == last]


#: #46's target: the device kernel trainer's due rows a step at most this many times the
#: CPU kernel trainer's visited rows, W2 and W3
DUE_RATIO_TARGET = 1.1


def due_rows(
    train: Callable[..., Any],
    X: np.ndarray,
    y: np.ndarray,
    m: int,
    iters: int,
    K: int,
    device: list[int] | None = None,
) -> dict[str, Any]:
    """The rows the kernel trainer visits each step on the CPU (numba) and on
    ``device="cpu"`` (the device trainer, as it runs on a GPU; ``device``: its rows
    recorded already, by :func:`visited_rows` around a counted run), from the same model,
    and the largest ratio of the two over the steps (a step where the CPU visits no row
    counts its device rows over one)."""
    from ..model import TwoLayerReLU

    runs = {} if device is None else {"device": list(device)}
    for kind, extra in (("cpu", {}), ("device", {"device": "cpu"})):
        if kind in runs:
            continue
        model = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=K, seed=7)
        with visited_rows() as got:
            train(model, X, y, method="kernel", iters=iters, **extra)
        runs[kind] = last_run(got[kind], m)
    steps = min(len(runs["cpu"]), len(runs["device"]))  # a run may converge early
    ratio = max(
        (v / max(c, 1) for v, c in zip(runs["device"][:steps], runs["cpu"][:steps], strict=True)),
        default=math.nan,
    )
    return {
        "m": m,
        "cpu": runs["cpu"],
        "device": runs["device"],
        "ratio": ratio,
        "target": DUE_RATIO_TARGET,
        "met": bool(ratio <= DUE_RATIO_TARGET),
    }


#: What ``bench_gpu.py --count`` counts: each workload's data at a width that a CPU
#: counts in minutes (``m``), the steps counted of its ``iters`` (the rest extrapolated
#: from the median of the last five counted), and the device methods.  ``small`` is the
#: tests' (seconds).
COUNT_SIZES: dict[str, dict[str, Any]] = {
    "small": {
        "scale_n": 1 / 8,
        "cases": {"W1": (2**10, 8), "W5": (2**10, 8)},
        "methods": ("dense", "lazy", "kernel"),
        "due": ("W5",),
    },
    "large": {
        "scale_n": 1.0,
        "cases": {"W1": (2**13, 30), "W2": (2**12, 8), "W3": (2**12, 8), "W5": (2**13, 30)},
        "methods": ("dense", "lazy", "kernel"),
        "due": ("W2", "W3"),
    },
}

#: #46's targets for a counted step of the device lazy and kernel trainers: the first
#: three steps (mass re-anchoring), the later ones, and a later step with nothing due.
STEP_TARGETS = {
    "first_three": {"syncs": 8, "launches": 300},
    "later": {"syncs": 2, "launches": 150},
    "nothing_due": {"syncs": 1, "launches": 40},
}


def _whole(
    steps: list[Counts],
    iters: int,
    rates: dict[str, float] | None = None,
    price: Callable[..., float] | None = None,
) -> tuple[float, bool]:
    """Modelled seconds of a whole run from its counted steps (the rest at the median of
    the last five counted), each priced by ``price`` (:func:`modelled_seconds` by
    default, or :func:`streamed_seconds`), and whether it was extrapolated."""
    price = modelled_seconds if price is None else price
    return _run_of([price(c, rates) for c in steps], iters)


def _run_figures(steps: list[Counts], iters: int, torch_s: float) -> dict[str, Any]:
    """A counted run's whole modelled seconds, by :func:`modelled_seconds` and by
    :func:`streamed_seconds`, each beside PyTorch dense's ``torch_s``."""
    whole, extrapolated = _whole(steps, iters)
    streamed, _ = _whole(steps, iters, price=streamed_seconds)
    return {
        "modelled_s": whole,
        "extrapolated": extrapolated,
        "vs_torch_dense": torch_s / whole,
        "modelled_streamed_s": streamed,
        "vs_torch_dense_streamed": torch_s / streamed,
    }


def _run_of(per: list[float], iters: int) -> tuple[float, bool]:
    """A whole run of ``iters`` steps from the modelled seconds ``per`` of its first
    ones (the rest at the median of the last five) and whether it was extrapolated."""
    rest = iters - len(per)
    return sum(per) + max(0, rest) * float(np.median(per[-5:])), rest > 0


#: #46's modelled targets at widths beyond what the CPU can count (the device trainers
#: on W1 at m = 2^22 hold 26 GB of rows; W2's kernel at 2^20 counted 8 steps at 2^16 in
#: 156 s and would take hours): workload -> (width, least ratio to PyTorch dense).
WIDE_TARGETS: dict[str, tuple[int, float]] = {"W1": (2**22, 30.0), "W2": (2**20, 10.0)}


def extrapolated_width(case: dict[str, Any], m: int, method: str = "kernel") -> dict[str, Any]:
    """A case of :func:`run_widths` carried to width ``m`` beyond those counted: each
    counted step's modelled seconds (and streamed seconds, where recorded) taken as
    affine in the width through the two widest counted widths (a step's work grows with
    the rows it reaches, its launches and synchronizations do not), never below the
    widest's, the run completed as :func:`_whole` does; PyTorch dense scaled linearly
    (its step is linear in ``m``).  An estimate of the model, not a count."""
    if len(case["widths"]) < 2 or m <= case["widths"][-1]["m"]:
        raise ValueError(
            f"m={m}: extrapolated_width needs two counted widths below it, "
            f"got {[p['m'] for p in case['widths']]}"
        )
    a, b = (p["runs"][method] for p in case["widths"][-2:])
    ma, mb = (p["m"] for p in case["widths"][-2:])
    out: dict[str, Any] = {"m": m, "from": [ma, mb], "method": method}
    torch_s = case["widths"][-1]["torch_dense_s"] * m / mb
    out["torch_dense_s"] = torch_s
    for key, name in (("modelled_per_step_s", ""), ("streamed_per_step_s", "_streamed")):
        if key not in a or key not in b:
            continue
        pa, pb = np.asarray(a[key]), np.asarray(b[key])
        per = np.maximum(pb + (pb - pa) * (m - mb) / (mb - ma), pb)
        whole, _ = _run_of(list(per), case["iters"])
        out[f"modelled{name}_s"] = whole
        out[f"vs_torch_dense{name}"] = torch_s / whole
    return out


def nothing_due(hist: Any) -> list[bool]:
    """Which steps of a counted run of a device band trainer visited nothing: evaluated
    no pair and re-anchored no neuron (the kernel trainer with no neuron due; the lazy
    trainer evaluates every tracked pair every step, so never)."""
    return [v == 0 and r == 0 for v, r in zip(hist.evaluated_pairs, hist.reanchored, strict=True)]


def _targets(steps: list[Counts], idle: list[bool]) -> dict[str, Any]:
    """The worst counts of the first three steps, the later ones and the later ones that
    visited nothing (``idle``, by step), against :data:`STEP_TARGETS`."""
    later = steps[3:]
    quiet = [c for c, q in zip(later, idle[3:], strict=True) if q]
    out: dict[str, Any] = {}
    for key, group in (("first_three", steps[:3]), ("later", later), ("nothing_due", quiet)):
        if not group:
            continue
        worst = {"syncs": max(c.syncs for c in group), "launches": max(c.launches for c in group)}
        limit = STEP_TARGETS[key]
        out[key] = {
            **worst,
            "target": limit,
            "met": all(worst[k] <= limit[k] for k in limit),
        }
    return out


def run_count(
    size: str = "large",
    out_dir: str = "benchmarks/results",
    only: str | None = None,
    methods: str | None = None,
) -> dict[str, Any]:
    """``bench_gpu.py --count``: the model validated on PyTorch dense, then each workload's
    device methods counted step by step on the CPU and priced for an H200, beside PyTorch
    dense at the same width.  JSON in ``out_dir/gpu_count_SIZE.json``; with ``only`` (some
    workloads, comma-separated) or ``methods`` (some methods), the other counts stored
    there are kept, and each recounted run records ``counted_on`` (its date)."""
    from ..model import TwoLayerReLU
    from ..training import train
    from ._util import print_table, save_result
    from .workloads import WORKLOADS, load

    cfg = COUNT_SIZES[size]
    payload: dict[str, Any] = {"size": size, "rates": H200, "step_targets": STEP_TARGETS}
    payload["dense_validation"] = validate_dense()
    results: dict[str, Any] = {}
    previous = os.path.join(out_dir, f"gpu_count_{size}.json")
    if (only or methods) and os.path.exists(previous):
        with open(previous, encoding="utf-8") as fh:
            results = json.load(fh)["results"]
    for name, (m, counted) in cfg["cases"].items():
        if only and name not in only.split(","):
            continue
        w = WORKLOADS[name]
        X, Y = load(w["data"], w["args"], cfg["scale_n"])
        y = Y if Y.shape[1] > 1 else Y[:, 0]
        iters = w["iters"]
        torch_step = count_dense_step(X.shape[0], X.shape[1], Y.shape[1], m)
        torch_s = modelled_seconds(torch_step) * iters
        case: dict[str, Any] = {
            "n": X.shape[0],
            "d": X.shape[1],
            "K": Y.shape[1],
            "m": m,
            "iters": iters,
            "steps_counted": counted,
            "torch_dense": {"step": torch_step.as_dict(), "modelled_s": torch_s},
            "runs": dict(results.get(name, {}).get("runs", {})),
        }
        if "due_rows" in results.get(name, {}):  # kept unless the kernel is counted again
            case["due_rows"] = results[name]["due_rows"]
        for method in cfg["methods"]:
            if methods and method not in methods.split(","):
                continue
            tiny = TwoLayerReLU.init(d=X.shape[1], m=256, outputs=Y.shape[1], seed=7)
            train(tiny, X[:64], y[:64], method=method, iters=3, device="cpu")  # compile
            model = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=Y.shape[1], seed=7)
            with visited_rows() as visits:
                got = count_train(train, model, X, y, method=method, iters=counted)
            hist = got["history"]
            if method == "kernel" and name in cfg["due"]:
                seen = last_run(visits["device"], m)
                case["due_rows"] = due_rows(train, X, y, m, counted, Y.shape[1], seen)
            case["runs"][method] = {
                **_run_figures(got["steps"], iters, torch_s),
                "counted_wall_s": got["wall_s"],
                "steps": [
                    c.as_dict()
                    | {"modelled_s": modelled_seconds(c), "streamed_s": streamed_seconds(c)}
                    for c in got["steps"]
                ],
                "moved_neurons": list(hist.moved_neurons),
                "targets": (
                    _targets(got["steps"], nothing_due(hist)) if method != "dense" else None
                ),
                "counted_on": time.strftime("%Y-%m-%d"),
            }
        results[name] = case
        save_result(out_dir, f"gpu_count_{size}", {**payload, "results": results})
    rows = [
        [k, v["measured_s"], v["modelled_s"], v["ratio"]]
        for k, v in payload["dense_validation"].items()
    ]
    print_table(
        "PyTorch dense float64 on an H200: measured and modelled",
        ["run", "measured s", "modelled s", "ratio"],
        rows,
    )
    rows = []
    for name, case in results.items():
        for method, r in case["runs"].items():
            later = (r["targets"] or {}).get("later", {})
            rows.append([
                name, case["m"], method, r["modelled_s"], case["torch_dense"]["modelled_s"],
                r["vs_torch_dense"], later.get("launches", "-"), later.get("syncs", "-"),
            ])  # fmt: skip
    print_table(
        "Modelled H200 whole runs (counted on the CPU)",
        ["workload", "m", "method", "modelled s", "torch dense s", "vs torch", "launches", "syncs"],
        rows,
    )
    rows = [
        [name, due["m"], max(due["device"], default=0), max(due["cpu"], default=0), due["ratio"]]
        for name, case in results.items()
        if (due := case.get("due_rows"))
    ]
    if rows:
        print_table(
            "Kernel trainer: rows due a step, device against CPU (target: ratio <= 1.1)",
            ["workload", "m", "device, most", "CPU, most", "worst ratio"],
            rows,
        )
    return {**payload, "results": results}


#: ``bench_gpu.py --count-widths``: the device trainers' modelled whole runs as the width
#: grows, up to each workload's own width: per case the widths, the steps counted at each
#: (the rest extrapolated as :func:`run_count` does) and the methods.  ``small`` is the
#: tests' (seconds).
COUNT_WIDTHS: dict[str, dict[str, Any]] = {
    "small": {"scale_n": 1 / 8, "cases": {"W1": ((2**10, 2**11), 6, ("kernel",))}},
    "large": {
        "scale_n": 1.0,
        "cases": {
            "W1": ((2**13, 2**14, 2**15, 2**16, 2**17), 30, ("kernel",)),
            "W2": ((2**12, 2**13, 2**14, 2**15, 2**16), 8, ("kernel",)),
            # the kernel trainer's H has (nK)^2 = 3.2e8 entries at W3's ten outputs: its
            # modelled run is 36x the lazy one's at 2^12 (8.7 s), and counting it takes
            # minutes a step on the CPU
            "W3": ((2**12, 2**13, 2**14, 2**15, 2**16, 2**17), 8, ("lazy",)),
            "W5": ((2**13, 2**14, 2**15, 2**16), 30, ("kernel", "lazy")),
        },
    },
}


def run_widths(
    size: str = "large", out_dir: str = "benchmarks/results", only: str | None = None
) -> dict[str, Any]:
    """``bench_gpu.py --count-widths``: each case's device methods counted at each width
    (:data:`COUNT_WIDTHS`) and priced for an H200, beside PyTorch dense modelled at the
    same width, with the first width at which each passes it.  JSON in
    ``out_dir/gpu_widths_SIZE.json``, saved after every width; with ``only`` (some
    cases, comma-separated) the other cases stored there are kept."""
    from ..model import TwoLayerReLU
    from ..training import train
    from ._util import print_table, save_result
    from .workloads import WORKLOADS, load

    cfg = COUNT_WIDTHS[size]
    payload: dict[str, Any] = {"size": size, "rates": H200, "step_targets": STEP_TARGETS}
    results: dict[str, Any] = {}
    previous = os.path.join(out_dir, f"gpu_widths_{size}.json")
    if only and os.path.exists(previous):
        with open(previous, encoding="utf-8") as fh:
            results = {k: v for k, v in json.load(fh)["results"].items() if k in cfg["cases"]}
    rows = []
    for name, (widths, counted, methods) in cfg["cases"].items():
        if only and name not in only.split(","):
            continue
        w = WORKLOADS[name]
        X, Y = load(w["data"], w["args"], cfg["scale_n"])
        y = Y if Y.shape[1] > 1 else Y[:, 0]
        iters = w["iters"]
        case: dict[str, Any] = {
            "n": X.shape[0], "d": X.shape[1], "K": Y.shape[1], "iters": iters,
            "steps_counted": counted, "widths": [], "passes_torch_dense_at": {},
        }  # fmt: skip
        results[name] = case
        for method in methods:
            tiny = TwoLayerReLU.init(d=X.shape[1], m=256, outputs=Y.shape[1], seed=7)
            train(tiny, X[:64], y[:64], method=method, iters=3, device="cpu")  # compile
        for m in widths:
            torch_s = modelled_seconds(count_dense_step(X.shape[0], X.shape[1], Y.shape[1], m))
            torch_s *= iters
            point: dict[str, Any] = {"m": m, "torch_dense_s": torch_s, "runs": {}}
            for method in methods:
                model = TwoLayerReLU.init(d=X.shape[1], m=m, outputs=Y.shape[1], seed=7)
                got = count_train(train, model, X, y, method=method, iters=counted)
                figures = _run_figures(got["steps"], iters, torch_s)
                whole = figures["modelled_s"]
                later = got["steps"][3:]
                point["runs"][method] = {
                    **figures,
                    "worst_later": {
                        "launches": max(c.launches for c in later),
                        "syncs": max(c.syncs for c in later),
                    },
                    "syncs_per_step": [c.syncs for c in got["steps"]],
                    "modelled_per_step_s": [modelled_seconds(c) for c in got["steps"]],
                    "streamed_per_step_s": [streamed_seconds(c) for c in got["steps"]],
                    "launches_per_step": [c.launches for c in got["steps"]],
                    "evaluated_pairs": list(got["history"].evaluated_pairs),
                    "counted_wall_s": got["wall_s"],
                }
                if torch_s >= whole:
                    case["passes_torch_dense_at"].setdefault(method, m)
                rows.append([name, m, method, whole, torch_s, torch_s / whole])
            case["widths"].append(point)
            if name in WIDE_TARGETS and len(case["widths"]) >= 2:  # #46's wide target
                wide, least = WIDE_TARGETS[name]
                beyond = extrapolated_width(case, wide, methods[-1])
                case["beyond"] = beyond | {"target": least}
            payload["counted_on"] = time.strftime("%Y-%m-%d")
            save_result(out_dir, f"gpu_widths_{size}", {**payload, "results": results})
    print_table(
        "Modelled H200 whole runs against width (counted on the CPU)",
        ["workload", "m", "method", "modelled s", "torch dense s", "vs torch"],
        rows,
    )
    return {**payload, "results": results}
