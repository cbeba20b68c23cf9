"""The documentation site's sources: every public name is in the API reference, the
citation file names this release and the paper, the gallery examples are complete."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import corrtree as ct

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _public_modules() -> tuple[str, ...]:
    """``PUBLIC_MODULES`` of ``docs/_ext.py``, the build's check (read, not imported: the
    extension imports Sphinx)."""
    tree = ast.parse((DOCS / "_ext.py").read_text())
    (value,) = (
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == "PUBLIC_MODULES"
    )
    return tuple(ast.literal_eval(value))


#: the modules whose ``__all__`` is the public API
PUBLIC = _public_modules()


def _reference() -> set[str]:
    """Full names the API pages document: autosummary entries under their
    ``currentmodule`` (or ``module``), ``data`` directives, and documented modules."""
    names: set[str] = set()
    for page in sorted((DOCS / "api").glob("*.rst")):
        module = None
        in_summary = False
        for line in page.read_text().splitlines():
            if m := re.match(r"\.\. (?:current)?module:: (\S+)", line):
                module = m.group(1)
                names.add(module)
            elif m := re.match(r"\.\. automodule:: (\S+)", line):
                names.add(m.group(1))
            elif m := re.match(r"\.\. data:: (\S+)", line):
                names.add(f"{module}.{m.group(1)}")
            elif line.startswith(".. autosummary::"):
                in_summary = True
            elif in_summary and re.match(r"   [A-Za-z_]\w*$", line):
                names.add(f"{module}.{line.strip()}")
            elif in_summary and line and not line.startswith("   "):
                in_summary = False
    return names


def _documented(full: str, reference: set[str]) -> bool:
    if full in reference:
        return True
    module, _, name = full.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    for ref in reference:  # the same object under another public name
        home, _, attr = ref.rpartition(".")
        try:
            if attr and getattr(importlib.import_module(home), attr) is obj:
                return True
        except (ImportError, AttributeError, ValueError):
            continue
    return False


@pytest.mark.parametrize("module_name", PUBLIC)
def test_every_public_name_is_in_the_reference(module_name):
    reference = _reference()
    module = importlib.import_module(module_name)
    missing = [n for n in module.__all__ if not _documented(f"{module_name}.{n}", reference)]
    assert not missing, f"{module_name}: not in docs/api: {missing}"


def test_the_reference_check_sees_a_missing_name():
    """The parse above finds names: drop one page and its names are reported missing."""
    reference = _reference()
    assert "corrtree.train" in reference and "corrtree.sklearn.CorrTreeClassifier" in reference
    without = {r for r in reference if not r.startswith("corrtree.sklearn")}
    assert not _documented("corrtree.sklearn.CorrTreeClassifier", without)


def test_every_module_with_a_public_all_is_checked():
    """Every public module of the package (no underscore in its path) whose ``__all__``
    holds a name that ``corrtree`` does not re-export is among those the reference is
    checked against."""
    import pkgutil

    found = {"corrtree"}
    for info in pkgutil.walk_packages(ct.__path__, "corrtree."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts) or parts[1] in ("bench", "training", "cli"):
            continue
        names = set(getattr(importlib.import_module(info.name), "__all__", ()))
        if names - set(ct.__all__):
            found.add(info.name)
    assert found == set(PUBLIC)


def test_citation_names_this_release_and_the_paper():
    yaml = pytest.importorskip("yaml")
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    assert cff["version"] == ct.__version__
    assert cff["license"] == "MIT"
    (paper,) = cff["references"]
    assert paper["title"].startswith("Bypass Exponential Time Preprocessing")
    assert [a["family-names"] for a in paper["authors"]] == [
        "Alman",
        "Liang",
        "Song",
        "Zhang",
        "Zhuo",
    ]


def test_gallery_examples_have_a_title_and_a_figure():
    examples = sorted((ROOT / "examples").glob("plot_*.py"))
    assert len(examples) >= 4
    for path in examples:
        source = path.read_text()
        doc = ast.get_docstring(ast.parse(source))
        assert doc and "\n===" in doc, f"{path.name}: sphinx-gallery needs a titled docstring"
        assert "plt.subplots" in source, f"{path.name} draws no figure"


def test_guides_are_in_the_toctree():
    index = (DOCS / "index.md").read_text()
    for guide in sorted((DOCS / "guides").glob("*.md")):
        assert f"guides/{guide.stem}" in index, guide.name


def _python_blocks(path: Path) -> str:
    return "\n".join(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))


@pytest.mark.parametrize(
    "guide", sorted(p.name for p in (DOCS / "guides").glob("*.md") if _python_blocks(p))
)
def test_guide_code_runs(guide, tmp_path, monkeypatch):
    """Each guide's Python blocks, in order, as a reader would paste them (the GPU guide's
    ``device="cuda"`` runs on the CPU here, as the device tests do)."""
    code = _python_blocks(DOCS / "guides" / guide).replace('device="cuda"', 'device="cpu"')
    monkeypatch.chdir(tmp_path)
    exec(compile(code, guide, "exec"), {"__name__": "__guide__"})
