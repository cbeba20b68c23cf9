"""Counting the device path on the CPU and pricing it for an H200 (``bench_gpu.py --count``).

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
(:func:`~.device_count.validate_dense`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import _config

__all__ = ["H200", "Counts", "OpCounter", "modelled_seconds", "streamed_seconds"]

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


def _count_upload(c: Counts, out: Any, kwargs: dict[str, Any]) -> None:
    """One host-to-device copy of ``out``: a launch and its bytes, queued with
    ``non_blocking=True`` (pinned memory), else a synchronizing upload."""
    if kwargs.get("non_blocking", False):
        c.queued_uploads += 1
    else:
        c.uploads += 1
    c.launches += 1
    c.upload_bytes += _nbytes(out)


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
                    _count_upload(c, out, kwargs)
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
                _count_upload(c, out, kwargs)
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
