"""MXNet's AMP on a build that lacks operators its lists name (issue: the sm_90 tree, built without the legacy
operators, failed at ``amp.init`` with "module 'mxnet.symbol' has no attribute 'Convolution_v1'" on the H200s).

The CPU's MXNet has every operator, so the build is simulated in a fresh process: Convolution_v1 taken out of
``mx.symbol`` and ``mx.nd`` (as in the sm_90 tree), _sparse_arccos out of ``mx.nd`` only, and names no MXNet has put in
the widest-type-cast and conditional-fp32 lists. The control runs MXNet's own ``amp.init`` (what the workload
and benches/bare_mixed_loop.py called before) on the same simulation and must fail as the GPU did."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import require_framework

SIMULATE = textwrap.dedent("""
    import json, sys, types
    import mxnet as mx
    from mxnet.contrib import amp
    from mxnet.contrib.amp import lists
    for module in (mx.symbol, mx.symbol.op, mx.nd, mx.nd.op):
        delattr(module, "Convolution_v1")
    delattr(mx.nd.sparse, "arccos")  # _sparse_arccos: in mx.symbol.sparse, not in mx.nd.sparse
    lists.symbol_fp16.WIDEST_TYPE_CASTS.append("NoSuchWidest")
    lists.symbol_fp16.CONDITIONAL_FP32_FUNCS.append(("NoSuchAct", "act_type", ["softrelu"]))
    widest = len(lists.symbol_fp16.WIDEST_TYPE_CASTS)
""")

WORKLOAD = SIMULATE + textwrap.dedent("""
    from kernelmap.frameworks import spec
    from kernelmap.frameworks.mxnet import workload
    # the AMP start of a GPU fp16 worker (fp16 is refused on the CPU before AMP; amp.init itself needs no GPU)
    workload.Workload._start_amp(types.SimpleNamespace(math=spec.Math.FP16), "gpu")
    conv = mx.sym.Convolution(mx.sym.var("x"), num_filter=2, kernel=(3, 3), name="c")
    x = mx.nd.ones((2, 3))
    fc = mx.nd.FullyConnected(x, mx.nd.ones((4, 3)), mx.nd.zeros((4,)), num_hidden=4)
    print(json.dumps({"dropped": workload.AMP_DROPPED, "started": workload.AMP_STARTED,
                      "conv": conv.get_internals().list_outputs(), "fc": fc.dtype.__name__,
                      "arccos": mx.sym.arccos(mx.sym.var("a"), name="ac").get_internals().list_outputs(), "relu": mx.nd.relu(x).dtype.__name__,
                      "widest_after": len(lists.symbol_fp16.WIDEST_TYPE_CASTS), "widest_before": widest}))
""")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_amp_starts_on_a_build_without_legacy_operators_and_says_what_it_left_out():
    require_framework("mxnet")
    control = _python(SIMULATE + "amp.init(target_dtype='float16')\n")
    assert control.returncode != 0
    assert "AttributeError: module 'mxnet.symbol' has no attribute 'Convolution_v1'" in control.stderr

    done = _python(WORKLOAD)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["started"] == {"target_dtype": "float16"}
    # exactly the simulated gaps, per list, each once; _sparse_arccos, in mx.symbol but not in mx.nd, left out of both
    assert out["dropped"] == {"fp32_ops": ["Convolution_v1", "_sparse_arccos"],
                              "conditional_fp32_ops": ["NoSuchAct"], "widest_type_casts": ["NoSuchWidest"]}
    assert ("mxnet amp: 4 operators of AMP's lists are not in this MXNet, left out of amp.init "
            "(fp32_ops: Convolution_v1, _sparse_arccos; conditional_fp32_ops: NoSuchAct; widest_type_casts: NoSuchWidest)"
            ) in done.stderr
    # AMP did wrap the operators the build has, in both modules: the symbol Convolution casts its three inputs,
    # FullyConnected computes in float16, arccos (AMP's fp32 list) casts its input; relu, on no list, is left alone
    assert out["conv"] == ["x", "amp_cast0_output", "c_weight", "amp_cast1_output", "c_bias", "amp_cast2_output",
                           "c_output"]
    assert out["arccos"] == ["a", "amp_cast3_output", "ac_output"]
    assert (out["fc"], out["relu"]) == ("float16", "float32")
    assert out["widest_after"] == out["widest_before"]  # AMP's own list given back whole after amp.init


def test_an_mxnet_with_every_operator_gets_amps_lists_whole():
    require_framework("mxnet")
    done = _python(textwrap.dedent("""
        import json
        import mxnet as mx
        from mxnet.contrib import amp
        from kernelmap.frameworks.mxnet import amp_ops
        kept, dropped = amp_ops.pruned_lists(mx, amp.amp, "float16")
        print(json.dumps({"dropped": dropped, "same": kept["fp32_ops"] == list(amp.list_fp32_ops("float16"))
                          and kept["widest_type_casts"] == list(amp.list_widest_type_cast("float16"))}))
    """))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"dropped": {}, "same": True}
