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


def main(paths: list[str]) -> int:
    summaries = [json.loads(Path(p).read_text()) for p in paths if Path(p).is_file() and Path(p).stat().st_size]
    print(format_agreement(agreement(summaries)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
