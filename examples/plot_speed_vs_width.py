"""
Speed against width
===================

Whole runs (set-up, ``lr="auto"`` and 20 iterations) of dense gradient descent and of the
kernel trainer on breast cancer (569 points, 30 features, the logistic loss) as the width
grows. Dense costs ``n·m·d`` an iteration; the kernel trainer's iterations cost the pairs
near the threshold, so its lead grows with the width. The figures are this build
machine's, measured side by side.
"""

import matplotlib.pyplot as plt
import numpy as np

import corrtree as ct

ds = ct.datasets.breast_cancer(test_size=0.25, seed=0)
labels = (ds.y_train > 0).astype(int)
ct.warmup(["dense", "kernel"])

widths = [2**k for k in range(10, 15)]
times = {"dense": [], "kernel": []}
for m in widths:
    W = {}
    for method in times:
        model = ct.TwoLayerReLU.init(d=ds.X_train.shape[1], m=m, seed=0)
        hist = ct.train(model, ds.X_train, labels, method=method, loss="logistic", iters=20)
        times[method].append(hist.total_time)
        W[method] = model.W
    assert np.linalg.norm(W["kernel"] - W["dense"]) <= 1e-9 * np.linalg.norm(W["dense"])

fig, ax = plt.subplots(figsize=(6, 3.5))
for method, t in times.items():
    ax.loglog(widths, t, "o-", label=method)
ax.set_xlabel("width m")
ax.set_ylabel("whole run (s)")
ax.legend()
ax.set_title("breast cancer, 20 iterations")
fig.tight_layout()
for m, td, tk in zip(widths, times["dense"], times["kernel"], strict=True):
    print(f"m = {m:6d}: dense {td:.3f} s, kernel {tk:.3f} s ({td / tk:.1f}x)")
