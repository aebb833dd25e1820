"""`kernelmap parity`: the comparison arithmetic, and real runs of both frameworks (subprocesses)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from conftest import require_framework
from kernelmap.frameworks import registry, spec

from kernelmap import parity
from kernelmap.errors import KernelmapError, MissingToolError

NAMES = spec.weight_names()


def fake_result(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {"logits": rng.normal(size=(4, 10)).astype(np.float32), "losses": np.linspace(2.3, 1.0, 20)}
    out.update({f"weight/{k}": v for k, v in spec.init_weights(seed).items()})
    return out


def test_compare_identical_is_zero():
    a = fake_result()
    figures = parity.compare(a, dict(a), NAMES)
    assert figures["forward_logits_max_abs_diff"] == 0 and figures["loss_max_rel_diff"] == 0
    assert figures["weights_worst"] == 0 and figures["passed"] and figures["failures"] == []


def test_compare_definitions_and_failures():
    a = fake_result()
    b = {k: v.copy() for k, v in a.items()}
    b["logits"][1, 2] += 3e-4
    b["losses"][7] *= 1 + 5e-4
    w = b["weight/fc1.weight"]
    w[0, 0] += 2e-4 * np.abs(w).max()
    figures = parity.compare(a, b, NAMES)
    assert figures["forward_logits_max_abs_diff"] == pytest.approx(3e-4, rel=1e-3)
    assert figures["loss_max_rel_diff"] == pytest.approx(5e-4, rel=1e-6)
    assert figures["loss_rel_diff_per_step"][7] == figures["loss_max_rel_diff"]
    assert figures["weights_max_rel_diff"]["fc1.weight"] == pytest.approx(2e-4, rel=1e-2)
    assert figures["weights_max_rel_diff"]["conv1.weight"] == 0
    assert not figures["passed"] and len(figures["failures"]) == 3  # the default limits: TOLERANCES (custom op)


def test_compare_nan_fails():
    a = fake_result()
    b = dict(a, losses=a["losses"].copy())
    b["losses"][3] = np.nan
    assert not parity.compare(a, b, NAMES)["passed"]


def test_missing_framework_names_fix(monkeypatch):
    # only MXNet missing: every other framework's modules found, installed here or not
    real = parity.importlib.util.find_spec
    monkeypatch.setattr(parity.importlib.util, "find_spec",
                        lambda m: None if m == "mxnet" else (real(m) or parity.importlib.machinery.ModuleSpec(m, None)))
    with pytest.raises(MissingToolError, match=r"pip install 'kernelmap\[mxnet\]'"):
        parity.compute_parity(data="synthetic")


def test_a_framework_found_only_on_its_own_pythonpath_is_available(monkeypatch, tmp_path):
    """On the H100 the run's parity said "python module 'mxnet' is not installed": the MXNet built by
    build-mxnet is on its workers' PYTHONPATH (the descriptor's own environment), not on kernelmap's."""
    (tmp_path / "python" / "mxnet").mkdir(parents=True)
    (tmp_path / "python" / "mxnet" / "__init__.py").write_text("")
    real = parity.importlib.util.find_spec
    monkeypatch.setattr(parity.importlib.util, "find_spec", lambda m: None if m == "mxnet" else real(m))
    with pytest.raises(MissingToolError, match=r"'mxnet' is not installed"):
        parity.check_available(("mxnet",))
    own = {"PYTHONPATH": str(tmp_path / "python"), "KERNELMAP_MXNET_TREE": str(tmp_path)}
    monkeypatch.setattr(registry.Framework, "own_env", lambda self: dict(own) if self.name == "mxnet" else {})
    parity.check_available(("mxnet",))  # found on its own PYTHONPATH: no error


def test_bad_arguments():
    with pytest.raises(KernelmapError):
        parity.compute_parity(data="synthetic", steps=0)


def _require_both():
    require_framework("pytorch")
    require_framework("mxnet")


def assert_within_tolerances(result: dict, steps: int) -> None:
    assert result["passed"], result["failures"]
    assert result["tolerances"] == parity.tolerances(("fp32", "fp32"))
    for key, tol in result["tolerances"].items():  # the held figures: the forward and the first updates
        assert 0 <= result[key] <= tol, (key, result[key])
    assert len(result["weights_early_per_step"]) == min(steps, parity.EARLY_STEPS)
    assert set(result["reported"]) == {"loss_max_rel_diff", "weights_worst", "weights_worst_per_path"}
    assert set(result["weights_max_rel_diff"]) == set(NAMES) == set(result["weights_early_diff_per_path"])
    for fw in ("pytorch", "mxnet"):
        losses = result["losses"][fw]
        assert len(losses) == steps and all(np.isfinite(losses))
    # training did something, so agreement is not agreement between two idle models
    assert result["losses"]["pytorch"][-1] < result["losses"]["pytorch"][0]


