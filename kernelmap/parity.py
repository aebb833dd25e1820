"""``kernelmap parity``: do both frameworks compute the same model? (fp32, on the CPU or the GPU)

Each framework runs in its own subprocess (on the CPU the two concurrently, on the GPU one after the
other, with TF32 off in every library: ``spec.Math.FP32``) (``python -m kernelmap.parity --worker ...``, never
both in one process); both load the same initial weight file and train on the same batches in
the same order. Each writes an ``.npz``: logits of the first batch before any step, the loss of
each SGD step, the weights after each of the first 3 steps and after the last, and each tensor's path. The parent
imports no framework and compares:

- ``forward_logits_max_rel_diff`` = max |a - b| / max |a| over the logits of the first batch (``a``: the first
  framework, ``pytorch``), and ``loss_first_diff_over_logits`` (below);
- ``weights_early_diff_per_path[name]`` = per weight tensor, the largest over the first ``EARLY_STEPS`` = 3 steps k
  of ||a_k - b_k||_2 over the reference's path to k (the sum over j <= k of ||a_j - a_(j-1)||_2); both start from
  the same weights, so this is the first updates' relative difference; ``weights_early_worst`` the largest;
- reported, not held: ``loss_max_rel_diff`` (max over steps of |a - b| / |a|), ``weights_max_rel_diff`` (per tensor
  max |a - b| / max |a| after the last step), ``weights_max_diff_per_path`` (||a - b||_2 after the last step over the
  whole path), each with its worst.

fp32 (TF32 off), the rule (``tolerances``; exit status 1 when a held figure is past it). Two fp32 implementations
differ only in the order of their sums (cuDNN's, XLA's, oneDNN's kernels). (i) **The forward**: a layer of fan-in n
sums n products per output; a sum in another order moves by about sqrt(n) u of its terms' scale (probabilistic
rounding analysis, Higham and Mary 2019; the worst case, n u, is never approached), u = 2**-24; the layers in a row
add, so per side u * (sqrt(9) + sqrt(288) + sqrt(3136) + sqrt(128)) = 87.3 u, both sides 175 u = 1.04e-5
(``fp32_forward_tolerance``), held on the logits and on the first loss (as at a mixed math, below). (ii) **The first
updates**: argument (1) below holds at fp32 too: a forward difference of relative size d switches a fraction
``SWITCH_DENSITY`` x d of the ReLU gates and max-pool windows (4.2, counted at bf16 and fp16), and a switched
fraction f moves an update by ``SWITCH_GRADIENT`` x sqrt(f) of itself (0.44, the largest of the first-update
errors measured at bf16 and fp16, 0.27 to 0.44); with d = the forward bound, 0.44 sqrt(4.2 x 1.04e-5) = 2.9e-3
(``fp32_update_tolerance``), held on the weights after each of the first 3 steps relative to their path (momentum
acts from the second step; by the third training has not yet amplified a difference, argument (2)). Measured on
the CPU (Fashion-MNIST; docs/MIXED_PRECISION.md): PyTorch against JAX 9.4e-6 (bs 64) and 2.1e-4 (bs 1024), over
data seeds 0-17 at bs 64 at most 1.26e-3 (one conv1 pooling window switched: a single switch is heavy-tailed at a
small batch); PyTorch 1 thread against 2, 9.3e-5 and 5.0e-5; the initial weights perturbed by 1e-7, up to 3.1e-4,
by 1e-6 (3-5x the real forward difference) up to 1.88e-3; each planted bug fails it: lr x 1.01 1.0e-2 to 1.3e-2,
momentum 0.85 for 0.9 3.6e-2 to 3.8e-2, a dropped bias update 1.0, and fc1's input in another order fails the forward
(logits 0.92 of max) (tests/test_parity.py). (iii) **The 20-step figures are reported**: argument (2) below: on the
H200 at bs 1024 the same command ended fc1.weight 4.4e-4, 3.75e-6 and 1.14e-3 (max|a-b|/max|a|) apart.
The custom op's parity (one framework, one process) keeps the older figures held to 1e-4 (``TOLERANCES``).

Per math (``--math fp32 bf16 fp16``, issue 38): the pair is compared at each math, and a framework at a mixed math
(bf16, fp16) is also compared with itself at fp32 (``--frameworks pytorch`` alone: only that). A low-precision
side's tolerance is derived from the format, not picked (``mixed_tolerance``), and holds what the derivation
covers, the forward: a conv or linear layer rounds its input and its weight to the low precision and its output
once more, three roundings of relative size u = 2**-(mantissa bits + 1) (bfloat16: 2**-8 = 3.9e-3; float16: 2**-11
= 4.9e-4), accumulating in fp32; ReLU and max pool move no value by more than their input moved (1-Lipschitz); the
L = 4 layers in a row give 3 L u relative to the output's scale, per low-precision side (two sides: the sum): bf16
against fp32 3 * 4 * 2**-8 = 0.047, bf16 against bf16 0.094, fp16 against fp32 0.0059. Checked: the first batch's
logits (``forward_logits_max_rel_diff``) and the first step's loss, which is those logits' log-softmax + NLL, a
function that moves at most 2 max|dz| (its gradient p - onehot has an absolute sum <= 2): ``loss_first_diff_over_logits``
= |a-b| of the first loss over 2 max|logits of a| <= the same bound.

Not checked for a mixed side, reported (docs/MIXED_PRECISION.md has the measurements): the first updates (the
fp32 rule's law with d = the mixed forward bound gives 0.44 sqrt(4.2 x 0.047) = 0.19 at bf16 against fp32, 0.069
at fp16: past a planted 1% bug, so it would hold nothing the forward does not), every later step's loss
(``loss_max_rel_diff``) and the weights after the steps (``weights_max_diff_per_path``: ||a-b||_2 over the sum of
each step's ||w_k - w_(k-1)||_2, the reference's). No bound linear in u holds for them: (1) the backward goes through
the derivatives of ReLU and max pool, which are steps: a rounding that carries an input across zero or across its
window's maximum moves a whole term of a weight gradient's sum; such switches are a fraction ~u of the elements,
their terms add in quadrature, so the gradient's relative error goes as sqrt(u), not u (measured, JAX on the CPU,
the first update: conv tensors 4.2e-2 at bf16, 1.3e-2 at fp16, a ratio 0.31 where sqrt(2**-11 / 2**-8) = 0.35; the
loss scale changes nothing); (2) training amplifies any difference: the fp32 step from initial weights perturbed
by 1e-5 relative ends 20 steps 1.6e-2 of its path away (1e-7: 4.7e-5). Convergence (``convergence``): each side's
loss at the first and last step and its test-set accuracy after the steps, reported per math (no tolerance on
accuracy: said, not checked).

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
from .frameworks import dataparallel
from .frameworks.spec import Math

FP32 = Math.FP32.value  # the reference math: TF32 off
PARITY_MATHS = tuple(m.value for m in Math if not m.tf32)  # tf32: not compared (check_maths)

FRAMEWORKS = (registry.FRAMEWORKS[0], registry.FRAMEWORKS[1])  # the default pair: the reference and the next
# one framework against itself in one process (the custom op's parity): the old, undivided 1e-4 rule
TOLERANCES = {"forward_logits_max_abs_diff": 1e-4, "loss_max_rel_diff": 1e-4, "weights_worst": 1e-4}
ROUNDINGS_PER_LAYER = 3  # a mixed-precision conv/linear rounds its input, its weight and its output
EARLY_STEPS = 3  # fp32: the updates held (momentum acts from the second; feedback has not yet amplified)
SWITCH_DENSITY = 4.2  # gates (max-pool windows) switched per gate per unit relative perturbation (bf16, fp16: 4.2, 4.1)
SWITCH_GRADIENT = 0.44  # first update's relative error / sqrt(switched fraction), the largest measured (0.27..0.44)
DEFINITIONS = {
    "forward_logits_max_abs_diff": "max |a-b| over the logits of the first batch, before any step",
    "loss_max_rel_diff": "max over steps of |a-b|/|a|, a = first framework's loss",
    "weights_max_rel_diff": "per tensor: max|a-b| / max|a| after the last step, a = first framework's",
    "weights_worst": "max of weights_max_rel_diff",
    "forward_logits_max_rel_diff": "max |a-b| / max |a| over the logits of the first batch, before any step",
    "weights_max_diff_per_path": "per tensor: ||a-b||_2 after the last step / the sum over steps of ||a_k - a_(k-1)||_2",
    "weights_worst_per_path": "max of weights_max_diff_per_path",
    "loss_first_diff_over_logits": "|a-b| of the first step's loss / (2 max|a| over the first batch's logits)",
    "weights_early_diff_per_path": f"per tensor: max over the first {EARLY_STEPS} steps k of ||a_k-b_k||_2 / the sum "
                                   "over steps j <= k of ||a_j - a_(j-1)||_2 (both start from the same weights)",
    "weights_early_worst": "max of weights_early_diff_per_path",
    "weights_early_per_step": "per step k of the first ones: the largest tensor's ||a_k-b_k||_2 / its path to k",
}
# a comparison's figures reported but not held to a bound (the module docstring says why)
REPORTED_MIXED = ("loss_max_rel_diff", "weights_worst_per_path")
REPORTED_FP32 = ("loss_max_rel_diff", "weights_worst", "weights_worst_per_path")


def mixed_tolerance(maths: tuple[str, str]) -> float | None:
    """The relative tolerance of a comparison whose sides run ``maths`` (module docstring): 3 L u summed over the
    low-precision sides, u = 2**-(mantissa bits + 1) of each; None where neither side is mixed (``TOLERANCES``)."""
    from .frameworks import spec

    sides = [spec.Math(m) for m in maths if spec.Math(m).mixed]
    if not sides:
        return None
    return ROUNDINGS_PER_LAYER * len(spec.LAYERS) * sum(2.0 ** -(m.mantissa_bits + 1) for m in sides)


def fp32_forward_tolerance() -> float:
    """Two fp32 sides that sum in different orders (module docstring): per side u * sum over the layers of
    sqrt(fan-in), the probabilistic scale of a reordered sum's error, u = 2**-24; both sides: twice that."""
    from .frameworks import spec

    u = 2.0 ** -(spec.Math.FP32.mantissa_bits + 1)
    return 2 * u * sum(float(np.sqrt(np.prod(layer.weight_shape[1:]))) for layer in spec.LAYERS)


