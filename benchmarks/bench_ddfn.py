"""Correlation trees and the DDFN firing detector against numpy and FAISS.

Usage: python benchmarks/bench_ddfn.py [--size small|medium|large] [--out DIR]
"""

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy is imported

from corrtree.bench import ddfn, script

if __name__ == "__main__":
    script(ddfn.run, ddfn.SIZES, __doc__, __file__)