@pytest.mark.mxnet
def test_parity_on_idx_files(idx_dir_gz):
    _require_both()
    result = parity.compute_parity(data=str(idx_dir_gz), steps=20, batch_size=16)  # 320 samples: 3+ epochs
    assert_within_tolerances(result, 20)
    assert result["data"]["kind"] == "idx" and result["data"]["n_train"] == 96
    assert result["versions"]["pytorch"]["framework"] == "pytorch"
    assert result["versions"]["mxnet"]["framework"] == "mxnet"


@pytest.mark.mxnet
def test_a_mode_switch_reaches_its_frameworks_worker(tmp_path, capsys):
    """``--hybridize`` (MXNet's descriptor's mode_flags) runs MXNet's worker hybridized, PyTorch's in its
    default mode; without it both run their first mode."""
    _require_both()
    p = argparse.ArgumentParser()
    parity.add_arguments(p)
    assert p.parse_args(["--hybridize"]).modes == [("mxnet", "hybridized")] and p.parse_args([]).modes == []
    args = p.parse_args(["--data", "synthetic", "--batch-size", "16", "--hybridize", "--json"])
    assert parity.main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["modes"] == {"pytorch": "eager", "mxnet": "hybridized"}
    assert printed["config"]["modes"] == {"mxnet": "hybridized"}
    assert_within_tolerances(printed, 20)
    default = parity.compute_parity(data="synthetic", steps=3, batch_size=16)
    assert default["modes"] == {"pytorch": "eager", "mxnet": "imperative"}


@pytest.mark.mxnet
def test_parity_cli_synthetic(tmp_path, capsys):
    _require_both()
    p = argparse.ArgumentParser()
    parity.add_arguments(p)
    out = tmp_path / "parity.json"
    args = p.parse_args(["--data", "synthetic", "--batch-size", "16", "--json", "--out", str(out)])
    assert parity.main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["data"]["kind"] == "synthetic" and printed["steps"] == 20
    assert_within_tolerances(printed, 20)
    assert not list(tmp_path.glob(".*partial"))


def test_worker_reports_broken_framework_with_fix(tmp_path):
    """A framework whose import fails makes the worker exit with MissingToolError's code and the fix."""
    import os
    import subprocess
    import sys

    (tmp_path / "mxnet.py").write_text('raise ImportError("simulated broken mxnet")\n')
    weights = tmp_path / "w.npz"
    spec.save_weights(weights, spec.init_weights(0))
    cmd = [sys.executable, "-m", "kernelmap.parity", "--worker", "mxnet", "--weights", str(weights)]
    cmd += ["--result", str(tmp_path / "r.npz"), "--params", json.dumps({"data": "synthetic", "steps": 1})]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert proc.returncode == MissingToolError.exit_code
    assert "simulated broken mxnet" in proc.stderr and "pip install 'kernelmap[mxnet]'" in proc.stderr
    assert not (tmp_path / "r.npz").exists()


FAKE_WORKER = """#!{python}
import json, sys, time
import numpy as np
time.sleep({sleep_s})
result = sys.argv[sys.argv.index("--result") + 1]
np.savez(result, meta=np.array(json.dumps({{"framework": "fake"}})))
"""


def test_gpu_workers_each_get_the_whole_timeout(tmp_path):
    """On the GPU the workers run one after the other: each has --timeout seconds from its own start,
    so two workers that each need most of it both finish."""
    import sys

    timeout_s, sleep_s = 4.0, 2.5  # one worker fits; the second would not fit in what a shared deadline leaves
    fws = parity.FRAMEWORKS
    python = {}
    for fw in fws:
        script = tmp_path / f"fake-{fw}"
        script.write_text(FAKE_WORKER.format(python=sys.executable, sleep_s=sleep_s))
        script.chmod(0o755)
        python[fw] = str(script)
    sides = [(fw, parity.FP32) for fw in fws]  # (framework, math)
    results = parity._run_workers(tmp_path, tmp_path / "weights.npz", {"device": "gpu"}, timeout_s, sides, python)
    assert {fw: r["meta"] for (fw, _), r in results.items()} == {fw: {"framework": "fake"} for fw in fws}
    slow = tmp_path / f"fake-{fws[1]}"
    slow.write_text(FAKE_WORKER.format(python=sys.executable, sleep_s=timeout_s + 5))
    with pytest.raises(KernelmapError, match=rf"the {fws[1]} worker took more than {timeout_s:g} s"):
        parity._run_workers(tmp_path, tmp_path / "weights.npz", {"device": "gpu"}, timeout_s, sides, python)


