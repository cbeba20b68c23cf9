"""Whole runs of every method on five workloads (sphere, image patches, digits, wide n,
breast cancer), against dense numpy and PyTorch.

Usage: python benchmarks/bench_workloads.py [--size small|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import script, workloads

if __name__ == "__main__":
    script(workloads.run, workloads.SIZES, __doc__, __file__)
