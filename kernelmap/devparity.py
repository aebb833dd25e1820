"""Parity across device counts (issue 39): does a framework's step on N devices compute its step on one?

``kernelmap parity``'s worker (``python -m kernelmap.parity --worker``) trains the framework twice from the
same weight file on the same global batches in the same order: on one device, and on ``N`` (``TrainConfig.
devices``: each device its slice of every global batch, ``frameworks/dataparallel.py``; one process per
device where the framework runs so, the ranks started here). Figures (the 1-device run is ``a``):

- ``loss_max_rel_diff``: max over steps of |a - b| / |a| (the N-device loss is the global batch's: the
  mean over the devices' slices);
- ``weights_max_rel_diff[name]``: max |a - b| / max |a| per weight tensor after the last step, and
  ``weights_worst``, the largest.

Tolerance (``TOLERANCES``): 1e-5 for both. Both runs do the same arithmetic but for the order of the sums
over the batch: a gradient is the sum over the devices of the sums over their slices instead of one sum
(and on the CPU the libraries block their sums by the batch they are given). In float32 each reordered sum
differs by a few units of 2^-24 (6e-8) relative; momentum SGD carries the differences from step to step,
and they grow with the steps: measured on the CPU after 8 steps at batch 32, N = 2, synthetic data, they
stay below 2e-7 in every framework (docs/DEVICES.md lists the figures): 1e-5 leaves them a margin of 50. A
real fault is far beyond it: the same 8 steps on one device at batch 16, half the global batch, end 0.2 apart
(relative, the worst weight) in every framework; the tests check that this fails.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import frameworks as registry
from .errors import KernelmapError
from .frameworks import dataparallel, spec
from .parity import interpreters, worker_env

TOLERANCES = {"loss_max_rel_diff": 1e-5, "weights_worst": 1e-5}


def _worker_cmds(framework: str, devices: int, python: str, weights: Path, result: Path,
                 params: dict[str, Any]) -> list[list[str]]:
    """The parity worker's command, once per rank where the framework runs a process per device (rank
    ``r > 0`` writes ``<result>.rank<r>.npz``, kept apart), else once."""
    dp = registry.get(framework).data_parallel
    ranks = devices if devices > 1 and dp is not None and dp.processes else 1
    base = [python, "-m", "kernelmap.parity", "--worker", framework, "--weights", str(weights),
            "--params", json.dumps(dict(params, devices=devices))]
    return [[*base, "--result", str(result if r == 0 else result.with_suffix(f".rank{r}.npz"))]
            for r in range(ranks)]


def run_one(framework: str, devices: int, params: dict[str, Any], weights: Path, result: Path,
            python: str, timeout: float) -> dict[str, np.ndarray]:
    """Train ``framework`` on ``devices`` devices (the parity worker's figures, rank 0's file)."""
    d = registry.get(framework)
    why = dataparallel.refusal(d, params["modes"].get(framework) or d.default_mode, devices)
    if why:
        raise KernelmapError(why)
    env = worker_env(framework, params["device"])
    if devices > 1:
        env = dataparallel.case_env(env, d.data_parallel, devices, params["device"])
    cmds = _worker_cmds(framework, devices, python, weights, result, params)
    if len(cmds) > 1:
        rc = dataparallel.launch(cmds, env, quiet_ranks=True, timeout=timeout)
        detail = "its ranks' stderr above"
    else:
        try:
            proc = subprocess.run(cmds[0], env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise KernelmapError(f"devices parity: {framework} on {devices} devices took more than {timeout:g} s") from None
        rc, detail = proc.returncode, "\n".join(proc.stderr.strip().splitlines()[-15:])
    if rc != 0:
        raise KernelmapError(f"devices parity: {framework} on {devices} devices failed (exit {rc}): {detail}")
    with np.load(result, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def relative(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |a| in float64 (0 where both are zero)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale, diff = float(np.max(np.abs(a64))), float(np.max(np.abs(a64 - b64)))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def figures(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, Any]:
    """``DEFINITIONS``' figures of the 1-device run ``a`` against the N-device run ``b``."""
    la, lb = a["losses"].astype(np.float64), b["losses"].astype(np.float64)
    if la.shape != lb.shape:
        raise KernelmapError(f"the runs trained different numbers of steps ({la.size} and {lb.size})")
    weights = {n: relative(a[f"weight/{n}"], b[f"weight/{n}"]) for n in spec.weight_names()}
    out = {"loss_max_rel_diff": float(np.max(np.abs(la - lb) / np.abs(la))) if la.size else 0.0,
           "weights_max_rel_diff": weights, "weights_worst": max(weights.values())}
    out["failures"] = [f"{k} = {out[k]:.3g} > {tol:g}" for k, tol in TOLERANCES.items() if not out[k] <= tol]
    out["passed"] = not out["failures"]
    return out


