"""FLOPs of conv/linear work from the spec's shapes (used by the roofline)."""

from kernelmap.flops import layer_flops


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
