"""The custom op against the built-in op in fc1, per run directory (``python benches/custom_op_compare.py
RUN_DIR...``; benches/gpu_job.sh's custom-op phase prints it): per run x source x direction, each kernel (GPU) or
op (CPU: the custom ops and the gemm ops, ``aten::mm``/``aten::addmm``) of layer fc1, its library and
its time per traced step (µs: the sum of its durations over the source's traced steps / their count;
GPU kernel time on the device clock, CPU op time on the host clock, the capture pass of that source).
Each run's route is read from its manifest (``built-in`` where it has none)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
from kernelmap.frameworks.pytorch import custom_op

from kernelmap import schema

LAYER = custom_op.LAYER
CPU_OPS = ("aten::mm", "aten::addmm", *custom_op.OP_NAMES.values())


def route_of(run_dir: Path) -> str:
    m = json.loads((Path(run_dir) / "manifest.json").read_text())
    return m["config"]["train"].get("options", {}).get("pytorch", {}).get(custom_op.OPTION) or "built-in"


def fc1_table(run_dir: str | Path) -> pd.DataFrame:
    """One row per source x direction x kernel (or CPU op) of PyTorch's fc1."""
    run_dir = Path(run_dir)
    df = schema.read_parquet(run_dir / "records.parquet")
    df = df[(df["framework"] == "pytorch") & df["source"].isin(["kineto", "nsys"])]
    rows = []
    for source, s in df.groupby("source"):
        steps = s["iteration"].dropna().nunique()
        k = s[(s["kind"] == "kernel") & (s["layer"] == LAYER)]
        name_col = "kernel_name"
        if k.empty:  # the CPU: ops, not kernels (nested ops counted once: only these names)
            k = s[(s["kind"].isin(["op", "annotation"])) & (s["layer"] == LAYER) & s["op_name"].isin(CPU_OPS)]
            name_col = "op_name"
        for (d, lib, name), g in k.groupby([k["direction"].fillna("none"), k["library"].fillna("unknown"),
                                            name_col]):
            rows.append({"run": run_dir.name, "route": route_of(run_dir), "source": source, "direction": d,
                         "library": lib, "name": name, "per_step": len(g) / steps if steps else None,
                         "us_per_step": float(g["dur_ns"].sum()) / steps / 1e3 if steps else None,
                         "steps": steps, "level": "kernel" if name_col == "kernel_name" else "op"})
    return pd.DataFrame(rows, columns=["run", "route", "source", "direction", "library", "name", "per_step",
                                       "us_per_step", "steps", "level"])


def format_table(t: pd.DataFrame) -> str:
    lines = ["fc1 of PyTorch per run: time per traced step (µs; GPU kernels on the device clock, CPU ops on "
             "the host clock), the capture pass of each source"]
    for (run, route, source), g in t.groupby(["run", "route", "source"], sort=False):
        lines.append(f"{run} ({route}), {source}, {int(g['steps'].iloc[0])} steps:")
        for _, r in g.sort_values(["direction", "library"]).iterrows():
            name = r["name"] if len(r["name"]) <= 90 else r["name"][:87] + "..."
            lines.append(f"  {r['direction']:<10} {r['library']:<9} {r['us_per_step']:>10.2f} µs "
                         f"x{r['per_step']:.0f}  {name}")
        total = g.groupby("direction")["us_per_step"].sum()
        lines.append("  total per direction: " + ", ".join(f"{d} {v:.2f} µs" for d, v in total.items()))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    t = pd.concat([fc1_table(d) for d in argv], ignore_index=True)
    print(format_table(t))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
