"""The device path's counter and its H200 model (``corrtree.bench.device_count``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import corrtree as ct  # noqa: E402
from corrtree.bench import device_count as dc  # noqa: E402


def test_counter_counts_launches_syncs_and_work_exactly():
    A = torch.ones((8, 5), dtype=torch.float64)
    B = torch.ones((5, 3), dtype=torch.float64)
    with dc.OpCounter() as counter:
        C = A @ B  # one launch: 2·8·3·5 flops
        V = C.reshape(-1)[1:]  # views: nothing (C.T.reshape would copy: a launch)
        total = float(V.sum()) + 5.0  # a launch and a scalar read
        mask = A[:, 0] > 0  # a launch
        rows = A[mask]  # boolean indexing: a launch and a synchronization
        picked = A[torch.as_tensor(np.array([0, 2]))]  # an upload, then a gather of 10
        host = C.numpy()  # a download
    c = counter.counts
    assert total == 120.0 and rows.shape == (8, 5) and picked.shape == (2, 5)
    assert host.shape == (8, 3)
    assert c.flops64 == 2 * 8 * 3 * 5 and c.flops32 == 0
    assert c.syncs == 3  # the scalar read, the boolean index, the download
    assert c.uploads == 1 and c.upload_bytes == 16
    assert c.gathers == 8 * 5 + 2 * 5  # the masked rows and the picked ones
    assert c.launches == 1 + 1 + 1 + 1 + 1 + 1 + 1  # mm, sum, gt, index, upload, index, numpy
    assert dc.modelled_seconds(c) > 7 * dc.H200["launch_s"] + 4 * dc.H200["sync_s"]
    # the modelled time by operation adds up to the whole, each part where it was spent
    r = dc.H200
    assert sum(c.op_s.values()) == pytest.approx(dc.modelled_seconds(c), rel=1e-12)
    assert set(c.op_s) == {"mm", "sum", "_local_scalar_dense", "gt", "index", "numpy()"}
    assert c.op_s["numpy()"] == pytest.approx(r["launch_s"] + r["sync_s"])  # a download
    assert c.op_s["_local_scalar_dense"] == pytest.approx(r["sync_s"])  # a scalar read
    # two gathers (one with an upload and one with a synchronization), each a launch
    assert c.op_s["index"] >= 3 * r["launch_s"] + 2 * r["sync_s"]
    assert next(iter(c.as_dict()["op_s"])) == "index"  # the costliest first
    assert (c - dc.Counts()).op_s == c.op_s and c.copy().op_s == c.op_s


def test_counter_prices_a_sort_at_the_sort_rate_where_the_rates_give_one():
    """A sort is counted by its records and priced at ``sorts_per_s`` (the H200's entry
    has one); without that rate, as the bytes it moves."""
    keys = torch.arange(4096, 0, -1, dtype=torch.float64)
    with_rate, without = dict(dc.H200), {k: v for k, v in dc.H200.items() if k != "sorts_per_s"}
    got = []
    for rates in (with_rate, without):
        with dc.OpCounter(rates) as counter:
            torch.sort(keys, stable=True)
        got.append(counter.counts)
    sorted_c, plain = got
    assert "sorts_per_s" in dc.H200 and sorted_c.launches == plain.launches == 1
    assert sorted_c.sorted == 4096 and plain.sorted == 0
    assert sorted_c.work_s == pytest.approx(4096 / dc.H200["sorts_per_s"], rel=1e-12)
    assert plain.work_s == pytest.approx(plain.bytes / dc.H200["bytes_per_s"], rel=1e-12)
    assert sorted_c.work_s > 10 * plain.work_s


@pytest.mark.parametrize("size", [1, 7, 300, 4096])
def test_compact_by_sort_picks_the_same_rows(size):
    """:func:`~corrtree.training.device_band.compact` by one stable sort of the flags
    gives the rows and marks of its prefix sums, marked rows first in order; and a
    trainer picks the sort only for masks short enough that the H200's rates price it
    below the launches it saves."""
    from corrtree import _config
    from corrtree.training.device_band import DeviceBand, compact

    gen = torch.Generator().manual_seed(size)
    for share in (0.0, 0.3, 1.0):
        mask = torch.rand(size, generator=gen) < share
        for cap in {1, max(1, int(mask.sum())), size}:
            by_sums, by_sort = compact(torch, mask, cap), compact(torch, mask, cap, by_sort=True)
            assert torch.equal(by_sums[0], by_sort[0]) and torch.equal(by_sums[1], by_sort[1])
            assert bool(mask[by_sort[0]].eq(by_sort[1]).all())
    band = DeviceBand.__new__(DeviceBand)
    band.device = torch.device("cuda")
    r = _config.DEVICE_RATES["cuda"]
    edge = 4.0 * r["launch"] * r["sorts"]  # the longest mask a sort is cheaper for
    assert band._by_sort(int(edge) - 1) and not band._by_sort(int(edge) + 1)
    assert 2**16 < edge < 2**17


def test_counter_tells_host_tensors_from_device_tensors():
    """What runs on data brought to the host (or made there) is the host's: not counted;
    host data read by a device operation is an upload."""
    D = torch.ones((4, 3), dtype=torch.float64)
    with dc.OpCounter() as counter:
        stats = torch.stack((D.sum(), D.amax())).cpu()  # two launches, one download
        first, peak = int(stats[0]), float(stats[1])  # host reads: free
        doubled = stats * 2  # host arithmetic: free
        err = torch.from_numpy(np.full((4, 3), 0.5))  # host data
        D -= err  # read by a device operation: an upload, and the launch
        sent = err.to(torch.device("cpu"))  # to a device: an upload (a new tensor here)
        sent *= 2  # a device operation now: counted
    c = counter.counts
    assert (first, peak, float(doubled[0])) == (12, 1.0, 24.0)
    assert c.syncs == 1 and c.uploads == 2 and c.upload_bytes == 2 * 4 * 3 * 8
    assert c.launches == 3 + 1 + 1 + 1 + 1 + 1  # sum, amax, stack; download; sub_; 2 up; mul_
    assert float(err[0, 0]) == 0.5 and float(sent[0, 0]) == 1.0
    assert torch.equal(D, torch.full((4, 3), 0.5, dtype=torch.float64))


def test_counter_restores_what_it_wraps():
    saved = (torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.to, torch.as_tensor)
    with dc.OpCounter():
        pass
    assert (torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.to, torch.as_tensor) == saved


def test_dense_step_is_one_synchronization_and_linear_in_m():
    small = dc.count_dense_step(64, 16, 1, 256)
    large = dc.count_dense_step(64, 16, 1, 1024)
    assert small.syncs == large.syncs == 1
    assert small.launches == large.launches <= 16
    assert large.flops64 == pytest.approx(4 * small.flops64, rel=1e-12)
    assert large.bytes == pytest.approx(4 * small.bytes, rel=0.01)  # X is shared
    assert small.scaled(4).flops64 == pytest.approx(large.flops64, rel=1e-12)


def test_model_reproduces_pytorch_dense_on_an_h200():
    """The validation: PyTorch dense float64's counted steps, priced, within 1.5× of its
    whole runs (and W1-shaped steps at 2^20 and 2^22) measured on an H200."""
    for name, r in dc.validate_dense(count_m=1024).items():
        assert 1 / 1.5 <= r["ratio"] <= 1.5, (name, r)


def test_model_reacts_to_each_rate():
    c = dc.count_dense_step(64, 16, 1, 256)
    base = dc.modelled_seconds(c)
    slow = {**dc.H200, "launch_s": 10 * dc.H200["launch_s"]}
    assert dc.modelled_seconds(c, slow) > base
    slow = {**dc.H200, "sync_s": 10 * dc.H200["sync_s"]}
    assert dc.modelled_seconds(c, slow) - base == pytest.approx(9 * dc.H200["sync_s"] * c.syncs)


def test_counted_device_run_is_the_uncounted_one():
    """Counting changes nothing: the counted run's weights are the plain run's, and its
    steps are really counted (the device kernel synchronizes in every step today)."""
    ds = ct.datasets.sphere(n=48, d=8, seed=3)
    plain = ct.TwoLayerReLU.init(d=8, m=512, seed=3)
    ct.train(plain, ds.X_train, ds.y_train, method="kernel", iters=5, device="cpu")
    model = ct.TwoLayerReLU.init(d=8, m=512, seed=3)
    got = dc.count_train(ct.train, model, ds.X_train, ds.y_train, method="kernel", iters=5)
    assert len(got["steps"]) == 5
    np.testing.assert_allclose(model.W, plain.W, rtol=0, atol=1e-12)
    assert all(c.launches > 0 and c.syncs > 0 for c in got["steps"])
    targets = dc._targets(got["steps"], dc.nothing_due(got["history"]))
    assert set(targets) >= {"first_three", "later"}
    whole, extrapolated = dc._whole(got["steps"], 20)
    per = [dc.modelled_seconds(c) for c in got["steps"]]
    assert extrapolated and whole == pytest.approx(sum(per) + 15 * float(np.median(per)))
    assert math.isfinite(whole)


def test_device_kernel_step_with_nothing_due_is_one_transfer():
    """#46's target for a step of the device kernel trainer in which no neuron is due: at
    most one host synchronization (the transfer of the History row, the number due and
    the outputs) and 40 launches; the error goes up queued, without a synchronization.
    Those steps come once the first ones have settled the fire sets (sphere, wide)."""
    ds = ct.datasets.sphere(n=64, d=256, seed=0)
    model = ct.TwoLayerReLU.init(d=256, m=4096, seed=0)
    got = dc.count_train(ct.train, model, ds.X_train, ds.y_train, method="kernel", iters=40)
    quiet = dc.nothing_due(got["history"])
    idle = [c for c, q in zip(got["steps"][3:], quiet[3:], strict=True) if q]
    assert len(idle) >= 5
    for c in idle:
        assert c.syncs <= 1 and c.launches <= 40 and c.uploads == 0, c.as_dict()
        assert c.queued_uploads == 1
    plain = ct.TwoLayerReLU.init(d=256, m=4096, seed=0)
    ct.train(plain, ds.X_train, ds.y_train, method="dense", iters=40)
    assert np.linalg.norm(model.W - plain.W) <= 1e-9 * np.linalg.norm(plain.W)


@pytest.mark.parametrize("kw", [{}, {"batch_size": 16}])
def test_device_dense_step_is_one_transfer(kw):
    """The device dense trainer's step, as PyTorch's own loop: one host synchronization
    (the outputs with the History row's counts), the errors uploaded queued (and a
    batch's points, once), and one block's mask and outputs written where they are made
    (21 launches; PyTorch's loop: 14); a mini-batch step that also evaluates the whole
    set reads twice.  The dense trajectory and its History."""
    ds = ct.datasets.sphere(n=64, d=16, seed=2)
    X, y = ds.X_train, ds.y_train
    model = ct.TwoLayerReLU.init(d=16, m=1024, seed=2)
    got = dc.count_train(ct.train, model, X, y, method="dense", iters=6, **kw)
    for c in got["steps"][1:]:
        assert c.uploads == 0 and c.queued_uploads == (2 if kw else 1), c.as_dict()
        if kw:
            assert c.syncs <= 2 and c.launches <= 34, c.as_dict()
        else:
            assert c.syncs <= 1 and c.launches <= 21, c.as_dict()
    plain = ct.TwoLayerReLU.init(d=16, m=1024, seed=2)
    hp = ct.train(plain, X, y, method="dense", iters=6, **kw)
    np.testing.assert_allclose(model.W, plain.W, rtol=0, atol=1e-9)
    hd = got["history"]
    assert hd.fired_pairs == hp.fired_pairs and hd.moved_neurons == hp.moved_neurons
    assert hd.flips == hp.flips


def _counted(shape: str, method: str, m: int, iters: int = 8, points: int | None = None):
    from corrtree.bench.workloads import WORKLOADS, load

    w = WORKLOADS[shape]
    X, Y = load(w["data"], w["args"], 1 / 8)  # the workload's d, an eighth of its points
    X, Y = X[:points], Y[:points]  # (digits are loaded whole: W3 takes its first points)
    Y = Y[:, 0] if Y.shape[1] == 1 else Y  # W3: ten outputs
    K = 1 if Y.ndim == 1 else Y.shape[1]
    model = ct.TwoLayerReLU.init(d=X.shape[1], m=m, outputs=K, seed=7)
    got = dc.count_train(ct.train, model, X, Y, method=method, iters=iters)
    plain = ct.TwoLayerReLU.init(d=X.shape[1], m=m, outputs=K, seed=7)
    ct.train(plain, X, Y, method="dense", iters=iters)
    assert np.linalg.norm(model.W - plain.W) <= 1e-9 * np.linalg.norm(plain.W)
    return got


@pytest.mark.parametrize("shape", ["W1", "W2"])
def test_device_lazy_steps_are_fixed_shapes(shape):
    """#46's targets for the device lazy trainer, counted on the CPU on W1's and W2's
    shapes: every step after the first three at most 2 host synchronizations and 150
    launches (every row's values by GEMM, the number expired read, the expired rows
    re-anchored in a batch of their capacity, the outputs by GEMM, one transfer), the
    first three at most 8 and 300; re-anchoring in every step, so the batch is
    exercised."""
    got = _counted(shape, "lazy", 1024)
    steps, hist = got["steps"], got["history"]
    assert sum(hist.reanchored[3:]) > 0
    for c in steps[:3]:
        assert c.syncs <= 8 and c.launches <= 300, c.as_dict()
    for c in steps[3:]:
        assert c.syncs <= 2 and c.launches <= 150 and c.uploads == 0, c.as_dict()


def test_device_lazy_batch_holds_exactly_the_expired_rows(monkeypatch):
    """Each re-anchoring batch of the device lazy trainer is the :func:`capacity` of the
    rows it re-anchors (the step's own count, read first), never a batch sized from
    earlier steps; the trajectory is dense's."""
    from corrtree.training import device_band, device_lazy

    batches = []
    inner = device_lazy.DeviceLazyTrainer._reanchor

    def counted(self, rows, live, before):
        batches.append((rows.numel(), int(live.sum()), self.m))
        return inner(self, rows, live, before)

    monkeypatch.setattr(device_lazy.DeviceLazyTrainer, "_reanchor", counted)
    got = _counted("W1", "lazy", 1024)
    assert sum(got["history"].reanchored[1:]) > 0 and len(batches) > 3
    for size, live, m in batches:
        assert live > 0 and size == device_band.capacity(live, m), (size, live)


@pytest.mark.parametrize("shape", ["W1", "W2", "W3"])
def test_device_kernel_steps_are_fixed_shapes_whatever_the_width(shape):
    """#46's targets for the device kernel trainer on W1's and W2's shapes, and on W3's
    with its ten outputs (``H`` of order ``10n``; 240 of its points): every step after the
    first three at most 2 host synchronizations (the transfer of the number due, then
    the one after the visits) and 150 launches, a number that does not grow with the
    width or the number due (a batch of :func:`capacity` rows, each re-anchored by GEMM,
    its counts added in one chunk while memory allows); the first three (the set-up's
    included in the first) at most 8 and 300."""
    worst = []
    for m in (1024, 4096):
        got = _counted(shape, "kernel", m, points=240 if shape == "W3" else None)
        steps, hist = got["steps"], got["history"]
        assert sum(hist.evaluated_pairs[3:]) > 0 and sum(hist.reanchored[3:]) > 0
        for c in steps[:3]:
            assert c.syncs <= 8 and c.launches <= 300, c.as_dict()
        for c in steps[3:]:
            assert c.syncs <= 2 and c.uploads == 0, c.as_dict()
        worst.append(max(c.launches for c in steps[3:]))
    assert max(worst) <= 150 and worst[1] <= worst[0], worst


def test_width_sweep_counts_and_tabulates(tmp_path, monkeypatch):
    """``bench_gpu.py --count-widths --size small``: each width counted and modelled beside
    PyTorch dense at that width, saved, and tabulated for benchmarks/README.md."""
    import importlib.util
    import json
    import os

    res = dc.run_widths("small", str(tmp_path))
    (case,) = res["results"].values()
    assert [p["m"] for p in case["widths"]] == [2**10, 2**11]
    for point in case["widths"]:
        run = point["runs"]["kernel"]
        assert run["vs_torch_dense"] == pytest.approx(point["torch_dense_s"] / run["modelled_s"])
        assert run["worst_later"]["syncs"] <= 2 and len(run["syncs_per_step"]) == 6
    here = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tables.py")
    spec = importlib.util.spec_from_file_location("tables", here)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    with open(tmp_path / "gpu_widths_small.json", encoding="utf-8") as fh:
        text = tables.gpu_widths(json.load(fh))
    assert "| 2^11 | kernel |" in text and "passes PyTorch dense" in text
    # W1's width of #46's target, beyond those counted: carried from the two widest
    beyond = case["beyond"]
    assert beyond["m"] == 2**22 and beyond["from"] == [2**10, 2**11]
    assert beyond["target"] == 30.0 and "| 2^22 † | kernel |" in text
    assert beyond["modelled_s"] >= case["widths"][-1]["runs"]["kernel"]["modelled_s"]
    assert beyond["modelled_streamed_s"] <= beyond["modelled_s"]
    # a case counted alone joins the cases stored, which stay as they were
    cases = {**dc.COUNT_WIDTHS["small"]["cases"], "W5": ((2**10,), 4, ("lazy",))}
    monkeypatch.setitem(dc.COUNT_WIDTHS, "small", {**dc.COUNT_WIDTHS["small"], "cases": cases})
    again = dc.run_widths("small", str(tmp_path), only="W5")
    assert set(again["results"]) == {"W1", "W5"}
    assert again["results"]["W1"] == json.loads(json.dumps(res["results"]["W1"]))
    assert [p["m"] for p in again["results"]["W5"]["widths"]] == [2**10]


@pytest.mark.parametrize("rates", ["scatters", "gemms"])
def test_device_kernel_changes_counts_either_way_without_a_synchronization(monkeypatch, rates):
    """Both ways of changing ``N`` after a visit (entry by entry, by float32 GEMMs of the
    flipped rows), each forced by the rates it is priced with: every step after the first
    three still at most 2 host synchronizations, and the dense trajectory."""
    from corrtree import _config

    cheap = ("scatters",) if rates == "scatters" else ("flops32", "bytes")
    forced = {k: (1e30 if k in cheap else 1.0) for k in _config.DEVICE_RATES["cuda"]}
    forced.update(sync=0.0, launch=0.0)
    monkeypatch.setitem(_config.DEVICE_RATES, "cuda", forced)  # what counting prices with
    got = _counted("W1", "kernel", 1024)
    assert sum(got["history"].flips[3:]) > 0
    for c in got["steps"][3:]:
        assert c.syncs <= 2, c.as_dict()
    scattered = sum(c.scatters for c in got["steps"][3:])  # accumulated into N
    gemm32 = sum(c.flops32 for c in got["steps"][3:])  # the count GEMMs
    assert (scattered > 0 and gemm32 == 0) if rates == "scatters" else (gemm32 > 0 == scattered)


def test_counter_on_a_real_device_counts_its_tensors_only():
    """Counting where the device is real (here the ``meta`` device, which runs no
    arithmetic): operations on its tensors are launches with their work, the host's own
    tensors are not counted, a host number passed to an operation is no upload, and a
    host tensor sent there is one."""
    A = torch.ones((8, 5), dtype=torch.float64, device="meta")
    B = torch.ones((5, 3), dtype=torch.float64, device="meta")
    with dc.OpCounter(real=True) as counter:
        C = A @ B
        D = torch.where(C > 0, C, 0.0)  # the 0.0: an argument, not an upload
        host = torch.ones(6) * 2.0  # the host's arithmetic
        sent = torch.arange(4.0).to("meta")  # an upload
    c = counter.counts
    assert D.device.type == "meta" and host.device.type == "cpu" and sent.numel() == 4
    assert c.flops64 == 2 * 8 * 3 * 5
    assert c.uploads == 1 and c.upload_bytes == 4 * 4
    assert c.launches == 3 + 1  # mm, gt, where; the upload
    assert c.syncs == 0


def test_device_rates_are_measured_stored_and_read_back(tmp_path):
    """``measure_rates`` (the small size, on the CPU) gives every rate the model prices
    with, positive and finite; ``set_rates`` stores a run's measured rates (read back by
    the package's reader, the other kinds kept) and refuses, in one line, a run without
    them or with a rate that is not positive; the package's own file holds them all."""
    import json

    from corrtree import _config
    from corrtree.bench import rates

    got = rates.measure_rates("cpu", "small")
    named = set(_config.RATE_NAMES) | set(_config.OPTIONAL_RATE_NAMES)
    assert set(got["rates"]) == named and set(_config.RATE_NAMES) <= set(dc.H200) <= named
    assert all(math.isfinite(v) and v > 0 for v in got["rates"].values())
    kinds = got["gathers_by_source_per_s"]
    assert set(kinds) == {"resident_G", "table_of_n", "within_rows", "whole_rows"}
    assert kinds["whole_rows"] == got["rates"]["row_gathers_per_s"]
    assert kinds["resident_G"] == got["rates"]["gathers_per_s"]
    assert all(math.isfinite(v) and v > 0 for v in kinds.values())
    assert _config.device_rates()["cuda"]["flops64_per_s"] == dc.H200["flops64_per_s"]
    store = tmp_path / "device_rates.json"
    store.write_text(json.dumps({"other": {**dc.H200, "date": "then"}}))
    result = tmp_path / "gpu_large.json"
    result.write_text(json.dumps({"rates_measured": got}))
    stored = rates.set_rates(result, store)
    assert {k: stored["cuda"][k] for k in named} == pytest.approx(got["rates"])
    assert stored["other"]["date"] == "then" and stored["cuda"]["measured_on"].startswith("cpu")
    assert _config.device_rates(store) == stored
    result.write_text(json.dumps({"rates_measured": {"error": "RuntimeError: no device"}}))
    with pytest.raises(ValueError, match=r"no measured rates \(RuntimeError"):
        rates.set_rates(result, store)
    result.write_text(json.dumps({"rates_measured": {"rates": {**got["rates"], "sync_s": 0}}}))
    with pytest.raises(ValueError, match="sync_s"):
        rates.set_rates(result, store)
    store.write_text(json.dumps({"cuda": {"launch_s": 1e-6}}))
    with pytest.raises(ValueError, match="flops64_per_s"):
        _config.device_rates(store)
    with pytest.raises(ValueError, match="size"):
        rates.measure_rates("cpu", "huge")


def test_due_rows_are_recorded_step_by_step_and_compared():
    """#46's due-fraction target is measured, not assumed: the rows each kernel trainer
    visits a step are recorded (the numba trainer's visits, the device trainer's due
    mask) for the run asked for only, the device's steps with no row due are the steps
    the History shows visiting nothing, and the ratio is the worst step's; the table
    shows it.  The recorder puts the trainers back as they were."""
    import importlib.util
    import os

    from corrtree.bench.workloads import WORKLOADS, load
    from corrtree.training.device_kernel import DeviceKernelTrainer
    from corrtree.training.kernel import KernelTrainer

    before = (KernelTrainer._visit, DeviceKernelTrainer._visit_due, KernelTrainer.advance)
    w = WORKLOADS["W5"]
    X, Y = load(w["data"], w["args"], 1 / 4)
    model = ct.TwoLayerReLU.init(d=X.shape[1], m=1024, seed=7)
    with dc.visited_rows() as seen:
        hist = ct.train(model, X, Y[:, 0], method="kernel", iters=10, device="cpu")
    device = dc.last_run(seen["device"], 1024)
    assert dc.last_run([(0, 8, 5), (0, 8, 6), (1, 4, 1), (2, 8, 7), (2, 8, 9)], 8) == [7, 9]
    assert len(device) == 10 and not seen["cpu"] and max(device) <= 1024
    idle = dc.nothing_due(hist)
    assert [rows == 0 for rows in device] == idle and not all(idle)
    assert (KernelTrainer._visit, DeviceKernelTrainer._visit_due, KernelTrainer.advance) == before

    due = dc.due_rows(ct.train, X, Y[:, 0], 1024, 10, 1, device)
    assert due["device"] == device and len(due["cpu"]) == 10 and sum(due["cpu"]) > 0
    worst = max(v / max(c, 1) for v, c in zip(due["device"], due["cpu"], strict=True))
    assert due["ratio"] == worst and due["met"] == (worst <= dc.DUE_RATIO_TARGET)
    again = dc.due_rows(ct.train, X, Y[:, 0], 1024, 10, 1)  # the device run made here
    assert again["device"] == device and again["cpu"] == due["cpu"]

    here = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tables.py")
    spec = importlib.util.spec_from_file_location("tables", here)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    res = {
        "dense_validation": {},
        "results": {
            "W5": {
                "n": X.shape[0], "d": X.shape[1], "K": 1, "m": 1024, "steps_counted": 10,
                "torch_dense": {"modelled_s": 1.0}, "runs": {}, "due_rows": due,
            }
        },
    }  # fmt: skip
    text = tables.gpu_count(res)
    assert f"| W5 | 2^10 | 10 | {min(device)}-{max(device)} |" in text


def test_row_accesses_are_priced_at_the_row_rate_where_one_is_given():
    """An indexed read or write of whole rows (``t[rows]``, ``t[rows] = v``,
    ``index_select`` along the first dimension) moves contiguous runs, which a GPU
    streams: with ``row_gathers_per_s`` in the rates it is priced at that rate, and
    counted in ``row_gathers``; one entry a place (a ``gather``, indices on the last
    dimension, a run shorter than ``ROW_RUN``) stays at ``gathers_per_s``.  Without the
    rate every access is priced as before."""
    from corrtree import _config

    M = torch.zeros((1000, 64), dtype=torch.float64)
    rows = torch.arange(0, 1000, 7)
    cols = torch.zeros((rows.numel(), 64), dtype=torch.int64)
    slow = {**dc.H200, "bytes_per_s": 1e30}  # work priced by its accesses alone
    slow.pop("row_gathers_per_s", None)
    fast = {**slow, "row_gathers_per_s": 100 * slow["gathers_per_s"]}
    entries = rows.numel() * 64.0
    for rates, rate in ((slow, slow["gathers_per_s"]), (fast, fast["row_gathers_per_s"])):
        for op in (
            lambda: M[rows],
            lambda: M.index_select(0, rows),
            lambda: M.__setitem__(rows, 1.0),
            lambda: M.view(1000, 1, 64)[rows],
        ):
            with dc.OpCounter(rates) as c:
                op()
            assert c.counts.work_s == pytest.approx(entries / rate)
            assert c.counts.row_gathers == (entries if rates is fast else 0.0)
        narrow = torch.zeros((1000, _config.ROW_RUN - 1), dtype=torch.float64)
        for op in (
            lambda: torch.gather(M[:143], 1, cols),
            lambda: M[:, torch.arange(0, 64, 2)],
            lambda: narrow[rows],  # noqa: B023 - called within this iteration
        ):
            with dc.OpCounter(rates) as c:
                out = op()
            assert c.counts.row_gathers == 0.0
            assert c.counts.work_s == pytest.approx(out.numel() / slow["gathers_per_s"])


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_device_set_up_makes_one_float64_gemm_of_the_rows(method):
    """At ``W(0)`` every coefficient is 0: the set-up's anchoring multiplies ``W(0)``'s
    rows with the points, one float64 GEMM of ``2·m·(n+1)·d`` flops, without a GEMM of
    the zero coefficients with ``X`` (and the lazy trainer without a second GEMM for its
    values at ``W(0)``, which are its anchored products)."""
    from corrtree.training.device_kernel import DeviceKernelTrainer
    from corrtree.training.device_lazy import DeviceLazyTrainer

    cls = {"lazy": DeviceLazyTrainer, "kernel": DeviceKernelTrainer}[method]
    rng = np.random.default_rng(0)
    n, d, m = 64, 10, 2048
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Y = rng.standard_normal((n, 1))
    model = ct.TwoLayerReLU.init(d=d, m=m, seed=1)
    with dc.OpCounter() as counter:
        cls(model, X, Y, X @ X.T, 1.0, device=torch.device("cpu"))
    rows = 2.0 * m * (n + 1) * d
    assert rows <= counter.counts.flops64 < 1.3 * rows, counter.counts.flops64 / rows


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_device_steps_of_an_implicit_model_trained_before_stay_on_the_device(method):
    """An implicit model with an earlier run's coefficients (``W = α·(W(0) - C' X')``) has
    its rows rebuilt on the device: every step after the first three at most 2 host
    synchronizations and no upload, as for a fresh model (its rows were taken on the
    host and uploaded at every visit before), and the explicit dense trajectory of both
    runs."""
    ds = ct.datasets.sphere(n=64, d=16, seed=2)
    X, y = ds.X_train, ds.y_train
    model = ct.TwoLayerReLU.init(d=16, m=2048, seed=5, implicit=True)
    plain = model.to_explicit()
    decay = {"weight_decay": 1e-2, "lr": 0.5}  # the earlier run on the host: α < 1
    ct.train(model, X[::2], y[::2], method="lazy", iters=6, **decay)
    ct.train(plain, X[::2], y[::2], method="dense", iters=6, **decay)
    assert model.implicit_weights.update[4] < 1.0
    got = dc.count_train(ct.train, model, X, y, method=method, iters=12)
    ct.train(plain, X, y, method="dense", iters=12)
    assert sum(got["history"].flips[3:]) > 0
    for c in got["steps"][3:]:
        assert c.syncs <= 2 and c.uploads == 0, c.as_dict()
    np.testing.assert_allclose(model.weights(), plain.W, rtol=0, atol=1e-9)


def test_device_memory_model_counts_an_implicit_models_earlier_run():
    """What ``method="auto"`` and the refusals model for a device run of an implicit model
    trained before includes its earlier points and coefficients, as uploaded at set-up:
    the fresh model's bytes plus :func:`update_bytes` at every width."""
    from corrtree.training import _choice
    from corrtree.training.device_band import update_bytes

    ds = ct.datasets.sphere(n=64, d=16, seed=2)
    fresh = ct.TwoLayerReLU.init(d=16, m=2048, seed=5, implicit=True)
    trained = ct.TwoLayerReLU.init(d=16, m=2048, seed=5, implicit=True)
    ct.train(trained, ds.X_train, ds.y_train, method="lazy", iters=4)
    src = trained.implicit_weights
    assert update_bytes(fresh.weight_source, 2048, 16) == 0.0
    extra = update_bytes(src, 2048, 16)
    assert extra >= 16.0 * src.pairs + 8.0 * 65 * 16 > 0
    for meth in ("lazy", "kernel"):
        got = [
            _choice._needs(ds.X_train, mod, False, {}, torch.device("cpu"), 1)[0](meth)
            for mod in (fresh, trained)
        ]
        for m in (1024, 2048):
            assert got[1](m) - got[0](m) == pytest.approx(update_bytes(src, m, 16))


def test_streamed_prices_whole_row_accesses_at_the_bandwidth():
    """Without a measured row rate an indexed access of whole rows is priced at the
    scattered gathers' rate; :func:`streamed_seconds` reprices exactly those accesses
    at the bandwidth (their bytes read and written) and leaves every other one."""
    rates = {**dc.H200}
    rates.pop("row_gathers_per_s", None)
    M = torch.zeros((1000, 64), dtype=torch.float64)
    rows = torch.arange(0, 1000, 7)
    entries = rows.numel() * 64.0
    with dc.OpCounter(rates) as c:
        M[rows]
        M[rows] = 1.0
    counts = c.counts
    assert counts.row_runs == 2 * entries
    assert counts.row_runs_s == pytest.approx(2 * entries / rates["gathers_per_s"])
    assert counts.row_runs_streamed_s == pytest.approx(2 * 2 * 8 * entries / rates["bytes_per_s"])
    assert dc.streamed_seconds(counts, rates) == pytest.approx(
        dc.modelled_seconds(counts, rates) - counts.row_runs_s + counts.row_runs_streamed_s
    )
    assert dc.streamed_seconds(counts, rates) < dc.modelled_seconds(counts, rates)
    cols = torch.zeros((rows.numel(), 64), dtype=torch.int64)
    with dc.OpCounter(rates) as c:  # one entry a place: not a row
        torch.gather(M[:143], 1, cols)
    assert c.counts.row_runs == 0.0
    assert dc.streamed_seconds(c.counts, rates) == dc.modelled_seconds(c.counts, rates)
    # scaled with the width as the rest of the work
    big = counts.scaled(4.0)
    assert big.row_runs == 4 * counts.row_runs
    assert big.row_runs_streamed_s == pytest.approx(4 * counts.row_runs_streamed_s)


def test_extrapolated_width_is_affine_in_the_width_through_the_two_widest():
    """Each counted step carried to a wider ``m`` on the line through the two widest
    counted widths (never below the widest's), the run completed at the median of the
    last five, PyTorch dense scaled linearly."""
    steps_a = [4.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    steps_b = [7.0, 2.5, 1.0, 0.5, 1.5, 1.0]
    case = {
        "iters": 10,
        "widths": [
            {"m": 8, "torch_dense_s": 1.0, "runs": {}},
            {"m": 16, "torch_dense_s": 2.0, "runs": {"kernel": {"modelled_per_step_s": steps_a}}},
            {"m": 32, "torch_dense_s": 4.0, "runs": {"kernel": {"modelled_per_step_s": steps_b}}},
        ],
    }
    out = dc.extrapolated_width(case, 64)
    per = [7.0 + 2 * 3.0, 2.5 + 2 * 0.5, 1.0, 0.5, 1.5 + 2 * 0.5, 1.0]
    per[3] = 0.5  # the line falls below the widest: kept at the widest
    whole = sum(per) + 4 * float(np.median(per[-5:]))
    assert out["m"] == 64 and out["from"] == [16, 32]
    assert out["torch_dense_s"] == 8.0
    assert out["modelled_s"] == pytest.approx(whole)
    assert out["vs_torch_dense"] == pytest.approx(8.0 / whole)
    assert "modelled_streamed_s" not in out  # not recorded, not made up
    with pytest.raises(ValueError, match="two counted widths"):
        dc.extrapolated_width(case, 32)
