"""Every option of `kernelmap run` runs or is refused before any work (kernelmap/options.py); the partial-batch
rule every framework and mode trains by (spec.training_batches); the CPU combinations of modes, batch sizes, steps
within and beyond an epoch and --epochs, each framework in its own worker process."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import SMALL_SIZES, fake_nvidia_smi, require_framework
from kernelmap.frameworks import spec

from kernelmap import frameworks, options, worker
from kernelmap.errors import KernelmapError

GIB = options.GIB
MIB = options.MIB


# --- the partial-batch rule -------------------------------------------------------------------------
def test_every_batch_is_full_and_each_epochs_rest_is_dropped():
    """10 samples, batches of 4: each epoch's order cut into 2 batches, its last 2 samples dropped, then the next
    epoch's order; the rows are exactly those slices of spec.sample_order."""
    rows = spec.training_batches(10, seed=3, batch_size=4, n_batches=5)
    assert rows.shape == (5, 4) and rows.dtype == np.int64
    e0, e1, e2 = (spec.sample_order(10, 3, e) for e in range(3))
    np.testing.assert_array_equal(rows, np.stack([e0[0:4], e0[4:8], e1[0:4], e1[4:8], e2[0:4]]))
    assert set(rows[:2].ravel()).isdisjoint(e0[8:])  # epoch 0's dropped samples are not trained in epoch 0


def test_the_h100_case_a_batch_of_1024_drops_608_images_an_epoch():
    plan = spec.epoch_plan(60_000, 1024)
    assert plan == {"batch_size": 1024, "steps_per_epoch": 58, "images_per_epoch": 59_392,
                    "dropped_per_epoch": 608, "train_images": 60_000}
    rows = spec.training_batches(60_000, 0, 1024, 70)  # the crash: step 59 was the 608-image batch
    assert rows.shape == (70, 1024)
    np.testing.assert_array_equal(rows[58], spec.sample_order(60_000, 0, 1)[:1024])


@pytest.mark.parametrize("bs", [0, 97])
def test_no_full_batch_is_refused(bs):
    with pytest.raises(KernelmapError, match=f"batch size {bs}: an epoch of 96 training images holds no full batch"):
        spec.training_batches(96, 0, bs, 1)


class Recorder:
    """A framework-free workload that records the size of every batch the worker trains on."""

    def __init__(self, n_train: int, batch_size: int):
        self.config = spec.TrainConfig(batch_size=batch_size)
        self.data_info = SimpleNamespace(n_train=n_train)
        self.sizes: list[int] = []
        self.samples: list[np.ndarray] = []

    def batches(self, split, batch_size, order):
        for start in range(0, len(order), batch_size):
            yield order[start : start + batch_size], None

    def region(self, name):
        return contextlib.nullcontext()

    def train_step(self, images, labels):
        self.sizes.append(len(images))
        self.samples.append(images)
        return 0.0

    def synchronize(self):
        pass

    def to_float(self, value):
        return float(value)

    def threads(self):
        return {}


def _pass(wl, tmp_path, **kw):
    return worker.run_pass(wl, framework="fake", pass_name="clean", out_dir=tmp_path, progress=False, **kw)


def test_the_worker_trains_full_batches_across_epochs(tmp_path):
    """Steps past an epoch and --epochs: every step gets the batch size (a graph's static buffers, a jit's one
    shape); --epochs 3 of 10 samples at 4 is 6 steps, 1 of them warm-up."""
    wl = Recorder(10, 4)
    result = _pass(wl, tmp_path, steps=None, epochs=3, warmup=1)
    assert wl.sizes == [4] * 6 and result["steps"] == 5 and result["warmup_steps"] == 1
    np.testing.assert_array_equal(np.concatenate(wl.samples), spec.training_batches(10, 0, 4, 6).ravel())
    wl = Recorder(10, 4)
    assert _pass(wl, tmp_path, steps=7, epochs=None, warmup=2)["steps"] == 7 and wl.sizes == [4] * 9


def test_the_worker_refuses_epochs_that_leave_nothing_to_time(tmp_path):
    with pytest.raises(KernelmapError, match="2 steps of 4 images, no more than the 2 warm-up steps"):
        _pass(Recorder(10, 4), tmp_path, steps=None, epochs=1, warmup=2)