@pytest.mark.gpu
@pytest.mark.parametrize("hybridize", [False, True], ids=["imperative", "hybridized"])
def test_parity_on_the_gpu_fp32(hybridize):
    """PyTorch and MXNet on this GPU (fp32, TF32 off) from the same weights and batches stay within
    the tolerances (measured on an H100: 8.9e-8 forward, 2.2e-7 loss, 3.5e-7 weights)."""
    from kernelmap import doctor, gpuinfo
    from kernelmap.run import devices as run_devices

    report = gpuinfo.query()
    cc = report.gpus[0].compute_capability if report.gpus else None
    d = run_devices.decide_device("mxnet", "gpu", doctor.probe_framework("mxnet"), cc, report.problem)
    if d.device != "gpu":
        pytest.skip(f"MXNet cannot run on this GPU: {d.note}")
    result = parity.compute_parity(data="synthetic", steps=20, batch_size=64, device="gpu",
                                   modes={"mxnet": "hybridized"} if hybridize else None)
    assert result["device"] == "gpu" and result["math"].startswith("fp32 (TF32 off")
    assert_within_tolerances(result, 20)


# --- the fp32 rule: the forward and the first updates held to derived bounds, the 20-step figures reported ---------
def test_fp32_tolerances_are_derived():
    """Forward: 2 sides x u x sum of sqrt(fan-in) over the layers (3 + 16.97 + 56 + 11.31), u = 2**-24; the first
    updates: SWITCH_GRADIENT x sqrt(SWITCH_DENSITY x that) (parity's docstring, argument (1) at fp32)."""
    fwd = 2 * 2.0**-24 * (3 + np.sqrt(288) + 56 + np.sqrt(128))
    t = parity.tolerances(("fp32", "fp32"))
    assert t["forward_logits_max_rel_diff"] == pytest.approx(fwd, rel=1e-12) == t["loss_first_diff_over_logits"]
    assert t["weights_early_worst"] == pytest.approx(0.44 * np.sqrt(4.2 * fwd), rel=1e-12)
    assert 1.0e-5 < fwd < 1.1e-5 and 2.8e-3 < t["weights_early_worst"] < 3.0e-3
    # the 20-step figures are reported, not held (training amplifies any difference: argument (2))
    assert {"loss_max_rel_diff", "weights_worst", "weights_worst_per_path"}.isdisjoint(t)


def _early_pair(diff: float) -> tuple[dict, dict]:
    """Two worker outputs whose first-step weights differ by ``diff`` of the reference's path in one tensor."""
    a = fake_result()
    for n in NAMES:
        w = a[f"weight/{n}"]
        a[f"early/{n}"] = np.stack([w, w, w]).astype(np.float32)
        a[f"early_path/{n}"] = np.array([2.0, 4.0, 6.0])
    b = {k: v.copy() for k, v in a.items()}
    b["early/fc1.weight"][0, 0, 0] += diff * 2.0
    return a, b


def test_early_updates_figure_and_its_bound():
    tol = parity.fp32_update_tolerance()
    for factor, passed in ((0.9, True), (1.1, False)):
        a, b = _early_pair(factor * tol)
        r = parity.compare(a, b, NAMES, parity.tolerances(("fp32", "fp32")))
        assert r["weights_early_diff_per_path"]["fc1.weight"] == pytest.approx(factor * tol, rel=1e-4)
        assert r["weights_early_per_step"][0] == r["weights_early_worst"] and r["passed"] is passed
    assert r["failures"] == [f"weights_early_worst = {r['weights_early_worst']:.3g} > {tol:g}"]
    # a worker that did not record the first steps' weights cannot pass the rule
    a, b = _early_pair(0.0)
    del b["early/conv1.bias"]
    r = parity.compare(a, b, NAMES, parity.tolerances(("fp32", "fp32")))
    assert np.isnan(r["weights_early_worst"]) and not r["passed"]


def _jax_python() -> str:
    import os
    import subprocess
    import sys

    python = os.environ.get("KERNELMAP_PYTHON_JAX") or sys.executable
    probe = subprocess.run([python, "-c", "import jax, flax, optax, kernelmap.frameworks.jax.workload"],
                           capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if probe.returncode != 0:
        pytest.skip(f"jax is not importable by {python} (KERNELMAP_PYTHON_JAX)")
    return python


def _drop_bias_update(cls, net):
    """The step leaves every bias where it was."""
    real = cls.train_step

    def step(self, images, labels):
        before = self.get_weights()
        loss = real(self, images, labels)
        self.set_weights({k: before[k] if k.endswith("bias") else v for k, v in self.get_weights().items()})
        return loss
    return cls, "train_step", step


def _fc1_input_in_another_order(cls, net):
    """fc1 reads its input flattened H, W, C instead of C, H, W (what a port forgets; JAX's workload permutes fc1's
    rows once instead)."""
    import torch
    import torch.nn.functional as F

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x.permute(0, 2, 3, 1), 1))))
    return net, "forward", forward


