"""Summary of the GPU job's harness phase (benches/gpu_job.sh, PHASES=harness):
``python benches/harness_vs_bare.py OUT``.

Per framework mode x batch size: the bare loop's per-process medians and kernelmap's clean-pass medians
(one trial per process), each as median [min-max] over processes, and kernelmap / bare of the medians.
The host's own noise is the bare loop's spread between processes: a difference inside it is noise."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def collect(out: Path) -> dict[tuple[str, int], dict[str, list[float]]]:
    """{(mode, batch size): {"bare": [ms per process], "kernelmap": [ms per process]}}."""
    table: dict[tuple[str, int], dict[str, list[float]]] = {}
    for line in (out / "bare.jsonl").read_text().splitlines() if (out / "bare.jsonl").is_file() else []:
        d = json.loads(line)
        table.setdefault((d["mode"], int(d["bs"])), {"bare": [], "kernelmap": []})["bare"].append(d["median_ms"])
    for f in sorted(out.glob("run-*.json")):
        mode = f.stem[len("run-"):].rsplit("-", 1)[0]
        text = f.read_text()
        if not text.strip():
            continue
        for r in json.loads(text)["results"]:
            table.setdefault((mode, int(r["batch_size"])), {"bare": [], "kernelmap": []})["kernelmap"].append(
                r["median_step_s"] * 1e3)
    return table


def summarise(table: dict[tuple[str, int], dict[str, list[float]]]) -> list[dict]:
    rows = []
    for (mode, bs), d in sorted(table.items()):
        b, k = d["bare"], d["kernelmap"]
        row = {"mode": mode, "batch_size": bs, "bare_n": len(b), "kernelmap_n": len(k)}
        for name, xs in (("bare", b), ("kernelmap", k)):
            row[f"{name}_ms"] = statistics.median(xs) if xs else None
            row[f"{name}_range_ms"] = (min(xs), max(xs)) if xs else None
        if b and k:
            row["ratio"] = row["kernelmap_ms"] / row["bare_ms"]
            row["bare_spread"] = (max(b) - min(b)) / row["bare_ms"]
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    out = ["mode bs | bare ms median [min-max] (n) | kernelmap clean ms median [min-max] (n) | kernelmap/bare | "
           "bare spread between processes"]
    def cell(r: dict, name: str) -> str:
        if r[f"{name}_ms"] is None:
            return "-"
        lo, hi = r[f"{name}_range_ms"]
        return f"{r[f'{name}_ms']:.3f} [{lo:.3f}-{hi:.3f}] ({r[f'{name}_n']})"

    for r in rows:
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "-"
        spread = f"{r['bare_spread']:.1%}" if "bare_spread" in r else "-"
        out.append(f"{r['mode']} {r['batch_size']} | {cell(r, 'bare')} | {cell(r, 'kernelmap')} | {ratio} | {spread}")
    return "\n".join(out)


if __name__ == "__main__":
    print(format_rows(summarise(collect(Path(sys.argv[1])))))
