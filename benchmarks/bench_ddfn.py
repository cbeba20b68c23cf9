"""Correlation trees and the DDFN firing detector against numpy and FAISS.

Usage: python benchmarks/bench_ddfn.py [--size small|medium|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import ddfn, script

if __name__ == "__main__":
    script(ddfn.run, ddfn.SIZES, __doc__, __file__)
