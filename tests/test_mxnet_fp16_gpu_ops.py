"""The sm_90 tree compiles the GPU kernels of every operator MXNet's training step runs, at fp32 and at fp16.

``kernelmap build-mxnet`` compiles only the operator .cu files in ``build.GPU_OPERATOR_SOURCES``; an operator
whose GPU kernels are left out fails on a GPU context. On the 2x H200 (session 10) the tree ran fp32 in both
modes, and ``--math fp16`` failed at once in both: "MXNetError: Operator amp_cast is not implemented for GPU."

Here, on the CPU, the operators of the workload's own step are read from the real MXNet 1.9.1, in a fresh
process (AMP patches MXNet process-wide): its Workload at ``--math fp16`` (the CPU refusal lifted: nothing
computes in float16 here) and at fp32, hybridized,

- the step's graph: the net, the loss and AMP's loss scaling (``Workload.scaled_loss``) traced as symbols and
  bound with gradients, every node of the executor's forward and backward graph (nnvm's gradient pass, which
  autograd and the CachedOp of both modes run too; in the imperative mode AMP's NDArray wrappers call the same
  ``amp_cast`` operator);
- the Trainer's step with AMP's loss scaler (``amp.init_trainer``), executed: MXNet's profiler names each
  operator run.

Each operator is looked up in MXNet's GPU operator sources (tests/data/mxnet_operator_cu: every
src/operator/**/*.cu of the kit's source, byte for byte): the .cu files whose ``NNVM_REGISTER_OP(name)``
statement sets a ``F...<gpu>`` attribute. Every operator must have one in ``GPU_OPERATOR_SOURCES``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from conftest import require_framework
from kernelmap.frameworks.mxnet import build

OPERATOR_CU = Path(__file__).parent / "data" / "mxnet_operator_cu" / "operator-cu.tar.xz"
MEMBER_PREFIX = "mxnet/src/operator/"
REGISTER = re.compile(r"NNVM_REGISTER_OP\((\w+)\)([^;]*);", re.S)
GPU_ATTRIBUTE = re.compile(r'"F\w*<gpu>"')  # FCompute<gpu>, FComputeEx<gpu>, FStatefulCompute<gpu>...
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)

STEP_OPERATORS = textwrap.dedent("""
    import json, re, sys
    from kernelmap.frameworks import spec
    from kernelmap.frameworks.mxnet import descriptor, workload
    mx = workload.mx
    math, profile = sys.argv[1], sys.argv[2]
    descriptor.MATH_REFUSALS["cpu"].pop("fp16")  # the GPU's math, on the CPU: only traced and bound, never run
    w = workload.Workload(spec.TrainConfig(batch_size=4, data="synthetic", device="cpu", math=math, mode="hybridized"))
    data, label = mx.sym.var("data"), mx.sym.var("label")
    scaled = w.scaled_loss(w.loss_fn(w.net(data), label))
    exe = scaled.simple_bind(ctx=mx.cpu(), grad_req="write", data=(4, 1, 28, 28), label=(4,))
    graph = sorted(set(re.findall(r"^Op:(\\S+?), Name=", exe.debug_str(), flags=re.M)))
    for p in w.net.collect_params().values():  # as a backward leaves them: fresh gradients (zeros)
        for d in p.list_data():
            d._fresh_grad = True
    mx.profiler.set_config(profile_all=True, aggregate_stats=False, filename=profile)
    mx.profiler.set_state("run")
    w.trainer.step(4)
    mx.nd.waitall()
    mx.profiler.set_state("stop")
    mx.profiler.dump(finished=True)
    registered = set(mx.operator.get_all_registered_operators())
    events = json.load(open(profile))["traceEvents"]
    ran = sorted({e["name"] for e in events if e.get("cat") == "operator" and e["name"] in registered})
    scaler = getattr(w.trainer, "_amp_loss_scaler", None)
    print(json.dumps({"graph": graph, "trainer": ran, "loss_scale": scaler and scaler.loss_scale}))
""")


def gpu_registrations(archive: Path = OPERATOR_CU) -> dict[str, set[str]]:
    """operator name -> the .cu files (relative to src/operator) that register its GPU implementation."""
    found: dict[str, set[str]] = {}
    with tarfile.open(archive) as tf:
        for member in tf:
            text = COMMENT.sub("", tf.extractfile(member).read().decode())
            for name, chain in REGISTER.findall(text):
                if GPU_ATTRIBUTE.search(chain):
                    found.setdefault(name, set()).add(member.name.removeprefix(MEMBER_PREFIX))
    return found


def without_gpu_kernels(operators: list[str], sources: tuple[str, ...]) -> list[str]:
    """The operators none of ``sources`` gives a GPU implementation."""
    registered = gpu_registrations()
    return [op for op in operators if not registered.get(op, set()) & set(sources)]


def step_operators(math: str, tmp_path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", STEP_OPERATORS, math, str(tmp_path / f"{math}.json")],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, MXNET_SUBGRAPH_BACKEND="NONE", CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_fixture_reads_registrations_from_the_real_source():
    with tarfile.open(OPERATOR_CU) as tf:
        names = tf.getnames()
    assert len(names) == 192 and all(n.startswith(MEMBER_PREFIX) and n.endswith(".cu") for n in names)
    assert set(build.GPU_OPERATOR_SOURCES) <= {n.removeprefix(MEMBER_PREFIX) for n in names}
    registered = gpu_registrations()
    # amp_cast.cu: its four statements, all GPU; a statement without a <gpu> attribute is not one
    assert {op for op, files in registered.items() if "tensor/amp_cast.cu" in files} == {
        "amp_cast", "_backward_amp_cast", "amp_multicast", "_backward_amp_multicast"}
    assert registered["multi_all_finite"] == registered["all_finite"] == {"contrib/all_finite.cu"}
    assert "Convolution_v1" not in registered  # a legacy operator: CreateOp<gpu>, no NNVM registration


@pytest.mark.slow
def test_every_operator_of_the_fp16_and_fp32_steps_has_its_gpu_kernels_in_the_build(tmp_path):
    require_framework("mxnet")
    fp16, fp32 = step_operators("fp16", tmp_path), step_operators("fp32", tmp_path)
    assert fp16["loss_scale"] == 2.0**16 and fp32["loss_scale"] is None  # AMP's dynamic loss scaling at fp16 only
    # what the step is made of: AMP's casts in the graph and the scaler's overflow check in the Trainer at fp16,
    # neither at fp32; the layers and the update in both
    assert {"amp_cast", "_backward_amp_cast", "Convolution", "_backward_FullyConnected"} <= set(fp16["graph"])
    assert {"multi_all_finite", "multi_sgd_mom_update"} <= set(fp16["trainer"])
    assert not {"amp_cast", "multi_all_finite"} & set(fp32["graph"] + fp32["trainer"])
    assert without_gpu_kernels(fp16["graph"] + fp16["trainer"], build.GPU_OPERATOR_SOURCES) == []
    assert without_gpu_kernels(fp32["graph"] + fp32["trainer"], build.GPU_OPERATOR_SOURCES) == []
    # the list the H200s ran (session 10): fp32 whole, fp16 without AMP's cast and the loss scaler's check
    before = tuple(s for s in build.GPU_OPERATOR_SOURCES if s not in ("tensor/amp_cast.cu", "contrib/all_finite.cu"))
    assert without_gpu_kernels(fp32["graph"] + fp32["trainer"], before) == []
    assert without_gpu_kernels(fp16["graph"] + fp16["trainer"], before) == [
        "_backward_amp_cast", "amp_cast", "multi_all_finite"]