def fp32_update_tolerance() -> float:
    """The first updates' relative error at fp32 (module docstring, argument (1)): gates switched by a forward
    difference of at most ``fp32_forward_tolerance`` are a fraction SWITCH_DENSITY times it, and move the update by
    SWITCH_GRADIENT times the square root of that fraction."""
    return SWITCH_GRADIENT * float(np.sqrt(SWITCH_DENSITY * fp32_forward_tolerance()))


def tolerances(maths: tuple[str, str]) -> dict[str, float]:
    """Each checked figure's tolerance for a comparison of sides at ``maths``."""
    tol = mixed_tolerance(maths)
    if tol is None:
        tol = fp32_forward_tolerance()
        return {"forward_logits_max_rel_diff": tol, "loss_first_diff_over_logits": tol,
                "weights_early_worst": fp32_update_tolerance()}
    return {"forward_logits_max_rel_diff": tol, "loss_first_diff_over_logits": tol}


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
    parser.add_argument("--math", nargs="+", default=[FP32], choices=PARITY_MATHS, metavar="MATH",
                        help="the maths compared: the pair at each, and each framework at a mixed math (bf16, fp16) "
                             "against itself at fp32 where fp32 is given; tolerances derived per math (the module's "
                             "docstring). Default fp32")
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


def _first_loss(la: np.ndarray, lb: np.ndarray, logits: np.ndarray) -> float:
    """|a-b| of the first step's loss over twice the largest first-batch logit of a (the module docstring)."""
    if not la.size:
        return 0.0
    scale = 2.0 * float(np.max(np.abs(logits)))
    diff = abs(float(la[0]) - float(lb[0]))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def _per_path(a: dict[str, np.ndarray], b: dict[str, np.ndarray], name: str) -> float:
    """||a - b||_2 of one weight tensor over the distance the reference's tensor travelled (``path/<name>``: the sum
    over steps of ||w_k - w_(k-1)||_2); NaN for a worker that did not record it."""
    if f"path/{name}" not in a:
        return float("nan")
    travelled = float(a[f"path/{name}"])
    diff = float(np.linalg.norm(a[f"weight/{name}"].astype(np.float64) - b[f"weight/{name}"]))
    return diff / travelled if travelled > 0 else (0.0 if diff == 0 else float("inf"))


