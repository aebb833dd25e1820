"""The custom-op variant against the built-in model: the same weights (``spec.init_weights``), the same
batches in the same order, fp32; both in this process (one framework: no clash). Figures as
``kernelmap parity``'s (``kernelmap.parity.compare``, its tolerances)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kernelmap.parity import TOLERANCES, compare

from ... import spec
from . import OPTION


def _train(config: spec.TrainConfig, order: np.ndarray) -> dict[str, Any]:
    from ..workload import Workload

    w = Workload(config)
    logits, losses = None, []
    for images, labels in w.batches("train", config.batch_size, order):
        if logits is None:
            logits = w.forward(images)
        losses.append(float(w.train_step(images, labels).cpu()))
    w.synchronize()
    out = {"logits": logits, "losses": np.asarray(losses, dtype=np.float64)}
    out.update({f"weight/{k}": v for k, v in w.get_weights().items()})
    out["versions"] = w.versions()
    return out


def custom_parity(route: str, device: str = "cpu", steps: int = 20, batch_size: int = 64, data: str = "synthetic",
                  seed: int = 0) -> dict[str, Any]:
    """Train the built-in model and the ``route`` variant ``steps`` SGD steps; the figures of
    ``kernelmap.parity.compare`` (``passed``) and both loss curves."""
    base = spec.TrainConfig(batch_size=batch_size, steps=steps, seed=seed, data=data, device=device,
                            math=spec.Math.FP32.value)
    custom = spec.TrainConfig(**{**base.to_dict(), "options": {OPTION: route}})
    from ...data import resolve_data

    info = resolve_data(base)
    order = spec.training_batches(info.n_train, seed, batch_size, steps).ravel()
    a, b = _train(base, order), _train(custom, order)
    figures = compare(a, b, spec.weight_names())
    return {"reference": "built-in", "variant": f"custom op ({route})", "route": route, "device": device,
            "dtype": "float32", "steps": steps, "batch_size": batch_size, "data": info.to_dict(), **figures,
            "tolerances": TOLERANCES, "losses": {"built-in": a["losses"].tolist(), route: b["losses"].tolist()},
            "build": b["versions"]["custom_op"]}


def format_text(r: dict[str, Any]) -> str:
    return "\n".join([
        f"parity built-in vs custom op ({r['route']} route) on {r['device']} fp32, {r['steps']} SGD steps, "
        f"batch {r['batch_size']}, data {r['data']['kind']}",
        f"  forward logits max |a-b|     {r['forward_logits_max_abs_diff']:.3e}  (<= {TOLERANCES['forward_logits_max_abs_diff']:g})",
        f"  loss max |a-b|/|a| per step  {r['loss_max_rel_diff']:.3e}  (<= {TOLERANCES['loss_max_rel_diff']:g})",
        f"  weights max|a-b|/max|a|      {r['weights_worst']:.3e}  (<= {TOLERANCES['weights_worst']:g})",
        "PASS" if r["passed"] else "FAIL: " + "; ".join(r["failures"]),
    ])
