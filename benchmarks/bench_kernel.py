"""The kernel trainer against the lazy one, dense numpy and PyTorch.

Usage: python benchmarks/bench_kernel.py [--size small|medium|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import fast, script

if __name__ == "__main__":
    script(fast.run_kernel, fast.SIZES, __doc__, __file__)
