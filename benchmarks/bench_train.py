"""The paper's trainers (dense, dtree, wtree) and PyTorch dense gradient descent.

Usage: python benchmarks/bench_train.py [--size small|medium|large] [--out DIR]
"""

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy is imported

from corrtree.bench import script, train

if __name__ == "__main__":
    script(train.run, train.SIZES, __doc__, __file__)
