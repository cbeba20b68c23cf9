"""OpenBLAS's threads against numba's: the band trainers' iterations run with OpenBLAS on
one thread when numpy was imported before corrtree (its long spin then in effect)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("threadpoolctl")

CHILD = """
import json, sys
first = sys.argv[1]
if first == "numpy":
    import numpy
import corrtree
import numpy as np
from threadpoolctl import threadpool_info
from corrtree import _threads

def blas():
    return max(d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas")

rng = np.random.default_rng(0)
X = rng.standard_normal((40, 5))
X /= np.linalg.norm(X, axis=1, keepdims=True)
y = rng.standard_normal(40)
out = {"short_spin": _threads.SHORT_SPIN, "before": blas()}
for method in sys.argv[2:]:
    seen = []
    model = corrtree.TwoLayerReLU.init(d=5, m=64, seed=0)
    corrtree.train(model, X, y, method=method, iters=3, callback=lambda t, h: seen.append(blas()))
    out[method] = seen
out["after"] = blas()
with _threads.quiet_blas(True):  # a re-anchoring's GEMM inside the iterations
    out["quiet"] = blas()
    with _threads.full_blas(_threads.FULL_BLAS_FLOPS):
        out["long_gemm"] = blas()
    with _threads.full_blas(_threads.FULL_BLAS_FLOPS / 2):
        out["short_gemm"] = blas()
    out["quiet_again"] = blas()
out["at_end"] = blas()
print(json.dumps(out))
"""


def _child(first: str, *methods: str) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    env.pop("OPENBLAS_THREAD_TIMEOUT", None)
    res = subprocess.run(
        [sys.executable, "-c", CHILD, first, *methods],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_numpy_first_runs_band_iterations_with_one_blas_thread():
    out = _child("numpy", "lazy", "kernel", "dense")
    assert out["short_spin"] is False
    assert out["before"] == 2
    assert out["lazy"] == [1, 1, 1] and out["kernel"] == [1, 1, 1]
    assert out["dense"] == [2, 2, 2]  # dense's iterations are GEMMs: all threads
    assert out["after"] == 2  # the limit is undone
    # a GEMM long against OpenBLAS's spin takes every thread back for its call
    assert (out["quiet"], out["long_gemm"], out["short_gemm"]) == (1, 2, 1)
    assert out["quiet_again"] == 1 and out["at_end"] == 2


def test_corrtree_first_keeps_blas_threads():
    out = _child("corrtree", "lazy")
    assert out["short_spin"] is True
    assert out["lazy"] == [2, 2, 2] and out["after"] == 2
    assert (out["quiet"], out["long_gemm"], out["short_gemm"], out["at_end"]) == (2, 2, 2, 2)
