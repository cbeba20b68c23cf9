"""The README's examples run as written, and its test command is the one CI runs."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(lang: str, marker: str) -> list[str]:
    """Code blocks of ``lang`` preceded by the HTML comment ``marker``."""
    pattern = re.compile(rf"<!-- {marker} -->\s*```{lang}\n(.*?)```", re.S)
    return pattern.findall(README)


def test_quickstart_has_exactly_two_commands_and_ci_runs_the_second():
    quick = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", quick, re.S)
    assert len(commands) == 2
    assert all(len(c.strip().splitlines()) == 1 for c in commands)
    assert "corrtree demo" in commands[0]
    assert "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in ci  # .ci/run executes the block after this marker
    assert _blocks("bash", "test-command") == [commands[1]]


@pytest.mark.parametrize("code", _blocks("python", "example"))
def test_python_examples(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})


@pytest.mark.parametrize("script", _blocks("bash", "cli-example"))
def test_cli_examples(script, tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 5))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    np.savetxt(
        tmp_path / "my_data.csv",
        np.column_stack([X, y]),
        delimiter=",",
        header="f1,f2,f3,f4,f5,label",
        comments="",
    )
    np.savetxt(tmp_path / "new_points.csv", X[:7], delimiter=",")
    bindir = str(Path(sys.executable).parent)
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_examples_exist():
    assert len(_blocks("python", "example")) >= 3
    assert len(_blocks("bash", "cli-example")) >= 1


def test_readme_is_for_users():
    """At most 300 lines, no commit hashes or history, and its results tables and
    ``benchmarks/README.md`` are what ``benchmarks/tables.py`` makes of the JSON."""
    import importlib.util

    assert len(README.splitlines()) <= 300
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\b(at|since) [0-9a-f]{7,40}\b", text), path
        assert "since the run before" not in text.lower(), path
    spec = importlib.util.spec_from_file_location("tables", ROOT / "benchmarks" / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    results = str(ROOT / "benchmarks" / "results")
    assert tables.with_results(README, tables.results_table(results, "large")) == README
    wide = tables.wide_table(results, "large")
    assert "No results" not in wide
    assert tables.with_results(README, wide, tables.WIDE_BEGIN, tables.WIDE_END) == README
    gpu = tables.gpu_table(results, "large")
    assert tables.with_results(README, gpu, tables.GPU_BEGIN, tables.GPU_END) == README
    bench = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert bench == tables.benchmarks_readme(results, "large")