def _early(a: dict[str, np.ndarray], b: dict[str, np.ndarray], names: list[str]) -> tuple[dict[str, float], list]:
    """Per tensor the largest ``||a_k - b_k||_2 / path_k`` over the first steps (``early/<name>``: the weights after
    each, ``early_path/<name>``: the reference's distance travelled up to each), and per step the largest tensor's;
    NaN for a worker that did not record them (a version before this rule)."""
    if any(f"early/{n}" not in x for n in names for x in (a, b)):
        return {n: float("nan") for n in names}, []
    per_step = []
    for n in names:
        wa, wb = a[f"early/{n}"].astype(np.float64), b[f"early/{n}"].astype(np.float64)
        diff = np.array([np.linalg.norm(wa[k] - wb[k]) for k in range(min(len(wa), len(wb)))])
        travelled = a[f"early_path/{n}"][: len(diff)].astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_step.append(np.where(travelled > 0, diff / travelled, np.where(diff == 0, 0.0, np.inf)))
    worst = {n: float(np.max(r)) if r.size else 0.0 for n, r in zip(names, per_step, strict=True)}
    return worst, [float(x) for x in np.max(np.vstack(per_step), axis=0)] if per_step[0].size else []


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray], names: list[str],
            limits: dict[str, float] | None = None) -> dict[str, Any]:
    """The figures of ``DEFINITIONS`` for two worker outputs (``a`` is the reference), checked against ``limits``
    (default ``TOLERANCES``: fp32)."""
    la, lb = a["losses"].astype(np.float64), b["losses"].astype(np.float64)
    if la.shape != lb.shape:
        raise KernelmapError(f"the workers ran different numbers of steps ({la.size} and {lb.size})")
    with np.errstate(divide="ignore", invalid="ignore"):
        loss_rel = np.abs(la - lb) / np.abs(la)
    weights = {n: _relative(a[f"weight/{n}"], b[f"weight/{n}"]) for n in names}
    per_path = {n: _per_path(a, b, n) for n in names}
    early, early_steps = _early(a, b, names)
    figures = {
        "forward_logits_max_abs_diff": float(np.max(np.abs(a["logits"].astype(np.float64) - b["logits"]))),
        "forward_logits_max_rel_diff": _relative(a["logits"], b["logits"]),
        "loss_first_diff_over_logits": _first_loss(la, lb, a["logits"]),
        "loss_max_rel_diff": float(np.max(loss_rel)) if loss_rel.size else 0.0,
        "loss_rel_diff_per_step": [float(x) for x in loss_rel],
        "weights_max_rel_diff": weights,
        "weights_worst": max(weights.values()),
        "weights_max_diff_per_path": per_path,
        "weights_worst_per_path": max(per_path.values()),
        "weights_early_diff_per_path": early,
        "weights_early_worst": float(np.max(list(early.values()))),  # NaN where not recorded: fails
        "weights_early_per_step": early_steps,
    }
    failures = [
        f"{key} = {figures[key]:.3g} > {tol:g}"
        for key, tol in (limits or TOLERANCES).items()
        if not figures[key] <= tol  # NaN fails too
    ]
    figures["failures"] = failures
    figures["passed"] = not failures
    return figures


