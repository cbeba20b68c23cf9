"""The classification losses: whole runs of W3 and W5 with their classification loss beside
the squared loss (speed-up over dense numpy with the same loss), and 5-fold accuracy and
log-loss beside MLPClassifier and LogisticRegression.

Usage: python benchmarks/bench_losses.py [--size small|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import losses, script

if __name__ == "__main__":
    script(losses.run, losses.SIZES, __doc__, __file__)
