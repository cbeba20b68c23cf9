"""Benchmark suites (run with ``corrtree bench`` or ``benchmarks/bench_*.py``)."""
