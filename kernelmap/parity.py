"""``kernelmap parity``: do both frameworks compute the same model? (fp32, on the CPU or the GPU)

Each framework runs in its own subprocess (on the CPU the two concurrently, on the GPU one after the
other, with TF32 off in every library: ``spec.Math.FP32``) (``python -m kernelmap.parity --worker ...``, never
both in one process); both load the same initial weight file and train on the same batches in
the same order. Each writes an ``.npz``: logits of the first batch before any step, the loss of
each SGD step, the weights after the last step. The parent imports no framework and compares:

- ``forward_logits_max_abs_diff`` = max |a - b| over all logits of the first batch;
- ``loss_max_rel_diff`` = max over steps of |a - b| / |a|;
- ``weights_max_rel_diff[name]`` = max |a - b| / max |a| for each weight tensor (``a`` is the
  first framework, ``pytorch``), and ``weights_worst`` the largest of these.

Each must be <= 1e-4 (``TOLERANCES``); exit status 1 when one is broken.

``--frameworks A,B`` picks the pair (default pytorch,mxnet; A is the reference). A framework whose
dependencies clash with another's (JAX needs numpy >= 2, MXNet numpy < 1.24) runs its worker
under its own interpreter: ``--python FRAMEWORK=PATH`` or ``KERNELMAP_PYTHON_<FRAMEWORK>`` (e.g.
``KERNELMAP_PYTHON_JAX=/venvs/jax/bin/python``), which must have kernelmap importable; the
interpreter used is recorded in the figures (``python``).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import frameworks as registry
from .errors import KernelmapError, MissingToolError

FRAMEWORKS = (registry.FRAMEWORKS[0], registry.FRAMEWORKS[1])  # the default pair: the reference and the next
TOLERANCES = {"forward_logits_max_abs_diff": 1e-4, "loss_max_rel_diff": 1e-4, "weights_worst": 1e-4}
DEFINITIONS = {
    "forward_logits_max_abs_diff": "max |a-b| over the logits of the first batch, before any step",
    "loss_max_rel_diff": "max over steps of |a-b|/|a|, a = first framework's loss",
    "weights_max_rel_diff": "per tensor: max|a-b| / max|a| after the last step, a = first framework's",
    "weights_worst": "max of weights_max_rel_diff",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", default="auto", help="auto | fashion-mnist | mnist | synthetic | DIR (default auto)"
    )
    parser.add_argument(
        "--data-dir", default=None, help="directory of the IDX files for --data fashion-mnist/mnist"
    )
    parser.add_argument("--steps", type=int, default=20, help="SGD steps compared (default 20)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    for d in registry.REGISTRY.values():  # a framework's switches that name one of its modes (descriptor.mode_flags)
        for flag, mode in d.mode_flags.items():
            parser.add_argument(flag, dest="modes", action="append_const", const=(d.name, mode), default=[],
                                help=f"{d.label} in its {mode} mode (default: every framework's first mode)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="where both frameworks run (gpu: fp32 with TF32 off in every library)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per framework subprocess")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"the frameworks compared, reference first (default {','.join(FRAMEWORKS)})")
    parser.add_argument("--python", action="append", default=[], metavar="FRAMEWORK=PATH",
                        help="interpreter for that framework's worker (else KERNELMAP_PYTHON_<FRAMEWORK>, "
                             "else this one)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--out", default=None, help="also write the figures to this file (parity.json)")


def interpreters(frameworks, python: dict[str, str] | None = None) -> dict[str, str]:
    """Per framework, the interpreter its worker runs under: ``python[fw]``, else the environment's
    ``KERNELMAP_PYTHON_<FW>``, else this one."""
    return {fw: registry.get(fw).python(python) or sys.executable for fw in frameworks}


def parse_python(items: list[str]) -> dict[str, str]:
    """``--python FRAMEWORK=PATH`` arguments as a dict."""
    try:
        return registry.parse_python(items)
    except ValueError as exc:
        raise KernelmapError(str(exc)) from None


def check_available(frameworks=FRAMEWORKS, python: dict[str, str] | None = None) -> None:
    """Raise ``MissingToolError`` naming the fix for a framework that is not installed (no import):
    found neither on this interpreter's path nor on its own environment's PYTHONPATH (an MXNet built
    for this GPU by build-mxnet). A framework run under another interpreter is checked by its worker
    (exit 3 names the fix)."""
    where = interpreters(frameworks, python)
    for fw in frameworks:
        if fw not in registry.FRAMEWORKS:
            raise KernelmapError(f"parity: unknown framework {fw!r}; choose from {registry.FRAMEWORKS}")
        if where[fw] != sys.executable:
            continue
        own_path = [p for p in registry.get(fw).own_env().get("PYTHONPATH", "").split(os.pathsep) if p]
        for module in registry.get(fw).import_names:
            if importlib.util.find_spec(module) is None and importlib.machinery.PathFinder.find_spec(module, own_path) is None:
                raise MissingToolError(f"{fw}: python module {module!r} is not installed; "
                                       f"{registry.get(fw).install_fix}")


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.max(np.abs(a)))
    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray], names: list[str]) -> dict[str, Any]:
    """The figures of ``DEFINITIONS`` for two worker outputs (``a`` is the reference)."""
    la, lb = a["losses"].astype(np.float64), b["losses"].astype(np.float64)
    if la.shape != lb.shape:
        raise KernelmapError(f"the workers ran different numbers of steps ({la.size} and {lb.size})")
    with np.errstate(divide="ignore", invalid="ignore"):
        loss_rel = np.abs(la - lb) / np.abs(la)
    weights = {n: _relative(a[f"weight/{n}"], b[f"weight/{n}"]) for n in names}
    figures = {
        "forward_logits_max_abs_diff": float(np.max(np.abs(a["logits"].astype(np.float64) - b["logits"]))),
        "loss_max_rel_diff": float(np.max(loss_rel)) if loss_rel.size else 0.0,
        "loss_rel_diff_per_step": [float(x) for x in loss_rel],
        "weights_max_rel_diff": weights,
        "weights_worst": max(weights.values()),
    }
    failures = [
        f"{key} = {figures[key]:.3g} > {tol:g}"
        for key, tol in TOLERANCES.items()
        if not figures[key] <= tol  # NaN fails too
    ]
    figures["failures"] = failures
    figures["passed"] = not failures
    return figures


def worker_env(framework: str, device: str) -> dict[str, str]:
    """A parity worker's environment. CPU: no GPU visible (and the framework's own ``cpu_env``). GPU: fp32 with TF32 off in every library (``spec.Math.FP32``), and the
    framework's own GPU environment (an MXNet built for this GPU: its tree)."""
    from .frameworks import spec

    if device == "cpu":
        return dict(os.environ, CUDA_VISIBLE_DEVICES="", **registry.get(framework).cpu_env)
    return spec.Math.FP32.apply({**os.environ, **registry.get(framework).own_env()})


