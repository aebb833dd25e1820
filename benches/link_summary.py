"""Issue 25's figures from normalised run directories (``kernelmap normalise`` / ``run`` wrote their
attribution.json): per framework x mode x batch size x source, the share of library-kernel time linked to
the library call that launched it, every unlinked remainder with its reason, what the libs pass's own
trace owned (calls by thread and time, or by order), the layers where a timing pass ran other kernels
than the libs pass, and the library calls per step against the model's (``reports.checks``).

    python benches/link_summary.py RUN_DIR [RUN_DIR ...] [--json OUT.json]

Computing (``summary``) returns data; ``text`` prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kernelmap.rundir import CaseEntry, RunDir


def _cases(run_dir: Path) -> dict[str, CaseEntry]:
    """The run's cases by their folder (attribution.json's ``runs`` are keyed by it), read by the one loader."""
    return {str(e.dir): e for e in RunDir(run_dir).read_cases()}


def summary(run_dirs: list[Path]) -> list[dict]:
    """One row per run x framework x batch size x source (see the module docstring)."""
    rows = []
    for d in run_dirs:
        attr = json.loads((d / "attribution.json").read_text())
        cases = _cases(d)
        for folder, run in sorted(attr.get("runs", {}).items()):
            key = cases[folder].key  # a folder without a results.json entry: KeyError, not a guessed case
            fw, bs = key.name, key.batch_size
            libs = {k: run.get(k) for k in ("libs_trace", "libs_trace_library_kernels", "libs_trace_kernels_owned",
                                            "libs_trace_kernels_owned_by_time", "libs_trace_kernels_owned_by_order",
                                            "log_clock_offset_ns", "carried_kernels_linked", "libs_pass_notes",
                                            "libs_trace_unowned_top")}
            for src, b in sorted(run.get("by_source", {}).items()):
                rows.append({
                    "run_dir": str(d), "framework": fw, "mode": key.mode, "math": key.math, "batch_size": bs, "source": src,
                    "library_kernels": b.get("library_kernels"), "linked": b.get("library_kernels_linked"),
                    "time_linked_share": b.get("library_kernel_time_linked_share"),
                    "unlinked": b.get("library_unlinked_top", []),
                    "algorithm_differs": [x for x in run.get("algorithm_differs", []) if x.get("source") == src],
                    **libs,
                })
    return rows


def library_call_checks(run_dirs: list[Path]) -> list[dict]:
    """The ``library calls per step`` self-check rows of each run (needs the reports package)."""
    from kernelmap.reports import analysis as A
    from kernelmap.reports import checks as C

    out = []
    for d in run_dirs:
        ch = C.self_checks([A.load_run(d)])
        ch = ch[ch["check"] == C.Check.LIBRARY_CALLS]
        out += [{"run_dir": str(d), **{k: (None if v != v else v) for k, v in r.items()}}
                for r in ch.astype(object).to_dict("records")]
    return out


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def text(rows: list[dict], checks: list[dict]) -> str:
    out = ["case                    mode            bs    source     library kernels linked      time linked"]
    for r in rows:
        out.append(f"{r['framework']:<23} {r['mode']:<15} {r['batch_size']:<5} {r['source']:<10} "
                   f"{r['linked']}/{r['library_kernels']:<22} {_pct(r['time_linked_share'])}")
        for u in r["unlinked"]:
            out.append(f"    unlinked: {u['count']} x {u['kernel_name'][:80]} ({u['time_ns'] / 1e3:.1f} us): {u['reason']}")
        for x in r["algorithm_differs"]:
            out.append(f"    {x['layer']} {x['direction']} ({x['op_name']}, {x['ops']} ops): the libs pass ran "
                       f"{x['libs_pass']}; this pass ran {', '.join(x['this_pass'])}")
    seen = set()
    for r in rows:
        key = (r["run_dir"], r["framework"], r["batch_size"])
        if key in seen or r.get("libs_trace") is None:
            continue
        seen.add(key)
        out.append(f"libs pass {r['framework']} bs {r['batch_size']}: {r['libs_trace_kernels_owned']}/"
                   f"{r['libs_trace_library_kernels']} kernels owned by a logged call ({r['libs_trace_kernels_owned_by_time']} "
                   f"by thread and time, {r['libs_trace_kernels_owned_by_order']} by order; log clock offset "
                   f"{r['log_clock_offset_ns']} ns), {r['carried_kernels_linked']} kernels of the timing passes linked "
                   f"through it; notes: {r['libs_pass_notes']}")
        for u in r.get("libs_trace_unowned_top") or []:
            out.append(f"    not owned: {u['count']} x {u['kernel_name'][:90]}")
    out.append("library calls per step (cuDNN convolutions) against the model:")
    for c in checks:
        out.append(f"  {c['framework']} bs {c['batch_size']} {c['subject']}: expected {c['expected']}, measured "
                   f"{c['measured']}, {c['status']}: {c['detail']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", type=Path)
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    a = p.parse_args(argv)
    rows = summary(a.run_dirs)
    checks = library_call_checks(a.run_dirs)
    print(text(rows, checks))
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "library_call_checks": checks}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
