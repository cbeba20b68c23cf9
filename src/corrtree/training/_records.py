"""Named bundles of the per-neuron kernels' arguments (numba namedtuples), so that two
floats or two arrays cannot change places in a call: the scalars of a step, the drift
bounds of the kernel trainer, the flip records and the per-row results.

Each is built by keyword on the Python side and read by field name in the kernels.  A
parallel kernel reads the fields it writes through before its ``prange`` loop: numba's
parfors lose writes to an array taken from a namedtuple inside the loop (numba 0.68).
"""

from __future__ import annotations

from collections import namedtuple

__all__ = ["Drifts", "EvalScalars", "FlipRecord", "RowResults", "VisitScalars"]

#: The band trainers' evaluate step: the step scale ``η/sqrt m``, the threshold ``b``, the
#: data radius ``R``, the certificate factor and the scatter cost of a Gram read
#: (:func:`~._calibrate.scatter_cost`, measured on the machine).
EvalScalars = namedtuple("EvalScalars", ["eta_s", "b", "R", "cert", "scatter"])

#: The kernel trainer's visit: :data:`EvalScalars`'s fields, the cost of a Gram read
#: against a flop (``gram_cost``), whether every ever-fired value is wanted (``full``),
#: the steps still expected (``ahead``, :func:`~._clocks.lookahead`), the global clock
#: ``P``, the drift rate per unit of it (``per_p``) and how far a row of the float32 copy
#: of X may lie from its row of X (``x32_err``, :func:`~._visit.rough_copy`; infinite
#: when there is no copy).
VisitScalars = namedtuple(
    "VisitScalars",
    ["eta_s", "b", "R", "cert", "scatter", "gram_cost", "full", "ahead", "P", "per_p", "x32_err"],
)

#: The kernel trainer's per-neuron drift marks: the drift at the last exact distance from
#: the anchor (``anchor``) and the bound on the residual move since the anchor
#: (``residual``, :func:`~._principal.principal_parts`).
Drifts = namedtuple("Drifts", ["anchor", "residual"])

#: Where the flips of ``rows[k]`` are recorded: ``j``, ``value``, ``on`` from
#: ``start[k]`` on (nothing is recorded when ``j`` is empty).
FlipRecord = namedtuple("FlipRecord", ["start", "j", "value", "on"])

#: What a per-neuron kernel returns for each row: its flips, its values evaluated, and
#: whether it must be re-anchored.
RowResults = namedtuple("RowResults", ["nflips", "nevals", "again"])
