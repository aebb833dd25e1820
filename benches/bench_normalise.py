"""The whole CLI path a user runs: ``kernelmap normalise FILE -o out.parquet`` (read, label,
attribute, validate, write Parquet) on the ~1M-event Kineto and nsys traces that
``bench_adapters.py`` builds from the real H200 fixtures, beside Holistic Trace Analysis'
``Trace.parse_traces`` on the same Kineto file in the same session (where ``hta`` is installed).

Every measurement is a fresh subprocess: its own wall time (interpreter start and imports
excluded: measured from just before ``cli.main``, with the modules ``normalise`` imports already
imported, as HTA's are before its parse is timed) and peak RSS (VmHWM and ru_maxrss of that
process), against the input file size. Medians of ``--rounds`` (default 3) with min-max spread:

    python benches/bench_normalise.py [--rounds 3] [--dir DIR] [--json OUT.json] [--input PATH ...]

``--dir`` keeps the scaled traces between invocations (built when missing). ``--input PATH``
(repeatable) adds a real trace: any Kineto ``.json``/``.json.gz``/``.json.xz`` or nsys
``.sqlite``/``.sqlite.gz``/``.sqlite.xz``, read by ``kernelmap normalise`` as it is (compressed
files too) and, for Kineto, by HTA from a decompressed copy. Its events are the trace's own:
Kineto ``traceEvents`` but metadata (``ph: M``), as for the scaled trace; for nsys, the rows of the
tables the adapter reads (kernels, runtime calls, memcpy/memset, NVTX ranges, cuDNN/cuBLAS
events). Peak RSS is given against the file as given and against its decompressed size.

The host's own speed (a 256 MB memory copy and a pure-Python loop, in a fresh process) is measured
before and after the rounds and printed with the CPU model and library versions (and kept in
``--json``): instances of one VM kind differ, and figures of two runs compare only where these agree.

Each kernelmap round also gives the whole process' wall time (interpreter start and imports too: what
a user waits for ``kernelmap normalise FILE``), beside the timed part.

A foreign trace (no one on this project recorded it): ``benches/data/owlv2-kineto-h100-tracelens.json.gz``
(2.7 MB; 56 MB of JSON, 132,092 events): AMD-AGI/TraceLens ``tests/traces/h100/google_owlv2-large-patch14-
ensemble__1016001.json.gz`` @ 171dd74721ca1ec45709e5805b68ae1f65e27811 (MIT; Copyright (c) 2024 - 2025
Advanced Micro Devices, Inc.): OWLv2 inference on an H100 with Python stacks, its top-level ``metadata``
member (the capturing machine's environment) cut out, the rest as written, ``gzip -9 -n``.

The real model's trace: ``benches/data/resnet50-kineto-h100-25steps.json.xz`` (2.6 MB; 52 MB of JSON,
193,193 events): torchvision ResNet-50 at bs 32 on an H100 (2026-11-23), recorded by
``python benches/record_resnet50_trace.py kineto OUT.json.gz --steps 40`` and cut, to stay under the
repository's 3 MB per file, after the host end of its 25th ProfilerStep (metadata events kept; events
starting later dropped, so the last step's GPU tail is partly cut).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
import kernelmap.normalise, pyarrow.parquet  # imports excluded, as for HTA's parse (its imports come first too)
base = hwm()
t = time.perf_counter()
rc = main(["normalise", sys.argv[1], "-o", sys.argv[2], "--replace", "--json"])
dt = time.perf_counter() - t
print(rc, dt, base, hwm(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr)
"""