def worker_env(framework: str, device: str, math: str = FP32) -> dict[str, str]:
    """A parity worker's environment. CPU: no GPU visible (and the framework's own ``cpu_env``). GPU: the math's
    rule (``spec.Math.apply``: fp32, bf16 and fp16 with TF32 off in every library), and the framework's own GPU
    environment (an MXNet built for this GPU: its tree)."""
    from .frameworks import spec

    if device == "cpu":
        return dict(os.environ, CUDA_VISIBLE_DEVICES="", **registry.get(framework).cpu_env)
    return spec.Math(math).apply({**os.environ, **registry.get(framework).own_env()})


def _side_name(side: tuple[str, str]) -> str:
    """A worker's name: its framework, and its math where that is not fp32 (``pytorch``, ``pytorch-bf16``)."""
    fw, math = side
    return fw if math == FP32 else f"{fw}-{math}"


def _run_workers(workdir: Path, weights: Path, params: dict[str, Any], timeout: float,
                 sides: list[tuple[str, str]], python: dict[str, str] | None = None) -> dict[tuple[str, str], dict]:
    """Start one worker per side (framework, math) (concurrently on the CPU, one after the other on the GPU),
    wait for all, read their ``.npz`` files. Each worker has ``timeout`` seconds from its own start."""
    where = interpreters(dict.fromkeys(fw for fw, _ in sides), python)
    procs: dict[str, subprocess.Popen] = {}
    stderr: dict[str, str] = {}
    deadline: dict[str, float] = {}

    def finish(name: str) -> None:
        try:
            stderr[name] = procs[name].communicate(timeout=max(deadline[name] - time.monotonic(), 0.1))[1]
        except subprocess.TimeoutExpired:
            raise KernelmapError(f"parity: the {name} worker took more than {timeout:g} s") from None

    try:
        for side in sides:
            fw, name = side[0], _side_name(side)
            cmd = [where[fw], "-m", "kernelmap.parity", "--worker", fw, "--weights", str(weights)]
            cmd += ["--result", str(workdir / f"{name}.npz"), "--params", json.dumps({**params, "math": side[1]})]
            deadline[name] = time.monotonic() + timeout
            procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           env=worker_env(fw, params["device"], side[1]))
            if params["device"] == "gpu":  # one GPU: no two workers contending for it
                finish(name)
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
    for side in sides:
        with np.load(workdir / f"{_side_name(side)}.npz", allow_pickle=False) as npz:
            results[side] = {k: npz[k] for k in npz.files}
        results[side]["meta"] = json.loads(str(results[side]["meta"]))
    return results


