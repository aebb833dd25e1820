"""Per framework x batch size figures from results.json: steps, parity, environment, overhead."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from kernelmap import timing

from .base import Busy, Run, case_of, field_at, fw_label, step_times_of


# --- summary ---------------------------------------------------------------------------------
def _is_fallback(asked: str | None, used: str | None, expected_auto: str) -> bool:
    """Did a framework run elsewhere than asked? ``auto`` asks for the GPU where the machine has
    one (MXNet on the CPU of a Hopper machine is a fallback; every framework on the CPU of a
    machine without a GPU is not). A framework that did not run at all is not a fallback."""
    if used is None or asked is None:
        return False
    return used != (expected_auto if asked == "auto" else asked)


def framework_devices(run: Run) -> pd.DataFrame:
    """Per framework: device asked, device used, and why they differ (manifest)."""
    expected = "gpu" if field_at(run.manifest, "gpu") else "cpu"
    rows = []
    for fw, info in (field_at(run.manifest, "frameworks", default={}) or {}).items():
        used = field_at(info, "device")
        asked = field_at(info, "device_requested", default=used)
        rows.append({"run": run.name, "framework": fw, "device_requested": asked, "device": used,
                     "device_note": field_at(info, "device_note"), "fallback": _is_fallback(asked, used, expected)})
    return pd.DataFrame(rows, columns=["run", "framework", "device_requested", "device", "device_note",
                                       "fallback"])






def clean_stats(r: dict) -> dict[str, Any]:
    """The clean pass's step figures of a results.json entry (``kernelmap.timing``). Entries of runs
    made before trials existed carry one trial's per-step times: their interval is computed here,
    by the same rule."""
    if field_at(r, "ci95_low_s") is not None or field_at(r, "n_trials") is not None:
        return {k: field_at(r, k) for k in ("median_step_s", "q25_step_s", "q75_step_s", "iqr_step_s", "ci95_low_s",
                                        "ci95_high_s", "ci95_half_width_rel", "noisy", "n_trials", "n_samples",
                                        "trial_medians_s", "e2e_step_s", "e2e_images_per_s", "timing")}
    st = step_times_of(r)
    if st is None:
        return {"median_step_s": field_at(r, "median_step_s"), "iqr_step_s": field_at(r, "iqr_step_s"), "n_trials": 1,
                "n_samples": field_at(r, "steps"), "timing": "one trial (older run); no interval"}
    return {**timing.step_stats([list(st)]).to_dict(), "e2e_step_s": None, "e2e_images_per_s": None,
            "timing": "one trial of per-step synchronised steps (older run)"}


def trial_samples(r: dict) -> list[list[float]] | None:
    """The used clean trials' samples, trial by trial: results.json's ``step_times_s`` (the used trials' samples,
    trial after trial) cut by each used trial's ``samples``; None where the entry does not record them so."""
    st, trials = field_at(r, "step_times_s"), field_at(r, "trials")
    if not isinstance(st, list) or not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
        return None
    counts = [t.get("samples") for t in trials if t.get("used")]
    if not counts or not all(isinstance(n, int) and n > 0 for n in counts) or sum(counts) != len(st):
        return None
    out, i = [], 0
    for n in counts:
        out.append([float(x) for x in st[i:i + n]])
        i += n
    return out


def judged_trials(r: dict) -> tuple[bool | None, str]:
    """(whether the used clean trials disagree, by which rule): this kernelmap's ``timing.trials_disagree`` over
    their samples where the entry keeps them per trial, else the runner's recorded verdict."""
    samples = trial_samples(r)
    if samples is not None:
        return timing.trials_disagree(samples), "this kernelmap's rule (timing.TRIALS_DISAGREE_RULE)"
    td = field_at(r, "trials_disagree")
    return (bool(td) if isinstance(td, bool) else None), "as the run recorded it (no samples per trial)"


def clean_contention(r: dict) -> dict[str, Any]:
    """What else used the machine during a results.json entry's clean pass (its ``contention``:
    ``contended`` None and ``contention`` "not measured" for runs made before it was recorded) and
    whether its trials disagreed beyond noise (``trials_disagree``: ``judged_trials``, after ``repeats``)."""
    b = Busy.of(r)
    td = judged_trials(r)[0]
    n, k = field_at(r, "contention.trials"), field_at(r, "contention.trials_contended")
    # the trials run under contention are left out of the figure where a quiet one exists (kernelmap.run.schedule)
    trials = (f" ({k}/{n} trials)" if b.contended else f" ({k}/{n} trials busy, left out)" if k else "") if n else ""
    return {"contended": b.contended, "contention": b.marked + trials,
            "trials_contended": field_at(r, "contention.trials_contended"),
            "trials_disagree": bool(td) if isinstance(td, bool) else None, "repeats": field_at(r, "repeats")}


