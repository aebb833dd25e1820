"""The merged timeline of every rank of one multi-device case (issue 39): a PNG drawn only from
``analyses.ranks.rank_timeline``'s frames (nothing here reads a run directory).

Per case one figure: a lane group per rank (communication above compute), each step of the rank a band
behind its lanes, compute coloured by canonical op (``figures.lane_color``, the one-iteration timeline's
colours), communication in the colour of its canonical op, the last arrival at each collective a marker on the
last rank's communication lane. One time axis: ms from the case's first shown step, on the records' own clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from . import figures as F
from . import html as H
from .analyses import ranks as RT
from .analyses.base import fw_label
from .analyses.ranks import Lane, RankTimeline

STEP_BAND = ("#f1f3f5", "#e7f5ff")  # alternate steps
MARK_COLOR = "#c92a2a"


def case_slug(case: str) -> str:
    """A case folder (``pytorch-x2/bs32``) as a file stem: ``ranks-pytorch-x2-bs32``."""
    return "ranks-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in str(case))


def _draw_lane(ax, ev: pd.DataFrame, y: float) -> list[str]:
    """One lane's rows at ``y``: those without a canonical op first, then the longest first (nested host ops
    lie inside their parents: the inner ones stay visible); returns the canonical ops drawn."""
    ev = ev.assign(known=ev["canonical_op"].notna()).sort_values(["known", "dur_ns"], ascending=[True, False],
                                                                  kind="stable")
    colors = [F.lane_color(op) for op in ev["canonical_op"]]
    spans = list(zip(ev["rel_ns"] / 1e6, np.maximum(ev["dur_ns"].astype(float) / 1e6, 1e-4), strict=True))
    for color in dict.fromkeys(colors):
        sel = [sp for sp, c in zip(spans, colors, strict=True) if c == color]
        ax.broken_barh(sel, (y - 0.38, 0.76), facecolors=color, edgecolors="none")
    return list(dict.fromkeys(ev["canonical_op"].dropna()))


def rank_timeline_figure(tl: RankTimeline, case: str, path: Path) -> Path | None:
    """The merged timeline of ``case`` (a row of ``tl.cases``'s ``run``) into ``path``; None where it has none."""
    info = tl.cases[tl.cases["run"] == case]
    ev, spans = tl.events[tl.events["run"] == case], tl.spans[tl.spans["run"] == case]
    if info.empty or ev.empty:
        return None
    c = info.iloc[0]
    marks = tl.marks[tl.marks["run"] == case]
    groups = list(dict.fromkeys(spans.sort_values(["rank", "process", "group"], na_position="last")["group"]))
    origin = int(c["origin_ns"])
    height = 1.6 + 1.1 * len(groups)
    fig, ax = plt.subplots(figsize=(13, height))
    seen: list[str] = []
    labels = []
    for gi, group in enumerate(groups):
        y_comm, y_work = 2 * gi, 2 * gi + 1
        mine = ev[ev["group"] == group]
        for k, s in enumerate(spans[spans["group"] == group].sort_values("iteration").itertuples()):
            x0, w = (s.start_ns - origin) / 1e6, (s.end_ns - s.start_ns) / 1e6
            ax.broken_barh([(x0, w)], (y_comm - 0.48, 1.96), facecolors=STEP_BAND[k % 2], edgecolors="#868e96",
                           linewidth=0.6, zorder=0)
            ax.text(x0, y_comm - 0.5, f" step {int(s.iteration)}", fontsize=7, va="bottom", color="#495057", zorder=7)
        for lane, y in ((Lane.COMMUNICATION, y_comm), (Lane.COMPUTE, y_work)):
            rows = mine[mine["lane"] == lane]
            seen += [o for o in _draw_lane(ax, rows, y) if o not in seen]
            if rows.empty:
                ax.text(0.5, y, "(none in these steps)", transform=ax.get_yaxis_transform(), fontsize=7,
                        ha="center", va="center", color="#868e96")
        labels += [f"{group} communication", f"{group} compute"]
        for m in marks[marks["group"] == group].itertuples():
            x = m.rel_ns / 1e6
            ax.plot([x], [y_comm - 0.42], marker="v", color=MARK_COLOR, markersize=7, zorder=6)
            ax.text(x, y_comm - 0.42, f" last, +{m.spread_ms:.3g} ms", fontsize=7, color=MARK_COLOR, va="bottom")
    if marks.empty:
        ax.text(1.0, -0.75, "no arrival order: the trace names no rank" if spans["rank"].isna().all() else
                "no collective issued by every rank in these steps", transform=ax.get_yaxis_transform(), fontsize=7,
                ha="right", va="center", color="#495057")
    ax.set_yticks(range(2 * len(groups)), labels, fontsize=8)
    ax.set_ylim(2 * len(groups) - 0.5, -1.0)
    ax.set_xlabel(f"ms from the first shown step's start; clock: {c['clock']}", fontsize=8)
    ax.set_title(f"{fw_label(str(c['framework']))} on {int(c['devices'])} devices, batch {c['batch_size']} "
                 f"({case}) — {c['capture_pass']} pass ({c['source']}), steps {c['iterations'].replace(';', ', ')}; "
                 f"{c['basis']}", fontsize=9, loc="left", color=F.FW_COLOR.get(str(c["framework"]), "#212529"))
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=F.lane_color(o), label=o) for o in seen]
    handles += [plt.Line2D([], [], marker="v", color=MARK_COLOR, linestyle="none",
                           label="last arrival at a collective (+ after the first rank)")] if len(marks) else []
    fig.legend(handles=handles, loc="lower center", ncol=min(8, len(handles)), frameon=False, fontsize=7,
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, (0.45 + 0.25 * (len(handles) // 8)) / height, 1, 1))
    return F.save_png(fig, path)


def _caption(c: pd.Series, marks: pd.DataFrame) -> str:
    arrived = (f"The last arrival at each collective is marked on the last rank's communication lane (+ ms after the "
               f"first rank's issuing op; {len(marks)} collectives; tables/comm_arrivals.csv)." if len(marks) else
               "No arrival order: the trace names no rank (one process drives every device), or no collective was "
               "issued by every rank in these steps.")
    return (f"The {c['capture_pass']} pass's trace ({c['source']}), steps {c['iterations'].replace(';', ' and ')} "
            f"(the last {len(c['iterations'].split(';'))} traced), one traced run of each step, not a median. One lane "
            f"group per {'rank' if c['clock'].startswith(RT.CLOCK_PER_RANK) else 'trace process (the trace names no rank)'}"
            f": communication (collective ops, their work, collective kernels) and compute ({c['basis']}: the rows "
            "tables/comm_steps.csv measures), compute coloured by canonical op; the band behind each group is its step "
            "as the communication figures measure it (the step region widened to its work). Clock: "
            f"{c['clock']}; time from the case's first shown step. {arrived} The data: rows drawn per group, lane and "
            "step (summed_ms counts nested host ops each).")


def figures(out: Path, timelines: list[tuple[str, RT.RankTimeline]], ov: pd.DataFrame,
            many_runs: bool) -> list[dict[str, Any]]:
    """The page's figure entries (as ``reports.cli``'s: stem, title, caption, file, data, busy mark) of every
    multi-device case of every run: one PNG each, drawn into ``out``."""
    entries = []
    for run, tl in timelines:
        for c in tl.cases.itertuples():
            row = tl.cases[tl.cases["run"] == c.run].iloc[0]
            stem = case_slug(f"{run}-{c.run}" if many_runs else c.run)
            path = rank_timeline_figure(tl, c.run, out / f"{stem}.png")
            data = RT.figure_data(tl, c.run)
            mine = ov[(ov["run"] == run) & (ov["framework"] == str(c.run).split("/")[0])
                      & (ov["batch_size"] == c.batch_size)] if len(ov) else ov
            busy, mark = H.busy_mark(mine, (c.capture_pass,), fw_label)
            entries.append({"stem": stem, "title": f"Every rank: {fw_label(str(c.framework))} on {c.devices} devices, "
                                                   f"batch {c.batch_size}" + (f" (run {run})" if many_runs else ""),
                            "caption": _caption(row, tl.marks[tl.marks["run"] == c.run]),
                            "file": f"{stem}.png" if path else None, "data_uri": H.data_uri(path) if path else None,
                            "why_empty": "no traced step of this case", "busy": busy, "mark": mark, "devices": True,
                            "table_html": H.table(data) if len(data) else ""})
    return entries