def check_maths(frameworks: tuple[str, ...], maths: tuple[str, ...], device: str) -> None:
    """KernelmapError unless every side can run: one or two frameworks (one: each mixed math against its own fp32,
    which must be asked for), each math once, a math parity compares (not tf32: no tolerance of its own), and each
    framework able to run it on ``device`` (``frameworks.math_refusal``)."""
    from .frameworks import spec

    if len(frameworks) not in (1, 2) or len(set(frameworks)) != len(frameworks):
        raise KernelmapError(f"parity compares two different frameworks (or one across maths), not {list(frameworks)}")
    if not maths or len(set(maths)) != len(maths):
        raise KernelmapError(f"parity --math {' '.join(maths)}: each math once")
    for m in maths:
        if spec.Math(m).tf32:
            raise KernelmapError("parity --math tf32: not compared (TF32's rounding is the library's choice per call; "
                                 "parity holds fp32 with TF32 off, and bf16/fp16 to their derived tolerance)")
        for fw in frameworks:
            if (why := registry.math_refusal(fw, m, device)) is not None:
                raise KernelmapError(f"parity --math {m}: {why}")
    if len(frameworks) == 1 and not (FP32 in maths and any(spec.Math(m).mixed for m in maths)):
        raise KernelmapError(f"parity --frameworks {frameworks[0]}: one framework is compared with itself across "
                             "maths: give --math fp32 and a mixed one (bf16, fp16)")


def comparisons(frameworks: tuple[str, ...], maths: tuple[str, ...]) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """(reference side, other side) pairs, each side (framework, math): the two frameworks at each math, then each
    framework at each mixed math against itself at fp32 (where fp32 was asked for)."""
    from .frameworks import spec

    pairs = [((frameworks[0], m), (frameworks[1], m)) for m in maths] if len(frameworks) == 2 else []
    if FP32 in maths:
        pairs += [((fw, FP32), (fw, m)) for m in maths if spec.Math(m).mixed for fw in frameworks]
    return pairs