# --- validate: pure ------------------------------------------------------------------------------------
def _args(**kw) -> argparse.Namespace:
    d = dict(framework="all", batch_size=[64], steps=100, epochs=None, warmup=5, trials=3, threads=None,
             max_repeats=2, repeat_budget=None, seed=0, lr=0.01, mode=None)
    return argparse.Namespace(**{**d, **kw})


HOST = options.Memory("cpu", "host RAM (MemAvailable)", 20 * GIB)


@pytest.mark.parametrize("kw, line", [
    ({"batch_size": [64, 0]}, "--batch-size 0: must be at least 1"),
    ({"steps": 0}, "--steps 0: must be at least 1"),
    ({"epochs": 0}, "--epochs 0: must be at least 1"),
    ({"warmup": -1}, "--warmup -1: must be at least 0"),
    ({"trials": 0}, "--trials 0: must be at least 1"),
    ({"threads": 0}, "--threads 0: must be at least 1"),
    ({"max_repeats": -1}, "--max-repeats -1: must be at least 0"),
    ({"repeat_budget": -0.5}, "--repeat-budget -0.5: must be at least 0"),
    ({"repeat_budget": float("nan")}, "--repeat-budget nan: must be at least 0"),
    ({"seed": -1}, "--seed -1: must be at least 0"),  # numpy's default_rng raised, a traceback
    ({"lr": -0.01}, "--lr -0.01: must be a finite number above 0"),  # torch.optim.SGD raised in the worker
    ({"lr": float("nan")}, "--lr nan: must be a finite number above 0"),  # the loss was nan after the run
    ({"lr": 0.0}, "--lr 0: must be a finite number above 0"),
])
def test_a_count_below_its_least_is_refused_by_name(kw, line):
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(**kw), 60_000, "synthetic", HOST)
    assert str(exc.value) == line


def test_a_mode_no_chosen_framework_has_and_a_batch_size_given_twice_are_refused():
    """--framework pytorch --mode hybridized ran PyTorch's eager mode without a word."""
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(framework="pytorch", mode=["eager", "hybridized"]), 60_000, "synthetic", None)
    assert str(exc.value) == ("--mode hybridized: not a mode of --framework pytorch (PyTorch: eager, cuda-graph, "
                              "compile, compile-graphs)")
    for fw, mode in (("all", ["hybridized"]), ("mxnet", ["all"]), ("pytorch", None)):  # all: one framework has it
        options.validate(_args(framework=fw, mode=mode), 60_000, "synthetic", None)
    with pytest.raises(KernelmapError, match="^--batch-size 64 1024 64: 64 given twice$"):
        options.validate(_args(batch_size=[64, 1024, 64]), 60_000, "synthetic", None)


def test_a_batch_larger_than_the_training_set_is_refused():
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(framework="pytorch", batch_size=[64, 97]), 96, "idx", HOST)
    assert str(exc.value) == ("--batch-size 97: larger than the 96 training images of the idx data (every step "
                              "trains on a full batch; each epoch's last partial batch is dropped)")


