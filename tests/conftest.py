import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, settings

import corrtree  # noqa: F401  first: OpenBLAS then spins briefly (corrtree._threads)

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: What the warm-up compiles, one group per process (numba compiles on one thread): the
#: kernel trainer's kernels take about as long as all the others together.
_WARM_GROUPS = (("kernel",), ("dense", "dtree", "wtree", "lazy"))
_WARMUP_S = pytest.StashKey[float]()


def pytest_configure(config):
    """Under ``-n`` (pytest-xdist), compile every trainer's kernels into numba's cache
    once, before the workers start, in two processes at a time.  Otherwise each worker
    and each command-line run a test starts compiles the same kernels while the cache is
    cold, which on two cores is minutes of duplicated work.  Compiling from an empty or
    damaged cache folder, or without one, is tested in folders of its own
    (``test_edges.py``); this only fills the cache every other test reads."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    t0 = time.perf_counter()
    code = "import sys, corrtree as ct; ct.warmup(sys.argv[1:])"
    procs = [subprocess.Popen([sys.executable, "-c", code, *group]) for group in _WARM_GROUPS]
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        raise pytest.UsageError(f"the kernels' warm-up failed: {failed}")
    config.stash[_WARMUP_S] = time.perf_counter() - t0


def pytest_terminal_summary(terminalreporter, config):
    """The warm-up's time, which pytest's own figure (from the workers' start) leaves out."""
    if _WARMUP_S in config.stash:
        seconds = config.stash[_WARMUP_S]
        terminalreporter.write_line(
            f"kernels loaded or compiled before the workers started: {seconds:.1f} s "
            "(not in the time below)"
        )
