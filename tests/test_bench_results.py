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


def _recording_sleep():
    """A sleep that only records how long it was asked to sleep."""
    slept = []
    return slept, slept.append


def test_settle_waits_until_free_memory_is_steady():
    from corrtree.bench import _util

    counts = iter([1000, 40000, 90000, 90100, 90200, 150000, 150100, 150000, 150200, 150300])
    slept, sleep = _recording_sleep()
    waited = _util.settle(read=lambda: next(counts), sleep=sleep)
    # 5 s, then one-second polls: the changes of 39 000, 50 000 and 59 800 pages reset
    # the count of quiet seconds; three quiet seconds in a row end the wait
    assert slept == [_util.SETTLE_S] + [1.0] * 8
    assert waited == _util.SETTLE_S + 8


def test_settle_gives_up_and_copes_without_a_count():
    from corrtree.bench import _util

    slept, sleep = _recording_sleep()
    busy = iter(range(0, 10**9, 10**5))  # never steady
    waited = _util.settle(read=lambda: next(busy), sleep=sleep)
    assert waited == _util.SETTLE_MAX_S and sum(slept) == _util.SETTLE_MAX_S
    slept, sleep = _recording_sleep()
    assert _util.settle(read=lambda: None, sleep=sleep) == _util.SETTLE_S
    assert slept == [_util.SETTLE_S]


def test_median_run_repeats_only_short_whole_runs(monkeypatch):
    from corrtree.bench import workloads

    totals = iter([5.0, 9.0, 7.0, 100.0, 50.0])
    calls = []

    def fake(func, *args):
        calls.append(args)
        t = next(totals)
        return {"total_s": t, "wall_s": t / 10 if t == 50.0 else t, "extrapolated": t == 50.0}

    monkeypatch.setattr(workloads, "in_child", fake)
    short = workloads.median_run("kernel", 1)
    assert len(calls) == workloads.REPEATS == 3
    assert short["total_s"] == 7.0 and short["repeat_totals_s"] == [5.0, 7.0, 9.0]
    long = workloads.median_run("lazy", 2)
    assert len(calls) == 4 and long["repeat_totals_s"] == [100.0]
    extrapolated = workloads.median_run("dense", 3)  # 5 s measured, 50 s in all
    assert len(calls) == 5 and extrapolated["repeat_totals_s"] == [50.0]


def test_the_cost_model_picks_the_fastest_measured_method_on_the_workloads():
    """``method="auto"`` on the five full-size workloads picks the exact method that was
    fastest in the stored benchmark (``benchmarks/results/workloads_large.json``)."""
    import json
    import pathlib
    from types import SimpleNamespace

    from corrtree.bench.workloads import WORKLOADS, load
    from corrtree.model import default_threshold
    from corrtree.training._choice import choose_method

    stored = pathlib.Path(__file__).parents[1] / "benchmarks/results/workloads_large.json"
    results = json.loads(stored.read_text())["results"]
    for name, w in WORKLOADS.items():
        X, Y = load(w["data"], w["args"], 1.0)
        # the model's sizes and threshold are all the cost model reads (no m × d weights)
        model = SimpleNamespace(m=w["m"], b=default_threshold(w["m"]), outputs=Y.shape[1])
        chosen, costs = choose_method(X, X @ X.T, model, w["iters"])
        assert chosen == results[name]["fastest"], (name, costs)


