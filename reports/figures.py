"""Figures: matplotlib (Agg) PNGs drawn only from what ``reports.analysis`` returns.

Each ``*_figure(data, path)`` writes one PNG and returns its path, or returns None when the data
is empty (the HTML then says there was nothing to draw). Nothing here reads a run directory.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from kernelmap.frameworks.case import color_of  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from kernelmap import frameworks, timing  # noqa: E402
from kernelmap.atomic import atomic_path  # noqa: E402
from kernelmap.schema import CANONICAL_OPS, UNATTRIBUTED  # noqa: E402

from .analysis import PHASE_ORDER, fw_label  # noqa: E402
from .relations import library_call_statement  # noqa: E402

FW_COLOR = {name: d.color for name, d in frameworks.REGISTRY.items()}
PHASE_COLOR = {"forward": "#4dabf7", "backward": "#f76707", "optimizer": "#37b24d", "data": "#ae3ec9",
               "other": "#adb5bd"}
LIB_COLOR = {"cuDNN": "#5c940d", "cuBLAS": "#1971c2", "cuBLASLt": "#4dabf7", "oneDNN": "#e8590c",
             "BLAS": "#f59f00", "native": "#868e96", "custom": "#c2255c", UNATTRIBUTED: "#dee2e6"}
DPI = 110


def _fw_color(fw: str) -> str:
    return FW_COLOR.get(fw) or color_of(fw) or "#495057"


def save_png(fig, path: Path) -> Path:
    """``fig`` as a PNG at ``path`` (written atomically), then closed."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI, bbox_inches="tight", format="png")
    plt.close(fig)
    return path


def _case(df: pd.DataFrame) -> list[tuple[str, object]]:
    """(run, batch_size) pairs in order."""
    return list(dict.fromkeys(zip(df["run"], df["batch_size"], strict=True)))


def _title_case(run: str, bs, many_runs: bool) -> str:
    return (f"{run}, " if many_runs else "") + (f"batch {bs}" if pd.notna(bs) else "batch ?")


def op_time_figure(op_time: pd.DataFrame, path: Path) -> Path | None:
    """Time per step per canonical op, stacked by phase; one panel per framework (shared axes),
    one row per run x batch size."""
    if op_time.empty:
        return None
    cases = _case(op_time)[:6]
    fws = list(dict.fromkeys(op_time["framework"]))
    many = op_time["run"].nunique() > 1
    fig, axes = plt.subplots(len(cases), len(fws), figsize=(5.2 * len(fws), 0.5 + 3.2 * len(cases)),
                             squeeze=False, sharey="row")
    for r, (run, bs) in enumerate(cases):
        sub = op_time[(op_time["run"] == run) & (op_time["batch_size"] == bs)]
        totals = sub.groupby("canonical_op")["ms_per_step"].sum().sort_values()
        ops = list(totals.index)
        xmax = sub.groupby(["framework", "canonical_op"])["ms_per_step"].sum().max()
        for c, fw in enumerate(fws):
            ax = axes[r][c]
            s = sub[sub["framework"] == fw]
            if s.empty:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{fw_label(fw)}: no timed events\nin {_title_case(run, bs, many)}\n"
                        "(not run there: see the summary)", ha="center", va="center", fontsize=9,
                        color="0.4", transform=ax.transAxes)
                continue
            left = np.zeros(len(ops))
            for ph, color in PHASE_COLOR.items():
                vals = s[s["phase"] == ph].groupby("canonical_op")["ms_per_step"].sum().reindex(ops).fillna(0)
                if vals.sum() == 0:
                    continue
                ax.barh(ops, vals.values, left=left, color=color, label=ph, edgecolor="white", linewidth=0.5)
                left += vals.values
            for y, v in enumerate(left):
                if v > 0:
                    ax.text(v, y, f" {v:.3g}", va="center", fontsize=7)
            level = s["level"].iloc[0] if len(s) else "?"
            ax.set_title(f"{fw_label(fw)} ({_title_case(run, bs, many)}; {level} time)", fontsize=10,
                         color=_fw_color(fw))
            ax.set_xlabel("ms per training step")
            ax.set_xlim(0, (xmax or 1) * 1.18)
            ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=c, label=p) for p, c in PHASE_COLOR.items() if p in set(op_time["phase"])]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), bbox_to_anchor=(0.5, 1.0),
               frameon=False, title="phase")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return save_png(fig, path)


