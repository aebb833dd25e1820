"""The framework-free spec: initial weights, the weight file, the data order."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from kernelmap.frameworks import spec

from kernelmap.errors import KernelmapError


def test_param_count_matches_layers():
    weights = spec.init_weights(0)
    assert list(weights) == spec.weight_names()
    assert sum(w.size for w in weights.values()) == spec.PARAM_COUNT == 421_642


def test_init_weights_deterministic_and_kaiming_uniform_bounds():
    a, b, c = spec.init_weights(0), spec.init_weights(0), spec.init_weights(1)
    for name, shape in spec.weight_shapes().items():
        assert a[name].shape == shape and a[name].dtype == np.float32
        np.testing.assert_array_equal(a[name], b[name])
        assert not np.array_equal(a[name], c[name])
    for layer in spec.LAYERS:
        bound = 1 / np.sqrt(np.prod(layer.weight_shape[1:]))
        w = a[f"{layer.name}.weight"]
        assert np.abs(w).max() <= bound
        if w.size > 1000:  # uniform over the whole interval, not a narrower one
            assert np.abs(w).max() > 0.95 * bound
            assert abs(float(w.std()) - bound / np.sqrt(3)) < 0.05 * bound


def test_weight_file_round_trip(tmp_path):
    path = tmp_path / "w.npz"
    weights = spec.init_weights(3)
    spec.save_weights(path, weights)
    loaded = spec.load_weights(path)
    assert list(loaded) == spec.weight_names()
    for name in weights:
        np.testing.assert_array_equal(loaded[name], weights[name])
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda w: w.pop("fc2.bias"), "missing \\['fc2.bias'\\]"),
        (lambda w: w.update(extra=np.zeros(1, np.float32)), "unexpected \\['extra'\\]"),
        (lambda w: w.update({"conv1.weight": np.zeros((32, 1, 3, 4), np.float32)}), "conv1.weight has shape"),
        (lambda w: w.update({"fc1.bias": w["fc1.bias"].astype(np.float64)}), "fc1.bias has dtype float64"),
        (lambda w: w["fc2.weight"].__setitem__((0, 0), np.nan), "non-finite"),
    ],
)
def test_load_weights_rejects_bad_file(tmp_path, damage, message):
    weights = spec.init_weights(0)
    damage(weights)
    path = tmp_path / "bad.npz"
    np.savez(path, **weights)
    with pytest.raises(KernelmapError, match=message) as info:
        spec.load_weights(path)
    assert str(path) in str(info.value)


def test_load_weights_rejects_missing_and_garbage(tmp_path):
    with pytest.raises(KernelmapError, match="not found"):
        spec.load_weights(tmp_path / "nope.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a zip file")
    with pytest.raises(KernelmapError, match=str(garbage)):
        spec.load_weights(garbage)


def test_save_weights_refuses_bad_weights(tmp_path):
    weights = spec.init_weights(0)
    weights["conv1.bias"] = weights["conv1.bias"][:3]
    with pytest.raises(KernelmapError, match="conv1.bias"):
        spec.save_weights(tmp_path / "w.npz", weights)
    assert not (tmp_path / "w.npz").exists()


def test_sample_order():
    a = spec.sample_order(100, seed=0, epoch=0)
    assert sorted(a.tolist()) == list(range(100))
    np.testing.assert_array_equal(a, spec.sample_order(100, seed=0, epoch=0))
    assert not np.array_equal(a, spec.sample_order(100, seed=0, epoch=1))
    assert not np.array_equal(a, spec.sample_order(100, seed=1, epoch=0))


def test_training_order_runs_into_later_epochs():
    order = spec.training_order(30, seed=2, n_samples=70)
    assert len(order) == 70
    np.testing.assert_array_equal(order[:30], spec.sample_order(30, 2, 0))
    np.testing.assert_array_equal(order[30:60], spec.sample_order(30, 2, 1))
    np.testing.assert_array_equal(order[60:], spec.sample_order(30, 2, 2)[:10])
    with pytest.raises(KernelmapError):
        spec.training_order(0, 0, 10)


def test_framework_free_modules_import_no_framework():
    code = (
        "import sys, kernelmap.frameworks.spec, kernelmap.frameworks.data, kernelmap.parity, "
        "kernelmap.frameworks.mxnet.cuda11\n"
        "bad = [m for m in ('torch', 'mxnet', 'torchvision') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
