"""noxfile.merge_options: arguments after `--` override only the options they name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("nox")


def _noxfile():
    path = Path(__file__).resolve().parents[1] / "noxfile.py"
    spec = importlib.util.spec_from_file_location("_kernelmap_noxfile", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_posargs_override_only_what_they_name():
    nf = _noxfile()
    assert nf.merge_options(nf.BENCH_DEFAULTS, ["--data", "synthetic"]) == [
        "--steps", "100", "--profile", "all", "--batch-size", "64", "256", "--data", "synthetic"]
    assert nf.merge_options(nf.BENCH_DEFAULTS, ["--steps", "20"]) == [
        "--steps", "20", "--profile", "all", "--batch-size", "64", "256"]
    assert nf.merge_options(nf.BENCH_DEFAULTS, ["--batch-size", "32", "--hybridize"]) == [
        "--steps", "100", "--profile", "all", "--batch-size", "32", "--hybridize"]
    assert nf.merge_options(nf.BENCH_DEFAULTS, ["--steps=7"]) == [
        "--steps", "7", "--profile", "all", "--batch-size", "64", "256"]
    assert nf.merge_options(nf.BENCH_DEFAULTS, []) == list(nf.BENCH_DEFAULTS)
    with pytest.raises(ValueError, match="expected an option"):
        nf.merge_options(nf.BENCH_DEFAULTS, ["20"])


def test_missing_python_names_the_command_that_fixes_it():
    nf = _noxfile()
    none = lambda name: None  # noqa: E731
    msg = nf.python_missing(which=none, find_spec=none)
    assert msg and f"Python {nf.PYTHON}" in msg and nf.PYTHON_FIX in msg
    assert nf.python_missing(which=lambda n: "/usr/bin/x" if n == f"python{nf.PYTHON}" else None,
                             find_spec=none) is None
    assert nf.python_missing(which=none, find_spec=lambda n: object() if n == "uv" else None) is None
    assert nf.python_missing(which=lambda n: "/bin/uv" if n == "uv" else None, find_spec=none) is None