def library_mix_figure(mix: pd.DataFrame, path: Path) -> Path | None:
    """Share of timed time per library, one horizontal 100% bar per framework x batch size."""
    if mix.empty:
        return None
    many = mix["run"].nunique() > 1
    keys = list(dict.fromkeys(zip(mix["run"], mix["batch_size"], mix["framework"], strict=True)))
    labels = [f"{fw_label(fw)}\n{_title_case(run, bs, many)}" for run, bs, fw in keys]
    libs = [lib for lib in LIB_COLOR if lib in set(mix["library"])] + sorted(
        set(mix["library"]) - set(LIB_COLOR))
    fig, ax = plt.subplots(figsize=(9, 0.8 + 0.7 * len(keys)))
    left = np.zeros(len(keys))
    for lib in libs:
        vals = np.array([mix[(mix["run"] == run) & (mix["batch_size"] == bs) & (mix["framework"] == fw)
                             & (mix["library"] == lib)]["share"].sum() for run, bs, fw in keys], dtype=float)
        ms = np.array([mix[(mix["run"] == run) & (mix["batch_size"] == bs) & (mix["framework"] == fw)
                           & (mix["library"] == lib)]["ms_per_step"].sum() for run, bs, fw in keys])
        ax.barh(labels, vals * 100, left=left, color=LIB_COLOR.get(lib, None), label=lib,
                edgecolor="white")
        for y, (v, m, lft) in enumerate(zip(vals, ms, left, strict=True)):
            if v >= 0.06:
                ax.text(lft + v * 50, y, f"{v * 100:.0f}%\n{m:.3g} ms", ha="center", va="center", fontsize=7)
        left += vals * 100
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of timed time per step (%)  —  GPU: kernel time; CPU: outermost op time")
    ax.invert_yaxis()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(keys) < 3 else -0.18),
              ncol=len(libs), frameon=False)
    ax.set_title("Library mix: which library's code the step's time is spent in")
    fig.tight_layout()
    return save_png(fig, path)


def kernel_count_figure(counts: pd.DataFrame, path: Path) -> Path | None:
    """Distinct kernels per canonical op, bars side by side per framework; launches per step
    written on each bar."""
    if counts.empty:
        return None
    cases = _case(counts)[:4]
    many = counts["run"].nunique() > 1
    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 0.6 + 3.0 * len(cases)), squeeze=False)
    for r, (run, bs) in enumerate(cases):
        ax = axes[r][0]
        sub = counts[(counts["run"] == run) & (counts["batch_size"] == bs)]
        ops = list(sub.groupby("canonical_op")["distinct_kernels"].sum().sort_values(ascending=False).index)
        fws = list(dict.fromkeys(sub["framework"]))
        width = 0.8 / max(1, len(fws))
        x = np.arange(len(ops))
        for i, fw in enumerate(fws):
            s = sub[sub["framework"] == fw].set_index("canonical_op").reindex(ops)
            bars = ax.bar(x + (i - (len(fws) - 1) / 2) * width, s["distinct_kernels"].fillna(0), width,
                          color=_fw_color(fw), label=fw_label(fw))
            for b, launches in zip(bars, s["launches_per_step"], strict=True):
                if pd.notna(launches):
                    ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{launches:.3g}/step",
                            ha="center", va="bottom", fontsize=6.5, rotation=90)
        ax.set_xticks(x, ops, rotation=30, ha="right")
        ax.set_ylabel("distinct kernels")
        ax.set_ylim(0, sub["distinct_kernels"].max() * 1.5 + 1)
        ax.set_title(f"Kernels per op ({_title_case(run, bs, many)}); label: launches per step", fontsize=10)
        ax.legend(frameon=False)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, path)


