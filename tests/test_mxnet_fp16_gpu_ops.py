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
statement sets a ``F...<gpu>`` attribute. Every operator must have one in ``GPU_OPERATOR_SOURCES``.

The whole step on N devices as well (``parallel.py``; the 4x H200, session 11: every MXNet case on N > 1 GPUs
stopped at its first step, "Operator Concat is not implemented for GPU", ``concat`` of the slices' losses): every
operator and engine function MXNet's profiler records while the workload trains (its first and second step, then
the evaluation forward) on 1 and 2 contexts, imperative and hybridized, with the GPU's KVStore (``device``: its
``CommDevice`` code, here over CPU contexts). fp32 runs whole; fp16 cannot compute on the CPU ("FP16 gemm on cpu
not implemented"), so there the graph is bound as above and what runs around it is executed: the Trainer's step
(KVStore, update, AMP's check), the loss over the contexts (``parallel.global_mean``) and the logits' gathering
(``parallel.forward``, the net's logits stood in by float16 arrays). An engine function (no operator: a copy
between contexts, the KVStore's sum, a scalar fill) must have its GPU code in a .cu outside ``src/operator``, which
every build compiles (``ENGINE_FUNCTIONS``, checked against those sources: tests/data/mxnet_operator_cu/
always-cu.tar.xz). Bulked execution is switched off, so that no operator hides in an ``ImperativeBulk``."""

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

from kernelmap import frameworks

OPERATOR_CU = Path(__file__).parent / "data" / "mxnet_operator_cu" / "operator-cu.tar.xz"
ALWAYS_CU = OPERATOR_CU.with_name("always-cu.tar.xz")  # sources outside src/operator: compiled in every build
MEMBER_PREFIX = "mxnet/src/operator/"
SRC_PREFIX = "mxnet/src/"
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


# Engine functions the profiler records besides operators, as MXNet 1.9.1 names them on the CPU, with the GPU code
# each runs there: (what src/ndarray/ndarray.cc pushes on a GPU context, the source outside src/operator that holds
# that code, and its statements there; checked against the sources in test_engine_functions_have_gpu_code_in_every_build).
ENGINE_FUNCTIONS = {
    # CopyFromTo: as_in_context, the KVStore's copies into and out of its merge buffer
    "CopyCPU2CPU": (('"CopyCPU2GPU"', '"CopyGPU2CPU"', '"CopyGPU2GPU"'), "ndarray/ndarray_function.cu",
                    ("void Copy<cpu, gpu>(", "void Copy<gpu, cpu>(", "void Copy<gpu, gpu>(",
                     "mshadow::expr::tcast<DType>(from.FlatTo1D<gpu, SrcDType>(s))")),  # astype's dtype change
    # ndarray::ElementwiseSum: the KVStore `device`'s sum (CommDevice::Reduce, src/kvstore/comm.h), named by its
    # function on the CPU and "DenseElementwiseSum" on the GPU; ndarray_function.cu includes the -inl.h with DEVICE gpu
    "ElementwiseSum": (("ndarray::ElementwiseSum<gpu>(source_tblob, &tmp, ctx);", '"DenseElementwiseSum"'),
                       "ndarray/ndarray_function.cu", ('#include "./ndarray_function-inl.h"',)),
    # SetValueOp (its function's name on both): a scalar written into an array (the loss scaler's, the Trainer's)
    "SetValueOp": (("ndarray::Eval<gpu>(rhs, &tmp, ctx);",), "ndarray/ndarray_function.cu",
                   ('#include "./ndarray_function-inl.h"',)),
}
ENGINE_BOOKKEEPING = ("DeleteVariable", "WaitForVar")  # the engine's own: no device code
CPU_ONLY = ("Reorder",)  # oneDNN's layout change on the CPU (this MXNet has oneDNN; the sm_90 tree has none)
INL_GPU = {"ElementwiseSum": "void ElementwiseSum<DEVICE>(", "SetValueOp": "void Eval<DEVICE>(const real_t &rhs"}
BULK_OFF = {"MXNET_EXEC_BULK_EXEC_TRAIN": "0", "MXNET_EXEC_BULK_EXEC_INFERENCE": "0",
            "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_FWD": "0", "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD": "0"}

# parallel.py as the 4x H200 ran it (commit e953021): the slices' losses and logits joined by Concat on a context
CONCAT_CODE = textwrap.dedent("""
    def forward(net, images):
        return mx.nd.concat(*[net(x).as_in_context(images[0].context) for x in images], dim=0)

    def train_step(w, images, labels):
        with autograd.record():
            losses = [w.loss_fn(w.net(x), y) for x, y in zip(images, labels, strict=True)]
            scaled = [w.scaled_loss(loss) for loss in losses]
        autograd.backward(scaled)
        w.trainer.step(sum(x.shape[0] for x in images))
        return mx.nd.concat(*[loss.as_in_context(w.ctx) for loss in losses], dim=0).mean()
""")

STEP_RUN = textwrap.dedent("""
    import json, re, sys
    from kernelmap.frameworks import spec
    from kernelmap.frameworks.mxnet import descriptor, parallel, workload
    mx = workload.mx
    math, mode, devices, profile, variant = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    descriptor.MATH_REFUSALS["cpu"].pop("fp16")  # the GPU's math, on the CPU: bound, its convolutions never run
    descriptor.KVSTORES["cpu"] = descriptor.KVSTORES["gpu"]  # the GPU's KVStore (device: CommDevice), CPU contexts
    if variant == "concat":
        exec(sys.stdin.read(), parallel.__dict__)
    options = {descriptor.KVSTORE_OPTION: descriptor.KVSTORE_DEFAULT["gpu"]} if devices > 1 else {}
    w = workload.Workload(spec.TrainConfig(batch_size=8, data="synthetic", device="cpu", math=math, mode=mode,
                                           devices=devices, options=options))
    if variant == "noreduce":  # the pass that times the step without the KVStore (dataparallel.NO_REDUCTION)
        parallel.drop_reduction(w)
    order = spec.training_batches(w.data_info.n_train, 0, 8, 3).ravel()
    (x0, y0), (x1, y1), (x2, _) = list(w.batches("train", 8, order))[:3]
    out = {"graph": [], "kvstore": w.trainer._kvstore_params["kvstore"]}
    if math == "fp16":  # the graph bound; what runs around it executed below
        data, label = mx.sym.var("data"), mx.sym.var("label")
        exe = w.scaled_loss(w.loss_fn(w.net(data), label)).simple_bind(
            ctx=mx.cpu(), grad_req="write", data=(4, 1, 28, 28), label=(4,))
        out["graph"] = sorted(set(re.findall(r"^Op:(\\S+?), Name=", exe.debug_str(), flags=re.M)))
        for p in w.net.collect_params().values():  # as a backward leaves them: fresh gradients (zeros)
            for d in p.list_data():
                d._fresh_grad = True
        losses = [mx.nd.ones((4,), ctx=c) for c in w.ctxs]  # float32, as the loss is at fp16 (log_softmax fp32)
        logits = {c: mx.nd.ones((4, 10), ctx=c, dtype="float16") for c in w.ctxs}  # AMP's logits
    mx.nd.waitall()
    mx.profiler.set_config(profile_all=True, aggregate_stats=False, filename=profile)
    mx.profiler.set_state("run")
    if math == "fp16":
        w.trainer.step(8)
        if devices > 1:
            parallel.global_mean(losses, w.ctx)
        parallel.forward(lambda x: logits[x.context], [x2] if devices == 1 else x2)
    else:
        w.train_step(x0, y0)
        out["loss"] = float(w.train_step(x1, y1).asscalar())
        w.forward(x2)
    mx.nd.waitall()
    mx.profiler.set_state("stop")
    mx.profiler.dump(finished=True)
    events = json.load(open(profile))["traceEvents"]
    out["ran"] = sorted({e["name"] for e in events if e.get("cat") == "operator"})
    if math == "fp32" and devices > 1 and variant == "new":  # the slices' mean: concat's (CPU) against ours
        per = [w.loss_fn(w.net(x), y) for x, y in zip(x1, y1)]
        out["means"] = [float(mx.nd.concat(*per, dim=0).mean().asscalar()),
                        float(parallel.global_mean(per, w.ctx).asscalar())]
        out["logits"] = [w.forward(x1).tolist(), [w.net(x).asnumpy().tolist() for x in x1]]
    print(json.dumps(out))
""")


def engine_sources(archive: Path = ALWAYS_CU) -> dict[str, str]:
    """Path (relative to src/) -> text of the sources outside src/operator in the fixture."""
    with tarfile.open(archive) as tf:
        return {m.name.removeprefix(SRC_PREFIX): tf.extractfile(m).read().decode() for m in tf}


def without_gpu_code(names: list[str], sources: tuple[str, ...]) -> list[str]:
    """The profiled names (operators and engine functions) that would have no GPU code in a tree built with
    ``sources``: an operator none of them registers for the GPU; anything that is neither an operator, an engine
    function of ``ENGINE_FUNCTIONS``, the engine's bookkeeping nor a CPU-only step (an ``ImperativeBulk`` too:
    it hides its operators)."""
    registered = gpu_registrations()
    known = set(ENGINE_FUNCTIONS) | set(ENGINE_BOOKKEEPING) | set(CPU_ONLY)
    return [n for n in names if n not in known and not registered.get(n, set()) & set(sources)]


def run_step(math: str, mode: str, devices: int, tmp_path: Path, variant: str = "new") -> dict:
    proc = subprocess.run([sys.executable, "-c", STEP_RUN, math, mode, str(devices),
                           str(tmp_path / f"{math}-{mode}-{devices}-{variant}.json"), variant],
                          input=CONCAT_CODE if variant == "concat" else "", capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, MXNET_SUBGRAPH_BACKEND="NONE", CUDA_VISIBLE_DEVICES="",
                                                **BULK_OFF))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


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


def test_engine_functions_have_gpu_code_in_every_build():
    """Each engine function's GPU names are pushed by the source that runs it, and its GPU code is in a .cu outside
    src/operator (compiled whatever the operator subset: build.count_sources)."""
    src = engine_sources()
    assert sorted(src) == ["kvstore/comm.h", "kvstore/kvstore_local.h", "ndarray/ndarray.cc",
                           "ndarray/ndarray_function-inl.h", "ndarray/ndarray_function.cu"]
    for name, (pushed, cu, statements) in ENGINE_FUNCTIONS.items():
        assert cu.endswith(".cu") and not cu.startswith("operator/")
        assert all(p in src["ndarray/ndarray.cc"] for p in pushed), name
        assert all(st in src[cu] for st in statements), name
        if name in INL_GPU:
            assert INL_GPU[name] in src["ndarray/ndarray_function-inl.h"], name
    # the KVStore `device` (CommDevice): Reduce copies into its merge buffer and sums with ElementwiseSum; Broadcast
    # copies out; the update is the optimizer's operator, run by the KVStore's updater (kvstore_local.h)
    comm = src["kvstore/comm.h"]
    device = comm[comm.index("class CommDevice"):]
    assert "ElementwiseSum(reduce, &buf_merged, priority);" in device and "CopyFromTo(" in device
    assert "updater_(key, merged,  &local);" in src["kvstore/kvstore_local.h"]
    # ElementwiseSum on a GPU buffer: pushed as "DenseElementwiseSum", ndarray::ElementwiseSum<gpu>; in the records
    # that is the KVStore `device`'s sum: communication, as `local`'s KVStoreReduce is
    nd = src["ndarray/ndarray.cc"]
    gpu_sum = nd[nd.index("void ElementwiseSum(const std::vector<NDArray> &source"):]
    assert gpu_sum.index("ndarray::ElementwiseSum<gpu>") < gpu_sum.index('"DenseElementwiseSum"')
    vocabulary = frameworks.get("mxnet").vocabulary
    assert vocabulary.lookup("DenseElementwiseSum") == vocabulary.lookup("KVStoreReduce") == ("collective", "none")
    assert vocabulary.lookup("ElementwiseSum") is None  # CPU contexts: `local` never runs it; an unknown op there


def test_unknown_names_and_bulks_are_reported():
    assert without_gpu_code(["Concat", "CopyCPU2CPU", "ImperativeBulk", "WaitForVar", "Reorder", "add_n"],
                            build.GPU_OPERATOR_SOURCES) == ["Concat", "ImperativeBulk"]


@pytest.mark.slow
def test_every_operator_of_the_steps_on_one_and_two_devices_has_gpu_code(tmp_path):
    """fp32 and fp16, imperative and hybridized, 1 and 2 contexts with the GPU's KVStore (and without it: the
    noreduce pass): all in the sm_90 tree."""
    require_framework("mxnet")
    seen = {}
    for math in ("fp32", "fp16"):
        for mode in ("imperative", "hybridized"):
            for n in (1, 2):
                got = seen[math, mode, n] = run_step(math, mode, n, tmp_path)
                assert without_gpu_code(got["graph"] + got["ran"], build.GPU_OPERATOR_SOURCES) == [], (math, mode, n)
                assert "ImperativeBulk" not in got["ran"]
    for mode in ("imperative", "hybridized"):
        one, two = seen["fp32", mode, 1], seen["fp32", mode, 2]
        # the layers ran, forward and backward, in both modes (not hidden in a bulk)
        assert {"Convolution", "_backward_Convolution", "_backward_FullyConnected", "multi_sgd_mom_update"} <= set(one["ran"])
        # two contexts: the KVStore `device` ran (CommDevice's sum; KVStore local's would be KVStoreReduce), and the
        # loss over the contexts is sum, add_n and a division, with no Concat anywhere
        assert two["kvstore"] == "device" and "ElementwiseSum" in two["ran"] and "KVStoreReduce" not in two["ran"]
        assert {"sum", "add_n", "_div_scalar", "CopyCPU2CPU"} <= set(two["ran"]) and "Concat" not in two["ran"]
        assert "Concat" not in one["ran"] and "ElementwiseSum" not in one["ran"]
        # the step without the KVStore (its noreduce pass): each context updated alone, nothing summed
        bare = run_step("fp32", mode, 2, tmp_path, variant="noreduce")
        assert bare["kvstore"] is None and without_gpu_code(bare["ran"], build.GPU_OPERATOR_SOURCES) == []
        assert "ElementwiseSum" not in bare["ran"] and "multi_sgd_mom_update" in bare["ran"]
        fp16 = seen["fp16", mode, 2]
        assert {"amp_cast", "_backward_amp_cast", "mean"} <= set(fp16["graph"])  # mean: the single device's loss too
        # AMP's check, the KVStore's sum, the loss over the contexts; astype's float16 -> float32 is a copy (CopyFromTo
        # converts: Copy<gpu, gpu> on the GPU), not the Cast operator
        assert {"multi_all_finite", "ElementwiseSum", "add_n", "CopyCPU2CPU"} <= set(fp16["ran"]) and "Cast" not in fp16["ran"]


@pytest.mark.slow
def test_the_concat_step_the_h200s_ran_fails_the_check_and_ours_keeps_its_results(tmp_path):
    require_framework("mxnet")
    old = run_step("fp32", "imperative", 2, tmp_path, variant="concat")
    assert without_gpu_code(old["ran"], build.GPU_OPERATOR_SOURCES) == ["Concat"]
    new = run_step("fp32", "imperative", 2, tmp_path)
    assert new["loss"] == pytest.approx(old["loss"], rel=1e-6, abs=0)  # the same data and weights, the same mean
    concat_mean, ours = new["means"]
    assert ours == pytest.approx(concat_mean, rel=1e-6, abs=0)  # float32: the additions' order only
    joined, per_context = new["logits"]
    assert joined == per_context[0] + per_context[1]  # the slices' logits in order, values untouched


PEAKS_RUN = textwrap.dedent("""
    import json, sys
    from kernelmap.frameworks.mxnet.loaded import mx
    from kernelmap.frameworks.mxnet import peaks
    x = mx.nd.ones((2, 2))  # MXNet's own start-up before the profiler (as the steps' test profiles after its steps):
    mx.nd.FullyConnected(x, x, num_hidden=2, no_bias=True).wait_to_read()  # the context's resources seeded on first use
    mx.profiler.set_config(profile_all=True, aggregate_stats=False, filename=sys.argv[1])
    mx.profiler.set_state("run")
    got = peaks.measure_on(mx.cpu(), 16, 1 << 12, 1, 1, skip={"fp16": "no CPU fp16 GEMM"})
    mx.nd.waitall()
    mx.profiler.set_state("stop")
    mx.profiler.dump(finished=True)
    events = json.load(open(sys.argv[1]))["traceEvents"]
    print(json.dumps({"ran": sorted({e["name"] for e in events if e.get("cat") == "operator"}),
                      "measured": sorted(k for k, v in got["gemm"].items() if "flops_per_s" in v)}))
""")


@pytest.mark.slow
def test_the_peaks_measurement_runs_only_operators_the_tree_has_gpu_code_for(tmp_path):
    """frameworks/mxnet/peaks.py's operators (here on the CPU, fp32; fp16 is the same FullyConnected in float16) all
    have GPU code in the sm_90 tree. Its first version did not: on an H200 (session 13) it died at its operands,
    "Operator _random_normal is not implemented for GPU", and its GEMMs (linalg_gemm2, dot) have none either."""
    require_framework("mxnet")
    proc = subprocess.run([sys.executable, "-c", PEAKS_RUN, str(tmp_path / "peaks.json")], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES="", NVIDIA_TF32_OVERRIDE="0",
                                                           **BULK_OFF))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["measured"] == ["fp32"] and "FullyConnected" in out["ran"]
    assert without_gpu_code(out["ran"], build.GPU_OPERATOR_SOURCES) == []
    old = ["_random_normal", "_linalg_gemm2", "dot"]  # the first version's operators: the check names each
    assert without_gpu_code(old, build.GPU_OPERATOR_SOURCES) == old
