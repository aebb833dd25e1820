"""Data resolution, IDX checks and the per-framework layout; both loaders read the same samples."""

from __future__ import annotations

import gzip
import hashlib
import struct

import numpy as np
import pytest
from conftest import write_idx
from kernelmap.frameworks import data, spec

from kernelmap.errors import KernelmapError


def cfg(**kw) -> spec.TrainConfig:
    return spec.TrainConfig(**kw)


@pytest.mark.parametrize("fixture", ["idx_dir_gz", "idx_dir_raw"])
def test_resolve_idx_directory(request, fixture, small_idx_arrays):
    directory = request.getfixturevalue(fixture)
    info = data.resolve_data(cfg(data=str(directory)))
    assert info.kind == "idx" and info.path == str(directory.resolve())
    assert (info.n_train, info.n_test) == (96, 40)
    assert set(info.files) == set(data.FILES)
    for name, digest in info.sha256.items():
        assert digest == hashlib.sha256((directory / name).read_bytes()).hexdigest()
    mnist = data.resolve_data(cfg(data="mnist", data_dir=str(directory)))
    assert mnist.kind == "mnist" and mnist.sha256 == info.sha256


def test_missing_data_names_path_and_fix(tmp_path):
    with pytest.raises(KernelmapError) as info:
        data.resolve_data(cfg(data="fashion-mnist", data_dir=str(tmp_path / "absent")))
    text = str(info.value)
    assert str(tmp_path / "absent") in text
    assert "apt-get install dataset-fashion-mnist" in text and "--data synthetic" in text
    with pytest.raises(KernelmapError, match="--data-dir"):
        data.resolve_data(cfg(data="mnist"))


def test_missing_file_and_bad_files(tmp_path, small_idx_arrays):
    images, labels = small_idx_arrays["train"]
    write_idx(tmp_path, "train", images, labels, gz=True)
    with pytest.raises(KernelmapError, match="t10k-images-idx3-ubyte"):
        data.resolve_data(cfg(data=str(tmp_path)))
    write_idx(tmp_path, "test", images[:5], labels[:4], gz=False)  # counts disagree
    with pytest.raises(KernelmapError, match="5 images but .* 4 labels"):
        data.resolve_data(cfg(data=str(tmp_path)))
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 1234, 4, 28, 28))
    with pytest.raises(KernelmapError, match="magic 1234"):
        data.resolve_data(cfg(data=str(tmp_path)))


def test_synthetic_is_explicit_and_deterministic():
    info = data.resolve_data(cfg(data="synthetic", seed=5))
    assert info.synthetic and info.path is None and (info.n_train, info.n_test) == data.SYNTHETIC_SIZES
    assert info == data.resolve_data(cfg(data="synthetic", seed=5))
    assert info.sha256 != data.resolve_data(cfg(data="synthetic", seed=6)).sha256
    images, labels = data.synthetic_arrays(5, "test")
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8 and labels.max() == 9
    assert hashlib.sha256(images.tobytes()).hexdigest() == info.sha256["test-images"]


@pytest.mark.parametrize("fixture", ["idx_dir_gz", "idx_dir_raw"])
def test_prepare_dir_layout(request, fixture, tmp_path):
    directory = request.getfixturevalue(fixture)
    info = data.resolve_data(cfg(data=str(directory)))
    prepared = data.prepare_dir(info, tmp_path)
    again = data.prepare_dir(info, tmp_path)
    assert again == prepared
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    raw = prepared.torchvision_root / "MNIST" / "raw"
    for base, name in info.files.items():
        source = (directory / name).read_bytes()
        original = gzip.decompress(source) if name.endswith(".gz") else source
        assert (raw / base).read_bytes() == original
        assert gzip.decompress((prepared.gluon_root / f"{base}.gz").read_bytes()) == original


def test_prepare_dir_refuses_synthetic(tmp_path):
    with pytest.raises(KernelmapError):
        data.prepare_dir(data.resolve_data(cfg(data="synthetic")), tmp_path)


def _expected_first(images: np.ndarray, order: list[int], n: int) -> np.ndarray:
    x = images[order[:n]].astype(np.float32) / np.float32(255)
    return (x - np.float32(spec.PIXEL_MEAN)) / np.float32(spec.PIXEL_STD)


@pytest.mark.parametrize("case", ["gz", "raw"])
@pytest.mark.parametrize("fw", ["pytorch", pytest.param("mxnet", marks=pytest.mark.mxnet)])
def test_framework_loader_reads_idx_in_order(framework_report, case, fw, small_idx_arrays):
    out = framework_report(fw)["loaders"][case]
    images, labels = small_idx_arrays["train"]
    assert out["order"] == spec.sample_order(96, 0, 0).tolist()
    assert out["labels"] == labels[out["order"]].tolist()
    assert out["first_shape"] == [32, 1, 28, 28]
    expected = _expected_first(images, out["order"], 32)
    assert out["first_sum"] == pytest.approx(float(expected.astype(np.float64).sum()), rel=1e-5)
    assert out["first_pixel"] == pytest.approx(float(expected[0, 0, 0]), abs=1e-6)
    assert out["n_test"] == 40


@pytest.mark.mxnet
def test_gluon_loader_never_downloads(framework_report):
    """Our offline dataset loaded the files above with the network blocked; stock gluon MNIST,
    given the same files, rejects their SHA1 and tries to download (the control)."""
    stock = framework_report("mxnet")["stock_gluon"]
    assert stock != "loaded"
    assert "network access attempted" in stock or "amazonaws" in stock


@pytest.mark.mxnet
def test_loaders_agree_on_fashion_mnist(framework_report):
    """The installed Fashion-MNIST (if any): both loaders yield the same labels in the same order."""
    if framework_report.fashion is None:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    pt, mx = (framework_report(fw)["loaders"]["fashion"] for fw in ("pytorch", "mxnet"))
    assert len(pt["labels"]) == 3000 and pt["first_shape"] == [1000, 1, 28, 28]
    assert pt["labels"] == mx["labels"]
    assert pt["first_sum"] == pytest.approx(mx["first_sum"], rel=1e-6)
    assert pt["n_test"] == mx["n_test"] == framework_report.fashion.n_test
