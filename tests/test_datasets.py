"""Data sets and data files."""

import numpy as np
import pytest

import corrtree as ct


def test_sphere():
    ds = ct.datasets.sphere(n=50, d=7, outputs=2, n_test=10, seed=3)
    assert ds.X_train.shape == (50, 7) and ds.X_test.shape == (10, 7)
    np.testing.assert_allclose(np.linalg.norm(ds.X_train, axis=1), 1.0)
    assert ds.y_train.shape == (50, 2) and np.abs(ds.y_train).max() <= 1
    np.testing.assert_array_equal(
        ds.X_train, ct.datasets.sphere(n=50, d=7, outputs=2, n_test=10, seed=3).X_train
    )
    assert ct.datasets.sphere(n=5, d=2).y_train.shape == (5,)
    with pytest.raises(ValueError, match="n must be >= 1"):
        ct.datasets.sphere(n=0)


def test_digits():
    ds = ct.datasets.digits(test_size=0.25, seed=1)
    assert ds.X_train.shape[0] + ds.X_test.shape[0] == 1797 and ds.X_train.shape[1] == 64
    assert ds.y_train.shape[1] == 10 and ds.outputs == 10 and ds.task == "multiclass"
    np.testing.assert_array_equal(ds.y_train.sum(axis=1), 1.0)
    np.testing.assert_allclose(np.linalg.norm(ds.X_test, axis=1), 1.0)
    # stratified: every class in both splits
    assert (ds.y_test.sum(axis=0) > 0).all()
    again = ct.datasets.digits(test_size=0.25, seed=1)
    np.testing.assert_array_equal(ds.X_test, again.X_test)
    assert ct.datasets.digits(test_size=0).X_train.shape == (1797, 64)
    with pytest.raises(ValueError, match="test_size must be in"):
        ct.datasets.digits(test_size=1.0)


def test_breast_cancer():
    ds = ct.datasets.breast_cancer(seed=0)
    assert ds.X_train.shape[1] == 30 and ds.task == "binary" and ds.outputs == 1
    assert set(np.unique(ds.y_train)) == {-1.0, 1.0}
    np.testing.assert_allclose(np.linalg.norm(ds.X_train, axis=1), 1.0)


def test_accuracy():
    assert ct.datasets.accuracy(np.array([1.0, -1, 1]), np.array([0.3, -2, -0.1])) == 2 / 3
    onehot = np.eye(3)
    assert ct.datasets.accuracy(onehot, onehot[[0, 2, 2]]) == 2 / 3
    with pytest.raises(ValueError, match="shape"):
        ct.datasets.accuracy(np.ones(3), np.ones(4))


def test_load_file(tmp_path):
    X = np.arange(12.0).reshape(4, 3)
    y = np.array([1.0, -1, 1, -1])
    np.savez(tmp_path / "d.npz", X=X, y=y)
    Xl, yl = ct.datasets.load_file(tmp_path / "d.npz")
    np.testing.assert_array_equal(Xl, X)
    np.testing.assert_array_equal(yl, y)
    (tmp_path / "h.csv").write_text(
        "a,b,c,label\n"
        + "\n".join(",".join(map(str, [*row, lab])) for row, lab in zip(X, y, strict=True))
    )
    Xc, yc = ct.datasets.load_file(tmp_path / "h.csv")
    np.testing.assert_array_equal(Xc, X)
    np.testing.assert_array_equal(yc, y)
    (tmp_path / "n.csv").write_text("1,2,3\n4,5,6\n")
    assert ct.datasets.load_file(tmp_path / "n.csv")[0].shape == (2, 2)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("bad.csv", "1,2\n3,x\n", "row 2 is not numeric"),
        ("ragged.csv", "1,2,3\n4,5\n", "same number"),
        ("empty.csv", "", "empty"),
        ("nan.csv", "1,nan\n2,3\n", "NaN or infinite"),
        ("data.txt", "1,2\n", "unknown format"),
        ("broken.npz", "not a zip", "cannot read data file"),
    ],
)
def test_load_file_errors(tmp_path, name, content, match):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=match):
        ct.datasets.load_file(tmp_path / name)


def test_load_file_npz_errors(tmp_path):
    np.savez(tmp_path / "x.npz", X=np.ones((3, 2)))
    with pytest.raises(ValueError, match="missing"):
        ct.datasets.load_file(tmp_path / "x.npz")
    np.savez(tmp_path / "y.npz", X=np.ones((3, 2)), y=np.ones(4))
    with pytest.raises(ValueError, match="one row per point"):
        ct.datasets.load_file(tmp_path / "y.npz")
    with pytest.raises(ValueError, match="does not exist"):
        ct.datasets.load_file(tmp_path / "none.npz")


def test_input_transform_standardizes_with_training_statistics(tmp_path):
    from corrtree.preprocessing import InputTransform, load_transform

    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 4)) * [1.0, 1e300, 3.0, 0.0] + [5.0, 0.0, -2.0, 7.0]
    t = InputTransform.fit(X)
    Z = t(X)
    np.testing.assert_allclose(np.linalg.norm(Z, axis=1), 1.0)
    raw = InputTransform.fit(X, unit_rows=False)(X)
    np.testing.assert_allclose(raw.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(raw.std(axis=0)[:3], 1.0)
    assert (raw[:, 3] == 0).all()  # a constant feature stays put
    model = ct.TwoLayerReLU.init(d=4, m=8)
    model.save(tmp_path / "m.npz", t)
    back = load_transform(tmp_path / "m.npz", 4)
    np.testing.assert_array_equal(back(X), Z)
    model.save(tmp_path / "plain.npz")
    assert load_transform(tmp_path / "plain.npz", 4) is None


def test_digits_standardized_is_less_coherent():
    plain = ct.datasets.digits(test_size=0.25, seed=0)
    std = ct.datasets.digits(test_size=0.25, seed=0, standardize=True)
    assert std.X_train.shape == plain.X_train.shape
    np.testing.assert_allclose(np.linalg.norm(std.X_test, axis=1), 1.0)

    def coherence(X):
        C = np.abs(X[:300] @ X[:300].T)
        return (C.sum() - np.trace(C)) / (300 * 299)

    assert coherence(std.X_train) < 0.5 * coherence(plain.X_train)
    np.testing.assert_array_equal(std.y_train, plain.y_train)


def test_image_patches_are_balanced_unit_rows_and_seeded():
    ds = ct.datasets.image_patches(n=64, size=8, seed=3, n_test=16)
    assert ds.X_train.shape == (64, 8 * 8 * 3) and ds.X_test.shape == (16, 192)
    assert ds.task == "binary" and set(np.unique(ds.y_train)) == {-1.0, 1.0}
    assert abs(np.sum(ds.y_train) + np.sum(ds.y_test)) <= 1  # half from each photo
    np.testing.assert_allclose(np.linalg.norm(ds.X_train, axis=1), 1.0)
    again = ct.datasets.image_patches(n=64, size=8, seed=3, n_test=16)
    np.testing.assert_array_equal(again.X_train, ds.X_train)
    other = ct.datasets.image_patches(n=64, size=8, seed=4, n_test=16)
    assert not np.array_equal(other.X_train, ds.X_train)
    with pytest.raises(ValueError, match="size must be at most"):
        ct.datasets.image_patches(n=4, size=1000)
