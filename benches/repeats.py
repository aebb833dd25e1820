"""Agreement of repeated ``kernelmap run`` clean passes: ``python benches/repeats.py RUN.json...`` (each the
``--json`` summary of one run). Per framework x batch size: every run's step median with its 95% CI, the spread
(max |x - median of the runs| / median) and the end-to-end step with the loader."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def agreement(summaries: list[dict]) -> dict[tuple[str, int], dict]:
    """Per framework x batch size: the runs' entries and the spread of their step medians."""
    by_bs: dict[tuple[str, int], list[dict]] = {}
    for s in summaries:
        for r in s["results"]:
            by_bs.setdefault((r["framework"], r["batch_size"]), []).append(r)
    out = {}
    for bs, rs in sorted(by_bs.items()):
        meds = [r["median_step_s"] for r in rs]
        mid = statistics.median(meds)
        out[bs] = {"runs": rs, "spread": max(abs(m - mid) for m in meds) / mid}
    return out


def format_agreement(table: dict[tuple[str, int], dict]) -> str:
    lines = ["repeated kernelmap runs (clean pass, step median ms [95% CI]; spread = max |x - median| / median)"]
    for (fw, bs), row in table.items():
        cells = ", ".join(f"{r['median_step_s'] * 1e3:.3f} [{r['ci95_low_s'] * 1e3:.3f}-{r['ci95_high_s'] * 1e3:.3f}]"
                          for r in row["runs"])
        e2e = ", ".join(f"{r['e2e_step_s'] * 1e3:.3f}" for r in row["runs"] if r.get("e2e_step_s"))
        lines.append(f"{fw} bs {bs}: {cells}; spread {row['spread']:.1%}; end-to-end with loader ms: {e2e}")
    return "\n".join(lines)


def load(paths: list[str]) -> tuple[list[dict], list[str]]:
    """(the summaries that hold results, one line per path that holds none, naming it and why)."""
    summaries, problems = [], []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            problems.append(f"{path}: no such file")
            continue
        text = path.read_text()
        if not text.strip():
            problems.append(f"{path}: empty (the run printed no summary: it failed or was stopped)")
            continue
        try:
            s = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}: not JSON ({exc.msg} at line {exc.lineno})")
            continue
        if isinstance(s, dict) and s.get("error"):
            problems.append(f"{path}: the run failed: {s['error']}")
            continue
        if not isinstance(s, dict) or not s.get("results"):
            problems.append(f"{path}: no results in the summary")
            continue
        summaries.append(s)
    return summaries, problems


def main(paths: list[str]) -> int:
    """Prints the agreement of the runs that hold results; exit 1 where any path holds none (named on stderr)."""
    summaries, problems = load(paths)
    if summaries:
        print(format_agreement(agreement(summaries)))
    for line in problems:
        print(f"repeats: {line}", file=sys.stderr)
    return 1 if problems or not summaries else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
