"""The quick form of every experiment runs and agrees with the paper where it should."""

import json

import pytest

from corrtree import experiments


@pytest.mark.parametrize("name", sorted(experiments.EXPERIMENTS))
def test_quick_experiment_writes_its_outputs(name, tmp_path):
    result = experiments.run(name, quick=True, out_dir=str(tmp_path))
    for ext in ("json", "png", "md"):
        assert (tmp_path / f"{name}.{ext}").stat().st_size > 0
    saved = json.loads((tmp_path / f"{name}.json").read_text())
    assert saved["experiment"] == name and saved["summary"] == result["summary"]
    assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_quick_results_match_the_statements():
    init = experiments.run("sparsity_init", quick=True)
    for row in init["rows"]:
        assert row["failure_rate"] == 0
        assert abs(row["mean"] / row["expected"] - 1) < 0.1
    lb = experiments.run("lower_bound", quick=True)
    assert lb["all_correct"]
    conv = experiments.run("convergence", quick=True)
    widest = conv["runs"][-1]
    assert widest["rate_holds"] and widest["movement_within_D"]


def test_unknown_experiment():
    with pytest.raises(ValueError, match="unknown experiment"):
        experiments.run("nope")