def convergence(results: dict[tuple[str, str], dict]) -> list[dict[str, Any]]:
    """Per side: its loss at the first and the last step and its test-set accuracy after the steps."""
    return [{"framework": fw, "math": m, "loss_first": float(r["losses"][0]), "loss_last": float(r["losses"][-1]),
             "test_accuracy": r["meta"].get("test_accuracy")} for (fw, m), r in results.items()]


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
    frameworks: tuple[str, ...] = FRAMEWORKS,
    python: dict[str, str] | None = None,
    maths: tuple[str, ...] = (FP32,),
) -> dict[str, Any]:
    """Run every side's worker (framework x math) and return the figures (see the module docstring); prints
    nothing. The first comparison's figures also sit at the top level (the fp32 pair, as before maths)."""
    from .frameworks import data as data_mod
    from .frameworks import spec

    if steps < 1 or batch_size < 1:
        raise KernelmapError("parity: --steps and --batch-size must be at least 1")
    frameworks, maths = tuple(frameworks), tuple(maths)
    check_maths(frameworks, maths, device)
    check_available(frameworks, python)
    config = spec.TrainConfig(batch_size=batch_size, lr=lr, momentum=momentum, steps=steps, seed=seed, data=data,
                              data_dir=data_dir, device=device)
    info = data_mod.resolve_data(config)
    if not info.synthetic:
        data_mod.prepare_dir(info, cache_dir)  # once, before two workers race for it
    params = {k: config.to_dict()[k] for k in ("batch_size", "lr", "momentum", "steps", "seed", "data", "data_dir",
                                                "device")}
    params["cache_dir"] = cache_dir
    params["modes"] = {fw: m for fw, m in (modes or {}).items() if fw in frameworks}  # else its default mode
    started = time.perf_counter()
    sides = [(fw, m) for m in maths for fw in frameworks]
    with tempfile.TemporaryDirectory(prefix="kernelmap-parity-", dir=workdir) as tmp:
        tmp = Path(tmp)
        weights = tmp / "initial_weights.npz"
        spec.save_weights(weights, spec.init_weights(seed))
        results = _run_workers(tmp, weights, params, timeout, sides, python)
    for side, r in results.items():
        if r["meta"]["data_sha256"] != info.sha256:
            raise KernelmapError(f"parity: the {_side_name(side)} worker read different data files than {info.path}")
    compared = []
    for a, b in comparisons(frameworks, maths):
        limits = tolerances((a[1], b[1]))
        figures = compare(results[a], results[b], spec.weight_names(), limits)
        compared.append({"sides": [_side_name(a), _side_name(b)], "maths": [a[1], b[1]], **figures,
                         "tolerances": limits, "reported": [k for k in dict.fromkeys(REPORTED_MIXED + REPORTED_FP32) if k not in limits]})
    first = compared[0]
    return {
        "frameworks": list(frameworks),
        "python": interpreters(frameworks, python),
        "device": device,
        "dtype": "float32 weights" + ("" if maths == (FP32,) else f"; compute per math: {', '.join(maths)}"),
        "math": ", ".join(maths) + (" (TF32 off: NVIDIA_TF32_OVERRIDE=0 and each framework's switch)"
                                    if device == "gpu" else ""),
        "maths": list(maths),
        "steps": steps,
        **{k: v for k, v in first.items() if k not in ("sides", "maths")},
        "comparisons": compared,
        "passed": all(c["passed"] for c in compared),
        "failures": [f"{' vs '.join(c['sides'])}: {f}" for c in compared for f in c["failures"]],
        "definitions": DEFINITIONS,
        "losses": {_side_name(side): [float(x) for x in r["losses"]] for side, r in results.items()},
        "convergence": convergence(results),
        "versions": {_side_name(side): r["meta"]["versions"] for side, r in results.items()},
        "modes": {_side_name(side): r["meta"]["mode"] for side, r in results.items()},  # each worker's execution mode
        "config": params,
        "data": info.to_dict(),
        "wall_s": round(time.perf_counter() - started, 3),
    }