def test_a_batch_that_does_not_fit_names_the_batch_the_need_and_what_was_free():
    """The estimate: the forward's values per image x the framework's factor x 4 bytes, plus the fixed part;
    PyTorch's factor 1, MXNet's 2, JAX's 3.5 (their descriptors)."""
    per_image = spec.activation_floats_per_image() * 4
    assert spec.activation_floats_per_image() == 104_548  # 784 + 2*25088 + 3*6272 + 2*12544 + 3*3136 + 256 + 20
    bs = 30_000
    need = {fw: options.FIXED_BYTES["cpu"] + per_image * f * bs for fw, f in (("mxnet", 2), ("jax", 3.5))}
    assert options.estimate_bytes("pytorch", bs, "cpu") == int(options.FIXED_BYTES["cpu"] + per_image * bs)
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(batch_size=[bs]), 60_000, "synthetic", HOST)
    fit = {fw: int((20 * GIB - 2 * GIB) // (per_image * f)) for fw, f in (("mxnet", 2), ("jax", 3.5))}
    assert str(exc.value) == (
        f"--batch-size 30000: a training step needs about {need['mxnet'] / GIB:.1f} GiB in MXNet (0.80 MiB an image, "
        f"at most {fit['mxnet']:,} images fit), {need['jax'] / GIB:.1f} GiB in JAX (1.40 MiB an image, at most "
        f"{fit['jax']:,} images fit), estimated with 2.0 GiB fixed, and host RAM (MemAvailable) had 20.0 GiB free "
        "(PyTorch would fit)")
    options.validate(_args(framework="pytorch", batch_size=[bs]), 60_000, "synthetic", HOST)  # PyTorch alone fits


def test_too_large_for_both_memory_and_data_says_both():
    gpu = options.Memory("gpu", "GPU 0 (NVIDIA H100 80GB HBM3, nvidia-smi memory.free)", 79 * GIB)
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(framework="pytorch", batch_size=[400_000]), 60_000, "fashion-mnist", gpu)
    msg = str(exc.value)
    # 1 GiB fixed + 400,000 x 104,548 x 4 bytes = 156.8 GiB; (79 - 1) GiB / 418,192 bytes = 200,271 images
    assert msg.startswith("--batch-size 400000: a training step needs about 156.8 GiB in PyTorch (0.40 MiB an image, "
                          "at most 200,271 images fit)")
    assert "GPU 0 (NVIDIA H100 80GB HBM3, nvidia-smi memory.free) had 79.0 GiB free; and larger than the 60,000 " \
           "training images of the fashion-mnist data" in msg and "\n" not in msg


def test_epochs_that_leave_only_warmup_are_refused_and_the_plan_is_returned():
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(epochs=1, batch_size=[16, 20_000]), 60_000, "synthetic", None)
    assert str(exc.value) == ("--epochs 1 at --batch-size 20000: 3 steps (full batches of the 60,000 training "
                              "images), no more than the 5 warm-up steps (--warmup): nothing would be timed; give "
                              "more epochs, a smaller batch or fewer warm-up steps")
    plan = options.validate(_args(epochs=1, batch_size=[1024, 1000]), 60_000, "synthetic", None)
    assert plan["partial_batch"] == spec.PARTIAL_BATCH_RULE == "dropped" and plan["memory"] is None
    assert [(p["batch_size"], p["steps_per_epoch"], p["dropped_per_epoch"]) for p in plan["per_batch_size"]] == \
        [(1024, 58, 608), (1000, 60, 0)]


