"""What the benchmark suites store."""

from corrtree.bench.fast import without_sketches


def test_results_are_stored_without_weight_sketches():
    res = {
        "headline": {"kernel": {"sketch": [[1.0] * 4] * 3, "per_iter_s": 0.1}},
        "rows": [{"sketch": [2.0], "m": 8}, {"m": 16}],
        "slope": 0.5,
    }
    assert without_sketches(res) == {
        "headline": {"kernel": {"per_iter_s": 0.1}},
        "rows": [{"m": 8}, {"m": 16}],
        "slope": 0.5,
    }
