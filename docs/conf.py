"""Sphinx configuration of corrtree's documentation site.

Build: ``pip install -e '.[docs]'`` then ``sphinx-build -W --keep-going -b html docs
docs/_build/html`` (what CI runs: every warning is an error).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath("."))  # the local extension _ext.py

import corrtree

project = "corrtree"
author = "The corrtree developers"
copyright = "2026, the corrtree developers"
release = corrtree.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinxarg.ext",
    "sphinx_gallery.gen_gallery",
    "_ext",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = [
    "_build",
    "_templates",
    "experiments/*.md",
    "api/generated/*.examples",
    "sg_execution_times.rst",
]
nitpicky = True
# Types that numpydoc's "Parameters" sections name in words, not as objects to link.

# numpydoc: the reference is the docstrings; a public object without one fails the build.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = {"GL08"}
numpydoc_validation_exclude = {r"\._[a-z]", r"\.__[a-z]+__$"}

autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "inherited-members": False}
autodoc_typehints = "none"  # the numpydoc sections carry the types
autodoc_member_order = "groupwise"

myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

intersphinx_mapping = {}  # no network at build time: links to other projects are written out

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "matplotlib_animations": False,
    "show_signature": False,
}

html_theme = "pydata_sphinx_theme"
html_title = f"corrtree {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
}
html_context = {"default_mode": "light"}
html_show_sourcelink = False
