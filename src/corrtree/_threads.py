"""Thread settings: OpenBLAS's spinning threads against numba's.

OpenBLAS worker threads spin for ~0.1 s after each call and starve the numba threads
that run next (on two cores the band trainers' iterations then take up to 2.5× as long:
W5's data, logistic loss, m = 2^16, lazy, 300 iterations: 27–30 s against 10–12 s).
``OPENBLAS_THREAD_TIMEOUT`` shortens the spin, but OpenBLAS reads it once, when numpy
loads it: ``import corrtree`` sets it first thing (:func:`quiet_openblas`).  Where numpy
was imported first, the band trainers run their iterations with OpenBLAS on one thread
instead (:func:`quiet_blas`), through ``threadpoolctl`` where it is installed (it comes
with scikit-learn); without it they warn once and run as they are.  A GEMM inside them
long enough that the spin after it is a small part of its time (re-anchoring a block of
rows) takes every BLAS thread back for its call (:func:`full_blas`): W4's data, m = 2^16,
numpy first, step 0's re-anchoring of every neuron 6.7-7.3 s against 8.4-9.5 s.
"""

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

#: The spin of OpenBLAS's worker threads after a call, in ms, set before numpy loads.
OPENBLAS_THREAD_TIMEOUT = "4"

#: The smallest GEMM, in flops, that :func:`full_blas` runs on every BLAS thread inside
#: :func:`quiet_blas`: about 0.2 s on one core, twice OpenBLAS's spin after the call.
FULL_BLAS_FLOPS = 2e10

#: The limits :func:`quiet_blas` holds now (innermost last), to be lifted by
#: :func:`full_blas`.
_LOWERED: list[Any] = []

#: Whether OpenBLAS spins briefly in this process: the variable was set before numpy
#: was imported (by the user, or by :func:`quiet_openblas` at ``import corrtree``).
SHORT_SPIN = True
_warned = False


def quiet_openblas() -> None:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` unless the user did, and note whether it takes
    effect (numpy not yet imported, or the variable set by the user before)."""
    global SHORT_SPIN
    SHORT_SPIN = "OPENBLAS_THREAD_TIMEOUT" in os.environ or "numpy" not in sys.modules
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)


def quiet_blas(needed: bool = True) -> contextlib.AbstractContextManager[Any]:
    """A context with OpenBLAS on one thread when its threads spin long (not
    :data:`SHORT_SPIN`) and ``needed`` (``threadpoolctl``'s limit, undone on leaving,
    whatever happens inside); otherwise one that does nothing."""
    global _warned
    if SHORT_SPIN or not needed:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        if not _warned:
            _warned = True
            warnings.warn(
                "numpy was imported before corrtree, so OpenBLAS's threads spin ~0.1 s "
                "after each call and slow the lazy and kernel trainers (up to 2.5x on two "
                "cores): import corrtree first, set OPENBLAS_THREAD_TIMEOUT=4 before "
                "starting Python, or install threadpoolctl",
                RuntimeWarning,
                stacklevel=3,
            )
        return contextlib.nullcontext()
    return _one_thread(threadpool_limits)


@contextlib.contextmanager
def _one_thread(threadpool_limits: Any) -> Iterator[None]:
    limiter = threadpool_limits(limits=1, user_api="blas")
    _LOWERED.append(limiter)
    try:
        yield
    finally:
        _LOWERED.pop()
        limiter.restore_original_limits()


def full_blas(flops: float) -> contextlib.AbstractContextManager[Any]:
    """A context with OpenBLAS's threads as they were before :func:`quiet_blas` lowered
    them to one, for one GEMM of ``flops`` of at least :data:`FULL_BLAS_FLOPS`;
    otherwise (no limit in effect, or a shorter GEMM) one that does nothing."""
    if not _LOWERED or flops < FULL_BLAS_FLOPS:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    threads = _LOWERED[-1].get_original_num_threads().get("blas")
    if threads is None:  # no BLAS found, or several with different counts
        return contextlib.nullcontext()
    return threadpool_limits(limits=threads, user_api="blas")
