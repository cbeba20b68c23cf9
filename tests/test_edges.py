"""The edges of a run: full disks, impossible combinations, memory limits (cgroups,
shards, devices), resuming elsewhere, refused runs, signals while compiling, damaged or
missing kernel caches, warm-up arguments.  Each section is one kind of fault; most
tests run the command or script in a subprocess, as a user would meet it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from interrupts import _MARK, _marked, trial
from test_cli import CLI, assert_one_line_error, run

import corrtree as ct
from corrtree import _memory, _validation


def _python(code: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        **kw,
    )


# -- 1. disks without room ---------------------------------------------------------------


def test_export_weights_refuses_a_disk_without_room_and_leaves_nothing(tmp_path, monkeypatch):
    model = ct.TwoLayerReLU.init(d=64, m=2**12, seed=0, implicit=True)  # 2 MiB of W
    path = tmp_path / "W.npy"
    path.write_bytes(b"the user's older file")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1, 1, 2**20))
    with pytest.raises(OSError, match=r"no room to write 2\.00 MiB \(only 1\.00 MiB free") as err:
        model.export_weights(path)
    assert err.value.filename == str(path)  # the user's path, not a temporary file's
    assert sorted(os.listdir(tmp_path)) == ["W.npy"]
    assert path.read_bytes() == b"the user's older file"


def test_a_disk_that_fills_during_the_write_leaves_the_old_file(tmp_path, monkeypatch):
    """The room check passes (another process fills the disk later): the write fails
    with the OS's error, the temporary file goes, the old file stays."""
    import corrtree._io as io

    model = ct.TwoLayerReLU.init(d=16, m=4096, seed=0, implicit=True)
    path = tmp_path / "W.npy"
    path.write_bytes(b"old")
    real = io.tempfile.mkstemp

    def full_disk(*a, **kw):
        fd, name = real(*a, **kw)
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), name  # every write: ENOSPC

    monkeypatch.setattr(io.tempfile, "mkstemp", full_disk)
    with pytest.raises(OSError, match="No space left"):
        model.export_weights(path)
    assert sorted(os.listdir(tmp_path)) == ["W.npy"] and path.read_bytes() == b"old"


