"""MXNet on this machine before a long run: one convolution forward and backward against PyTorch's.

    python benches/mxnet_smoke.py TREE    # a tree of `kernelmap build-mxnet`, preloaded as kernelmap's worker
                                          # does it, on GPU 0 (benches/gpu_job.sh's smoke phase)
    python benches/mxnet_smoke.py         # the installed mxnet on the CPU (this script where there is no GPU)

Prints the preload, mxnet's version and features, and max |MXNet - PyTorch| of y, dx and dw (fp32: the GPU
job sets NVIDIA_TF32_OVERRIDE=0); exit 1 where one of them is over TOLERANCE times that tensor's largest
|PyTorch| value, so that a tree which runs but computes something else stops the job before its timed phases."""

from __future__ import annotations

import sys
import time

TOLERANCE = 1e-3  # relative to the tensor's largest magnitude: fp32 cuDNN against fp32 ATen differ by ~1e-6


def main(argv: list[str]) -> int:
    if argv:
        from kernelmap.frameworks.mxnet import built

        print("preload:", built.preload(argv[0]).describe())
        sys.path.insert(0, f"{argv[0]}/python")  # before numpy: the tree's numpy < 2 is MXNet's
    t0 = time.time()
    import mxnet as mx
    import numpy as np
    import torch

    print(f"mxnet {mx.__version__} ({mx.__file__}), numpy {np.__version__}, import {time.time() - t0:.1f} s")
    print("features:", [f.name for f in mx.runtime.Features().values()
                        if f.enabled and f.name in ("CUDA", "CUDNN", "NVTX", "BLAS_OPEN")])
    ctx = mx.gpu(0) if argv else mx.cpu()
    x = mx.nd.array(np.random.RandomState(0).rand(2, 1, 28, 28).astype("float32"), ctx=ctx)
    w = mx.nd.array(np.random.RandomState(1).rand(4, 1, 5, 5).astype("float32"), ctx=ctx)
    x.attach_grad()
    w.attach_grad()
    with mx.autograd.record():
        y = mx.nd.Convolution(x, w, kernel=(5, 5), num_filter=4, no_bias=True)
    y.backward()
    mx.nd.waitall()
    tx = torch.tensor(x.asnumpy(), requires_grad=True)
    tw = torch.tensor(w.asnumpy(), requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw)
    ty.backward(torch.ones_like(ty))
    bad = []
    for name, got, ref in (("y", y, ty.detach()), ("dx", x.grad, tx.grad), ("dw", w.grad, tw.grad)):
        diff = float(np.abs(got.asnumpy() - ref.numpy()).max())
        scale = float(np.abs(ref.numpy()).max())
        print(f"conv on {y.context}: max |mxnet - torch| of {name} {diff:.2e} (largest |torch| {scale:.2e})")
        if not diff <= TOLERANCE * scale:
            bad.append(name)
    if bad:
        print(f"MXNet's convolution differs from PyTorch's beyond {TOLERANCE:g} of the largest value: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
