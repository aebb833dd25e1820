"""kernelmap's own PyTorch op (frameworks/pytorch/custom_op, issue 26) on the CPU: the C++ kernel
built by each route (jit, setuptools, cmake) with the compiler here, cached, its values, the seed's
AddModel converging, parity of the custom-op CNN with the built-in one, its records (counts from a
plain json read of the raw Kineto trace), and one line naming a missing tool.

The first run compiles the three routes (about a minute each on 2 idle cores); they are cached in
~/.cache/kernelmap/custom_op (keyed by the sources and torch's version), so later runs compile nothing."""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernelmap.frameworks import spec  # noqa: E402
from kernelmap.frameworks.pytorch import custom_op  # noqa: E402
from kernelmap.frameworks.pytorch.custom_op import Route, build  # noqa: E402

from kernelmap import frameworks  # noqa: E402
from kernelmap.adapters import kineto  # noqa: E402
from kernelmap.errors import MissingToolError  # noqa: E402

ROUTES = custom_op.ROUTES


def _skip_unbuildable(route: str) -> None:
    missing = build.missing_tools(route, False)
    if missing:
        pytest.skip(f"{route} route cannot build here: {missing}")


@pytest.fixture(scope="module", params=ROUTES)
def ops(request) -> build.Ops:
    _skip_unbuildable(request.param)
    return build.load(request.param, cuda=False)


# --- building -------------------------------------------------------------------------------
def test_ops_compute_what_torch_computes(ops):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    assert torch.equal(ops.add2(a, b), a + b)
    y, bias = torch.randn(37, 128, generator=g), torch.randn(128, generator=g)
    assert torch.equal(ops.bias_add(y, bias), y + bias)
    assert torch.allclose(ops.bias_grad(y), y.sum(0), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="bias_add needs y"):
        ops.bias_add(y, torch.randn(5))


def test_a_second_build_compiles_nothing(ops, tmp_path):
    """A fresh process finds the build in the cache: `kernelmap custom-op build` says built False."""
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "custom-op", "build", "--route", ops.route,
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(out.read_text())
    assert info["built"] is False and info["build_s"] == 0
    assert info["artifact"] == str(ops.artifact)
    assert "found in the cache (nothing compiled)" in proc.stdout
    assert Path(info["artifact"]).parent == build.build_dir(ops.route, False)


def test_build_key_follows_sources_torch_and_route(monkeypatch):
    key = build.build_key("cmake", False)
    assert key != build.build_key("jit", False)
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".other")
    assert build.build_key("cmake", False) != key
    monkeypatch.undo()
    monkeypatch.setattr(build, "SOURCES", (*build.SOURCES[:-1],))  # one file fewer hashed
    assert build.build_key("cmake", False) != key
    monkeypatch.undo()
    # a route's own build file is in its key only: editing CMakeLists.txt rebuilds no jit module
    monkeypatch.setitem(build.ROUTE_FILES, Route.JIT, ("CMakeLists.txt",))
    jit = build.build_key("jit", False)
    monkeypatch.undo()
    assert build.build_key("jit", False) != jit


# --- a missing tool: one line naming it -----------------------------------------------------
def _bin_with(tmp_path: Path, *tools: str) -> str:
    """A PATH folder holding only links to these tools (from the real PATH)."""
    import shutil

    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for t in tools:
        (d / t).symlink_to(shutil.which(t))
    return str(d)


