"""Mini-batch SGD with momentum on natural-image patches: every method against dense
numpy SGD and PyTorch's torch.optim.SGD on the same batches.

Usage: python benchmarks/bench_sgd.py [--size small|large] [--out DIR]
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import script, sgd

if __name__ == "__main__":
    script(sgd.run, sgd.SIZES, __doc__, __file__)