PLANTED = {  # a bug in the PyTorch side: (its parameters changed, a patch of its workload or model; the figure it fails)
    "lr x1.01": ({"lr": 0.0101}, None, "weights_early_worst"),
    "momentum 0.85": ({"momentum": 0.85}, None, "weights_early_worst"),
    "no bias update": ({}, _drop_bias_update, "weights_early_worst"),
    "fc1 input in another order": ({}, _fc1_input_in_another_order, "forward_logits_max_rel_diff"),
}


@pytest.fixture(scope="module")
def fp32_runs(tmp_path_factory):
    """Real workers on the CPU, Fashion-MNIST where installed (else synthetic), bs 64, the first 3 steps: PyTorch and
    JAX (subprocesses, as parity runs them), and PyTorch once per planted bug (in this process)."""
    import sys

    from kernelmap.frameworks import data as data_mod
    from kernelmap.frameworks import load_workload

    require_framework("pytorch")
    jax = _jax_python()
    tmp = tmp_path_factory.mktemp("fp32-rule")
    try:
        data_mod.resolve_data(spec.TrainConfig(data="fashion-mnist"))
        data = "fashion-mnist"
    except KernelmapError:
        data = "synthetic"
    params = {"batch_size": 64, "lr": 0.01, "momentum": 0.9, "steps": parity.EARLY_STEPS, "seed": 0, "data": data,
              "data_dir": None, "device": "cpu", "cache_dir": None, "modes": {}, "math": parity.FP32}
    weights = tmp / "w.npz"
    spec.save_weights(weights, spec.init_weights(0))
    sides = [("pytorch", parity.FP32), ("jax", parity.FP32)]
    runs = {fw: r for (fw, _), r in parity._run_workers(tmp, weights, params, 600, sides, {"jax": jax}).items()}
    cls = load_workload("pytorch")
    net = sys.modules[cls.__module__].Net
    for name, (changed, patch, _) in PLANTED.items():
        owner, attr, replacement = patch(cls, net) if patch else (cls, "train_step", cls.train_step)
        real = getattr(owner, attr)
        setattr(owner, attr, replacement)
        try:
            out = tmp / f"{name}.npz"
            parity.worker("pytorch", str(weights), str(out), {**params, **changed})
        finally:
            setattr(owner, attr, real)
        with np.load(out) as npz:
            runs[name] = {k: npz[k] for k in npz.files}
    return runs


@pytest.mark.slow
def test_fp32_rule_passes_real_runs_and_fails_each_planted_bug(fp32_runs):
    limits = parity.tolerances(("fp32", "fp32"))
    real = parity.compare(fp32_runs["pytorch"], fp32_runs["jax"], NAMES, limits)
    assert real["passed"], real["failures"]
    assert len(real["weights_early_per_step"]) == parity.EARLY_STEPS
    assert 0 < real["weights_early_worst"] < limits["weights_early_worst"] / 5  # two implementations, well inside
    for name, (_, _, figure) in PLANTED.items():
        r = parity.compare(fp32_runs[name], fp32_runs["jax"], NAMES, limits)
        assert r[figure] > 3 * limits[figure], (name, r[figure])
        if figure == "weights_early_worst":  # the same forward: only the updates differ
            assert [f.split(" = ")[0] for f in r["failures"]] == [figure], (name, r["failures"])
        else:
            assert r["forward_logits_max_rel_diff"] > 1e3 * limits[figure], (name, r[figure])


def test_text_says_which_figures_are_held_and_which_reported():
    a, b = _early_pair(2e-4)
    limits = parity.tolerances(("fp32", "fp32"))
    c = {"sides": ["pytorch", "jax"], **parity.compare(a, b, NAMES, limits), "tolerances": limits}
    result = {"frameworks": ["pytorch", "jax"], "device": "gpu", "math": "fp32", "steps": 20, "comparisons": [c],
              "data": {"kind": "synthetic", "path": None}, "convergence": [], "passed": c["passed"],
              "failures": c["failures"]}
    text = parity.format_text(result)
    assert f"first 3 updates ||a-b||/path    {c['weights_early_worst']:.3e}  (<= 0.00291)" in text
    assert f"forward logits max|a-b|/max|a|  0.000e+00  (<= {limits['forward_logits_max_rel_diff']:.3g})" in text
    for label in ("loss max |a-b|/|a| per step", "weights max|a-b|/max|a|", "weights ||a-b||/path  "):
        assert next(line for line in text.splitlines() if label in line).endswith("(reported)"), label
    assert text.endswith("PASS")