NO_OP_COLOR = "#ced4da"


def lane_color(op) -> str:
    """A fixed colour per canonical op (its place in the schema's vocabulary), unique to it: tab20 then tab20b,
    40 colours for the vocabulary's ops (22 now; at 21 conv2d and 'other' shared one of tab20's 20); grey when none."""
    palette = plt.get_cmap("tab20").colors + plt.get_cmap("tab20b").colors
    if len(CANONICAL_OPS) > len(palette):
        raise ValueError(f"{len(CANONICAL_OPS)} canonical ops, {len(palette)} timeline colours: add a palette")
    if op is None or pd.isna(op) or op not in CANONICAL_OPS:
        return NO_OP_COLOR
    return matplotlib.colors.to_hex(palette[CANONICAL_OPS.index(op)])


def _empty_lane(lane: str, sub: pd.DataFrame, libcalls: pd.DataFrame | None, run, bs, fw) -> str:
    """What an empty timeline lane means for this framework x batch size."""
    cpu = not (sub["lane"] == "kernel").any() and sub["device"].eq("cpu").any() if "device" in sub else False
    if lane == "kernel" and cpu:
        return "(none: on the CPU the ops run on the host, no device kernels)"
    if lane == "library_call" and libcalls is not None and len(libcalls):
        said = library_call_statement(libcalls, run, fw, bs)  # one statement of the calls, as the answer's
        if said:
            return f"(not on this trace's clock: {said}; see Library calls)"
    return "(none in this trace)"


def _step_note(sub: pd.DataFrame, fw: str) -> str | None:
    """Why an asynchronous framework's ops outlast its step mark (canonical.ASYNC_FRAMEWORKS: the
    mark is the host issuing the step; the ops run after it on the framework's engine threads), or
    None where they do not."""
    from kernelmap.adapters.canonical import ASYNC_FRAMEWORKS

    steps = sub[(sub["lane"] == "phase") & (sub["kind"] == "step")]
    ops = sub[sub["lane"] == "op"]
    if fw not in ASYNC_FRAMEWORKS or steps.empty or ops.empty:
        return None
    mark_end = float((steps["rel_ns"] + steps["dur_ns"]).max())
    ops_end = float((ops["rel_ns"] + ops["dur_ns"]).max())
    if ops_end <= mark_end:
        return None
    return (f"the step mark ({mark_end / 1e6:.1f} ms) is the host issuing the step; {fw_label(fw)} runs its ops "
            f"after it on its engine threads (to {ops_end / 1e6:.1f} ms)")


