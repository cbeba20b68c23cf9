"""Benchmark suites (run with ``corrtree bench`` or ``benchmarks/bench_*.py``)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable


def script(run: Callable[[str, str], object], sizes: dict, doc: str, here: str) -> None:
    """Command line of a ``benchmarks/bench_*.py`` script: ``--size`` and ``--out``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--size", choices=sorted(sizes), default="large")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(here), "results"))
    args = parser.parse_args()
    run(args.size, args.out)
