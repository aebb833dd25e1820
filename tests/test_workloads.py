"""Each framework's Workload, exercised in its own subprocess (torch and mxnet never share one)."""

from __future__ import annotations

import pytest
from kernelmap.frameworks import spec
from kernelmap.frameworks.mxnet import cuda11


@pytest.fixture
def workload_output(framework_report):
    return lambda fw: framework_report(fw)["workload"]


FRAMEWORKS = ["pytorch", pytest.param("mxnet", marks=pytest.mark.mxnet)]


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_workload_model_and_weights(workload_output, fw):
    out = workload_output(fw)
    assert out["param_count"] == spec.PARAM_COUNT == 421_642
    assert out["round_trip_exact"] is True
    assert out["logits_shape"] == [5, spec.NUM_CLASSES]


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_workload_regions_in_profiler_trace(workload_output, fw):
    assert workload_output(fw)["regions"] == [
        "kernelmap:backward",
        "kernelmap:forward",
        "kernelmap:optimizer",
    ]


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_workload_versions(workload_output, fw):
    out = workload_output(fw)
    v = out["versions"]
    assert v["framework"] == fw and v["version"] == out["module_version"]
    for key in ("cuda", "cudnn", "cublas"):
        assert key in v
    if fw == "mxnet":  # CPU wheel here: no CUDA 11 libraries, so nothing is claimed
        assert v["cuda_enabled"] or v["cuda"] is None


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_workload_trains_and_evaluates(workload_output, fw):
    out = workload_output(fw)
    losses = out["losses"]
    assert len(losses) == 15
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert 0.5 < out["accuracy"] <= 1.0  # 40 test images of a learnable pattern; chance is 0.1


@pytest.mark.mxnet
def test_gluon_hybridized_matches_imperative(workload_output):
    out = workload_output("mxnet")
    assert out["hybrid_losses"] == pytest.approx(out["losses"][:5], rel=1e-5)


@pytest.mark.mxnet
def test_frameworks_train_alike(workload_output):
    pt, mx = workload_output("pytorch"), workload_output("mxnet")
    assert pt["losses"] == pytest.approx(mx["losses"], rel=1e-4)
    assert pt["accuracy"] == mx["accuracy"]


# --- MXNet GPU install story: pure logic, no mxnet and no GPU needed -------------------------


@pytest.mark.parametrize(
    "cc, ok, via",
    [
        ((5, 0), True, "sm_50"),
        ((6, 1), True, "sm_60"),
        ((7, 0), True, "sm_70"),
        ((7, 5), True, "sm_70"),
        ((8, 0), True, "sm_80"),
        ((8, 6), True, "sm_86"),
        ((8, 9), True, "sm_86"),
        ((9, 0), False, None),
        ((10, 0), False, None),
        ((12, 0), False, None),
        ((3, 7), False, None),
    ],
)
def test_gpu_verdict(cc, ok, via):
    verdict, message = cuda11.gpu_verdict(cc)
    assert verdict is ok
    assert f"sm_{cc[0]}{cc[1]}" in message
    if ok:
        assert via in message
    else:
        assert "no PTX" in message and "sm_86" in message


def fake_nvidia_tree(root, skip=()):
    for component, soname in cuda11.LIBRARIES:
        if soname in skip:
            continue
        lib = root / "nvidia" / component / "lib"
        lib.mkdir(parents=True, exist_ok=True)
        (lib / soname).write_bytes(b"")
    return root / "nvidia"


def test_plan_orders_libraries_and_reports_missing(tmp_path):
    nvidia = fake_nvidia_tree(tmp_path, skip={"libcufft.so.10"})
    files, missing, dirs = cuda11.plan([nvidia], owned=lambda component, path: True)
    assert [f.name for f in files] == [s for _, s in cuda11.LIBRARIES if s != "libcufft.so.10"]
    assert missing == ["libcufft.so.10"]
    assert dirs["cudnn"] == nvidia / "cudnn" / "lib"
    names = [f.name for f in files]
    assert (
        names.index("libcudart.so.11.0") < names.index("libcublasLt.so.11") < names.index("libcublas.so.11")
    )
    assert names.index("libcudnn_ops_infer.so.8") < names.index("libcudnn.so.8")


def test_plan_skips_files_of_other_cuda_wheels(tmp_path):
    """torch's nvidia-nccl-cu13 installs nvidia/nccl/lib/libnccl.so.2 too; it must not be loaded."""
    nvidia = fake_nvidia_tree(tmp_path)
    files, missing, _ = cuda11.plan([nvidia], owned=lambda component, path: component != "nccl")
    assert "libnccl.so.2" in missing and "libnccl.so.2" not in [f.name for f in files]
    files, missing, _ = cuda11.plan([nvidia], owned=lambda component, path: component != "cuda_runtime")
    assert files == []  # no CUDA 11 runtime: nothing at all is preloaded


def test_preload_is_a_clear_noop_without_cuda11_runtime(tmp_path):
    nvidia = fake_nvidia_tree(tmp_path, skip={"libcudart.so.11.0"})
    result = cuda11.preload([nvidia], owned=lambda component, path: True)
    assert not result.active and result.loaded == {}
    assert "nothing preloaded" in result.describe()
    assert not cuda11.preload([tmp_path / "absent"]).active


def test_preload_loads_real_files_only(tmp_path):
    nvidia = fake_nvidia_tree(tmp_path)
    with pytest.raises(OSError):  # empty files are not libraries: a broken install is loud
        cuda11.preload([nvidia], owned=lambda component, path: True)


def test_nvidia_namespace_found_through_importlib(tmp_path, monkeypatch):
    nvidia = fake_nvidia_tree(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert nvidia.resolve() in [p.resolve() for p in cuda11.nvidia_roots()]
    assert cuda11.find_lib_dirs()["cuda_runtime"].resolve() == (nvidia / "cuda_runtime" / "lib").resolve()


def test_preload_here_loads_nothing_foreign():
    """This environment: whatever nvidia wheels torch brought, no CUDA 11 runtime wheel means no preload."""
    from importlib import metadata

    try:
        metadata.distribution("nvidia-cuda-runtime-cu11")
    except metadata.PackageNotFoundError:
        files, _, _ = cuda11.plan()
        assert files == []
    else:
        pytest.skip("nvidia-cuda-runtime-cu11 is installed here")