def test_free_memory_readings(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20971520 kB\n")
    assert options.host_available(str(meminfo)) == options.Memory("cpu", "host RAM (MemAvailable)", 20 * GIB,
                                                                   24000000 * 1024)
    assert options.host_available(str(tmp_path / "none")) is None
    smi = "0, GPU-aaa, NVIDIA H100 80GB HBM3, 81000\n1, GPU-bbb, NVIDIA H100 80GB HBM3, 1024\n"
    first = options.parse_smi_free(smi, None)
    assert first.free_bytes == 81000 << 20 and first.where == "GPU 0 (NVIDIA H100 80GB HBM3, nvidia-smi memory.free)"
    assert options.parse_smi_free(smi, "1,0").free_bytes == 1024 << 20  # CUDA_VISIBLE_DEVICES: the first listed
    assert options.parse_smi_free(smi, "GPU-bbb").free_bytes == 1024 << 20
    assert options.parse_smi_free(smi, "7") is None and options.parse_smi_free("", None) is None
    assert first.capacity_bytes is None and first.holders == ()  # no memory.used column: capacity not read


def test_a_gpu_memory_refusal_names_its_capacity_and_who_holds_it(tmp_path, monkeypatch):
    """nvidia-smi (fake: session 10's GPU 1, 0.5 GiB free of 139.8, two processes holding it): the refusal of a batch
    that fits the GPU names what was free of its capacity, the processes that hold the rest and that it would fit."""
    smi = str(fake_nvidia_smi(tmp_path) / "nvidia-smi")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    held = options.gpu_free(smi)
    assert held == options.Memory("gpu", "GPU 1 (NVIDIA H200, nvidia-smi memory.free)", 558 * MIB,
                                  (558 + 142598) * MIB, (options.Holder(8715, "python3.12", 107520 * MIB),
                                                         options.Holder(8790, "pt_main_thread", 35078 * MIB)))
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(framework="mxnet", batch_size=[64]), 60_000, "synthetic", held)
    assert str(exc.value) == (
        "--batch-size 64: a training step needs about 1.0 GiB in MXNet (0.80 MiB an image, at most 0 images fit), "
        "estimated with 1.0 GiB fixed, and GPU 1 (NVIDIA H200, nvidia-smi memory.free) had 0.5 GiB free of 139.8 GiB "
        "(pid 8715 python3.12 holds 105.0 GiB, pid 8790 pt_main_thread holds 34.3 GiB); it would fit GPU 1's 139.8 "
        "GiB were other processes not holding it")
    # a batch the GPU cannot hold whoever holds it: no "would fit"
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(framework="mxnet", batch_size=[200_000]), 300_000, "synthetic", held)
    assert "had 0.5 GiB free of 139.8 GiB (pid 8715" in str(exc.value) and "would fit" not in str(exc.value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa")
    idle = options.gpu_free(smi)
    assert (idle.free_bytes, idle.capacity_bytes, idle.holders) == (143156 * MIB, 143156 * MIB, ())
    options.validate(_args(framework="mxnet", batch_size=[64]), 60_000, "synthetic", idle)
    assert options.gpu_free(str(tmp_path / "none")) is None


def test_smi_holders_of_one_gpu_largest_first():
    apps = ("GPU-b, 12, small, 10\nGPU-a, 13, other gpu, 900\nGPU-b, 14, python, my, job, 300\n"
            "GPU-b, 15, no reading, [N/A]\nGPU-b, 16, big, 2048\n")
    assert options.parse_smi_holders(apps, "GPU-b") == (
        options.Holder(16, "big", 2048 * MIB), options.Holder(14, "python, my, job", 300 * MIB),
        options.Holder(12, "small", 10 * MIB))
    four = options.Memory("gpu", "GPU 1 (x, nvidia-smi memory.free)", 0, None,
                          tuple(options.Holder(i, "p", GIB) for i in range(4)))
    assert options.holders_said(four) == (" (pid 0 p holds 1.0 GiB, pid 1 p holds 1.0 GiB, pid 2 p holds 1.0 GiB "
                                          "and 1 more process)")


def test_a_device_of_a_multi_gpu_case_without_memory_is_refused_before_any_work(tmp_path, monkeypatch):
    """The 2x H200 (fake nvidia-smi: session 10's GPU 1, 0.5 GiB free): ``--devices 1 2`` checked GPU 0 alone, and
    each x2 case failed minutes in, its own way (PyTorch rank 1: NCCL 'Failed to CUDA calloc async 8 bytes'; MXNet:
    SIGABRT, cuBLAS's handle; JAX: device 0 waited at the all-reduce to the stall limit). Each device past the
    first is now held to its slice (B / N images) before any work."""
    smi = str(fake_nvidia_smi(tmp_path) / "nvidia-smi")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    gpus = options.gpus_free(smi)
    assert [(m.unit, m.free_bytes) for m in gpus] == [("GPU 0", 143156 * MIB), ("GPU 1", 558 * MIB)]
    need = options.estimate_bytes("pytorch", 512, "gpu")
    assert need == GIB + 512 * spec.activation_floats_per_image() * 4  # PyTorch's factor 1
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(framework="pytorch", batch_size=[1024], devices=[1, 2]), 20_000, "fashion-mnist",
                         gpus[0], gpus)
    assert str(exc.value) == (
        f"--devices 2 --batch-size 1024: device 1 of 2 trains 512 images a step: a training step needs about "
        f"{need / GIB:.1f} GiB in PyTorch (0.40 MiB an image, at most 0 images fit), estimated with 1.0 GiB fixed, "
        "and GPU 1 (NVIDIA H200, nvidia-smi memory.free) had 0.5 GiB free of 139.8 GiB (pid 8715 python3.12 holds "
        "105.0 GiB, pid 8790 pt_main_thread holds 34.3 GiB); it would fit GPU 1's 139.8 GiB were other processes "
        "not holding it")
    plan = options.validate(_args(framework="pytorch", batch_size=[1024], devices=[1]), 20_000, "fashion-mnist",
                            gpus[0], gpus)  # one device: GPU 1 is not used
    assert [m["free_bytes"] for m in plan["devices_memory"]] == [143156 * MIB, 558 * MIB]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # CUDA's order: GPU 1 is the first device
    assert [m.unit for m in options.gpus_free(smi)] == ["GPU 1", "GPU 0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7,1")  # CUDA stops at the first that names no GPU
    assert [m.unit for m in options.gpus_free(smi)] == ["GPU 0"]
    assert options.devices_free("cpu", True, [1, 2]) is None and options.devices_free("gpu", True, [1]) is None