def compute(framework: str, devices: int, *, steps: int = 8, batch_size: int = 32, data: str = "synthetic",
            data_dir: str | None = None, lr: float = 0.01, momentum: float = 0.9, seed: int = 0,
            mode: str | None = None, device: str = "cpu", python: dict[str, str] | None = None,
            timeout: float = 600.0, workdir: str | None = None, reference_batch_size: int | None = None
            ) -> dict[str, Any]:
    """``framework`` on 1 device (at ``reference_batch_size``, default the same global batch) against
    ``devices`` devices: the figures, the losses, both runs' settings. Prints nothing."""
    from .frameworks import data as data_mod

    dataparallel.check_divides(batch_size, devices)
    config = spec.TrainConfig(batch_size=batch_size, lr=lr, momentum=momentum, steps=steps, seed=seed, data=data,
                              data_dir=data_dir, device=device, math=spec.Math.FP32.value)
    info = data_mod.resolve_data(config)
    if not info.synthetic:
        data_mod.prepare_dir(info)
    params = {k: config.to_dict()[k] for k in ("batch_size", "lr", "momentum", "steps", "seed", "data", "data_dir",
                                                "device", "math")}
    params["modes"] = {framework: mode} if mode else {}
    exe = interpreters((framework,), python)[framework]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernelmap-devparity-", dir=workdir) as tmp:
        tmp = Path(tmp)
        weights = tmp / "initial_weights.npz"
        spec.save_weights(weights, spec.init_weights(seed))
        ref_params = dict(params, batch_size=reference_batch_size or batch_size)
        a = run_one(framework, 1, ref_params, weights, tmp / "x1.npz", exe, timeout)
        b = run_one(framework, devices, params, weights, tmp / f"x{devices}.npz", exe, timeout)
    return {"framework": framework, "devices": [1, devices], "device": device, "steps": steps,
            "batch_size": batch_size, "reference_batch_size": ref_params["batch_size"], **figures(a, b),
            "tolerances": TOLERANCES, "losses": {"1": [float(x) for x in a["losses"]],
                                                  str(devices): [float(x) for x in b["losses"]]},
            "modes": {"1": json.loads(str(a["meta"]))["mode"], str(devices): json.loads(str(b["meta"]))["mode"]},
            "python": exe, "wall_s": round(time.perf_counter() - started, 3)}


def run_parities(run_dir: Path, train: dict[str, Any], results: list[dict[str, Any]], python: dict[str, str],
                 notes: list[str], steps: int) -> dict[str, bool]:
    """``kernelmap run``'s parity across devices: for each case that ran on N > 1 devices (its first batch size),
    ``compute`` of its framework and mode on 1 and N devices, written to ``parity-devices-<case>.json`` in
    ``run_dir``; {case: passed}. A failure is a note; the run is kept."""
    from .atomic import atomic_file

    out: dict[str, bool] = {}
    first: dict[str, dict[str, Any]] = {}
    for r in results:
        name = r["dir"].split("/")[0]
        if r.get("devices", 1) > 1 and name not in first:
            first[name] = r
    for name, r in first.items():
        try:
            figures = compute(r["framework"], r["devices"], steps=steps, batch_size=r["batch_size"], data=train["data"],
                              data_dir=train["data_dir"], lr=train["lr"], momentum=train["momentum"],
                              seed=train["seed"], mode=r["mode"], device=r["device"], python=python)
        except KernelmapError as exc:
            notes.append(f"parity across devices failed for {name}: {exc}")
            continue
        with atomic_file(run_dir / f"parity-devices-{name}.json") as fh:
            json.dump(figures, fh, indent=1)
        out[name] = figures["passed"]
        if not figures["passed"]:
            notes.append(f"parity across devices: {name} differs from 1 device beyond tolerance: "
                         f"{'; '.join(figures['failures'])}")
    return out