def _small_disk(tmp_path: Path, size: str) -> Path | None:
    """A tmpfs of ``size`` (root only), or ``None`` where one cannot be mounted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    return mount if done.returncode == 0 else None


def test_export_and_save_onto_a_real_small_disk(tmp_path):
    """On a 4 MiB tmpfs: an 8 MiB export is refused in one line (no ``Bus error``, no
    temporary file), the CLI says so in one line too, and a model that fits is saved."""
    disk = _small_disk(tmp_path, "4m")
    if disk is None:
        pytest.skip("mounting a tmpfs needs root")  # the patched tests above still ran
    try:
        code = (
            "import corrtree as ct\n"
            "m = ct.TwoLayerReLU.init(d=64, m=2**14, seed=0, implicit=True)\n"
            f"m.export_weights({str(disk / 'W.npy')!r})\n"
        )
        out = _python(code)
        assert out.returncode == 1 and "no room to write 8.00 MiB" in out.stderr, out.stderr
        assert os.listdir(disk) == []
        ct.TwoLayerReLU.init(d=8, m=256, seed=0).save(disk / "small.npz")
        assert os.listdir(disk) == ["small.npz"]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_export_into_a_missing_folder_creates_it(tmp_path):
    model = ct.TwoLayerReLU.init(d=4, m=64, seed=0, implicit=True)
    path = tmp_path / "not" / "yet" / "W.npy"
    model.export_weights(path)
    np.testing.assert_array_equal(np.load(path), model.weights())


def test_a_checkpoint_that_cannot_be_written_is_refused_before_the_first_step(tmp_path):
    """A checkpoint path that is a folder, lies under a file, or holds a file that is not
    a checkpoint is refused in one line naming ``checkpoint`` before any step (not at
    the first save, after the work, or by replacing the file); ``resume`` checks its
    ``checkpoint`` the same way.  A missing folder is fine: the first save makes it."""
    ds = ct.datasets.sphere(n=32, d=6, seed=0)
    X, y = ds.X_train, ds.y_train
    model = ct.TwoLayerReLU.init(d=6, m=64, seed=0)
    steps = []
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cases = {tmp_path: "is a folder", blocker / "ck.npz": re.escape(f"{blocker} is a file")}
    for bad, why in cases.items():
        with pytest.raises(ValueError, match=f"^checkpoint='{re.escape(str(bad))}': {why}"):
            ct.train(
                model,
                X,
                y,
                method="lazy",
                iters=3,
                checkpoint=bad,
                checkpoint_every=1,
                callback=lambda t, h: steps.append(t),
            )
    assert steps == [] and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
    good = tmp_path / "not" / "yet" / "ck.npz"
    ct.train(model, X, y, method="lazy", iters=2, checkpoint=good, checkpoint_every=1)
    with pytest.raises(ValueError, match=r"^checkpoint=.*: is a folder"):
        ct.resume(good, X, y, iters=3, checkpoint=tmp_path)
    # a file that is not a checkpoint is never replaced; a checkpoint is
    data = tmp_path / "data.csv"
    data.write_text("1,2,3\n")
    with pytest.raises(ValueError, match=r"^checkpoint=.*data\.csv' is a file that is not a"):
        ct.train(model, X, y, method="lazy", iters=2, checkpoint=data, checkpoint_every=1)
    with pytest.raises(ValueError, match=r"^checkpoint=.*data\.csv' is a file that is not a"):
        ct.resume(good, X, y, iters=3, checkpoint=data)
    assert data.read_text() == "1,2,3\n"
    ct.train(model, X, y, method="lazy", iters=2, checkpoint=good, checkpoint_every=1)
    ct.resume(good, X, y, iters=3)  # the good one still resumes


def test_saving_onto_a_folder_or_under_a_file_names_the_path_and_leaves_nothing(tmp_path):
    """``save`` onto a folder, or below a file, is refused in one line naming the path,
    and no temporary file is left in the folder above (it would be written there)."""
    model = ct.TwoLayerReLU.init(d=4, m=16, seed=0)
    target = tmp_path / "models"
    target.mkdir()
    with pytest.raises(
        IsADirectoryError, match=re.escape(f"is a folder; give a file name: '{target}'")
    ):
        model.save(target)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError, match=re.escape(f"{blocker} is a file")):
        model.save(blocker / "m.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "models"]
    assert blocker.read_text() == "x" and not any(target.iterdir())


def test_files_that_are_not_npz_archives_are_named_so_without_pickle_advice(tmp_path):
    """A model, checkpoint or data file that is a single ``.npy`` array or not numpy's at
    all gets one line saying what it is, never numpy's offer to unpickle it."""
    X = np.zeros((4, 3))
    npy, text = tmp_path / "a.npy", tmp_path / "b.npz"
    np.save(npy, X)
    text.write_text("not an archive")
    loaders = {
        "model file": ct.TwoLayerReLU.load,
        "checkpoint": lambda p: ct.resume(p, X, X[:, 0]),
        "data file": ct.datasets.load_file,
    }
    for what, load in loaders.items():
        for path, why in ((npy, "a single .npy array"), (text, "not an .npz archive")):
            if what == "data file" and path == npy:
                why = "unknown format"  # a data file is chosen by its suffix first
            with pytest.raises(ValueError) as info:
                load(path)
            msg = str(info.value)
            assert f"cannot read {what} {path}: {why}" in msg and "pickle" not in msg.replace(
                "without pickle", ""
            ), msg
            assert "\n" not in msg


# -- 2. combinations no method takes ----------------------------------------------------


def _sphere(n=64, d=10, outputs=1):
    ds = ct.datasets.sphere(n=n, d=d, outputs=outputs, seed=0)
    return ds.X_train, ds.y_train


