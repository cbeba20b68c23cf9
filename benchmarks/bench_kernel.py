"""The kernel trainer against the lazy one, dense numpy and PyTorch.

Usage: python benchmarks/bench_kernel.py [--size small|medium|large] [--out DIR]
"""

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy is imported

from corrtree.bench import fast, script

if __name__ == "__main__":
    script(fast.run_kernel, fast.SIZES, __doc__, __file__)