def normalise_once(path: Path, out: Path, tree: Path | None = None) -> dict:
    """``kernelmap normalise path -o out`` in a fresh process: seconds, peak RSS, records. ``tree``:
    another checkout whose kernelmap is run (first on PYTHONPATH; its native helper built in place)."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # run from the output's folder: ``python -c`` puts the working directory first on sys.path, and a
    # checkout's own kernelmap there would shadow ``tree``'s
    t0, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-c", _CLI, str(Path(path).resolve()), str(Path(out).resolve())],
                       capture_output=True, text=True, env=env, cwd=Path(out).resolve().parent)
    process = time.perf_counter() - t0  # the whole process: interpreter start, imports, the command
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # and its CPU time, all threads (less load-bound)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    if p.returncode:
        raise RuntimeError(f"kernelmap normalise {path} failed:\n{p.stderr[-3000:]}")
    rc, dt, base, peak, maxrss = p.stderr.split()[-5:]
    summary = json.loads(p.stdout)
    size = path.stat().st_size
    return {"seconds": float(dt), "process_seconds": process, "process_cpu_seconds": cpu, "records": summary["events"], "input_bytes": size,
            "peak_rss_bytes": int(peak), "ru_maxrss_bytes": int(maxrss), "rss_before_bytes": int(base),
            "peak_rss_ratio": int(peak) / size, "parquet_bytes": out.stat().st_size}


def input_events(path: Path, d: Path) -> dict:
    """A real input: its format, events, decompressed size, and a decompressed copy for HTA (Kineto:
    the only file of its own directory)."""
    from kernelmap import adapters
    from kernelmap.adapters import _common

    fmt = adapters.detect(path)
    if fmt == "kineto":
        data = _common.read_bytes(path)
        plain = d / f"hta_{path.name.split('.')[0]}" / "trace.json"
        plain.parent.mkdir(parents=True, exist_ok=True)
        plain.write_bytes(data)
        doc = _common.parse_json(data, path)
        events = sum(1 for e in doc["traceEvents"] if not (isinstance(e, dict) and e.get("ph") == "M"))
        return {"format": fmt, "events": events, "plain_bytes": len(data), "hta_path": str(plain)}
    if fmt != "nsys":
        raise SystemExit(f"{path}: a {fmt} file; --input takes Kineto and nsys traces")
    import sqlite3
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "t.sqlite"
        with open(path, "rb") as fh:
            magic = fh.read(6)
        if not _common.decompressed_copy(path, magic, db):
            db = path
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        have = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        counts = {"CUPTI_ACTIVITY_KIND_KERNEL": "", "CUPTI_ACTIVITY_KIND_RUNTIME": "", "CUPTI_ACTIVITY_KIND_MEMCPY": "",
                  "CUPTI_ACTIVITY_KIND_MEMSET": "", "CUDNN_EVENTS": "", "CUBLAS_EVENTS": "",
                  "NVTX_EVENTS": ' WHERE eventType IN (59, 60) AND "end" IS NOT NULL'}
        events = sum(con.execute(f"select count(*) from {t}{w}").fetchone()[0] for t, w in counts.items() if t in have)
        con.close()
        return {"format": fmt, "events": events, "plain_bytes": db.stat().st_size, "hta_path": None}


def hta_once(path: Path) -> dict:
    r = bench_adapters._peak(path, "hta")
    return {"seconds": r["seconds_fresh_process"], "records": r["rows"], "input_bytes": r["input_bytes"],
            "peak_rss_bytes": r["peak_rss_bytes"], "peak_rss_ratio": r["peak_rss_ratio"]}


# The host's own speed, in a fresh process before and after the rounds: one VM kind gives
# instances that differ (the same code 1.7x slower on one than on another), so a figure read
# against another run's needs these beside it. Copying 256 MB (memory-bound, as the columnar
# work is) and a pure-Python loop (as HTA's parse is), best of 5 each.
_HOST = """
import json, time, numpy as np
a = np.ones(1 << 25); b = np.empty_like(a)
copy = min((lambda t: (np.copyto(b, a), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))
def loop():
    t = time.perf_counter(); s = 0
    for i in range(3_000_000):
        s += i
    return time.perf_counter() - t
py = min(loop() for _ in range(5))
print(json.dumps({"copy_gb_per_s": a.nbytes / copy / 1e9, "python_loop_m_per_s": 3.0 / py}))
"""


def host_speed() -> dict:
    """Memory copy GB/s and pure-Python loop iterations/s (millions) of this host, just now."""
    p = subprocess.run([sys.executable, "-c", _HOST], capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


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
    whole = [r["process_seconds"] for r in runs if "process_seconds" in r]  # kernelmap's runs (not HTA's)
    cpu = [r["process_cpu_seconds"] for r in runs if "process_cpu_seconds" in r]
    process = {"process_seconds_median": statistics.median(whole), "process_seconds": whole,
               "process_events_per_s_median": events / statistics.median(whole),
               "process_cpu_seconds_median": statistics.median(cpu), "process_cpu_seconds": cpu} if whole else {}
    return {"events": events, "records": runs[0]["records"], "input_bytes": runs[0]["input_bytes"],
            **process, "seconds_median": statistics.median(secs), "seconds": secs,
            "events_per_s_median": statistics.median(eps), "events_per_s_min": min(eps), "events_per_s_max": max(eps),
            "peak_rss_ratio_median": statistics.median(ratio), "peak_rss_ratio_min": min(ratio),
            "peak_rss_ratio_max": max(ratio), "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the scaled traces are kept (default: a temporary directory)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--only", choices=["kineto", "nsys", "hta"], action="append",
                    help="only these of the scaled traces (and HTA on the scaled Kineto one)")
    ap.add_argument("--input", action="append", default=[], metavar="PATH",
                    help="a real Kineto or nsys trace to measure too (repeatable; .gz/.xz as they are)")
    ap.add_argument("--no-scaled", action="store_true", help="only the --input traces")
    ap.add_argument("--baseline", metavar="DIR",
                    help="another checkout of kernelmap (e.g. `git worktree add DIR COMMIT`, then `python setup.py "
                         "build_ext --inplace` there) timed on the same traces in the same interleaved rounds")
    a = ap.parse_args(argv)
    import tempfile

    tmp = None
    if a.dir is None:
        tmp = tempfile.TemporaryDirectory()
        a.dir = tmp.name
    d = Path(a.dir)
    traces = {} if a.no_scaled else build(d)
    inputs = {}
    for i, p in enumerate(map(Path, a.input)):
        info = input_events(p, d)
        inputs[f"input{i + 1}:{p.name}"] = {"path": str(p), **info}
    try:
        import hta  # noqa: F401
        have_hta = True
    except ImportError:
        have_hta = False
    want = [] if a.no_scaled else (a.only or ["kineto", "hta", "nsys"])
    jobs = {what: (Path(traces["kineto" if what == "hta" else what][0]), what == "hta") for what in want
            if what != "hta" or have_hta}
    events = {what: traces["kineto" if what == "hta" else what][1] for what in jobs}
    for name, info in inputs.items():
        jobs[name] = (Path(info["path"]), False)
        events[name] = info["events"]
        if info["hta_path"] and have_hta:
            jobs[f"{name}:hta"] = (Path(info["hta_path"]), True)
            events[f"{name}:hta"] = info["events"]
    trees: dict[str, Path | None] = {what: None for what in jobs}
    if a.baseline:
        base = Path(a.baseline).resolve()
        if not (base / "kernelmap" / "cli.py").is_file():
            raise SystemExit(f"--baseline {a.baseline}: not a kernelmap checkout (no kernelmap/cli.py)")
        for what, (path, is_hta) in list(jobs.items()):
            if not is_hta:
                jobs[f"{what}@baseline"], events[f"{what}@baseline"] = (path, False), events[what]
                trees[f"{what}@baseline"] = base
    load_start = os.getloadavg()
    speed_before = host_speed()
    runs: dict[str, list] = {}
    for r in range(a.rounds):  # interleaved, so that load on the machine falls on all readers alike
        for what, (path, is_hta) in jobs.items():
            res = hta_once(path) if is_hta else normalise_once(path, d / f"{what.replace(':', '_').replace('@', '_')}.parquet",
                                                                 trees[what])
            info = inputs.get(what.split("@")[0])
            if info:  # against the decompressed size too
                res["peak_rss_ratio_plain"] = res["peak_rss_bytes"] / info["plain_bytes"]
            runs.setdefault(what, []).append(res)
            print(f"round {r + 1} {what}: {res['seconds']:.2f} s, peak RSS {res['peak_rss_ratio']:.2f}x file",
                  file=sys.stderr)
    speed_after = host_speed()
    import numpy
    import pandas
    import pyarrow

    out = {"machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "loadavg_start": load_start,
                       "loadavg_end": os.getloadavg(),
                       "python": sys.version.split()[0], "numpy": numpy.__version__, "pandas": pandas.__version__,
                       "pyarrow": pyarrow.__version__, "speed_before": speed_before, "speed_after": speed_after},
           "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    for what, rs in runs.items():
        out[what] = _stats(rs, events[what])
        if what.split("@")[0] in inputs:
            out[what].update(inputs[what.split("@")[0]], peak_rss_ratio_plain_median=statistics.median(
                r["peak_rss_ratio_plain"] for r in rs))
    vs = {k: (k, "hta") for k in ["kineto"]} | {k: (k, f"{k}:hta") for k in inputs}
    for k, (mine, theirs) in vs.items():
        if mine in out and theirs in out:
            out[f"{k}_vs_hta"] = out[mine]["events_per_s_median"] / out[theirs]["events_per_s_median"]
    for what in runs:
        s = out[what]
        plain = (f" = {s['peak_rss_ratio_plain_median']:.2f}x its decompressed {s['plain_bytes'] / 1e6:.0f} MB"
                 if "plain_bytes" in s and s["plain_bytes"] != s["input_bytes"] else "")
        print(f"{what:7s} {s['events']:>9,} events  {s['seconds_median']:.2f} s ({min(s['seconds']):.2f}-"
              f"{max(s['seconds']):.2f})  {s['events_per_s_median'] / 1e3:7.0f}k events/s "
              f"({s['events_per_s_min'] / 1e3:.0f}k-{s['events_per_s_max'] / 1e3:.0f}k)  "
              f"peak RSS {s['peak_rss_ratio_median']:.2f}x file ({s['peak_rss_ratio_min']:.2f}-"
              f"{s['peak_rss_ratio_max']:.2f})  {s['input_bytes'] / 1e6:.0f} MB{plain}")
        if "process_seconds" in s:
            ps = s["process_seconds"]
            cs = s["process_cpu_seconds"]
            print(f"{'':7s} whole process (interpreter start and imports too): {s['process_seconds_median']:.2f} s "
                  f"({min(ps):.2f}-{max(ps):.2f})  {s['process_events_per_s_median'] / 1e3:7.0f}k events/s; "
                  f"its CPU time {s['process_cpu_seconds_median']:.2f} s ({min(cs):.2f}-{max(cs):.2f})")
    for k in vs:
        if f"{k}_vs_hta" in out:
            print(f"kernelmap normalise / HTA parse ({k}): {out[f'{k}_vs_hta']:.1f}x")
    m = out["machine"]
    print(f"load average (1, 5, 15 min) at the start: {m['loadavg_start']}, at the end: {m['loadavg_end']} "
          f"({m['cpus']} CPUs)")
    print(f"host: {m['cpu']}, {m['cpus']} CPUs; Python {m['python']}, numpy {m['numpy']}, pandas {m['pandas']}, "
          f"pyarrow {m['pyarrow']}; memory copy {speed_before['copy_gb_per_s']:.1f} -> {speed_after['copy_gb_per_s']:.1f} "
          f"GB/s, Python loop {speed_before['python_loop_m_per_s']:.0f}M -> {speed_after['python_loop_m_per_s']:.0f}M "
          f"iterations/s (before -> after the rounds; compare figures across runs only where these agree)")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
