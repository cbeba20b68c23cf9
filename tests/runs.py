"""Helpers the tests of several files share to drive runs."""

from __future__ import annotations

import corrtree as ct


def interrupted(model, X, y, checkpoint, stop_after: int, **kw):
    """``ct.train`` with a checkpoint, stopped by its callback after iteration
    ``stop_after`` (the checkpoint holds the last scheduled save before it)."""
    return ct.train(model, X, y, checkpoint=checkpoint, callback=lambda t, h: t < stop_after, **kw)
