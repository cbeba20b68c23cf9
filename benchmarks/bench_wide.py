"""Widths beyond memory: the kernel trainer on an implicit W(0), m = 2^18 ... 2^23, W1-shaped.

Usage: python benchmarks/bench_wide.py [--size small|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import script, wide

if __name__ == "__main__":
    script(wide.run, wide.SIZES, __doc__, __file__)