@pytest.mark.parametrize("route, lacks", [("jit", "ninja"), ("cmake", "cmake")])
def test_missing_tool_is_one_line_naming_it(tmp_path, route, lacks):
    """With only a C++ compiler on PATH and an empty build cache, the build stops before compiling,
    exit 3, with one stderr line naming the missing tool (and not the compiler, which is there)."""
    if build.missing_tools(route, False):
        pytest.skip(f"{route} cannot build here anyway")
    env = dict(os.environ, PATH=_bin_with(tmp_path, "c++"), KERNELMAP_CUSTOM_OP_HOME=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "custom-op", "build", "--route", route],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 3
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith("W")]  # torch's own warnings: W...
    assert len(lines) == 1, proc.stderr
    assert lacks in lines[0] and "C++ compiler" not in lines[0] and f"{route} route" in lines[0]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_missing_compiler_and_nvcc_named(tmp_path, monkeypatch):
    tools = _bin_with(tmp_path, "c++", "ninja")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing at all
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    missing = custom_op.tools_missing("jit", cuda=True)
    assert [m.split(" ")[0] for m in missing] == ["C++", "nvcc", "ninja"]
    with pytest.raises(MissingToolError, match=r"missing C\+\+ compiler.*; nvcc.*; ninja"):
        build.check_tools("jit", True)
    monkeypatch.setenv("PATH", tools)
    assert custom_op.tools_missing("jit", cuda=False) == []


# --- the seed's AddModel --------------------------------------------------------------------
def test_addmodel_converges(ops):
    """500 epochs, loss every 25: both parameters below 1e-3 (a vector of 2^16, not the seed's 2^20, to
    keep CI short: the bound 0.98^500 · max|N(0,1)| holds for either)."""
    from kernelmap.frameworks.pytorch.custom_op import addmodel

    r = addmodel.train(ops.route, "cpu", n=1 << 16)
    assert r["converged"] and r["a_max_abs"] < 1e-3 and r["b_max_abs"] < 1e-3
    assert [x["epoch"] for x in r["losses"]] == [*range(0, 500, 25), 499]
    losses = [x["loss"] for x in r["losses"]]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False))
    # loss = sum(a² + b²) shrinks by 0.98² an epoch
    assert losses[1] / losses[0] == pytest.approx(0.98 ** 50, rel=1e-3)
    text = addmodel.format_text(r)
    assert "epoch  25: loss =" in text and "converged" in text


def test_addmodel_too_short_does_not_converge(ops):
    from kernelmap.frameworks.pytorch.custom_op import addmodel

    r = addmodel.train(ops.route, "cpu", n=1 << 12, epochs=100)
    assert not r["converged"] and "NOT converged" in addmodel.format_text(r)


def test_addmodel_records_hold_add2(ops, tmp_path):
    """The last 5 epochs profiled: the add2 op is in the records as often as the raw trace has it,
    library custom, canonical add, forward."""
    from kernelmap.frameworks.pytorch.custom_op import addmodel

    r = addmodel.train(ops.route, "cpu", n=1 << 10, epochs=30, trace_dir=tmp_path)
    raw = _raw_counts(Path(r["trace"]))
    name = custom_op.OP_NAMES["add2"]
    cat = "cpu_op" if ops.route == Route.CMAKE else "user_annotation"
    assert raw[(cat, name)] == 5 and raw[("cpu_op", custom_op.ADD2_FUNCTION)] == 5
    df = kineto.read(r["trace"])
    rows = df[df["op_name"] == name]
    assert len(rows) == 5
    assert set(rows["kind"]) == {"op" if ops.route == Route.CMAKE else "annotation"}
    assert set(rows["library"]) == {"custom"} and set(rows["canonical_op"]) == {"add"}
    assert set(rows["direction"]) == {"fwd"} and set(rows["iteration"]) == set(range(25, 30))


# --- the CNN: parity and records -------------------------------------------------------------
def test_parity_with_the_built_in_model(ops):
    from kernelmap.frameworks.pytorch.custom_op.parity import custom_parity

    r = custom_parity(ops.route, "cpu", steps=3, batch_size=32)
    assert r["passed"], r["failures"]
    assert r["build"]["route"] == ops.route and r["build"]["artifact"] == str(ops.artifact)


