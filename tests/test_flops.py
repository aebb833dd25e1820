"""FLOPs of conv/linear work: from the spec's shapes (the roofline's fallback), and per library
call from the sizes the library's own log records. The two derivations must agree."""

import json
from pathlib import Path

import pytest

from kernelmap.adapters import read
from kernelmap.adapters.onednn import _problem_flops
from kernelmap.flops import conv2d_call_flops, gemm_call_flops, layer_flops

DATA = Path(__file__).parent / "data"


def test_conv_flops_follow_the_spec_geometry():
    # conv1: 1 -> 32 channels, 3x3, on 28x28; conv2: 32 -> 64 on 14x14 (after the 2x2 pool).
    assert layer_flops("conv1", "fwd", 64) == 2 * 64 * 32 * 28 * 28 * 1 * 3 * 3
    assert layer_flops("conv2", "fwd", 64) == 2 * 64 * 64 * 14 * 14 * 32 * 3 * 3
    assert layer_flops("conv2", "bwd_data", 64) == layer_flops("conv2", "fwd", 64)
    assert layer_flops("conv2", "bwd_weight", 64) == layer_flops("conv2", "fwd", 64)


def test_linear_flops_and_non_model_work():
    assert layer_flops("fc1", "fwd", 256) == 2 * 256 * 3136 * 128
    assert layer_flops("fc2", "bwd_weight", 256) == 2 * 256 * 128 * 10
    assert layer_flops("fc1", "bwd", 64) is None  # an unsplit backward is not one GEMM
    assert layer_flops("loss", "fwd", 64) is None


def test_call_flops_formulas():
    assert conv2d_call_flops([64, 32, 3, 3], [16, 64, 14, 14]) == 2 * 16 * 64 * 14 * 14 * 32 * 9
    assert conv2d_call_flops([64, 32, 3, 3], [16, 32, 14, 14]) is None  # C_out disagrees
    assert conv2d_call_flops([64, 32, 3], [16, 64, 14, 14]) is None
    assert conv2d_call_flops(None, [16, 64, 14, 14]) is None
    assert gemm_call_flops(128, 64, 3136) == 2 * 128 * 64 * 3136
    assert gemm_call_flops(8, 8, 8, 36) == 2 * 8**3 * 36
    assert gemm_call_flops(8, None, 8) is None
    assert gemm_call_flops(2**40, 2**40, 2**40) is None  # a corrupt log: no int64 holds it
    # oneDNN problem descriptors: groups divide the input channels; inner products count spatial input
    assert _problem_flops("convolution", "g2mb4_ic8oc16_ih10oh10kh3sh1dh0ph1_iw10ow10kw3sw1dw0pw1") == \
        2 * 4 * 16 * 10 * 10 * 4 * 3 * 3
    assert _problem_flops("inner_product", "mb16ic64ih7iw7oc128") == 2 * 16 * 128 * 64 * 49
    assert _problem_flops("convolution", "mb4_ic8oc16_id5od5kd3_ih10oh10kh3_iw10ow10kw3") is None  # 3-d
    assert _problem_flops("pooling", "mb16_ic32_ih28oh14kh2sh2ph0_iw28ow14kw2sw2pw0") is None


# (fixture, library-call rows, rows with flops, rows with flops and a model layer): the real logs
CALL_LOGS = [
    ("gpu_cudnn.log.gz", 20, 20, 20),  # every cudnnBackendExecute is a conv
    ("gpu_cublas.log.gz", 16, 16, 16),
    ("gpu_cublaslt.log.gz", 12, 12, 8),  # 4 are cuDNN's batched Winograd matmuls (batchCount=36)
    ("cpu_torch_onednn.log.gz", 63, 15, 15),  # reorders have no FLOPs
    ("cpu_mxnet_onednn.log.gz", 90, 33, 33),
]


@pytest.mark.parametrize(("name", "rows", "with_flops", "with_layer"), CALL_LOGS)
def test_library_call_flops_agree_with_the_spec(name, rows, with_flops, with_layer):
    """Each call's FLOPs from its own logged sizes equal the spec's for its layer, direction and
    batch size (the batch from the logged shapes; for cuBLAS/cuBLASLt, whose shapes do not say
    which size is the batch, the GPU fixtures' recorded batch size)."""
    gpu_batch = json.loads((DATA / "gpu_fixtures.json").read_text())["batch_size"]
    df = read(DATA / name)
    assert len(df) == rows
    has = df[df["flops"].notna()]
    assert len(has) == with_flops
    layered = has[has["layer"].notna()]
    assert len(layered) == with_layer
    for _, r in layered.iterrows():
        batch = json.loads(r["shapes"])[0][0] if r["library"] in ("cuDNN", "oneDNN") else gpu_batch
        assert r["flops"] == layer_flops(r["layer"], r["direction"], batch), r.to_dict()