def test_auto_on_a_device_says_why_no_method_takes_the_run():
    pytest.importorskip("torch")
    X, y = _sphere()
    model = ct.TwoLayerReLU.init(d=10, m=256, seed=0, implicit=True)
    kw = dict(device="cpu", momentum=0.9, batch_size=16, iters=2)
    with pytest.raises(ValueError) as err:
        ct.train(model, X, y, **kw)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("method='auto' on a device has no method")
    assert "method='dense' on a device needs the stored weight matrix" in msg
    assert "method='lazy' on a device takes plain gradient steps" in msg
    assert "device=None" in msg
    # the estimators say the same
    from corrtree.sklearn import CorrTreeRegressor

    est = CorrTreeRegressor(width=256, implicit=True, device="cpu", momentum=0.9, batch_size=16)
    with pytest.raises(ValueError, match="has no method for this run"):
        est.fit(X, y)


def test_named_methods_refuse_before_any_set_up(monkeypatch):
    """Momentum on the device's lazy trainer, an implicit model on dense: refused before
    the trainer exists (its construction would fail the test)."""
    pytest.importorskip("torch")
    from corrtree.training import _registry

    def never(*a, **kw):
        raise AssertionError("set-up started")

    X, y = _sphere()
    explicit = ct.TwoLayerReLU.init(d=10, m=256, seed=0)
    for k in ("lazy", "kernel"):
        monkeypatch.setattr(_registry.DEVICE_TRAINERS[k], "__init__", never)
        with pytest.raises(ValueError, match=f"method='{k}' on a device takes plain gradient"):
            ct.train(explicit, X, y, method=k, device="cpu", momentum=0.5, iters=2)
    implicit = ct.TwoLayerReLU.init(d=10, m=256, seed=0, implicit=True)
    with pytest.raises(ValueError, match="an implicit model trains with method='lazy' or"):
        ct.train(implicit, X, y, method="dense", iters=2)


def test_auto_names_itself_for_an_unknown_option():
    X, y = _sphere()
    model = ct.TwoLayerReLU.init(d=10, m=256, seed=0)
    with pytest.raises(TypeError, match=r"unknown option 'bandd' for method='auto'; .* band"):
        ct.train(model, X, y, iters=2, bandd=0.5)
    # an option only some methods take: auto chooses among those
    hist = ct.train(model, X, y, iters=2, band=0.5)
    assert hist.method in ("lazy", "kernel")
    with pytest.raises(TypeError, match="for method='auto'"):
        ct.train(model, X, y, iters=2, device="cpu", gemm_dtype="float32")


# -- 3., 4., 5. memory: shards, cgroups, devices --------------------------------------------


def test_sharded_runs_check_their_memory_in_process(monkeypatch):
    X, y = _sphere(n=256, d=32)
    model = ct.TwoLayerReLU.init(d=32, m=2**15, seed=0)
    monkeypatch.setattr(_validation, "available_memory", lambda: 40 * 2**20)
    with pytest.raises(MemoryError) as err:
        ct.train(model, X, y, method="lazy", iters=2, shards=2)
    msg = str(err.value)
    assert "\n" not in msg and "method='lazy' at n=256, m=32768, d=32 in 2 shards" in msg
    assert "m=8192 would fit" in msg or "m=16384 would fit" in msg


def test_a_dask_worker_refuses_its_shard_before_allocating():
    """An implicit m = 2^24 kernel run on two workers with a 1 GiB memory limit each: each
    worker models its share and refuses it in one line that names a width that fits."""
    pytest.importorskip("dask.distributed")
    from dask.distributed import Client, LocalCluster

    X, y = _sphere(n=1024, d=64)
    model = ct.TwoLayerReLU.init(d=64, m=2**24, seed=0, implicit=True)
    cluster = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        memory_limit="1GiB",
    )
    try:
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=120)
            with pytest.raises(MemoryError) as err:
                ct.train(model, X, y, method="kernel", iters=2, client=client)
    finally:
        cluster.close()
    msg = str(err.value)
    assert "\n" not in msg and "a shard of 8388608 neurons of method='kernel'" in msg
    assert "available on worker tcp://127.0.0.1" in msg and "would fit" in msg


