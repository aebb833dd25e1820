"""The whole CLI path a user runs: ``kernelmap normalise FILE -o out.parquet`` (read, label,
attribute, validate, write Parquet) on the ~1M-event Kineto and nsys traces that
``bench_adapters.py`` builds from the real H200 fixtures, beside Holistic Trace Analysis'
``Trace.parse_traces`` on the same Kineto file in the same session (where ``hta`` is installed).

Every measurement is a fresh subprocess: its own wall time (interpreter start and imports
excluded: measured from just before ``cli.main``) and peak RSS (VmHWM and ru_maxrss of that
process), against the input file size. Medians of ``--rounds`` (default 3) with min-max spread:

    python benches/bench_normalise.py [--rounds 3] [--dir DIR] [--json OUT.json]

``--dir`` keeps the scaled traces between invocations (built when missing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_adapters  # noqa: E402  (the scaling of the real fixtures, and HTA's reader)

_CLI = """
import re, resource, sys, time
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
from kernelmap.cli import main
base = hwm()
t = time.perf_counter()
rc = main(["normalise", sys.argv[1], "-o", sys.argv[2], "--replace", "--json"])
dt = time.perf_counter() - t
print(rc, dt, base, hwm(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr)
"""


def normalise_once(path: Path, out: Path) -> dict:
    """``kernelmap normalise path -o out`` in a fresh process: seconds, peak RSS, records."""
    p = subprocess.run([sys.executable, "-c", _CLI, str(path), str(out)], capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"kernelmap normalise {path} failed:\n{p.stderr[-3000:]}")
    rc, dt, base, peak, maxrss = p.stderr.split()[-5:]
    summary = json.loads(p.stdout)
    size = path.stat().st_size
    return {"seconds": float(dt), "records": summary["events"], "input_bytes": size,
            "peak_rss_bytes": int(peak), "ru_maxrss_bytes": int(maxrss), "rss_before_bytes": int(base),
            "peak_rss_ratio": int(peak) / size, "parquet_bytes": out.stat().st_size}


def hta_once(path: Path) -> dict:
    r = bench_adapters._peak(path, "hta")
    return {"seconds": r["seconds_fresh_process"], "records": r["rows"], "input_bytes": r["input_bytes"],
            "peak_rss_bytes": r["peak_rss_bytes"], "peak_rss_ratio": r["peak_rss_ratio"]}


def build(d: Path) -> dict:
    """The scaled traces in ``d`` (built once; their event counts in ``d/events.json``)."""
    d.mkdir(parents=True, exist_ok=True)
    meta = d / "events.json"
    if meta.is_file():
        return json.loads(meta.read_text())
    (d / "kineto").mkdir(exist_ok=True)  # HTA reads every trace of the directory it is given
    k, s = d / "kineto" / "rank0.json", d / "nsys.sqlite"
    s.unlink(missing_ok=True)
    out = {"kineto": [str(k), bench_adapters._scale_kineto(k)[0]], "nsys": [str(s), bench_adapters._scale_nsys(s)[0]]}
    meta.write_text(json.dumps(out))
    return out


def _stats(runs: list[dict], events: int) -> dict:
    secs = [r["seconds"] for r in runs]
    eps = [events / s for s in secs]
    ratio = [r["peak_rss_ratio"] for r in runs]
    return {"events": events, "records": runs[0]["records"], "input_bytes": runs[0]["input_bytes"],
            "seconds_median": statistics.median(secs), "seconds": secs,
            "events_per_s_median": statistics.median(eps), "events_per_s_min": min(eps), "events_per_s_max": max(eps),
            "peak_rss_ratio_median": statistics.median(ratio), "peak_rss_ratio_min": min(ratio),
            "peak_rss_ratio_max": max(ratio), "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the scaled traces are kept (default: a temporary directory)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--only", choices=["kineto", "nsys", "hta"], action="append")
    a = ap.parse_args(argv)
    import tempfile

    tmp = None
    if a.dir is None:
        tmp = tempfile.TemporaryDirectory()
        a.dir = tmp.name
    d = Path(a.dir)
    traces = build(d)
    try:
        import hta  # noqa: F401
        have_hta = True
    except ImportError:
        have_hta = False
    want = a.only or ["kineto", "hta", "nsys"]
    runs: dict[str, list] = {}
    for r in range(a.rounds):  # interleaved, so that load on the machine falls on all readers alike
        for what in want:
            if what == "hta" and not have_hta:
                continue
            path = Path(traces["kineto" if what == "hta" else what][0])
            res = hta_once(path) if what == "hta" else normalise_once(path, d / f"{what}.parquet")
            runs.setdefault(what, []).append(res)
            print(f"round {r + 1} {what}: {res['seconds']:.2f} s, peak RSS {res['peak_rss_ratio']:.2f}x file",
                  file=sys.stderr)
    out = {"machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg(), "python": sys.version.split()[0]},
           "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    for what, rs in runs.items():
        out[what] = _stats(rs, traces["kineto" if what == "hta" else what][1])
    if "kineto" in out and "hta" in out:
        out["kineto_vs_hta"] = out["kineto"]["events_per_s_median"] / out["hta"]["events_per_s_median"]
    for what in runs:
        s = out[what]
        print(f"{what:7s} {s['events']:>9,} events  {s['events_per_s_median'] / 1e3:7.0f}k events/s "
              f"({s['events_per_s_min'] / 1e3:.0f}k-{s['events_per_s_max'] / 1e3:.0f}k)  "
              f"peak RSS {s['peak_rss_ratio_median']:.2f}x file ({s['peak_rss_ratio_min']:.2f}-"
              f"{s['peak_rss_ratio_max']:.2f})  {s['input_bytes'] / 1e6:.0f} MB")
    if "kineto_vs_hta" in out:
        print(f"kernelmap normalise / HTA parse (Kineto): {out['kineto_vs_hta']:.1f}x")
    print(f"load average at the end: {out['machine']['loadavg_end']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