def _run_workers(workdir: Path, weights: Path, params: dict[str, Any], timeout: float,
                 frameworks=FRAMEWORKS, python: dict[str, str] | None = None) -> dict[str, dict]:
    """Start one worker per framework (concurrently on the CPU, one after the other on the GPU),
    wait for all, read their ``.npz`` files. Each worker has ``timeout`` seconds from its own start."""
    where = interpreters(frameworks, python)
    procs: dict[str, subprocess.Popen] = {}
    stderr: dict[str, str] = {}
    deadline: dict[str, float] = {}

    def finish(fw: str) -> None:
        try:
            stderr[fw] = procs[fw].communicate(timeout=max(deadline[fw] - time.monotonic(), 0.1))[1]
        except subprocess.TimeoutExpired:
            raise KernelmapError(f"parity: the {fw} worker took more than {timeout:g} s") from None

    try:
        for fw in frameworks:
            cmd = [where[fw], "-m", "kernelmap.parity", "--worker", fw, "--weights", str(weights)]
            cmd += ["--result", str(workdir / f"{fw}.npz"), "--params", json.dumps(params)]
            deadline[fw] = time.monotonic() + timeout
            procs[fw] = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=worker_env(fw, params["device"])
            )
            if params["device"] == "gpu":  # one GPU: no two frameworks contending for it
                finish(fw)
        errors, missing = {}, {}
        for fw, proc in procs.items():
            if fw not in stderr:
                finish(fw)
            if proc.returncode == MissingToolError.exit_code:
                missing[fw] = stderr[fw].strip().splitlines()[-1]
            elif proc.returncode != 0:
                tail = "\n".join(stderr[fw].strip().splitlines()[-15:])
                errors[fw] = f"the {fw} worker failed (exit {proc.returncode}):\n{tail}"
        if missing:
            raise MissingToolError("parity: " + "; ".join(missing.values()))
        if errors:
            raise KernelmapError("parity: " + "\n".join(errors.values()))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = {}
    for fw in frameworks:
        with np.load(workdir / f"{fw}.npz", allow_pickle=False) as npz:
            results[fw] = {k: npz[k] for k in npz.files}
        results[fw]["meta"] = json.loads(str(results[fw]["meta"]))
    return results


