"""The kernel trainer against dense numpy, PyTorch and the paper's trainers.

Usage: python benchmarks/bench_kernel.py [--size small|medium|large]
"""

import argparse
import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy is imported

from corrtree.bench import fast  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(fast.SIZES), default="large")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    fast.run_kernel(args.size, args.out)
