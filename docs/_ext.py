"""A check of corrtree's site: every name of a public ``__all__`` is in the reference.

At the end of reading the sources, each public module's ``__all__`` is compared with the
objects the Python domain documents; a name that is missing (and is not the same object
as a documented one, as ``corrtree.datasets.unit_rows`` is ``preprocessing.unit_rows``)
is a warning, so ``sphinx-build -W`` fails on it.
"""

from __future__ import annotations

import importlib

from sphinx.util import logging

#: The modules whose ``__all__`` is the public API.
PUBLIC_MODULES = (
    "corrtree",
    "corrtree.datasets",
    "corrtree.preprocessing",
    "corrtree.sklearn",
    "corrtree.distributed",
    "corrtree.experiments",
    "corrtree.theory",
    "corrtree.lowerbound",
    "corrtree.plots",
)

logger = logging.getLogger(__name__)


def _check_reference(app, env) -> None:
    domain = env.get_domain("py")
    documented = {name for name, *_ in domain.get_objects()}
    objects = {}
    for name in documented:
        module, _, attr = name.rpartition(".")
        try:
            objects[id(getattr(importlib.import_module(module), attr))] = name
        except (ImportError, AttributeError, ValueError):
            continue
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            full = f"{module_name}.{name}"
            if full in documented or id(getattr(module, name)) in objects:
                continue
            logger.warning("public name %s is not in the API reference", full)


def _skip_member(app, what, name, obj, skip, options):
    """Leave out the metadata-routing methods scikit-learn adds to every estimator
    (documented by scikit-learn, not by corrtree)."""
    if name == "get_metadata_routing" or (name.startswith("set_") and name.endswith("_request")):
        return True
    return None


def setup(app):
    app.connect("env-check-consistency", _check_reference)
    app.connect("autodoc-skip-member", _skip_member)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