def test_each_device_is_held_to_its_share_for_each_n_asked_device_0_too():
    """``--devices 2`` alone trains B / 2 images a step on GPU 0 too: it was held to the whole batch B (``memory``)
    and refused a batch that fits. Device 0 now meets B / min N; with ``--devices 1 2`` the 1-device case holds it
    to B."""
    need = options.estimate_bytes("pytorch", 1024, "gpu")
    half = options.estimate_bytes("pytorch", 512, "gpu")
    gpu0 = options.Memory("gpu", "GPU 0 (NVIDIA H200, nvidia-smi memory.free)", (need + half) // 2, 140 * GIB)
    gpu1 = options.Memory("gpu", "GPU 1 (NVIDIA H200, nvidia-smi memory.free)", 140 * GIB, 140 * GIB)
    assert half < gpu0.free_bytes < need
    for devices in ([2], [2, 4]):
        plan = options.validate(_args(framework="pytorch", batch_size=[1024], devices=devices), 20_000,
                                "fashion-mnist", gpu0, [gpu0, gpu1, gpu1, gpu1])
        assert plan["devices_memory"][0]["free_bytes"] == gpu0.free_bytes
    with pytest.raises(KernelmapError) as exc:
        options.validate(_args(framework="pytorch", batch_size=[1024], devices=[1, 2]), 20_000, "fashion-mnist",
                         gpu0, [gpu0, gpu1])
    assert str(exc.value).startswith("--batch-size 1024: device 0 of 1 trains 1,024 images a step: a training step "
                                     f"needs about {need / GIB:.1f} GiB in PyTorch")
    with pytest.raises(KernelmapError) as exc:  # device 0 of 4 at B / 4 fits; of 2 at B / 2 it does not
        options.validate(_args(framework="pytorch", batch_size=[2048], devices=[2, 4]), 20_000, "fashion-mnist",
                         gpu0, [gpu0, gpu1, gpu1, gpu1])
    assert str(exc.value).startswith("--devices 2 --batch-size 2048: device 0 of 2 trains 1,024 images a step: ")
    # no per-device reading (one device, or the CPU): the memory read holds the whole batch, as before
    with pytest.raises(KernelmapError, match=r"^--batch-size 1024: a training step needs"):
        options.validate(_args(framework="pytorch", batch_size=[1024], devices=[2]), 20_000, "fashion-mnist",
                         gpu0, None)


def test_nvidia_smis_rows_are_cudas_devices_only_in_pci_bus_order(tmp_path, monkeypatch):
    """nvidia-smi lists the GPUs by PCI bus id; CUDA numbers them so only with CUDA_DEVICE_ORDER=PCI_BUS_ID, which
    ``kernelmap run`` sets for itself and its workers where it is unset. A user's other order matches GPUs by UUID
    only ($CUDA_VISIBLE_DEVICES naming UUIDs, which CUDA takes in the order named), else reads none."""
    smi = str(fake_nvidia_smi(tmp_path) / "nvidia-smi")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert [m.unit for m in options.gpus_free(smi)] == ["GPU 0", "GPU 1"]  # unset: kernelmap run sets PCI_BUS_ID
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    assert options.gpus_free(smi) == [] and options.gpu_free(smi) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert options.gpus_free(smi) == []  # indices in CUDA's own order: which GPU is 1 is not nvidia-smi's to say
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbb,GPU-aaa")
    assert [m.unit for m in options.gpus_free(smi)] == ["GPU 1", "GPU 0"]
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert [m.unit for m in options.gpus_free(smi)] == ["GPU 1", "GPU 0"]
    env: dict[str, str] = {}
    options.pci_order(env)
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    options.pci_order(env)  # the user's own order stays
    assert env == {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}


# --- the CLI: refused before any work, one line ----------------------------------------------------------
def _kernelmap_run(*argv: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", *argv], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("argv, names", [
    (["--batch-size", "64", "97"], "--batch-size 97: larger than the 96 training images of the idx data"),
    (["--batch-size", "1000000000"], "--batch-size 1000000000: a training step needs about"),
    (["--epochs", "1", "--batch-size", "32"], "--epochs 1 at --batch-size 32: 3 steps"),
])
def test_refused_before_any_work_with_one_line(tmp_path, idx_dir_gz, argv, names):
    """No worker starts, no run directory is made: one line naming the option, exit 2, no traceback."""
    out = tmp_path / "run"
    proc, _ = _kernelmap_run("--framework", "pytorch", "--device", "cpu", "--data", str(idx_dir_gz), "--out", str(out),
                             *argv)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"kernelmap run: error: {names}"), proc.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_multi_gpu_run_with_a_held_gpu_is_refused_before_any_work(tmp_path, idx_dir_gz):
    """``kernelmap run --device gpu --devices 1 2`` on the fake 2x H200 (GPU 1 held): exit 2, one line, before any
    framework is probed or a worker started; nothing written."""
    smi_dir = fake_nvidia_smi(tmp_path / "bin")
    out = tmp_path / "run"
    env = dict(os.environ, PATH=f"{smi_dir}{os.pathsep}{os.environ['PATH']}")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "pytorch", "--device", "gpu",
                           "--devices", "1", "2", "--batch-size", "64", "--data", str(idx_dir_gz), "--out",
                           str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("kernelmap run: error: --devices 2 --batch-size 64: device 1 of 2 trains 32 "
                                  "images a step: a training step needs about"), proc.stderr
    assert "GPU 1 (NVIDIA H200, nvidia-smi memory.free) had 0.5 GiB free of 139.8 GiB (pid 8715" in proc.stderr
    assert not out.exists()