def _fake_cgroup(tmp_path, monkeypatch, lines: str, files: dict[str, str]) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "self_cgroup").write_text(lines)
    (tmp_path / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    monkeypatch.setattr(_memory, "CGROUP_ROOT", tmp_path / "fs")
    monkeypatch.setattr(_memory, "PROC_CGROUP", tmp_path / "self_cgroup")
    monkeypatch.setattr(_memory, "PROC_MEMINFO", tmp_path / "meminfo")


def test_available_memory_reads_cgroup_v2_limits_up_the_tree(tmp_path, monkeypatch):
    _fake_cgroup(
        tmp_path,
        monkeypatch,
        "0::/user.slice/job\n",
        {
            "fs/cgroup.controllers": "cpu memory",
            "fs/user.slice/memory.max": str(3 * 2**30),  # the parent's limit
            "fs/user.slice/memory.current": str(2**30),
            "fs/user.slice/job/memory.max": "max",
            "fs/user.slice/job/memory.current": str(2**29),
            "fs/user.slice/memory.stat": "anon 1\ninactive_file 268435456\n",
        },
    )
    # 3 GiB - (1 GiB - 256 MiB of reclaimable cache), below MemAvailable's 3.8 GiB
    assert _validation.available_memory() == 3 * 2**30 - 2**30 + 2**28


def test_available_memory_reads_cgroup_v1_limits(tmp_path, monkeypatch):
    _fake_cgroup(
        tmp_path,
        monkeypatch,
        "5:cpu:/\n4:memory:/docker/abc\n0::/\n",
        {
            "fs/memory/docker/abc/memory.limit_in_bytes": str(2**30),
            "fs/memory/docker/abc/memory.usage_in_bytes": str(2**28),
            "fs/memory/docker/abc/memory.stat": "total_inactive_file 0\n",
            "fs/memory/memory.limit_in_bytes": "9223372036854771712",  # no limit
        },
    )
    assert _validation.available_memory() == 2**30 - 2**28
    # a container that mounts only its own group sees it at the mount's root
    (tmp_path / "self_cgroup").write_text("4:memory:/kubepods/pod1/xyz\n")
    shutil.rmtree(tmp_path / "fs/memory/docker")
    (tmp_path / "fs/memory/memory.limit_in_bytes").write_text(str(2**29))
    (tmp_path / "fs/memory/memory.usage_in_bytes").write_text("0")
    assert _validation.available_memory() == 2**29


def test_no_cgroup_limit_leaves_meminfo(tmp_path, monkeypatch):
    _fake_cgroup(tmp_path, monkeypatch, "0::/\n", {"fs/cgroup.controllers": "memory"})
    assert _validation.available_memory() == 4000000 * 1024


_CGROUP_V1 = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def memory_cgroup():
    """A fresh memory cgroup of 1 GiB under this process's own (v1 or v2; root only),
    and the prefix of a shell command that runs in it."""
    group = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and _CGROUP_V1.is_dir():
            group, limit = _CGROUP_V1 / path.lstrip("/"), "memory.limit_in_bytes"
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            group, limit = Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"
        if group is not None:
            break
    leaf = None if group is None else group / f"corrtree-test-{os.getpid()}"
    try:
        leaf.mkdir()
        (leaf / limit).write_text(str(2**30))
    except (OSError, AttributeError):
        pytest.skip("no memory cgroup can be made here (needs root)")
    yield f"echo $$ > {leaf / 'cgroup.procs'} && exec "
    for _ in range(50):
        try:
            leaf.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def _in_cgroup(prefix: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", "-c", prefix + command], capture_output=True, text=True, timeout=300
    )


def test_under_a_1_gib_cgroup_every_path_refuses_in_one_line(memory_cgroup, tmp_path):
    """W1's shape (n = 1024, d = 784): a stored model of 2^18 neurons (1.5 GiB), and
    implicit models (no W) whose runs do not fit: on the CPU trainers, on the device's
    (torch on the CPU), and in two Dask workers (each refuses its shard)."""
    py = sys.executable
    init = _in_cgroup(
        memory_cgroup,
        f"{py} -c 'import corrtree as ct; ct.TwoLayerReLU.init(d=784, m=2**18)'",
    )
    assert init.returncode == 1 and "MemoryError" in init.stderr, init.stderr
    assert "m=131072 would fit" in init.stderr.strip().splitlines()[-1]
    paths = {
        "cpu": ["--width", "262144", "--method", "kernel"],
        "device": ["--width", "262144", "--method", "lazy", "--device", "cpu"],
        "sharded": ["--width", "1048576", "--method", "kernel", "--workers", "2"],
    }
    for path, extra in paths.items():
        if path == "device":
            pytest.importorskip("torch")
        cli = " ".join(
            [*CLI, "train", "--data", "sphere", "--implicit", "--iters", "2", "--quiet",
             "--out", str(tmp_path / path), *extra]
        )  # fmt: skip
        proc = _in_cgroup(memory_cgroup, cli)
        assert_one_line_error(proc, 1, "would fit")
        last = proc.stderr.strip().splitlines()[-1]
        assert re.search(r"m=\d+ would fit", last) and "Killed" not in proc.stderr, (path, last)
        if path == "sharded":
            assert "a shard of 524288 neurons" in last and "on worker" in last, last


def test_device_refusals_name_what_would_fit(monkeypatch):
    pytest.importorskip("torch")
    X, y = _sphere()
    model = ct.TwoLayerReLU.init(d=10, m=2**14, seed=0)
    monkeypatch.setattr(_validation, "available_memory", lambda: 2**20)
    for method in ("lazy", "kernel", "auto"):
        with pytest.raises(MemoryError) as err:
            ct.train(model, X, y, method=method, iters=2, device="cpu")
        msg = str(err.value)
        assert "\n" not in msg and "available on cpu" in msg, msg
        assert "m=" in msg and "would fit" in msg, msg


# -- 6., 7. resuming elsewhere; a refused run leaves an interrupted one as it was -----------


def _interrupted_run(tmp_path, *extra) -> Path:
    """A ``corrtree train`` run stopped by SIGINT once its first checkpoint exists
    (``--checkpoint-every 1``)."""
    from test_cli import signal_mid_run

    out = tmp_path / "run"
    args = ["train", "--data", "breast_cancer", "--width", "1024", "--iters", "12"]
    args += ["--checkpoint-every", "1", "--quiet", "--out", str(out), *extra]
    proc = subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    signal_mid_run(proc, out, signal.SIGINT)
    return out


def test_a_refused_run_leaves_an_interrupted_one_resumable_on_another_device(tmp_path):
    """A dense run stopped on the CPU: new runs into its folder that are refused (a device
    that is not there, a method that cannot take the model) leave every file as it was;
    ``--resume`` takes ``--device`` (here torch on the CPU: dense checkpoints cross
    devices), and names it when the run's own device is not here."""
    pytest.importorskip("torch")
    out = _interrupted_run(tmp_path, "--method", "dense")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for bad in (["--device", "cudaa"], ["--implicit", "--method", "dense"]):
        refused = run(
            "train", "--data", "breast_cancer", "--width", "1024", "--out", out, *bad, check=False
        )
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before, bad
    run_file = out / "run.json"
    recorded = json.loads(run_file.read_text())
    run_file.write_text(json.dumps({**recorded, "device": "cuda"}))  # as if it ran on a GPU
    absent = run("train", "--resume", out, check=False)
    assert_one_line_error(absent, 1, "the run trained on 'cuda', which is not here")
    assert "--device cpu" in absent.stderr
    asked = run("train", "--resume", out, "--device", "cuda:7", check=False)
    assert_one_line_error(asked, 1, "--device: device='cuda:7' is not there")
    run("train", "--resume", out, "--device", "cpu", "--quiet")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] and summary["method"] == "dense"
    assert json.loads(run_file.read_text()) == {**recorded, "device": "cpu", "finished": True}


