"""corrtree on one GPU against PyTorch dense gradient descent on that GPU (W1-W5, W1 wide,
two W1 variants), and the CPU trainers' scaling with the machine's cores.

Usage: PYTHONPATH=src python3 benchmarks/bench_gpu.py [--size small|large] [--out DIR]
(``--size large`` on a CUDA device; ``--size small`` runs on the CPU in minutes.)
"""

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree.bench import gpu, script

if __name__ == "__main__":
    script(gpu.run, gpu.SIZES, __doc__, __file__)