def test_parity_fails_for_a_wrong_kernel(ops, monkeypatch):
    """A bias gradient off by a factor of 2 breaks the weights figure (parity can fail)."""
    from kernelmap.frameworks.pytorch.custom_op.parity import custom_parity

    wrong = dataclasses.replace(ops, bias_grad=lambda g: ops.bias_grad(g) * 2)
    monkeypatch.setitem(build._LOADED, (ops.route, False), wrong)
    r = custom_parity(ops.route, "cpu", steps=3, batch_size=32)
    assert not r["passed"] and any(f.startswith("weights_worst") for f in r["failures"])


def _raw_counts(trace: Path) -> collections.Counter:
    """(cat, name) -> count of complete events, read with json alone."""
    doc = json.loads(gzip.decompress(trace.read_bytes()) if trace.suffix == ".gz" else trace.read_bytes())
    return collections.Counter((e.get("cat"), e.get("name")) for e in doc["traceEvents"] if e.get("ph") == "X")


@pytest.fixture(scope="module")
def cnn_trace(ops, tmp_path_factory) -> Path:
    """4 profiled training steps of the custom-op CNN (batch 16, synthetic data) after one warm-up."""
    from kernelmap.frameworks.pytorch.workload import Workload

    out = tmp_path_factory.mktemp(f"cnn-{ops.route}")
    w = Workload(spec.TrainConfig(batch_size=16, steps=5, data="synthetic", options={custom_op.OPTION: ops.route}))
    assert w.versions()["custom_op"]["route"] == ops.route
    order = spec.training_order(w.data_info.n_train, 0, 5 * 16)
    batches = list(w.batches("train", 16, order))
    w.train_step(*batches[0])
    with w.profile(out):
        for i, (x, y) in enumerate(batches[1:]):
            with w.region(f"kernelmap:step#{i}"):
                w.train_step(x, y)
    return out / "trace.json.gz"


def test_cnn_records_put_the_custom_op_in_fc1(ops, cnn_trace):
    """Exact counts from the raw trace: 4 steps, one bias_add and one bias_grad each, recorded as ops
    (cmake: the dispatcher's) or as annotations (jit, setuptools: record_function around a pybind11
    call); both in fc1's linear row (forward, backward), library custom; and the built-in addmm is gone
    from fc1 (its forward is KernelmapLinear's mm)."""
    raw = _raw_counts(cnn_trace)
    dispatcher = ops.route == Route.CMAKE
    cat = "cpu_op" if dispatcher else "user_annotation"
    for op in ("bias_add", "bias_grad"):
        assert raw[(cat, custom_op.OP_NAMES[op])] == 4
        assert raw[("user_annotation" if dispatcher else "cpu_op", custom_op.OP_NAMES[op])] == 0
    assert raw[("cpu_op", custom_op.FUNCTION)] == 4
    assert raw[("cpu_op", custom_op.FUNCTION_BACKWARD)] == 4
    assert raw[("cpu_op", "aten::addmm")] == 4  # fc2 only: fc1 is ours

    df = kineto.read(cnn_trace)
    for op, direction in (("bias_add", "fwd"), ("bias_grad", "bwd")):
        rows = df[df["op_name"] == custom_op.OP_NAMES[op]]
        assert len(rows) == 4
        assert set(rows["kind"]) == {"op" if dispatcher else "annotation"}
        assert set(rows["library"]) == {"custom"}
        assert set(rows["canonical_op"]) == {"linear"} and set(rows["layer"]) == {"fc1"}
        assert set(rows["direction"]) == {direction} and set(rows["iteration"]) == {0, 1, 2, 3}
    fn = df[df["op_name"] == custom_op.FUNCTION]
    assert len(fn) == 4 and set(fn["layer"]) == {"fc1"} and set(fn["canonical_op"]) == {"linear"}
    addmm = df[df["op_name"] == "aten::addmm"]
    assert set(addmm["layer"]) == {"fc2"}