def summary_table(runs: list[Run]) -> pd.DataFrame:
    """Per run x framework x device x batch size: the clean pass's step time (median over all trials'
    samples, 95% CI, noise flag, IQR), images/s from it, the end-to-end step with the loader, test
    accuracy, the device fallback mark, and what else used the machine meanwhile
    (``clean_contention``: ``contended``, ``contention`` text marked ``BUSY``, ``trials_disagree``)."""
    rows = []
    for run in runs:
        devs = framework_devices(run).set_index("framework")
        for r in run.results:
            fw = case_of(r)  # the case: the rows of its tables
            bs = field_at(r, "batch_size")
            c = clean_stats(r)
            med = c.get("median_step_s")
            lo, hi = c.get("ci95_low_s"), c.get("ci95_high_s")
            e2e = c.get("e2e_step_s")
            name = field_at(r, "framework")  # the framework's name (its typed key's field)
            dev = devs.loc[name] if name in devs.index else None
            rows.append({
                "run": run.name, "framework": fw, "mode": field_at(r, "mode"), "math": field_at(r, "math"),
                "device": field_at(r, "device", default=None if dev is None else dev["device"]),
                "device_requested": None if dev is None else dev["device_requested"],
                "fallback": False if dev is None else bool(dev["fallback"]),
                "device_note": None if dev is None else dev["device_note"],
                "batch_size": bs, "steps_timed": field_at(r, "steps"), "trials": c.get("n_trials"),
                "step_ms_median": None if med is None else med * 1e3,
                "step_ms_ci95_low": None if lo is None else lo * 1e3,
                "step_ms_ci95_high": None if hi is None else hi * 1e3,
                "ci95_half_width_pct": None if c.get("ci95_half_width_rel") is None
                else c["ci95_half_width_rel"] * 100,
                "noisy": c.get("noisy"),
                "step_ms_iqr": None if c.get("iqr_step_s") is None else c["iqr_step_s"] * 1e3,
                "images_per_s": bs / med if med and bs else None,
                "e2e_step_ms": None if e2e is None else e2e * 1e3,
                "e2e_images_per_s": bs / e2e if e2e and bs else None,
                "test_accuracy": field_at(r, "test_accuracy"),
                "timing": c.get("timing"),
                **clean_contention(r),
            })
    return pd.DataFrame(rows)


def parity_table(runs: list[Run]) -> pd.DataFrame:
    """parity.json's headline figures: run, figure, value, tolerance, definition. Scalars only
    (per-step lists, versions and config stay in the file); per-tensor dicts become one row each."""
    rows = []
    skip = {"tolerances", "definitions", "versions", "config", "data", "losses", "frameworks", "python"}
    for run in runs:
        for p in run.parity:
            if not isinstance(p, dict):
                continue
            pair = " vs ".join(fw_label(f) for f in p.get("frameworks") or [])
            tol, defs = p.get("tolerances") or {}, p.get("definitions") or {}
            for k, v in p.items():
                if k in skip or isinstance(v, list):
                    continue
                items = v.items() if isinstance(v, dict) else [(None, v)]
                for sub, val in items:
                    if isinstance(val, dict | list):
                        continue
                    rows.append({"run": run.name, "pair": pair, "figure": k if sub is None else f"{k} [{sub}]",
                                 "value": val, "tolerance": tol.get(k), "definition": defs.get(k)})
    return pd.DataFrame(rows, columns=["run", "pair", "figure", "value", "tolerance", "definition"])


# (label, manifest key) as kernelmap/manifest.py writes them
_ENV_KEYS = (
    ("GPU", "gpu.name"),
    ("compute capability", "gpu.compute_capability"),
    ("driver", "driver"),
    ("CUDA driver API", "cuda_driver_version"),
    ("CPU", "host.cpu"),
    ("Python", "host.python"),
    ("commit", "git_commit.commit"),
    ("tree dirty", "git_commit.dirty"),
    ("kernelmap", "kernelmap_version"),
    ("data", "data.kind"),
)
# (label, key of a framework's ``versions`` as the workloads' ``versions()`` write them)
_FW_VERSION_KEYS = (("framework", "version"), ("CUDA", "cuda"), ("cuDNN", "cudnn"), ("cuBLAS", "cublas"),
                    ("oneDNN", "mkldnn"))


def _scalar(v: Any) -> Any:
    if isinstance(v, dict | list):
        return json.dumps(v, sort_keys=True)
    return v


def batch_rule(manifest: dict) -> str | None:
    """What the run's partial-batch rule made of an epoch at each batch size (``config.batches``, written by
    kernelmap/options.py); None for a run made before it (whose epochs kept their last partial batch)."""
    b = field_at(manifest, "config.batches")
    if not b:
        return None
    per = "; ".join(f"bs {p['batch_size']}: {p['steps_per_epoch']:,} steps, {p['images_per_epoch']:,} of "
                    f"{p['train_images']:,} images an epoch" + (f" ({p['dropped_per_epoch']:,} dropped)"
                                                                if p["dropped_per_epoch"] else "")
                    for p in b["per_batch_size"])
    return f"each epoch's last partial batch {b['partial_batch']}: {per}"


def environment_table(runs: list[Run]) -> pd.DataFrame:
    """Rows: item (GPU, driver, CUDA, cuDNN, cuBLAS, framework versions, commit...); one column per run."""
    table: dict[str, dict[str, Any]] = {}
    for run in runs:
        m = run.manifest
        col = {}
        for label, key in _ENV_KEYS:
            v = field_at(m, key)
            if v is not None:
                col[label] = _scalar(v)
        if (rule := batch_rule(m)) is not None:
            col["batches"] = rule
        for fw, info in (field_at(m, "frameworks", default={}) or {}).items():
            versions = field_at(info, "versions", default={}) or {}
            for label, key in _FW_VERSION_KEYS:
                v = field_at(versions, key)
                if v is not None:
                    col[f"{fw_label(fw)} {label}".replace(" framework", "")] = _scalar(v)
            asked, used = field_at(info, "device_requested"), field_at(info, "device")
            if used is not None:
                col[f"{fw_label(fw)} device"] = used if asked in (None, used) else f"{used} (asked {asked})"
        table[run.name] = col
    df = pd.DataFrame(table)
    df.index.name = "item"
    return df.reset_index()


