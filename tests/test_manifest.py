"""manifest.json: required keys, framework entries, the git commit of the checkout."""

from __future__ import annotations

import json
import subprocess

import pytest

from kernelmap import gpuinfo, manifest


def _build(frameworks):
    gpus = gpuinfo.GpuReport((gpuinfo.Gpu(0, "NVIDIA H100", "9.0", "570.1", 81559, "nvidia-smi"),), "nvidia-smi",
                             None, "12.8")
    return manifest.build(config={"train": {"steps": 3}}, gpus=gpus, frameworks=frameworks,
                          data={"kind": "synthetic", "sha256": {"a": "b"}})


def test_manifest_keys_and_values():
    fw = {"mxnet": {"device_requested": "auto", "device": "cpu", "device_note": "sm_90: no code",
                    "versions": {"framework": "mxnet", "version": "1.9.1"}}}
    man = _build(fw)
    assert set(manifest.REQUIRED_KEYS) <= set(man)
    assert man["gpu"] == {"name": "NVIDIA H100", "compute_capability": "9.0", "memory_mib": 81559, "count": 1}
    assert man["driver"] == "570.1" and man["cuda_driver_version"] == "12.8"
    assert man["frameworks"]["mxnet"]["device_note"] == "sm_90: no code"
    json.dumps(man)  # JSON-able


def test_manifest_refuses_incomplete_framework_entry():
    with pytest.raises(ValueError, match="device_note"):
        _build({"pytorch": {"device_requested": "cpu", "device": "cpu", "versions": {}}})


def test_git_commit(tmp_path):
    here = manifest.git_commit()
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=manifest.Path(manifest.__file__).parent.parent)
    if head.returncode == 0:
        assert here["commit"] == head.stdout.strip() and here["dirty"] in (True, False)
    assert manifest.git_commit(tmp_path) is None  # not a checkout
