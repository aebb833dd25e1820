"""What was attributed and linked, per source."""

from __future__ import annotations

import pandas as pd

from .base import Run
from .timed import timed_events

# --- coverage ----------------------------------------------------------------------------------
ATTRIBUTION_COLUMNS = ("framework", "batch_size", "source", "steps", "kernels", "kernel_time_ns",
                       "attributed_kernel_time_share", "launch_op_known_kernel_time_share", "library_kernels", "library_kernels_linked",
                       "library_kernel_time_linked_share", "ops", "onednn_primitives", "onednn_linked",
                       "onednn_linked_share")


def coverage(runs: list[Run]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(summary, top unattributed events, attribution.json per part, files normalise did not read).

    summary: per run x framework x batch size, timed time with and without a canonical op.
    top: the largest unattributed events by time per step, with whatever reason is recorded."""
    summ, top = [], []
    for run in runs:
        for t in timed_events(run):
            ev = t.events
            un = ev[ev["canonical_op"].isna()]
            total = float(ev["dur_ns"].sum())
            summ.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                         "level": t.level, "source": t.source, "events": len(ev),
                         "unattributed_events": len(un),
                         "unattributed_ms_per_step": float(un["dur_ns"].sum()) / t.n_steps / 1e6,
                         "unattributed_share": float(un["dur_ns"].sum()) / total if total else None})
            name = un["kernel_name"].fillna(un["op_name"]).fillna("(unnamed)")
            for nm, g in un.groupby(name):
                top.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                            "event": nm, "count_per_step": len(g) / t.n_steps,
                            "ms_per_step": float(g["dur_ns"].sum()) / t.n_steps / 1e6,
                            "launch_op_known": "yes" if g["op_event_id"].notna().any() else "no",
                            "linked_to_call": "yes" if g["call_event_id"].notna().any() else "no"})
    attr, skipped_files = [], []
    for run in runs:
        a = run.attribution
        if not isinstance(a, dict):
            continue
        # GPU: one row per framework x batch size x source (Kineto and nsys are separate passes).
        # CPU (no kernels): one row per framework x batch size with the oneDNN figures.
        for entry in (a.get("runs") or {}).values():
            per_source = entry.get("by_source") or {}
            for src, fig in per_source.items():
                attr.append({"run": run.name, "framework": entry.get("case"),
                             "batch_size": entry.get("batch_size"), "source": src,
                             **{k: fig.get(k) for k in ATTRIBUTION_COLUMNS[3:]}})
            if not per_source:
                prims = entry.get("onednn_primitives") or {}
                attr.append({"run": run.name, **{k: entry.get(k) for k in ATTRIBUTION_COLUMNS},
                             "source": "all files", "onednn_primitives": sum(prims.values()) if prims else None})
        for nr in a.get("not_records") or []:
            skipped_files.append({"run": run.name, "file": nr.get("file"), "reason": nr.get("reason")})
    top_df = pd.DataFrame(top, columns=["run", "framework", "batch_size", "event", "count_per_step",
                                        "ms_per_step", "launch_op_known", "linked_to_call"])
    top_df = top_df.sort_values("ms_per_step", ascending=False).groupby(
        ["run", "framework", "batch_size"], dropna=False).head(10).reset_index(drop=True)
    return (pd.DataFrame(summ, columns=["run", "framework", "batch_size", "level", "source", "events",
                                        "unattributed_events", "unattributed_ms_per_step",
                                        "unattributed_share"]),
            top_df, pd.DataFrame(attr, columns=["run", *ATTRIBUTION_COLUMNS]).dropna(axis=1, how="all"),
            pd.DataFrame(skipped_files, columns=["run", "file", "reason"]))




UNLINKED_COLUMNS = ("run", "framework", "batch_size", "source", "kernel_name", "reason", "count", "time_ns")


def unlinked_library_kernels(runs: list[Run]) -> pd.DataFrame:
    """Per run x framework x batch size x source, the library kernels not linked to the call that launched
    them (attribution.json's ``library_unlinked_top``: the largest by time), each with its reason; where a
    timing pass ran other kernels than the libs pass, the reason names both (``calllink.carry``)."""
    rows = []
    for run in runs:
        a = run.attribution if isinstance(run.attribution, dict) else {}
        for entry in (a.get("runs") or {}).values():
            for src, fig in (entry.get("by_source") or {}).items():
                for u in fig.get("library_unlinked_top") or []:
                    rows.append({"run": run.name, "framework": entry.get("case"),
                                 "batch_size": entry.get("batch_size"), "source": src,
                                 **{k: u.get(k) for k in UNLINKED_COLUMNS[4:]}})
    return pd.DataFrame(rows, columns=list(UNLINKED_COLUMNS))
