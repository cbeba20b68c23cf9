"""The lazy trainer against dense numpy, PyTorch and the paper's trainers.

Usage: python benchmarks/bench_lazy.py [--size small|medium|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import fast, script

if __name__ == "__main__":
    script(fast.run_lazy, fast.SIZES, __doc__, __file__)
