"""Sharded training on a Dask LocalCluster (2 workers x 1 thread) against one process.

Usage: python benchmarks/bench_distributed.py [--size small|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import distributed, script

if __name__ == "__main__":
    script(distributed.run, distributed.SIZES, __doc__, __file__)