def test_cnn_without_the_option_has_no_custom_op(tmp_path):
    """The built-in model: no custom op in its records (the test above can fail)."""
    from kernelmap.frameworks.pytorch.workload import Workload

    w = Workload(spec.TrainConfig(batch_size=16, steps=1, data="synthetic"))
    assert w.versions()["custom_op"] is None
    x, y = next(iter(w.batches("train", 16, spec.training_order(w.data_info.n_train, 0, 16))))
    with w.profile(tmp_path):
        w.train_step(x, y)
    df = kineto.read(tmp_path / "trace.json.gz")
    assert not (df["library"] == "custom").any()
    assert set(df.loc[df["op_name"] == "aten::addmm", "layer"]) == {"fc1", "fc2"}


# --- the option: one flag made from PyTorch's descriptor --------------------------------------
def test_run_option_comes_from_the_descriptor(tmp_path):
    import argparse

    from kernelmap import frameworks
    from kernelmap.errors import KernelmapError
    from kernelmap.run import cli as run_cli

    (opt,) = frameworks.get("pytorch").options
    assert (opt.name, opt.flag, opt.choices) == (custom_op.OPTION, "--custom-op", ROUTES)
    # the custom op is PyTorch's alone (MXNet's own option is its KVStore: issue 39)
    assert all(custom_op.OPTION not in {o.name for o in d.options} for n, d in frameworks.REGISTRY.items() if n != "pytorch")
    p = argparse.ArgumentParser()
    run_cli.add_arguments(p)
    assert p.parse_args(["--custom-op", "cmake"]).custom_op == "cmake"
    assert p.parse_args([]).custom_op is None
    with pytest.raises(SystemExit):
        p.parse_args(["--custom-op", "nvrtc"])
    args = p.parse_args(["--framework", "mxnet", "--custom-op", "jit", "--out", str(tmp_path / "r")])
    with pytest.raises(KernelmapError, match="--custom-op is PyTorch's option, and pytorch does not run"):
        run_cli.execute(args)
    assert not (tmp_path / "r").exists()


def test_doctor_says_what_each_route_lacks(tmp_path, monkeypatch):
    from kernelmap import doctor

    monkeypatch.setenv("PATH", _bin_with(tmp_path, "c++", "cmake"))
    monkeypatch.setattr(doctor.gpuinfo, "query", lambda: doctor.gpuinfo.GpuReport((), None, "no GPU here", None))
    monkeypatch.setattr(doctor, "probe_framework", lambda name, **kw: {"installed": True, "version": "1.0"})
    tools = doctor.collect()["options"]["pytorch"]  # the descriptor's hook, as doctor reports it
    assert tools["cmake"] == {"cpu": [], "gpu": None}
    assert tools["jit"]["cpu"] == ["ninja (pip install ninja)"]
    lines = doctor.frameworks.get("pytorch").option_tool_lines(tools)
    assert lines[0].startswith("custom op   --custom-op jit: CPU missing ninja")
    assert "--custom-op cmake: CPU ready" in lines[2]


def test_sources_ship_as_package_data():
    """Every file the builders read is matched by pyproject's package-data for the custom_op.csrc package."""
    import fnmatch
    import tomllib

    conf = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]
    pkg = "kernelmap.frameworks.pytorch.custom_op.csrc"  # a data-only package (listed: no setuptools warning)
    assert pkg in conf["packages"]
    globs = conf["package-data"][pkg]
    files = {*build.SOURCES, *(f for fs in build.ROUTE_FILES.values() for f in fs)}
    assert {f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)} == set()
    assert files == {p.name for p in build.CSRC.iterdir() if p.is_file()}


def test_the_bias_gradient_kernel_is_a_bias_gradient_through_the_registry():
    """The trace labeller reads the custom op's bias-gradient kernel mark from PyTorch's descriptor (it no
    longer imports the custom op): its kernel in fc1's backward is bwd_bias."""
    from kernelmap.adapters import _trace

    assert custom_op.BIAS_GRAD_KERNEL in _trace.BIAS_GRAD_MARKS
    assert frameworks.get("pytorch").bias_grad_kernel_marks == (custom_op.BIAS_GRAD_KERNEL,)