def timeline_figure(tl: pd.DataFrame, libcalls: pd.DataFrame | None, path: Path) -> Path | None:
    """One iteration per framework: lanes phase / op / library call / kernel, coloured by
    canonical op, on a shared time axis (ms from the start of the shown iteration). An empty lane
    says why: library calls logged in another pass (``libcalls``: analysis.library_calls) are not on
    this trace's clock; a CPU trace has no kernels."""
    if tl.empty:
        return None
    keys = list(dict.fromkeys(zip(tl["run"], tl["batch_size"], tl["framework"], strict=True)))[:6]
    many = tl["run"].nunique() > 1
    lanes = ["phase", "op", "library_call", "kernel"]
    lane_label = {"phase": "step / phase", "op": "framework ops", "library_call": "library calls",
                  "kernel": "kernels"}
    ops_seen: list[str] = []
    height = 1.2 + 2.3 * len(keys)
    fig, axes = plt.subplots(len(keys), 1, figsize=(13, height), squeeze=False)
    for r, (run, bs, fw) in enumerate(keys):
        ax = axes[r][0]
        sub = tl[(tl["run"] == run) & (tl["batch_size"] == bs) & (tl["framework"] == fw)]
        for li, lane in enumerate(lanes):
            ev = sub[sub["lane"] == lane]
            if lane == "op":  # nested ops would overdraw: the outermost ones with a canonical op
                ev = ev[ev["outermost"].eq(True)]
            if lane == "phase":  # grey with the phase written in: op colours stay unambiguous
                colors = ["#dee2e6" if k != "step" else "#f8f9fa" for k in ev["kind"]]
                span = float(sub["rel_ns"].max() + 1) / 1e6
                for x0, w, ph, k in zip(ev["rel_ns"] / 1e6, ev["dur_ns"] / 1e6, ev["phase"], ev["kind"], strict=True):
                    if k != "step" and pd.notna(ph) and ph in PHASE_ORDER[:3] and w > 0.05 * span:
                        ax.text(x0 + w / 2, li, ph, ha="center", va="center", fontsize=8, zorder=5)
            else:
                colors = [lane_color(op) for op in ev["canonical_op"]]
                ops_seen += [o for o in dict.fromkeys(ev["canonical_op"].dropna()) if o not in ops_seen]
            spans = list(zip(ev["rel_ns"] / 1e6, np.maximum(ev["dur_ns"].astype(float) / 1e6, 1e-4), strict=True))
            steps = (ev["kind"] == "step").to_numpy() if lane == "phase" else np.zeros(len(ev), bool)
            for is_step in (True, False):  # steps first, phases drawn over them
                for color in dict.fromkeys(colors):
                    sel = [sp for sp, c, st in zip(spans, colors, steps, strict=True) if c == color and st == is_step]
                    if sel:
                        y, h = (li - 0.45, 0.9) if is_step else (li - 0.4, 0.8)
                        ax.broken_barh(sel, (y, h), facecolors=color,
                                       edgecolors="#495057" if lane == "phase" else "none", linewidth=0.3)
            if lane == "library_call" and len(ev) and ev["derived"].eq(True).all():
                ax.text(1.0, li, " derived from kernel spans", transform=ax.get_yaxis_transform(),
                        fontsize=7, va="center", color="#495057")
            if ev.empty:
                ax.text(0.5, li, _empty_lane(lane, sub, libcalls, run, bs, fw), transform=ax.get_yaxis_transform(),
                        fontsize=7, va="center", ha="center", color="#868e96")
        note = _step_note(sub, fw)
        if note:
            ax.text(1.0, 0, f" {note}", transform=ax.get_yaxis_transform(), fontsize=7, va="center", ha="right",
                    color="#495057", zorder=6)
        ax.set_yticks(range(len(lanes)), [lane_label[x] for x in lanes])
        ax.set_ylim(len(lanes) - 0.5, -0.5)
        ax.set_xlabel("ms from the start of the shown window")
        it = sub["shown_iteration"].dropna()
        ax.set_title(f"{fw_label(fw)} — {_title_case(run, bs, many)}"
                     + (f", iteration {int(it.iloc[0])}" if len(it) else
                        ": every traced step (the trace marks no step boundaries)"), fontsize=10,
                     color=_fw_color(fw), loc="left")
        ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=lane_color(o), label=o) for o in ops_seen]
    fig.legend(handles=handles, loc="lower center", ncol=min(8, len(handles)), frameon=False,
               fontsize=8, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, (0.5 + 0.25 * (len(handles) // 8)) / height, 1, 1))
    return save_png(fig, path)


def busy_share_figure(busy: pd.DataFrame, path: Path) -> Path | None:
    """Busy share per framework x batch size: sum of kernel (or outermost op) time / step time."""
    b = busy.dropna(subset=["busy_share"]).iloc[::-1]
    if b.empty:
        return None
    many = b["run"].nunique() > 1
    labels = [f"{fw_label(fw)}, {_title_case(run, bs, many)} ({lvl})"
              for run, bs, fw, lvl in zip(b["run"], b["batch_size"], b["framework"], b["level"], strict=True)]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(b)))
    bars = ax.barh(labels, b["busy_share"] * 100, color=[_fw_color(f) for f in b["framework"]])
    for bar, v, bm, sm in zip(bars, b["busy_share"], b["busy_ms_per_step"], b["step_ms"], strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f" {v * 100:.1f}%  ({bm:.3g} of {sm:.3g} ms)", va="center", fontsize=8)
    ax.axvline(100, color="#495057", lw=0.8, ls="--")
    ax.set_xlim(0, max(110, float(b["busy_share"].max()) * 135))
    ax.set_xlabel("busy share of the step (%)")
    ax.set_title("Busy share = summed kernel time (GPU) or outermost op time (CPU) / step wall time\n"
                 "GPU: low = launch-bound. CPU: op time adds up over engine threads, so it can pass 100%",
                 fontsize=9)
    bases = sorted(set(b["step_basis"].dropna()))
    fig.text(0.01, 0.0, "step wall time: " + "; ".join(bases), fontsize=7, va="bottom", color="#495057")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save_png(fig, path)


def _flagged(v: object) -> bool:
    """A ``contended`` cell that says contended (True; not False, None or NaN)."""
    return isinstance(v, bool | np.bool_) and bool(v)


def _overhead_label(row: pd.Series, clean_busy: bool = False) -> str:
    """A capture pass's bar label: its change vs clean where it is one (timing.OverheadVerdict); "busy" where the
    pass or its clean pass ran contended: two processes, each slowed by its own neighbours, give no overhead."""
    if pd.isna(row["overhead"]):
        return ""
    if clean_busy or _flagged(row.get("contended")):
        return "busy"
    if row["verdict"] == str(timing.OverheadVerdict.ABOVE):
        return f"{row['overhead'] * 100:+.0f}%"
    if row["verdict"] == str(timing.OverheadVerdict.WITHIN):
        return "noise"
    return str(row["verdict"])


def overhead_figure(ov: pd.DataFrame, path: Path) -> Path | None:
    """Median step time per capture pass, per framework; one panel per run x batch size (their
    scales differ: GPU steps are ms, CPU steps 100s of ms), linear axes from 0; the change against
    the clean pass on top of each bar."""
    skipped = ov[ov["step_ms_median"].isna() & ov["skipped"].notna()]
    ov = ov.dropna(subset=["step_ms_median"])
    if ov.empty:
        return None
    many = ov["run"].nunique() > 1
    panels = list(dict.fromkeys(zip(ov["run"], ov["batch_size"], strict=True)))
    passes = list(dict.fromkeys(ov["pass"]))
    cmap = plt.get_cmap("Set2").colors
    width = 0.8 / len(passes)
    fws_most = max(ov[(ov["run"] == r) & (ov["batch_size"] == b)]["framework"].nunique() for r, b in panels)
    ncols = min(len(panels), 3)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, squeeze=False,
                             figsize=(max(4.5, 1.3 * fws_most * max(1, len(passes) / 2)) * ncols, 3.6 * nrows + 0.6))
    for k, (run, bs) in enumerate(panels):
        ax = axes[k // ncols][k % ncols]
        here = ov[(ov["run"] == run) & (ov["batch_size"] == bs)]
        fws = list(dict.fromkeys(here["framework"]))
        x = np.arange(len(fws))
        for i, p in enumerate(passes):
            vals, labels = [], []
            for fw in fws:
                m = here[(here["framework"] == fw) & (here["pass"] == p)]
                vals.append(m["step_ms_median"].iloc[0] if len(m) else np.nan)
                clean = here[(here["framework"] == fw) & (here["pass"] == "clean")]
                clean_busy = bool(len(clean)) and "contended" in clean and _flagged(clean["contended"].iloc[0])
                labels.append(_overhead_label(m.iloc[0], clean_busy) if len(m) and p != "clean" else "")
            bars = ax.bar(x + (i - (len(passes) - 1) / 2) * width, vals, width, label=p, color=cmap[i % len(cmap)])
            for bar, text in zip(bars, labels, strict=True):
                if text:  # upright: side by side, bars are narrower than "below noise"
                    ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), " " + text,
                            ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_xticks(x, [fw_label(fw) for fw in fws])
        ax.set_title(_title_case(run, bs, many), fontsize=10)
        ax.set_ylabel("median step time (ms)")
        ax.set_ylim(0, np.nanmax(here["step_ms_median"]) * 1.45)  # room for the upright labels
        ax.grid(axis="y", alpha=0.3)
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    axes[0][0].legend(title="pass", frameon=False, fontsize=8)
    fig.suptitle("Median step time per capture pass, ms (label: change vs the clean pass where it lies outside "
                 "the clean pass's 95% interval, else 'noise'; 'busy' where either ran contended; capture passes "
                 "sync every step)", fontsize=9)
    if len(skipped):
        why = sorted({f"{p} pass skipped: {w}" for p, w in zip(skipped["pass"], skipped["skipped"], strict=True)})
        fig.text(0.01, -0.02, "\n".join(why), fontsize=8, va="top", color="#862e9c")
    fig.tight_layout()
    return save_png(fig, path)


