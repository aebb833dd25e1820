"""What a run keeps and prints: each case's results.json entry, the manifest's timing record, the
``--json`` summary and the console table.

A case's step figure leaves out trials run under contention where a quiet one exists
(``schedule.used_trials``); each capture pass's overhead is judged against the clean pass's interval
(``timing.overhead_verdict``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from .. import contention, rundir, timing
from ..frameworks import dataparallel
from ..frameworks.case import CaseKey
from .counters import COUNTERS
from .devices import Decision
from .schedule import trial_contended, used_trials


def _trial_ids(trials: list[dict[str, Any]]) -> str:
    return ", ".join(str(t["trial"]) for t in trials)


def _trial_mean_step(t: dict[str, Any]) -> float:
    """A trial's mean step (s): its block samples weighted by their steps (``sample_steps``, equal without)."""
    st = t["step_times_s"]
    w = t.get("sample_steps") or [1] * len(st)
    return sum(s * n for s, n in zip(st, w, strict=True)) / sum(w)


def _clean_summary(trials: list[dict[str, Any]], used: list[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    """The clean pass's figures: the step figure over the ``used`` trials (``kernelmap.timing``); the
    end-to-end figure over the same used trials (each fetches its own batches): the step figure plus what
    the loader added per step, the median over those trials of each one's end to end less its own mean step
    (a median of per-trial end-to-end times beside a median of all samples could read below the step: 107.8
    against 112.9 ms on a busy run). A used trial that reused its batches (``--reuse-batches``) adds nothing:
    the method says which trials did; none where no used trial fetched (never another trial's)."""
    stats = timing.step_stats([t["step_times_s"] for t in used])
    fetched = [t for t in used if not t.get("batches_reused") and t.get("e2e_step_s")]
    added = [t["e2e_step_s"] - _trial_mean_step(t) for t in fetched]
    loader = [t["loader_batch_s"] for t in fetched if t.get("loader_batch_s")]
    e2e_step = stats.median_s + float(statistics.median(added)) if added else None
    e2e_timing = (fetched or trials)[0].get("e2e_timing")
    if not fetched:
        e2e_timing = f"not measured: no used trial fetched its own batches ({e2e_timing})"
    else:
        e2e_timing = (f"the step figure + the loader's time per step (median over {_trial_ids(fetched)} of the "
                      f"trial's end to end less its mean step); end to end: {e2e_timing}"
                      + (f"; the other used trials reused {timing.WINDOW_STEPS} batches" if len(fetched) < len(used)
                         else ""))
    return {
        **stats.to_dict(),
        "images_per_s": batch_size / stats.median_s if stats.median_s > 0 else None,
        "e2e_step_s": e2e_step,
        "e2e_images_per_s": batch_size / e2e_step if e2e_step else None,
        "loader_batch_s": float(statistics.median(loader)) if loader else None,
        "e2e_trials": [t["trial"] for t in fetched],
        "timing": trials[0]["timing"], "e2e_timing": e2e_timing,
        "block_steps": trials[0]["block_steps"],
    }


def _ci_fields(samples: list[float]) -> dict[str, float | None]:
    ci = timing.capture_ci(samples)
    return {"ci95_low_s": None if ci is None else ci[0], "ci95_high_s": None if ci is None else ci[1]}


def no_reduction_entry(result: dict[str, Any], used: list[dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """The step without the gradients' reduction (``dataparallel.NO_REDUCTION``), rank 0's result: its figures,
    and per rank (a framework of one process per device: each rank's own files, ``rank<r>/``; else the one
    process) its median step without the reduction beside its clean pass's median over the same used trials
    (``used``: rank 0's clean results; ``timing.step_stats`` of that rank's samples, as the case's figure is of
    rank 0's): what the report sets against the exposed communication of the traces (reports/analyses/comm.py).
    Rank 0's are ``result`` and ``used`` as given; the other ranks' are read from their folders."""
    if "skipped" in result:
        return result
    used_ids = [t["trial"] for t in used]
    ranks = []
    for r, folder in dataparallel.rank_folders(out_dir):
        if r == 0:  # the case folder's: what the caller read already
            own, cleans = result, [t["step_times_s"] for t in used]
        else:
            own = rundir.read_json(folder / rundir.pass_result_name(dataparallel.NO_REDUCTION))
            cleans = [rundir.read_json(folder / rundir.pass_result_name("clean", t))["step_times_s"] for t in used_ids]
        clean = timing.step_stats(cleans)
        own_ci = timing.capture_ci(own["step_times_s"])
        # each side's 95% interval: what the report judges the traces' exposed time against beside the 5%
        ranks.append({"rank": r, "median_step_s": own["median_step_s"],
                      "ci95_low_s": None if own_ci is None else own_ci[0],
                      "ci95_high_s": None if own_ci is None else own_ci[1],
                      "clean_median_step_s": clean.median_s, "clean_ci95_low_s": clean.ci95_low_s,
                      "clean_ci95_high_s": clean.ci95_high_s})
    return {"median_step_s": result["median_step_s"], **_ci_fields(result["step_times_s"]), "steps": result["steps"],
            "step_times_s": result["step_times_s"], "timing": result["timing"],
            "contention": result.get("contention"), "clean_trials": list(used_ids), "ranks": ranks}


def case_entry(key: CaseKey, decision: Decision, clean_trials: list[dict[str, Any]],
               pass_results: dict[str, dict[str, Any]], repeat_trials: list[int], out_dir: Path, rel: Path,
               notes: list[str]) -> dict[str, Any]:
    """The results.json entry of one case at one batch size (``key``: its fields are the entry's first) from
    its workers' results (trials in the order they ran; ``repeat_trials``: the numbers of the extra ones). Trials run under contention are left out of the step figure where a quiet one
    exists (``used_trials``), kept in ``trials`` and marked; ``notes`` gets a line for each."""
    fw, bs = key.name, key.batch_size  # the notes name the case
    used = used_trials(clean_trials)
    busy = [t for t in clean_trials if trial_contended(t) is True]
    clean = _clean_summary(clean_trials, used, bs)
    disagree = timing.trials_disagree([t["step_times_s"] for t in used])
    cont = {**contention.summarise([w for t in used for w in t.get("contention_windows", ())],
                                   [g for t in used for g in t.get("contention_gpu", ())]),
            "trials": len(clean_trials), "trials_contended": len(busy), "trials_used": [t["trial"] for t in used]}
    if busy and len(used) < len(clean_trials):
        notes.append(f"{fw} bs {bs}: clean trial{'s' if len(busy) > 1 else ''} {_trial_ids(busy)} ran under "
                     f"contention ({'; '.join(t['contention']['text'] for t in busy)}); left out of the step figure "
                     "(kept in results.json's trials)")
    elif busy:
        notes.append(f"{fw} bs {bs}: every clean trial ran under contention ({cont['text']}); its step figure "
                     "is flagged contended")
    repeats = len(repeat_trials)
    if disagree:
        meds = ", ".join(f"{t['median_step_s'] * 1e3:.3f}" for t in used)
        notes.append(f"{fw} bs {bs}: its clean trials disagree beyond noise (medians {meds} ms) after "
                     f"{repeats} repeat{'s' if repeats != 1 else ''}")
    first = clean_trials[0]
    notes.extend(f"{fw} bs {bs}: {line}" for line in first.get("math_notes", ()))  # where its math ran off-library
    passes_summary: dict[str, Any] = {
        "clean": {"median_step_s": clean["median_step_s"], "ci95_low_s": clean["ci95_low_s"],
                  "ci95_high_s": clean["ci95_high_s"], "steps": first["steps"],
                  "warmup_steps": first["warmup_steps"], "trials": len(clean_trials), "trials_used": len(used),
                  "timing": clean["timing"], "contention": cont},
    }
    counters = None  # the counters pass (kernelmap/run/counters.py): not a timing pass, its own field
    no_reduction = None
    for p, r in pass_results.items():
        if p == COUNTERS:
            counters = r
            continue
        if p == dataparallel.NO_REDUCTION:  # a timing of another step, not a capture of this one: its own field
            no_reduction = no_reduction_entry(r, used, out_dir)
            continue
        if "skipped" in r:
            passes_summary[p] = r
            continue
        pc = r.get("contention")
        if pc and pc.get("contended"):
            notes.append(f"{fw} bs {bs}: the {p} pass ran under contention ({pc['text']})")
        passes_summary[p] = {
            "median_step_s": r["median_step_s"], **_ci_fields(r["step_times_s"]), "steps": r["steps"],
            "warmup_steps": r["warmup_steps"], "step_times_s": r["step_times_s"], "timing": r["timing"],
            "overhead": r["median_step_s"] / clean["median_step_s"] - 1.0,
            "overhead_verdict": str(timing.overhead_verdict(r["median_step_s"], r["steps"], clean,
                                                             between_processes=not cont.get("contended"))),
            "contention": pc,
            "cpu_time": timing.cpu_figure([r]),  # the pass's own CPU time (timing.CPU_RULE); None before it was kept
        }
    used_ids = {t["trial"] for t in used}
    files = sorted(str(rel / f.name) for f in out_dir.iterdir() if f.is_file())
    return {
        **key.to_fields(),  # the case key, typed (frameworks/case.py): what every reader parses
        "device": decision.device,
        "device_requested": decision.requested,
        "device_note": decision.note,
        # what the GPU's convs and matmuls were allowed (spec.Math), and the environment that held them to it
        "tf32_override": first["tf32_override"],
        "steps": first["steps"],
        "warmup_steps": first["warmup_steps"],
        # the samples of the trials the figure uses, trial after trial (``trials`` says which are whose)
        "step_times_s": [x for t in used for x in t["step_times_s"]],
        **clean,
        "cpu_time": timing.cpu_figure(used),  # process CPU time over the same used trials (timing.CPU_RULE)
        "trials": [{"trial": t["trial"], "pid": t["pid"], "median_step_s": t["median_step_s"],
                    **_ci_fields(t["step_times_s"]), "e2e_step_s": t.get("e2e_step_s"),
                    "samples": len(t["step_times_s"]), "train_wall_s": t["train_wall_s"],
                    "batches_reused": t.get("batches_reused"), "repeat": t["trial"] in repeat_trials,
                    "used": t["trial"] in used_ids, "contended": trial_contended(t), "contention": t.get("contention")}
                   for t in clean_trials],
        "trials_disagree": disagree,
        "repeats": repeats,
        "contention": cont,
        "threads": first["threads"],
        "test_accuracy": first["test_accuracy"],
        "final_loss": first["final_loss"],
        "train_wall_s": first["train_wall_s"],
        "passes": passes_summary,
        **({COUNTERS: counters} if counters is not None else {}),
        **({dataparallel.NO_REDUCTION: no_reduction} if no_reduction is not None else {}),
        "dir": str(rel),
        "files": files,
        "versions": first["versions"],
        "math_notes": first.get("math_notes", []),  # Workload.math_notes: where the math ran outside its library
    }


def timing_config(args: argparse.Namespace, budget: float, budget_said: str) -> dict[str, Any]:
    """The manifest's record of how every figure of the run is timed and judged."""
    return {"step": timing.STEP_METHOD, "end_to_end": timing.E2E_METHOD,
            "capture": timing.CAPTURE_METHOD, "block_steps": timing.BLOCK_STEPS,
            "window_steps": timing.WINDOW_STEPS, "confidence": timing.CONFIDENCE,
            "noise_threshold": timing.NOISE_THRESHOLD,
            "min_capture_steps": timing.MIN_CAPTURE_STEPS,
            "contention": contention.RULE, "trials_disagree": timing.TRIALS_DISAGREE_RULE,
            "max_repeats": args.max_repeats, "repeat_budget_s": budget,
            "repeat_budget": budget_said,
            # the glibc malloc settings every worker ran with (docs/timing.md "Memory"; each worker's result
            # records its own in threads.env)
            "malloc": dict(timing.ALLOC_ENV)}


def summary(out: Path, results: list[dict[str, Any]], decisions: dict[str, Decision], notes: list[str],
             parities: dict[str, dict], parity_failed: str | None) -> dict[str, Any]:
    """What ``--json`` prints (exit code aside)."""
    return {
        "run_dir": str(out),
        "results": [
            {k: r[k] for k in ("framework", "mode", "math", "devices", "batch_size", "device", "device_note", "median_step_s",
                               "ci95_low_s",
                               "ci95_high_s", "ci95_half_width_rel", "noisy", "n_trials", "iqr_step_s",
                               "images_per_s", "e2e_step_s", "e2e_images_per_s", "test_accuracy", "contention",
                               "trials_disagree", "repeats")}
            | {"overheads": {p: {"overhead": v.get("overhead"), "verdict": v.get("overhead_verdict"),
                                 "skipped": v.get("skipped"), "contention": v.get("contention")}
                             for p, v in r["passes"].items() if p != "clean"}}
            for r in results
        ],
        "skipped": {fw: d.note for fw, d in decisions.items() if d.device is None},
        "notes": notes,
        "parity_passed": {fw: p["passed"] for fw, p in parities.items()} or None,
        "parity_failed": parity_failed,
    }


def contention_cell(c: dict[str, Any] | None) -> str:
    """The console's contention column of a figure (``contention.summarise``, with ``trials`` and
    ``trials_contended`` for the clean pass): "quiet", "BUSY: <what was measured> (k/n trials)", or why
    there is no figure."""
    if not c:
        return "not recorded"
    if c.get("contended") is None:
        return c.get("text") or "not measured"
    n, k = c.get("trials"), c.get("trials_contended")
    if c["contended"]:
        return f"BUSY: {c['text']}" + (f" ({k}/{n} trials)" if n else "")
    return "quiet" + (f" ({k}/{n} trials busy, left out)" if k else "")


def _overhead_text(name: str, o: dict[str, Any]) -> str:
    if o.get("skipped"):
        return f"{name} skipped"
    busy = " BUSY" if (o.get("contention") or {}).get("contended") else ""
    if o.get("verdict") == str(timing.OverheadVerdict.ABOVE):
        return f"{name} {o['overhead']:+.0%}{busy}"
    return f"{name} {o.get('verdict')}{busy}"


def print_table(summary: dict[str, Any]) -> None:
    rows = summary["results"]
    print("step: training step only, batches on the device; median of all trials' samples, 95% CI;"
          " e2e: with the loader")
    head = (f"{'framework':<10} {'mode':<14} {'math':<5} {'bs':>5} {'device':<6} {'step ms':>9} {'95% CI ms':>17} "
            f"{'trials':>6} "
            f"{'img/s step':>11} {'e2e ms':>8} {'img/s e2e':>10} {'acc':>7}  {'contention':<10}  capture overhead")
    print(head)
    for r in rows:
        over = ", ".join(_overhead_text(p, o) for p, o in r["overheads"].items())
        acc = f"{r['test_accuracy']:.4f}" if r["test_accuracy"] is not None else "-"
        ci = (f"{r['ci95_low_s'] * 1e3:.3f}-{r['ci95_high_s'] * 1e3:.3f}" if r["ci95_low_s"] is not None else "-")
        if r["noisy"]:
            ci += " noisy"
        if r.get("trials_disagree"):
            ci += " disagree"
        e2e = f"{r['e2e_step_s'] * 1e3:8.3f}" if r["e2e_step_s"] else f"{'-':>8}"
        e2e_ips = f"{r['e2e_images_per_s']:10.1f}" if r["e2e_images_per_s"] else f"{'-':>10}"
        device = r["device"] if r.get("devices", 1) == 1 else f"{r['device']}x{r['devices']}"  # issue 39: N devices
        print(f"{r['framework']:<10} {r['mode']:<14} {r['math']:<5} {r['batch_size']:>5} {device:<6} "
              f"{r['median_step_s'] * 1e3:>9.3f} "
              f"{ci:>17} {r['n_trials']:>6} {r['images_per_s']:>11.1f} {e2e} {e2e_ips} {acc:>7}  "
              f"{contention_cell(r.get('contention')):<10}  {over}")
    busy = [(r, p, o) for r in rows for p, o in r["overheads"].items() if (o.get("contention") or {}).get("contended")]
    for r, p, o in busy:
        print(f"{r['framework']} {r['mode']} {r['math']} bs {r['batch_size']} {p} pass: BUSY: {o['contention']['text']}")
    for fw, note in summary["skipped"].items():
        print(f"{fw}: not run: {note}")
    print(summary["run_dir"])


