"""Thread settings that must be made before numpy is first imported."""

import os

#: OpenBLAS worker threads spin for ~0.1 s after each call and then starve the
#: numba threads that run next; a short spin (in ms) keeps the two from fighting.
OPENBLAS_THREAD_TIMEOUT = "4"


def quiet_openblas() -> None:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` unless the user did.  It only takes effect
    before numpy is first imported: ``import corrtree`` does it first thing."""
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)