# -- 8., 9. signals while the kernels compile; the helper ends with its caller --------------


@pytest.mark.parametrize(
    ("command", "kind", "delay"),
    [
        ("train", "double ctrl-c", None),
        ("warmup", "double ctrl-c", 1.5),
        ("train", "sigterm", 4.0),
        ("warmup", "ctrl-c", 7.0),
    ],
)
def test_a_signal_while_compiling_ends_cleanly(command, kind, delay):
    """Cold (an empty cache): exit 130, one line, no traceback, nothing left running 2 s
    later.  Four moments here (the suite's time), the first as soon as the command takes
    signals (numpy, numba and scipy still to load); ``python tests/interrupts.py 20``
    runs 20 trials of each command and kind, spread over the first 25 s."""
    assert trial(command, kind, delay) is None


def test_the_command_line_takes_signals_before_numpy_numba_and_scipy_load():
    """``import corrtree.cli`` loads the standard library alone, so ``main`` installs its
    handlers before the heavy imports (the first trial above signals at that moment)."""
    code = "import sys, corrtree.cli; print(sorted({'numpy', 'numba', 'scipy'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_an_interrupt_through_generated_code_still_exits_130(tmp_path):
    """A ``KeyboardInterrupt`` that crossed an ``exec`` of source text (numba and scipy run
    such code as they compile and load) is handled by ``main``: one line and status 130,
    not the interpreter ending itself by SIGINT afterwards (``python -m``)."""
    (tmp_path / "probe.py").write_text(
        "import sys\n"
        "from corrtree import _commands, cli\n"
        "def command(args):\n"
        "    exec(\"raise KeyboardInterrupt('interrupted')\")\n"
        "_commands.COMMANDS['demo'] = command\n"
        "sys.exit(cli.main(['demo']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "probe"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.strip() == "corrtree: interrupted", proc.stderr


def test_a_signal_is_held_until_the_compilation_ends():
    """In a library call (no hook), SIGINT sent while a kernel compiles arrives as
    ``KeyboardInterrupt`` once the compilation is over: the kernel is whole and runs."""
    code = """
import os, signal
import numpy as np
from numba.core import event
from corrtree._jit import njit

signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job inherits SIG_IGN

@njit(cache=False)
def f(x):
    return np.sqrt(x).sum()

class Interrupt(event.Listener):
    def on_start(self, ev):
        if ev.data["dispatcher"].py_func is f.py_func:
            os.kill(os.getpid(), signal.SIGINT)  # delivered in the middle of the compiler
    def on_end(self, ev):
        if ev.data["dispatcher"].py_func is f.py_func:
            print("compiled", flush=True)

event.register("numba:compile", Interrupt())
try:
    f(np.ones(3))
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted after", len(f.signatures), "signature")
print(f(np.ones(4)))
"""
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["compiled", "interrupted after 1 signature", "4.0"]


def test_the_compile_helper_never_outlives_its_caller(tmp_path):
    """SIGKILL of a cold ``corrtree warmup`` (no handler runs): its helper, which compiles
    in a session of its own, is gone 2 s later."""
    mark = os.urandom(8).hex()
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), _MARK: mark}
    proc = subprocess.Popen(
        [*CLI, "warmup", "--methods", "lazy"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while len(_marked(mark)) < 2 and time.time() < deadline:  # the helper has started
        time.sleep(0.05)
    assert len(_marked(mark)) >= 2
    proc.kill()
    proc.wait()
    time.sleep(2.0)
    left = _marked(mark)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


# -- 10., 11. damaged caches; no cache folder at all -----------------------------------------

_TRAIN_ONCE = """
import logging
import corrtree as ct
logging.basicConfig(level=logging.WARNING, format="%(message)s")
ds = ct.datasets.sphere(n=40, d=8, seed=0)
model = ct.TwoLayerReLU.init(d=8, m=512, seed=0)
hist = ct.train(model, ds.X_train, ds.y_train, method="dense", lr=0.5, iters=3)
print(repr(hist.final_loss))
"""
#: A few kernels (the correlation tree's): quick to compile cold.
_QUERY_TREE = """
import logging
import numpy as np
import corrtree as ct
logging.basicConfig(level=logging.WARNING, format="%(message)s")
rng = np.random.default_rng(0)
tree = ct.CorrelationDTree(rng.standard_normal((20, 8)), rng.standard_normal((500, 8)))
tree.update(3, np.ones(8))
print(tree.query(2, 0.5).tolist())
"""


def test_damaged_cache_files_are_compiled_again(tmp_path):
    """Every kernel's files damaged, each in one of three ways: an index garbled from its
    first byte, a data file truncated, a data file with one byte flipped deep inside."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path)}
    first = _python(_QUERY_TREE, env)
    assert first.returncode == 0, first.stderr
    index = sorted(tmp_path.rglob("*.nbi"))
    assert len(index) >= 3
    for k, nbi in enumerate(index):
        data = sorted(nbi.parent.glob(nbi.name[: -len(".nbi")] + ".*.nbc"))
        if k % 3 == 0:
            nbi.write_bytes(b"\x80\x04garbage")
        for nbc in data:
            body = bytearray(nbc.read_bytes())
            if k % 3 == 1:
                body = body[:100]
            else:
                body[len(body) // 2] ^= 0xFF
            nbc.write_bytes(bytes(body))
    second = _python(_QUERY_TREE, env)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout  # the same run
    assert "Traceback" not in second.stderr and "was damaged" in second.stderr
    third = _python(_QUERY_TREE, env)  # the damaged files were replaced
    assert third.returncode == 0 and third.stdout == first.stdout
    assert "damaged" not in third.stderr


_READ_ONLY = """
import numba.core.caching as caching
def read_only(self):
    raise PermissionError(13, "Read-only file system")
caching._CacheLocator.ensure_cache_path = read_only  # every cache folder is read-only
"""


def test_without_any_writable_cache_folder_corrtree_imports_and_trains():
    """numba raises at definition time when no cache folder is writable; corrtree then
    compiles in memory and says so once a run compiles."""
    version = _python(_READ_ONLY + "import sys; sys.argv = ['corrtree', '--version']\n"
                      "from corrtree.cli import main; main()")  # fmt: skip
    assert version.returncode == 0 and version.stdout.strip() == f"corrtree {ct.__version__}"
    trained = _python(_READ_ONLY + _TRAIN_ONCE)
    assert trained.returncode == 0, trained.stderr
    assert "no writable cache folder" in trained.stderr and "in memory" in trained.stderr


# -- 12. warm-up arguments ----------------------------------------------------------------


def test_warmup_checks_every_name_before_compiling(monkeypatch):
    from corrtree.training import _train

    calls = []
    monkeypatch.setattr(_train, "ensure", lambda *a, **kw: calls.append(a) or ct.Warmup(0.0, 0))
    with pytest.raises(ValueError, match="'bogus'"):
        ct.warmup(["dense", "bogus"])
    with pytest.raises(ValueError, match="names no method"):
        ct.warmup([])
    with pytest.raises(ValueError, match="a method's name or a sequence"):
        ct.warmup(3)
    assert calls == []
    ct.warmup("kernel")  # one name, not the letters of one
    assert [c[1] for c in calls] == ["kernel", "kernel"]


@pytest.mark.parametrize("methods", ["", ",", "dense,,kernel", "dense,bogus"])
def test_cli_warmup_refuses_lists_without_a_method(methods):
    assert_one_line_error(run("warmup", "--methods", methods, check=False), 1, "--methods")


_CALLER = """
import sys
sys.path.insert(0, {root!r})
from pkg.main import f
print(f(3))
"""


def test_a_kernel_compiles_again_when_a_helper_of_another_module_changes(tmp_path):
    """numba stamps a cached kernel with its own file only, while the kernel carries the
    code of what it calls from other modules (here inlined): a change to the helper alone
    must not load the old code (it did: 7 again)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    helper = pkg / "helper.py"
    helper.write_text(
        "from corrtree._jit import njit\n\n"
        "@njit(cache=True, inline='always')\ndef twice(x):\n    return 2 * x\n"
    )
    (pkg / "main.py").write_text(
        "from corrtree._jit import njit\nfrom .helper import twice\n\n"
        "@njit(cache=True)\ndef f(x):\n    return twice(x) + 1\n"
    )
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    script = _CALLER.format(root=str(tmp_path))
    assert _python(script, env).stdout.split() == ["7"]
    assert _python(script, env).stdout.split() == ["7"]  # from the cache
    helper.write_text(helper.read_text().replace("2 * x", "3 * x"))
    assert _python(script, env).stdout.split() == ["10"]
