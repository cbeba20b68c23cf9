"""The paper's trainers (dense, dtree, wtree) and PyTorch dense gradient descent.

Usage: python benchmarks/bench_train.py [--size small|medium|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import script, train

if __name__ == "__main__":
    script(train.run, train.SIZES, __doc__, __file__)
