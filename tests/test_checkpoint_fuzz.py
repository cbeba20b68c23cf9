"""Damaged and hand-edited checkpoints of every method give a one-line CheckpointError.

Two kinds of damage: bytes changed on disk (the digest catches them), and a
file rewritten with a fresh digest around a state that is out of its schema
(wrong dtype or shape, an index out of range, a missing field or scalar, a
scalar of the wrong type) -- the schema and the trainers' invariants catch them
before any kernel runs.  A resume that is refused never writes a model.
"""

import json
import zipfile

import numpy as np
import pytest

import corrtree as ct
from corrtree.training import checkpoint as ckpt

METHODS = ["dense", "dtree", "wtree", "lazy", "kernel"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One real mid-run checkpoint per method (K = 2, so every array has some size)."""
    ds = ct.datasets.sphere(n=40, d=6, outputs=2, seed=5)
    out = {}
    for method in METHODS:
        path = tmp_path_factory.mktemp(method) / "c.npz"
        model = ct.TwoLayerReLU.init(d=6, m=600, outputs=2, seed=6)
        ct.train(
            model,
            ds.X_train,
            ds.y_train,
            method=method,
            iters=6,
            checkpoint=path,
            checkpoint_every=3,
            callback=lambda t, h: t < 4,
        )
        out[method] = path
    return ds, out


def _read(path):
    with np.load(path, allow_pickle=False) as data:
        manifest = json.loads(str(data["manifest"]))
        arrays = {k: np.array(data[k]) for k in data.files if k != "manifest"}
    return manifest, arrays


def _write(path, manifest, arrays, sign=True):
    if sign:
        manifest["digest"] = ckpt.digest_of(manifest, arrays)
    np.savez(path, manifest=np.array(json.dumps(manifest)), **arrays)


def _refused(path, ds, match=None):
    with pytest.raises(ct.CheckpointError, match=match) as info:
        ct.resume(path, ds.X_train, ds.y_train)
    assert "\n" not in str(info.value)


def _mutations(arr):
    """(name, mutated array) for one array: dtype, shape, range, NaN."""
    yield "dtype", arr.astype(np.float32 if arr.dtype != np.float32 else np.float64)
    if arr.ndim:
        yield "shorter", arr[:-1] if arr.shape[0] else np.zeros((1, *arr.shape[1:]), arr.dtype)
        yield "flat", arr.reshape(-1)[:, None] if arr.ndim == 1 else arr.reshape(-1)
    if arr.size and arr.dtype.kind in "iu":
        for bad in (10**6, -1):
            m = arr.copy()
            m.reshape(-1)[arr.size // 2] = bad
            yield f"value {bad}", m
    if arr.size and arr.dtype.kind == "f":
        m = arr.copy()
        m.reshape(-1)[arr.size // 2] = np.nan
        yield "nan", m


@pytest.mark.parametrize("method", METHODS)
def test_every_state_field_is_checked(checkpoints, tmp_path, method):
    ds, paths = checkpoints
    manifest, arrays = _read(paths[method])
    bad = tmp_path / "bad.npz"
    cases = 0
    for name, arr in arrays.items():
        for label, mutated in _mutations(arr):
            if label == "value -1" and name.endswith(("_fire", "model_a")):
                continue
            changed = {**arrays, name: mutated}
            _write(bad, json.loads(json.dumps(manifest)), changed, sign=False)
            _refused(bad, ds, "digest")  # damage on disk
            _write(bad, json.loads(json.dumps(manifest)), changed)
            try:
                _refused(bad, ds)  # a consistent file around a state out of its schema
            except BaseException as exc:
                raise AssertionError(f"{method}: {name} {label} was accepted") from exc
            cases += 2
        removed = {k: v for k, v in arrays.items() if k != name}
        _write(bad, json.loads(json.dumps(manifest)), removed)
        _refused(bad, ds)
        cases += 1
    for key in list(manifest["scalars"]):
        for value in ("text", None, -(10**9), float("nan")):
            m = json.loads(json.dumps(manifest))
            m["scalars"][key] = value
            if value is None:
                del m["scalars"][key]
            _write(bad, m, arrays)
            try:
                _refused(bad, ds)
            except BaseException as exc:
                raise AssertionError(f"{method}: scalar {key}={value!r} was accepted") from exc
            cases += 1
    for key in ("trainer", "schema", "lr", "b", "meta", "history"):
        m = json.loads(json.dumps(manifest))
        m[key] = "x" if key != "trainer" else 3
        _write(bad, m, arrays)
        _refused(bad, ds)
        cases += 1
    assert cases > 40


@pytest.mark.parametrize("method", METHODS)
def test_truncated_and_foreign_files(checkpoints, tmp_path, method):
    ds, paths = checkpoints
    data = paths[method].read_bytes()
    bad = tmp_path / "bad.npz"
    for cut in (0, 10, len(data) // 3, len(data) - 30):
        bad.write_bytes(data[:cut])
        _refused(bad, ds)
    np.savez(bad, X=np.zeros(3))
    _refused(bad, ds, "not a corrtree checkpoint")
    manifest, arrays = _read(paths[method])
    manifest["schema"] = 99
    _write(bad, manifest, arrays)
    _refused(bad, ds, "version")
    other = ct.datasets.sphere(n=40, d=6, outputs=2, seed=6)
    with pytest.raises(ct.CheckpointError, match="different training data"):
        ct.resume(paths[method], other.X_train, other.y_train)


def test_a_member_that_is_not_an_array_file(checkpoints, tmp_path):
    ds, paths = checkpoints
    bad = tmp_path / "bad.npz"
    data = paths["lazy"].read_bytes()
    bad.write_bytes(data)
    with zipfile.ZipFile(bad, "a") as z:
        z.writestr("state_extra.npy", b"not an array")
    _refused(bad, ds)


@pytest.mark.parametrize("method", METHODS)
def test_a_valid_checkpoint_still_resumes(checkpoints, method):
    ds, paths = checkpoints
    model, hist = ct.resume(paths[method], ds.X_train, ds.y_train)
    assert len(hist) == 6 and np.isfinite(model.W).all()


@pytest.mark.parametrize("method", ["lazy", "kernel"])
def test_anchored_rows_are_stored_exactly_when_float64(checkpoints, tmp_path, method):
    """float32 anchored rows are never kept, float64 ones always: a file that says
    otherwise is refused, and a float64 run resumes to the same weights."""
    ds, paths = checkpoints
    manifest, arrays = _read(paths[method])
    assert manifest["scalars"]["anchor_dtype"] == "float32"
    assert not any(k.endswith("_V") for k in arrays)
    bad = tmp_path / "bad.npz"
    m = ct.TwoLayerReLU.init(d=6, m=600, outputs=2, seed=6).m
    _write(bad, json.loads(json.dumps(manifest)), {**arrays, "state_V": np.zeros((m, 40))})
    _refused(bad, ds, "V")
    wrong = json.loads(json.dumps(manifest))
    wrong["scalars"]["anchor_dtype"] = "float64"
    _write(bad, wrong, arrays)
    _refused(bad, ds, "V")

    path = tmp_path / "f64.npz"
    whole = ct.TwoLayerReLU.init(d=6, m=600, outputs=2, seed=6)
    kw = {"method": method, "anchor_dtype": "float64", "gemm_dtype": "float64"}
    ct.train(whole, ds.X_train, ds.y_train, iters=6, **kw)
    part = ct.TwoLayerReLU.init(d=6, m=600, outputs=2, seed=6)
    ct.train(
        part,
        ds.X_train,
        ds.y_train,
        iters=6,
        checkpoint=path,
        checkpoint_every=3,
        callback=lambda t, h: t < 4,
        **kw,
    )
    assert "state_V" in _read(path)[1]
    model, _ = ct.resume(path, ds.X_train, ds.y_train)
    np.testing.assert_allclose(model.W, whole.W, rtol=1e-9, atol=1e-12)