def compute_parity(
    *,
    data: str = "auto",
    data_dir: str | None = None,
    steps: int = 20,
    batch_size: int = 64,
    lr: float = 0.01,
    momentum: float = 0.9,
    seed: int = 0,
    modes: dict[str, str] | None = None,
    device: str = "cpu",
    timeout: float = 600.0,
    cache_dir: str | None = None,
    workdir: str | os.PathLike | None = None,
    frameworks: tuple[str, str] = FRAMEWORKS,
    python: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run both framework workers and return the figures (see the module docstring); prints nothing."""
    from .frameworks import data as data_mod
    from .frameworks import spec

    if steps < 1 or batch_size < 1:
        raise KernelmapError("parity: --steps and --batch-size must be at least 1")
    frameworks = tuple(frameworks)
    if len(frameworks) != 2 or frameworks[0] == frameworks[1]:
        raise KernelmapError(f"parity compares two different frameworks, not {list(frameworks)}")
    check_available(frameworks, python)
    config = spec.TrainConfig(
        batch_size=batch_size,
        lr=lr,
        momentum=momentum,
        steps=steps,
        seed=seed,
        data=data,
        data_dir=data_dir,
        device=device,
        math=spec.Math.FP32.value,
    )
    info = data_mod.resolve_data(config)
    if not info.synthetic:
        data_mod.prepare_dir(info, cache_dir)  # once, before two workers race for it
    params = {
        k: config.to_dict()[k]
        for k in ("batch_size", "lr", "momentum", "steps", "seed", "data", "data_dir", "device", "math")
    }
    params["cache_dir"] = cache_dir
    params["modes"] = {fw: m for fw, m in (modes or {}).items() if fw in frameworks}  # else its default mode
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernelmap-parity-", dir=workdir) as tmp:
        tmp = Path(tmp)
        weights = tmp / "initial_weights.npz"
        spec.save_weights(weights, spec.init_weights(seed))
        results = _run_workers(tmp, weights, params, timeout, frameworks, python)
    for fw, r in results.items():
        if r["meta"]["data_sha256"] != info.sha256:
            raise KernelmapError(f"parity: the {fw} worker read different data files than {info.path}")
    figures = compare(results[frameworks[0]], results[frameworks[1]], spec.weight_names())
    return {
        "frameworks": list(frameworks),
        "python": interpreters(frameworks, python),
        "device": device,
        "dtype": "float32",
        "math": "fp32 (TF32 off: NVIDIA_TF32_OVERRIDE=0 and each framework's switch)" if device == "gpu" else "fp32",
        "steps": steps,
        **figures,
        "tolerances": TOLERANCES,
        "definitions": DEFINITIONS,
        "losses": {fw: [float(x) for x in r["losses"]] for fw, r in results.items()},
        "versions": {fw: r["meta"]["versions"] for fw, r in results.items()},
        "modes": {fw: r["meta"]["mode"] for fw, r in results.items()},  # each worker's execution mode
        "config": params,
        "data": info.to_dict(),
        "wall_s": round(time.perf_counter() - started, 3),
    }


def format_text(result: dict[str, Any]) -> str:
    lines = [
        f"parity {' vs '.join(result['frameworks'])} on {result['device']} {result['math']}, "
        f"{result['steps']} SGD steps, data {result['data']['kind']} ({result['data']['path'] or 'generated'})",
        f"  forward logits max |a-b|     {result['forward_logits_max_abs_diff']:.3e}  (<= {TOLERANCES['forward_logits_max_abs_diff']:g})",
        f"  loss max |a-b|/|a| per step  {result['loss_max_rel_diff']:.3e}  (<= {TOLERANCES['loss_max_rel_diff']:g})",
        f"  weights max|a-b|/max|a|      {result['weights_worst']:.3e}  (<= {TOLERANCES['weights_worst']:g})",
    ]
    for name, v in result["weights_max_rel_diff"].items():
        lines.append(f"    {name:<14} {v:.3e}")
    first, last = (result["losses"][fw] for fw in result["frameworks"])
    lines.append(
        f"  loss step 1 / {result['steps']}: {first[0]:.6f} / {first[-1]:.6f} vs {last[0]:.6f} / {last[-1]:.6f}"
    )
    lines.append("PASS" if result["passed"] else "FAIL: " + "; ".join(result["failures"]))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    result = compute_parity(
        data=args.data,
        data_dir=args.data_dir,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        momentum=args.momentum,
        seed=args.seed,
        device=args.device,
        modes=dict(args.modes),
        timeout=args.timeout,
        frameworks=tuple(f.strip() for f in args.frameworks.split(",") if f.strip()),
        python=parse_python(args.python),
    )
    if args.out:
        from .atomic import atomic_file

        with atomic_file(args.out) as fh:
            json.dump(result, fh, indent=2)
    print(json.dumps(result, indent=2) if args.json else format_text(result))
    return 0 if result["passed"] else 1


# --- the worker: one framework, in its own process -------------------------------------------
def worker(framework: str, weights_path: str, result_path: str, params: dict[str, Any]) -> None:
    from .atomic import atomic_file
    from .frameworks import load_workload, spec

    cache_dir = params.pop("cache_dir", None)
    mode = params.pop("modes", {}).get(framework)  # None: its default mode
    config = spec.TrainConfig(**params, mode=mode)
    try:
        cls = load_workload(framework)
    except ImportError as exc:
        raise MissingToolError(f"{framework}: import failed ({exc}); {registry.get(framework).install_fix}") from exc
    workload = cls(config, cache_dir=cache_dir)
    workload.set_weights(spec.load_weights(weights_path))
    info = workload.data_info
    # the runs' batches (every one full, each epoch's partial batch dropped: spec.PARTIAL_BATCH_NOTE)
    order = spec.training_batches(info.n_train, config.seed, config.batch_size, config.steps).ravel()
    logits = None
    losses = []
    for images, labels in workload.batches("train", config.batch_size, order):
        if logits is None:
            logits = workload.forward(images)
        losses.append(workload.to_float(workload.train_step(images, labels)))
    workload.synchronize()
    meta = {"versions": workload.versions(), "data_sha256": info.sha256, "framework": framework, "mode": workload.mode}
    arrays = {f"weight/{k}": v for k, v in workload.get_weights().items()}
    with atomic_file(result_path, "wb") as fh:
        np.savez(
            fh, logits=logits, losses=np.asarray(losses, dtype=np.float64), meta=json.dumps(meta), **arrays
        )


def _worker_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernelmap.parity")
    p.add_argument("--worker", required=True, choices=registry.FRAMEWORKS)
    p.add_argument("--weights", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--params", required=True, help="JSON of TrainConfig fields")
    a = p.parse_args(argv)
    try:
        worker(a.worker, a.weights, a.result, json.loads(a.params))
    except KernelmapError as exc:
        print(f"kernelmap parity worker ({a.worker}): error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
