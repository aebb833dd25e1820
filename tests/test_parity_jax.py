"""JAX against PyTorch: `kernelmap parity --frameworks pytorch,jax` on the CPU, real subprocesses.

JAX needs numpy >= 2 and cannot share an environment with MXNet, so its worker may run under its
own interpreter: ``KERNELMAP_PYTHON_JAX`` (the same variable ``kernelmap parity`` reads), else this
one. The test skips, saying why, where that interpreter cannot import jax, flax and optax."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import require_framework
from kernelmap.frameworks import spec

from kernelmap import parity
from kernelmap.errors import KernelmapError


def _jax_python() -> str:
    python = os.environ.get("KERNELMAP_PYTHON_JAX") or sys.executable
    probe = subprocess.run([python, "-c", "import jax, flax, optax, kernelmap.frameworks.jax.workload"],
                           capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"jax is not importable by {python} (set KERNELMAP_PYTHON_JAX to an interpreter with "
                    f"jax[cpu], flax, optax and kernelmap): {tail}")
    return python


@pytest.mark.slow
def test_jax_matches_pytorch_on_the_cpu(tmp_path):
    require_framework("pytorch")
    python = _jax_python()
    r = parity.compute_parity(data="synthetic", steps=8, batch_size=32, frameworks=("pytorch", "jax"),
                              python={"jax": python}, workdir=tmp_path)
    assert r["frameworks"] == ["pytorch", "jax"] and r["python"]["jax"] == python
    assert r["versions"]["jax"]["matmul_precision"] == "highest"
    for key, tol in parity.tolerances(("fp32", "fp32")).items():  # the forward and the first 3 updates
        assert 0 <= r[key] <= tol, (key, r[key])
    assert r["passed"] and r["failures"] == []
    # the steps trained (the loss moved), so agreement is not two untouched copies of the weights
    losses = np.array(r["losses"]["jax"])
    assert losses.shape == (8,) and abs(losses[-1] - losses[0]) > 1e-3
    assert list(r["weights_max_rel_diff"]) == spec.weight_names()
    assert max(r["weights_max_rel_diff"].values()) > 0  # two implementations: never bit-identical weights


def test_python_option_is_parsed_and_checked():
    assert parity.parse_python(["jax=/opt/j/bin/python"]) == {"jax": "/opt/j/bin/python"}
    with pytest.raises(KernelmapError, match="FRAMEWORK=PATH"):
        parity.parse_python(["jax"])
    with pytest.raises(KernelmapError, match="FRAMEWORK=PATH"):
        parity.parse_python(["tensorflow=/usr/bin/python3"])
    with pytest.raises(KernelmapError, match="two different frameworks"):
        parity.compute_parity(data="synthetic", frameworks=("jax", "jax"))


def test_interpreter_from_the_environment(monkeypatch):
    monkeypatch.setenv("KERNELMAP_PYTHON_JAX", "/somewhere/python")
    assert parity.interpreters(("pytorch", "jax")) == {"pytorch": sys.executable, "jax": "/somewhere/python"}
    assert parity.interpreters(("jax",), {"jax": "/given"}) == {"jax": "/given"}
