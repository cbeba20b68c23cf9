import os

from hypothesis import HealthCheck, settings

import corrtree  # noqa: F401  first: OpenBLAS then spins briefly (corrtree._threads)

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