def roofline_figure(roof: pd.DataFrame, peaks: dict, path: Path) -> Path | None:
    """Achieved FLOP/s of each conv and linear op's kernels, against the device's fp32/tf32 peak."""
    r = roof.dropna(subset=["achieved_flops"])
    if r.empty:
        return None
    many = r["run"].nunique() > 1
    fig, ax = plt.subplots(figsize=(11, 4.8))
    labels = list(dict.fromkeys(f"{layer} {d}" for layer, d in zip(r["layer"], r["direction"], strict=True)))
    xpos = {lab: i for i, lab in enumerate(labels)}
    keys = list(dict.fromkeys(zip(r["run"], r["batch_size"], r["framework"], strict=True)))
    markers = "osD^v<>"
    for k, (run, bs, fw) in enumerate(keys):
        s = r[(r["run"] == run) & (r["batch_size"] == bs) & (r["framework"] == fw)]
        xs = [xpos[f"{a} {d}"] + (k - (len(keys) - 1) / 2) * 0.12 for a, d in zip(s["layer"], s["direction"],
                                                                                   strict=True)]
        ax.scatter(xs, s["achieved_flops"] / 1e12, color=_fw_color(fw), marker=markers[k % len(markers)],
                   s=45, label=f"{fw_label(fw)}, {_title_case(run, bs, many)}", zorder=3)
    notes = []
    drawn = set()
    for run, pk in peaks.items():
        if run not in set(r["run"]):
            continue
        if "fp32" in pk:
            for kind, ls in (("fp32", "--"), ("tf32", ":")):
                if (pk.get("gpu"), kind) in drawn:
                    continue
                drawn.add((pk.get("gpu"), kind))
                ax.axhline(pk[kind] / 1e12, color="#212529", ls=ls, lw=1)
                ax.text(len(labels) - 0.5, pk[kind] / 1e12, f"{pk['gpu']} peak {kind.upper()} "
                        f"{pk[kind] / 1e12:.0f} TFLOP/s (dense)", ha="right", va="bottom", fontsize=8)
        else:
            notes.append(f"{run}: {pk.get('note')}")
        if pk.get("not_shown"):
            notes.append(f"{run}: {pk['not_shown']}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylabel("achieved TFLOP/s (FLOPs from shapes / summed time)")
    ax.set_title("Achieved throughput of conv and linear work vs device peak"
                 + "".join(f"\n{line}" for line in textwrap.wrap("; ".join(notes), 130)), fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(frameon=False, fontsize=8, loc="lower left")
    fig.tight_layout()
    return save_png(fig, path)


MATH_COLOR = {"tf32": "#1971c2", "bf16": "#e8590c", "fp16": "#c2255c", "fp32": "#2b8a3e", "mixed": "#7048e8"}


def counters_roofline_figure(kernels: pd.DataFrame, peaks: dict, path: Path) -> Path | None:
    """Per case with a counters pass: each counted kernel at its arithmetic intensity (FLOPs / DRAM bytes,
    counters) and achieved FLOP/s (counter FLOPs over ncu's duration of the kernel), coloured by the math its
    counters say it ran; the run's measured roofs (GEMM peak per precision, copy bandwidth); each conv and
    linear layer x direction named at its costliest kernel. Unpaired kernels (no layer) in grey."""
    k = kernels.copy()
    for c in ("intensity", "flops_per_s"):
        k[c] = pd.to_numeric(k[c], errors="coerce")
    k = k[(k["intensity"] > 0) & (k["flops_per_s"] > 0)]
    if k.empty:
        return None
    keys = list(dict.fromkeys(zip(k["run"], k["case"], k["batch_size"], strict=True)))
    ncols = min(len(keys), 2)
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.6 * nrows + 0.8), squeeze=False)
    for ax, (run, case, bs) in zip(axes.flat, keys, strict=False):
        s = k[(k["run"] == run) & (k["case"] == case) & (k["batch_size"] == bs)]
        _counter_roofs(ax, peaks.get(run) or {}, s["intensity"])
        paired = s["matched"].astype(bool)
        for math, g in s[paired].groupby(s.loc[paired, "counter_math"].astype(str)):
            ax.scatter(g["intensity"], g["flops_per_s"] / 1e12, s=28, zorder=3,
                       color=MATH_COLOR.get(math, "#495057"), label=f"{math} ({len(g)} kernels)")
        if (~paired).any():
            ax.scatter(s.loc[~paired, "intensity"], s.loc[~paired, "flops_per_s"] / 1e12, s=14, zorder=2,
                       color="#adb5bd", marker="x", label=f"not paired ({int((~paired).sum())} kernels)")
        layer_work = s[paired & s["canonical_op"].isin(["conv2d", "linear"]) & s["layer"].notna()]
        for i, (_, g) in enumerate(layer_work.groupby(["layer", "direction"], sort=True)):
            top = g.loc[pd.to_numeric(g["flops"], errors="coerce").idxmax()]
            ax.annotate(f"{top['layer']} {top['direction']}", (top["intensity"], top["flops_per_s"] / 1e12),
                        xytext=(6, 8 - 14 * (i % 3)), textcoords="offset points", fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOPs / DRAM byte, counters)")
        ax.set_ylabel("achieved TFLOP/s (counters / ncu duration)")
        every = kernels[(kernels["run"] == run) & (kernels["case"] == case) & (kernels["batch_size"] == bs)]
        ax.set_title(f"{fw_label(str(case))}, bs {bs} ({run}): {int(every['matched'].astype(bool).sum())} of "
                     f"{len(every)} kernels paired; {len(every) - len(s)} without FLOPs or bytes not drawn", fontsize=9)
        ax.grid(which="both", alpha=0.25)
        ax.legend(frameon=False, fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    fig.suptitle("Counters pass (Nsight Compute, one training step, each kernel replayed with caches flushed, "
                 "clocks not locked): kernels under the roofs this run measured (a large GEMM per precision through the framework, "
                 "device copy); grey x: kernels not paired with a timing-pass kernel", fontsize=9, wrap=True)
    fig.tight_layout()
    return save_png(fig, path)


def _counter_roofs(ax, peaks: dict, intensity: pd.Series) -> None:
    """The measured roofs: min(GEMM peak of each precision, intensity x copy bandwidth), or a note."""
    bw = (peaks.get("dram") or {}).get("bytes_per_s")
    gemm = {m: g["flops_per_s"] for m, g in (peaks.get("gemm") or {}).items() if g.get("flops_per_s")}
    if not gemm or not bw:
        ax.text(0.02, 0.98, "no peaks measured in this run: no roofs", transform=ax.transAxes, va="top",
                fontsize=8)
        return
    x = np.logspace(np.log10(max(intensity.min() / 2, 1e-3)), np.log10(intensity.max() * 4), 100)
    for m, peak in sorted(gemm.items(), key=lambda kv: kv[1]):
        ax.plot(x, np.minimum(peak, x * bw) / 1e12, color=MATH_COLOR.get(m, "#212529"), lw=1, ls="--", zorder=1)
        ax.text(x[-1], peak / 1e12, f"{m} {peak / 1e12:.0f}", ha="right", va="bottom", fontsize=7)
    ax.text(x[0], x[0] * bw / 1e12, f"DRAM {bw / 1e12:.2f} TB/s", fontsize=7, va="bottom", rotation=0)


def trend_figure(history: pd.DataFrame, path: Path, stat: str = "median") -> Path | None:
    """Step benchmark time per bench job (pytest-benchmark storage, ``kernelmap.history``): one
    labelled line per key (framework x mode x device x batch size, ``trend_series``) over the jobs in
    time order (x: ``job_axis``; one job = one ``nox -s bench`` or ``nox -s benchmarks``, a run saved
    before jobs is a job of its own). y: the ``stat`` of the step benchmark, ms per training step
    (timed in blocks of steps like the clean pass). A point measured under contention (another process
    used the machine, ``kernelmap.contention``) is ringed in red; a point whose process ran with other glibc malloc
    settings than the key's previous point (``timing.ALLOC_ENV``, or recorded there first: ``trend_series``'s
    ``malloc_changed``) is boxed in black, since the step may be theirs. None when no saved benchmark carries
    a key."""
    from kernelmap.history.keys import flagged
    from kernelmap.history.trend import trend_series

    series = trend_series(history, stat)
    if not series:
        return None
    points = pd.concat(series.values())
    several_machines = points["machine"].nunique() > 1
    ticks = points.drop_duplicates("x").sort_values("x")
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(ticks) + 4), 4.2))
    # colour: framework; marker: batch size (a key with one point is told apart by it); line: mode
    styles = ("-", "--", ":", "-.")
    markers = ("o", "s", "^", "D", "v", "P", "X")
    bss = sorted(points["batch_size"].unique())
    modes = sorted(points["mode"].unique())
    for label, g in series.items():
        fw, mode, bs = g["framework"].iloc[0], g["mode"].iloc[0], g["batch_size"].iloc[0]
        ax.plot(g["x"], g["value"] * 1e3, label=label,
                color=_fw_color(fw), ls=styles[modes.index(mode) % len(styles)],
                marker=markers[bss.index(bs) % len(markers)], markersize=7)
    busy = points[[flagged(c) for c in points["contended"]]]
    if not busy.empty:
        ax.scatter(busy["x"], busy["value"] * 1e3, s=160, facecolors="none", edgecolors="red", linewidths=1.5,
                   zorder=5, label="measured under contention")
    moved = points[points["malloc_changed"].astype(bool)] if "malloc_changed" in points.columns else points.iloc[0:0]
    if not moved.empty:
        ax.scatter(moved["x"], moved["value"] * 1e3, s=220, marker="s", facecolors="none", edgecolors="black",
                   linewidths=1.2, zorder=5, label="malloc settings other than the previous point's (or first recorded)")
    ax.set_xticks(ticks["x"].tolist(), [f"{p} ({m})" if several_machines else p
                                        for p, m in zip(ticks["point"], ticks["machine"], strict=True)],
                  rotation=20, ha="right")
    ax.set_xlim(-0.5, max(len(ticks) - 0.5, 0.5))
    ax.set_xlabel("bench job (nox -s bench / benchmarks), in time order")
    ax.set_ylabel(f"{stat} time per training step (ms)")
    ax.set_title(f"Step time trend over bench jobs ({stat}), one line per framework x mode x device x batch size\n"
                 "(colour: framework; marker: batch size; line: mode)", fontsize=10)
    ax.set_yscale("log")
    # labels at 1, 2 and 5 per decade only (every minor tick labelled collided), written out: 2000, 0.5
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(alpha=0.3, which="both")
    ax.legend(frameon=False, fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return save_png(fig, path)