# --- the CPU combinations, each framework in its own worker process ------------------------------------
CPU_MODES = [(fw, m) for fw, d in frameworks.REGISTRY.items() for m in d.modes_on("cpu")]


def _python_args() -> list[str]:
    return [a for fw, d in frameworks.REGISTRY.items() if (py := d.python()) for a in ("--python", f"{fw}={py}")]


@pytest.mark.slow
@pytest.mark.parametrize("fw, mode", CPU_MODES, ids=[f"{fw}-{m}" for fw, m in CPU_MODES])
def test_every_cpu_mode_runs_within_and_past_an_epoch(tmp_path, idx_dir_gz, fw, mode):
    """96 training images at batch 64: one step an epoch (32 images dropped), so the 4 steps (1 warm-up) cross 3
    epoch boundaries, where a compiled or jitted step met a 32-image batch before. Each timed step trains the full
    batch (the results' steps), the manifest records the rule and what it drops; no traceback anywhere."""
    require_framework(fw)
    out = tmp_path / "run"
    proc, _ = _kernelmap_run("--framework", fw, "--mode", mode, "--device", "cpu", "--data", str(idx_dir_gz),
                             "--batch-size", "64", "--steps", "3", "--warmup", "1", "--trials", "1",
                             "--max-repeats", "0", "--out", str(out), *_python_args())
    assert proc.returncode == 0 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [(r["mode"], r["batch_size"], r["steps"]) for r in results] == [(mode, 64, 3)]
    batches = json.loads((out / "manifest.json").read_text())["config"]["batches"]
    assert batches["partial_batch"] == "dropped"
    assert [(p["batch_size"], p["steps_per_epoch"], p["dropped_per_epoch"]) for p in batches["per_batch_size"]] == \
        [(64, SMALL_SIZES["train"] // 64, SMALL_SIZES["train"] % 64)] == [(64, 1, 32)]


@pytest.mark.slow
def test_one_epoch_trains_its_full_batches(tmp_path, idx_dir_gz):
    """--epochs 1 at batch 16 of 96 images: 6 steps, 1 warm-up, 5 timed."""
    require_framework("pytorch")
    out = tmp_path / "run"
    proc, _ = _kernelmap_run("--framework", "pytorch", "--device", "cpu", "--data", str(idx_dir_gz), "--epochs", "1",
                             "--batch-size", "16", "--warmup", "1", "--trials", "1", "--max-repeats", "0",
                             "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (entry,) = json.loads((out / "results.json").read_text())
    assert entry["steps"] == 5 and json.loads(Path(out / "manifest.json").read_text())["config"]["train"]["epochs"] == 1


def test_the_report_says_what_the_rule_made_of_an_epoch(tmp_path):
    """The environment table's 'batches' row, from the manifest's record; none for a run made before the rule."""
    from kernelmap.reports.analyses.base import Run
    from kernelmap.reports.analyses.summary import environment_table

    plan = options.batch_plan([1024, 1000], 60_000)
    runs = [Run(tmp_path / "new", {"config": {"batches": plan}}, []), Run(tmp_path / "old", {"config": {}}, [])]
    env = environment_table(runs).set_index("item")
    assert env.loc["batches", "new"] == ("each epoch's last partial batch dropped: bs 1024: 58 steps, 59,392 of 60,000 "
                                         "images an epoch (608 dropped); bs 1000: 60 steps, 60,000 of 60,000 images "
                                         "an epoch")
    assert env.loc["batches"].isna()["old"]


JIT_SCRIPT = """
import json, sys, tempfile
from pathlib import Path
from kernelmap import worker
from kernelmap.frameworks import load_workload, spec
w = load_workload("jax")(spec.TrainConfig(data=sys.argv[1], batch_size=64, device="cpu"))
worker.run_pass(w, framework="jax", pass_name="clean", out_dir=Path(tempfile.mkdtemp()), steps=3, epochs=None,
                warmup=1, progress=False)
print(json.dumps({"compiled": w._train_step._cache_size()}))
"""


def test_jit_compiles_its_step_once_across_epochs(idx_dir_gz):
    """96 images at 64: 4 steps cross 3 epoch boundaries; with the 32-image rest of each epoch kept, jit compiled
    the step twice (the second inside the timed steps)."""
    require_framework("jax")
    python = frameworks.get("jax").python() or sys.executable
    proc = subprocess.run([python, "-c", JIT_SCRIPT, str(idx_dir_gz)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **frameworks.get("jax").cpu_env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"compiled": 1}


GPU_GRAPH_MODES = [m for m in frameworks.get("pytorch").modes if m != frameworks.get("pytorch").default_mode]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", GPU_GRAPH_MODES)
def test_graph_and_compiled_modes_run_past_an_epoch_on_the_gpu(tmp_path, mode):
    """Issue 37's H100 crash: cuda-graph, --steps 70 at batch 1024 of 60,000 images (58 full batches an epoch) met
    a 608-image batch its static buffers could not take (exit 2). Every step is now a full batch: the 75 steps
    (5 warm-up) cross into epoch 1 and all 70 are timed; the manifest says 608 images an epoch are dropped."""
    require_framework("pytorch")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "pytorch", "--mode", mode,
                           "--device", "gpu", "--profile", "none", "--steps", "70", "--batch-size", "1024", "--data",
                           "synthetic", "--trials", "1", "--max-repeats", "0", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (entry,) = json.loads((out / "results.json").read_text())
    assert (entry["mode"], entry["device"], entry["steps"]) == (mode, "gpu", 70)
    (plan,) = json.loads((out / "manifest.json").read_text())["config"]["batches"]["per_batch_size"]
    assert (plan["steps_per_epoch"], plan["dropped_per_epoch"]) == (58, 608)


PEAK_SCRIPT = """
import json, sys
from kernelmap.frameworks import load_workload, spec
def status(key):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key + ":"))
bs = int(sys.argv[2])
w = load_workload(sys.argv[1])(spec.TrainConfig(batch_size=bs, data="synthetic", device="cpu"))
batches = list(w.batches("train", bs, spec.training_batches(w.data_info.n_train, 0, bs, 2).ravel()))
peak = status("VmHWM")
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # the peak resident set (VmHWM) starts again from here: the steps' own
before = status("VmRSS")
for x, y in batches:
    w.to_float(w.train_step(x, y))
w.synchronize()
print(json.dumps({"step_bytes": status("VmHWM") - before, "peak_bytes": max(peak, status("VmHWM"))}))
"""
BIG = 2048


@pytest.mark.slow
@pytest.mark.parametrize("fw", list(frameworks.FRAMEWORKS))
def test_the_memory_estimate_holds_a_step_on_the_cpu(fw):
    """Two steps at batch 2048 in a process of their own: the process's peak resident memory stays below the
    estimate, and the steps' own peak growth (the peak reset before them) between half and all of the estimate's
    per-image part: a factor too small or twice too large fails. Measured 2026-11-27: PyTorch 0.88, MXNet 1.49,
    JAX 2.95 of the forward's values an image (factors 1, 2, 3.5)."""
    require_framework(fw)
    d = frameworks.get(fw)
    proc = subprocess.run([d.python() or sys.executable, "-c", PEAK_SCRIPT, fw, str(BIG)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES="", **d.cpu_env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["peak_bytes"] < options.estimate_bytes(fw, BIG, "cpu"), got
    assert 0.5 < got["step_bytes"] / (options.bytes_per_image(fw) * BIG) < 1.0, got