def test_warm_kernels_loads_what_a_long_run_uses():
    """The kernel trainer's heap (a coherent run reaches it only once few neurons are
    due) and its flips by rows (many flips at once) are loaded before a timed run, in a
    fresh process, where nothing else loaded them."""
    import subprocess
    import sys

    code = (
        "import corrtree\n"
        "from corrtree.bench._util import warm_kernels\n"
        "from corrtree.training import _flips, _heap\n"
        "warm_kernels('kernel')\n"
        "for f in (_heap.push_all, _heap.pop_due, _flips._flip_sets, _flips._add_symmetric):\n"
        "    print(f.__name__, len(f.signatures))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = dict(line.split() for line in out.stdout.splitlines())
    assert loaded == {"push_all": "1", "pop_due": "1", "_flip_sets": "1", "_add_symmetric": "1"}


def test_widths_exactness_check_fails_on_a_drifted_run():
    """The width benchmark's exactness flag (first losses against dense's, final loss
    against a dense forward pass of the final weights) is false as soon as either drifts."""
    from corrtree.bench.widths import _agree

    dense = {"loss": [10.0, 8.0, 6.5]}
    kernel = {"loss": [10.0, 8.0, 6.5, 5.0], "final_loss": 1.25, "final_loss_dense": 1.25}
    assert _agree(kernel, dense)
    assert not _agree({**kernel, "loss": [10.0, 8.0, 6.5 * (1 + 1e-7)]}, dense)
    assert not _agree({**kernel, "final_loss": 1.25 * (1 + 1e-7)}, dense)
    # beyond memory, without a dense run: the final loss alone
    assert _agree({**kernel, "loss": [10.0, 8.0, 6.5 * (1 + 1e-7)]}, None)
    assert not _agree({**kernel, "final_loss": 1.25 * (1 + 1e-7)}, None)


def test_widths_dense_beyond_memory_is_the_stored_run_scaled_by_width():
    from corrtree.bench.widths import _scaled_dense

    dense = {"m": 2**18, "total_s": 300.0, "iteration_median_s": 2.5, "loss": [1.0]}
    scaled = _scaled_dense(dense, 2**20)
    assert scaled == {"total_s": 1200.0, "iteration_median_s": 10.0, "from_m": 2**18}


def test_stored_width_runs_are_exact_and_their_ratios_add_up():
    """Every stored run of ``bench_widths.py`` followed dense's trajectory (beyond memory:
    its final loss is its final weights'), its ratios are those of its own times, and a
    dense time beyond memory is a stored width's, scaled by the widths."""
    import json
    import pathlib

    stored = pathlib.Path(__file__).parents[1] / "benchmarks/results/widths_large.json"
    results = json.loads(stored.read_text())["results"]
    runs = [e for case in results.values() for e in case["runs"]]
    assert runs
    dense_at = {
        (name, e["m"]): e["dense_total_s"]
        for name, case in results.items()
        for e in case["runs"]
        if "error" not in e and not e.get("implicit")
    }
    for name, case in results.items():
        for e in case["runs"]:
            if "error" in e or not e.get("implicit"):
                continue
            # beyond memory: dense is a stored width's measured run, scaled by the widths
            ref = dense_at[name, e["dense_scaled_from_m"]]
            want = ref * e["m"] / e["dense_scaled_from_m"]
            assert abs(e["dense_total_s"] - want) < 1e-9 * want
            assert all(r["implicit"] for r in e["methods"].values())
    for e in runs:
        if "error" in e:  # a width that could not run says why
            assert e["error"] and e["m"] > 0
            continue
        k = e["methods"][e["best"]]
        assert all(k["total_s"] <= r["total_s"] for r in e["methods"].values())
        assert e["exact"]
        assert (
            abs(e["whole_over_setup"] - k["total_s"] / k["setup_s"]) < 1e-9 * e["whole_over_setup"]
        )
        assert (
            abs(e["speedup_vs_dense"] - e["dense_total_s"] / k["total_s"])
            < 1e-9 * e["speedup_vs_dense"]
        )
        assert not any(r["extrapolated"] for r in e["methods"].values())  # every iteration


def test_agreement_checks_tell_a_different_trajectory():
    from corrtree.bench import workloads

    ref = [10.0, 5.0, 2.5]
    assert workloads.same_losses({"loss": [10.0, 5.0 * (1 + 1e-12)]}, ref)
    assert not workloads.same_losses({"loss": [10.0, 5.0 * (1 + 1e-6), 2.5]}, ref)
    run = {"final_loss": 1.0, "final_loss_dense": 1.0 + 1e-13}
    assert workloads.final_consistent(run, ref[0])
    assert not workloads.final_consistent({**run, "final_loss": 1.001}, ref[0])
