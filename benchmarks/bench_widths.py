"""Whole runs against width on real data: W2's patches at m = 2^14 ... 2^20 (implicit
models from 2^19), other patches, a tabular regression set; the fastest exact trainer against
dense numpy, whole run / set-up.

Usage: python benchmarks/bench_widths.py [--size small|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import script, widths

if __name__ == "__main__":
    script(widths.run, widths.SIZES, __doc__, __file__)
