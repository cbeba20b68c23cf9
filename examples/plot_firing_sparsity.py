"""
Firing sparsity: how few pairs fire, and how few change
=======================================================

With the paper's threshold ``b = sqrt(0.4 ln m)`` a neuron fires on a unit-norm point with
probability ``Q(b)`` at initialization (:func:`corrtree.theory.fire_probability`), and
training barely changes which pairs fire. The left panel compares the measured share of
firing pairs with ``Q(b)`` over widths; the right one shows, over a run, how many pairs
fire and how many flip in each iteration — what the lazy and kernel trainers pay for.
"""

import matplotlib.pyplot as plt
import numpy as np

import corrtree as ct

ds = ct.datasets.sphere(n=256, d=32, seed=0)
widths = [2**k for k in range(10, 17, 2)]
measured, predicted = [], []
for m in widths:
    model = ct.TwoLayerReLU.init(d=32, m=m, seed=0)
    measured.append(np.mean(model.W @ ds.X_train.T >= model.b))
    predicted.append(ct.theory.fire_probability(model.b))

model = ct.TwoLayerReLU.init(d=32, m=2**14, seed=0)
hist = ct.train(model, ds.X_train, ds.y_train, method="kernel", iters=40)

fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
left.loglog(widths, measured, "o", label="measured")
left.loglog(widths, predicted, "-", label="Q(b)")
left.set_xlabel("width m")
left.set_ylabel("share of pairs that fire")
left.legend()
right.semilogy(hist.fired_pairs, label="firing pairs")
right.semilogy(np.maximum(hist.flips, 1), label="flips")
right.set_xlabel("iteration")
right.set_title(f"m = 2^14, {model.m * ds.X_train.shape[0]:.2e} pairs in all")
right.legend()
fig.tight_layout()
print("measured / Q(b):", np.round(np.array(measured) / np.array(predicted), 3))
