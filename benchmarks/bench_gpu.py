"""corrtree on one GPU against PyTorch dense gradient descent on that GPU (W1-W5, W1 wide,
two W1 variants), and the CPU trainers' scaling with the machine's cores.

Usage: PYTHONPATH=src python3 benchmarks/bench_gpu.py [--size small|large] [--out DIR]
(``--size large`` on a CUDA device; ``--size small`` runs on the CPU in minutes.)
With ``--count`` it runs on the CPU instead: the device path counted step by step
(launches, host synchronizations, gathers, flops, bytes) and priced for an H200 by a
model validated on PyTorch dense (``corrtree.bench.device_count``); with
``--count-widths`` the device kernel trainer so counted and modelled as the width grows.
With ``--set-rates RESULT`` it stores the device rates that a run measured (its JSON,
``rates_measured``) in the package's ``device_rates.json``, which the device trainers
price their choices with and ``--count`` its modelled runs.
"""

import sys

import corrtree  # noqa: F401  (first: it sets the BLAS threads up before numpy loads)
from corrtree._config import DEVICE_RATES_FILE
from corrtree.bench import device_count, gpu, rates, script

if __name__ == "__main__":
    if "--set-rates" in sys.argv:
        at = sys.argv.index("--set-rates")
        if at + 1 >= len(sys.argv):
            sys.exit("--set-rates: give the JSON of a bench_gpu.py run")
        try:
            stored = rates.set_rates(sys.argv[at + 1])
        except (OSError, ValueError) as exc:
            sys.exit(f"--set-rates: {exc}")
        print(f"stored in {DEVICE_RATES_FILE}: {stored}")
    elif "--count-widths" in sys.argv:
        sys.argv.remove("--count-widths")
        script(device_count.run_widths, device_count.COUNT_WIDTHS, __doc__, __file__)
    elif "--count" in sys.argv:
        sys.argv.remove("--count")
        script(device_count.run_count, device_count.COUNT_SIZES, __doc__, __file__)
    else:
        script(gpu.run, gpu.SIZES, __doc__, __file__)
