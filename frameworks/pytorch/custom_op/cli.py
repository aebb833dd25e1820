"""``kernelmap custom-op``: build kernelmap's custom op by a route, run the seed's AddModel example with
it, or check the custom-op CNN against the built-in one.

  kernelmap custom-op build    --route cmake [--device gpu]    build (or find in the cache) and load it
  kernelmap custom-op addmodel --route jit --device gpu         AddModel, 500 epochs, loss every 25
  kernelmap custom-op parity   --route setuptools               the CNN: custom fc1 vs built-in, fp32

Exit status: 0; 1 where AddModel did not converge or parity failed; 3 where a tool is missing.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import (  # (torch is imported by the actions only: `kernelmap --help`)
    ADDMODEL_EPOCHS,
    ADDMODEL_N,
    ROUTES,
)

ACTIONS = ("build", "addmodel", "parity")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--route", choices=ROUTES, required=True, help="how the op is built and called")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="cpu: the C++ kernel; gpu: the CUDA kernel (needs nvcc)")
    parser.add_argument("--epochs", type=int, default=ADDMODEL_EPOCHS, help="addmodel: epochs (default 500)")
    parser.add_argument("--n", type=int, default=ADDMODEL_N, help="addmodel: vector length (default 2^20)")
    parser.add_argument("--trace-dir", help="addmodel: profile the last epochs into DIR/trace.json.gz")
    parser.add_argument("--steps", type=int, default=20, help="parity: SGD steps (default 20)")
    parser.add_argument("--batch-size", type=int, default=64, help="parity: batch size (default 64)")
    parser.add_argument("--data", default="synthetic", help="parity: data as `kernelmap run --data` (default synthetic)")
    parser.add_argument("--out", help="also write the result as JSON to this file")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def compute(args: argparse.Namespace) -> tuple[dict, bool]:
    """(the result, whether it passed)."""
    if args.action == "build":
        from .build import load

        info = load(args.route, args.device == "gpu").info()
        return info, True
    if args.action == "addmodel":
        from . import addmodel

        r = addmodel.train(args.route, args.device, n=args.n, epochs=args.epochs, trace_dir=args.trace_dir)
        return r, r["converged"]
    from .parity import custom_parity

    r = custom_parity(args.route, args.device, steps=args.steps, batch_size=args.batch_size, data=args.data)
    return r, r["passed"]


def format_text(action: str, result: dict) -> str:
    if action == "build":
        how = f"built in {result['build_s']:.1f} s" if result["built"] else "found in the cache (nothing compiled)"
        return f"custom op ({result['route']} route, {'CUDA' if result['cuda'] else 'CPU'}): {how}: {result['artifact']}"
    if action == "addmodel":
        from . import addmodel

        return addmodel.format_text(result)
    from .parity import format_text as parity_text

    return parity_text(result)


def main(args: argparse.Namespace) -> int:
    result, ok = compute(args)
    if args.out:
        from kernelmap.atomic import atomic_file

        with atomic_file(args.out) as fh:
            json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1) if args.json else format_text(args.action, result))
    sys.stdout.flush()
    return 0 if ok else 1
