"""
Training curves: every method on one trajectory
===============================================

Digits (64 features, 10 classes) with the cross-entropy loss, trained by dense gradient
descent, by the paper's WTree trainer and by the lazy trainer from the same initial
weights. The three loss curves lie on top of each other and the final weights agree to
about 1e-15: the fast trainers are exact, not approximations.
"""

import matplotlib.pyplot as plt
import numpy as np

import corrtree as ct

ds = ct.datasets.digits(test_size=0.25, seed=0)
labels = ds.y_train.argmax(axis=1)
ct.warmup(["dense", "wtree", "lazy"])  # compile (or load) the kernels outside every figure

runs = {}
for method in ("dense", "wtree", "lazy"):
    model = ct.TwoLayerReLU.init(d=64, m=2048, outputs=10, seed=0)
    hist = ct.train(model, ds.X_train, labels, method=method, loss="cross_entropy", iters=30)
    runs[method] = (hist, model.W)

dense_W = runs["dense"][1]
fig, ax = plt.subplots(figsize=(6, 3.5))
for (method, (hist, W)), style in zip(runs.items(), ("-", "--", ":"), strict=True):
    gap = np.linalg.norm(W - dense_W) / np.linalg.norm(dense_W)
    print(f"{method:7s} final loss {hist.final_loss:.6f}  |W - W_dense| / |W_dense| = {gap:.1e}")
    ax.plot(hist.loss, style, lw=2, label=f"{method} ({hist.total_time:.2f} s)")
ax.set_xlabel("iteration")
ax.set_ylabel("training loss (cross-entropy, summed)")
ax.set_yscale("log")
ax.legend()
ax.set_title("digits, m = 2048: three methods, one trajectory")
fig.tight_layout()