def _held(c: dict[str, Any], key: str) -> str:
    """A figure of comparison ``c`` and its verdict's basis: its tolerance, or that it is reported only."""
    t = c["tolerances"]
    return f"{c[key]:.3e}  " + (f"(<= {t[key]:.3g})" if key in t else "(reported)")


def format_text(result: dict[str, Any]) -> str:
    lines = [
        f"parity {' vs '.join(result['frameworks'])} on {result['device']} {result['math']}, "
        f"{result['steps']} SGD steps, data {result['data']['kind']} ({result['data']['path'] or 'generated'})",
    ]
    for c in result["comparisons"]:
        early = c["weights_early_per_step"]
        lines += [f"  {' vs '.join(c['sides'])}",
                  f"    forward logits max|a-b|/max|a|  {_held(c, 'forward_logits_max_rel_diff')}",
                  f"    first loss |a-b|/(2 max|logit|) {_held(c, 'loss_first_diff_over_logits')}",
                  f"    first {len(early)} updates ||a-b||/path    {_held(c, 'weights_early_worst')}"
                  + (f"  per step {' '.join(f'{x:.2e}' for x in early)}" if early else ""),
                  f"    loss max |a-b|/|a| per step     {_held(c, 'loss_max_rel_diff')}",
                  f"    weights max|a-b|/max|a|         {_held(c, 'weights_worst')}",
                  f"    weights ||a-b||/path            {_held(c, 'weights_worst_per_path')}"]
        lines += [f"      {name:<14} {v:.3e}  per path {c['weights_max_diff_per_path'][name]:.3e}  first steps "
                  f"{c['weights_early_diff_per_path'][name]:.3e}" for name, v in c["weights_max_rel_diff"].items()]
        lines.append("    " + ("pass" if c["passed"] else "FAIL: " + "; ".join(c["failures"])))
    lines.append(f"  convergence after {result['steps']} steps (loss first -> last, test accuracy):")
    for c in result["convergence"]:
        acc = f"{c['test_accuracy']:.4f}" if c["test_accuracy"] is not None else "-"
        lines.append(f"    {c['framework']:<8} {c['math']:<5} {c['loss_first']:.6f} -> {c['loss_last']:.6f}  {acc}")
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
        maths=tuple(args.math),
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
    before = workload.get_weights()
    path = {k: 0.0 for k in before}  # per tensor: the sum over steps of ||w_k - w_(k-1)||_2, how far it travelled
    early: list[dict[str, np.ndarray]] = []  # the weights after each of the first EARLY_STEPS steps
    early_path: list[dict[str, float]] = []  # and the path up to each
    for images, labels in workload.batches("train", config.batch_size, order):
        if logits is None:
            logits = workload.forward(images)
        losses.append(workload.to_float(workload.train_step(images, labels)))
        after = workload.get_weights()
        for k, w in after.items():
            path[k] += float(np.linalg.norm(w.astype(np.float64) - before[k]))
        if len(early) < EARLY_STEPS:
            early.append(after)
            early_path.append(dict(path))
        before = after
    workload.synchronize()
    meta = {"versions": workload.versions(), "data_sha256": info.sha256, "framework": framework, "mode": workload.mode,
            "math": config.math, "test_accuracy": float(workload.evaluate())}  # convergence: after the steps
    arrays = {f"weight/{k}": v for k, v in workload.get_weights().items()}
    arrays.update({f"path/{k}": np.float64(v) for k, v in path.items()})
    arrays.update({f"early/{k}": np.stack([w[k] for w in early]) for k in path})
    arrays.update({f"early_path/{k}": np.array([p[k] for p in early_path], dtype=np.float64) for k in path})
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
    dataparallel.die_with_launcher()  # a rank of kernelmap/devparity.py's launch: not past its launcher
    try:
        worker(a.worker, a.weights, a.result, json.loads(a.params))
    except KernelmapError as exc:
        print(f"kernelmap parity worker ({a.worker}): error: {exc}", file=sys.stderr)
        return exc.exit_code
    if dataparallel.is_rank():  # out of its process group, as the run's workers (PyTorch warned at exit: 4x H200)
        registry.load_parallel(a.worker).leave()
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
