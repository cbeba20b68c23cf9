"""Random files and arguments for the readers and the command line (hypothesis).

Accepted outcomes only: a correct result (checked against an independent
reading of the same content), or a clean error -- ``ValueError`` from the
readers, a one-line message and exit status 1 or 2 from the CLI.  Never a
traceback, a crash, a dropped or invented row.  The CI profile runs over 2000
cases in all; ``CORRTREE_FUZZ=slow`` runs ten times more.
"""

import contextlib
import csv
import io
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corrtree import cli, datasets

SLOW = os.environ.get("CORRTREE_FUZZ") == "slow"
READER_CASES = 12000 if SLOW else 1200
CLI_CASES = 2000 if SLOW else 500
COMMON = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

CELL = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
    st.integers(-(10**6), 10**6).map(str),
    st.sampled_from(
        [
            "",
            " ",
            "cat",
            "dog",
            "true",
            "1e308",
            "-1e999",
            "0x10",
            "1,5",
            '"2"',
            "nan",
            "inf",
            "é",
            "\ufeff1",
        ]
    ),
)


@st.composite
def csv_text(draw):
    width = draw(st.integers(1, 5))
    rows = draw(st.lists(st.lists(CELL, min_size=width, max_size=width), max_size=8))
    if draw(st.booleans()):  # ragged rows
        rows = [r[: draw(st.integers(0, len(r)))] for r in rows]
    buf = io.StringIO()
    csv.writer(buf, lineterminator=draw(st.sampled_from(["\n", "\r\n"]))).writerows(rows)
    text = buf.getvalue()
    if draw(st.booleans()):
        text = "\ufeff" + text
    if draw(st.booleans()):
        text += draw(st.sampled_from(["\n", "\n\n", "1,2\n", "a,b,c\n", "\x00"]))
    return text


def _expected_rows(text: str) -> int:
    """Non-blank rows by the csv module itself (BOM removed)."""
    rows = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
    return sum(1 for r in rows if r and any(c.strip() for c in r))


@settings(COMMON, max_examples=READER_CASES)
@given(text=csv_text(), header=st.sampled_from([None, True, False]))
def test_csv_reader(tmp_path_factory, text, header):
    path = tmp_path_factory.mktemp("csv") / "d.csv"
    path.write_text(text, encoding="utf-8", newline="")
    try:
        X, y = datasets.load_file(path, header)
    except ValueError as exc:
        assert "\n" not in str(exc).strip()
        return
    rows = _expected_rows(text)
    has_header = rows - X.shape[0]
    assert has_header in (0, 1)  # every data row read, at most a header dropped
    assert header is None or has_header == int(header)
    assert np.isfinite(X).all() and y.shape[0] == X.shape[0]


@settings(COMMON, max_examples=READER_CASES // 4)
@given(
    X=st.one_of(
        st.none(),
        st.integers(0, 3).flatmap(
            lambda nd: st.lists(st.floats(width=32), min_size=0, max_size=12).map(
                lambda v: np.array(v).reshape((-1,) + (1,) * nd) if v else np.zeros((0,) * nd)
            )
        ),
    ),
    y=st.one_of(
        st.none(),
        st.lists(st.integers(-3, 3), max_size=12).map(np.array),
        st.just(np.array(1.0)),
        st.just(np.array(["a", "b"])),
    ),
)
def test_npz_reader(tmp_path_factory, X, y):
    path = tmp_path_factory.mktemp("npz") / "d.npz"
    np.savez(path, **{k: v for k, v in (("X", X), ("y", y)) if v is not None})
    try:
        Xr, yr = datasets.load_file(path)
    except ValueError as exc:
        assert "\n" not in str(exc).strip()
        return
    assert Xr.ndim == 2 and yr.shape[0] == Xr.shape[0] and np.isfinite(Xr).all()
    np.testing.assert_array_equal(Xr, np.asarray(X, dtype=np.float64))


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as exc:  # argparse: usage errors
            code = exc.code
    return code, out.getvalue(), err.getvalue()


OPTION = st.sampled_from(
    [
        ("--width", st.sampled_from(["4", "16", "0", "-3", "x", "1e3"])),
        ("--iters", st.sampled_from(["0", "1", "2", "-1", "nan"])),
        ("--lr", st.sampled_from(["auto", "0.1", "0", "-1", "nan", "inf", "1e6", "x"])),
        ("--seed", st.sampled_from(["0", "7", "-1", "2.5"])),
        ("--test-size", st.sampled_from(["0", "0.25", "1", "nan", "-0.1"])),
        ("--task", st.sampled_from(["auto", "regression", "classification", "other"])),
        ("--method", st.sampled_from(["dense", "wtree", "lazy", "kernel", "auto", "bad"])),
        ("--header", None),
        ("--no-header", None),
        ("--no-normalize", None),
    ]
)


@settings(COMMON, max_examples=CLI_CASES)
@given(text=csv_text(), options=st.lists(OPTION, max_size=4), data=st.data(), predict=st.booleans())
def test_cli_train_and_predict(tmp_path_factory, text, options, data, predict):
    folder = tmp_path_factory.mktemp("cli")
    path = folder / "d.csv"
    path.write_text(text, encoding="utf-8", newline="")
    argv = ["train", "--data", path, "--out", folder / "o", "--quiet", "--width", 8, "--iters", 2]
    for flag, values in options:
        argv += [flag] if values is None else [flag, data.draw(values)]
    code, _, err = _cli(argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    if code != 0:
        assert code in (1, 2) and lines, err
        assert (
            lines[-1].startswith(("corrtree: error:", "usage:", "corrtree train: error:"))
            or "error:" in lines[-1]
        ), err
        return
    assert (folder / "o" / "model.npz").exists()
    if predict:
        code, out, err = _cli(["predict", "--model", folder / "o" / "model.npz", "--data", path])
        assert "Traceback" not in err
        if code == 0:
            assert len(out.splitlines()) in (_expected_rows(text), _expected_rows(text) - 1)
        else:
            assert code == 1 and err.strip().startswith("corrtree: error:"), err


def test_the_fuzz_budget():
    assert READER_CASES + READER_CASES // 4 + CLI_CASES >= 2000
