"""Adapter speed: events/s of the Kineto JSON and nsys SQLite adapters on >= 1M-event traces built
at bench time by replicating the real GPU fixtures (the H200 Kineto trace and nsys export; steps
shifted in time, correlation and External ids shifted), and peak RSS of a fresh process reading
them, against the input file size (``extra_info``).

    pytest benches/bench_adapters.py --benchmark-only
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
TARGET = 1_000_000


def _scale_kineto(dst: Path) -> tuple[int, int, int]:
    """Returns (events, complete events, complete events of category ``Trace``)."""
    doc = json.loads(gzip.open(DATA / "gpu_kineto.json.gz").read())
    ev = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    t0 = min(e["ts"] for e in ev)
    span = max(e["ts"] + e.get("dur", 0) for e in ev) - t0 + 10.0
    reps = -(-TARGET // len(ev))
    with open(dst, "w") as fh:
        fh.write('{"schemaVersion": 1, "traceEvents": [\n')
        fh.write(",\n".join(json.dumps(e) for e in meta))
        for r in range(reps):
            for e in ev:
                e2 = dict(e, ts=round(e["ts"] + r * span, 3))
                a = e2.get("args")
                if isinstance(a, dict):
                    e2["args"] = dict(a, **{k: a[k] + r * 1_000_000 for k in ("External id", "correlation")
                                            if isinstance(a.get(k), int)})
                if "id" in e2 and isinstance(e2["id"], int):  # flow events (ac2g: the correlation id)
                    e2["id"] += r * 1_000_000
                fh.write(",\n")
                fh.write(json.dumps(e2))
        fh.write("\n]}\n")
    complete = [e for e in ev if e.get("ph") == "X"]
    return reps * len(ev), reps * len(complete), reps * sum(e.get("cat") == "Trace" for e in complete)


def _scale_nsys(dst: Path) -> tuple[int, int]:
    with gzip.open(DATA / "gpu_nsys.sqlite.gz", "rb") as fi, open(dst, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    con = sqlite3.connect(dst)
    have = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    tables = [t for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                          "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS") if t in have]
    base = sum(con.execute(f"select count(*) from {t}").fetchone()[0] for t in tables)
    lo, hi = con.execute('select min(start), max("end") from CUPTI_ACTIVITY_KIND_RUNTIME').fetchone()
    span = hi - lo + 1000
    reps = -(-TARGET // base)
    for t in tables:
        cols = [r[1] for r in con.execute(f'pragma table_info("{t}")')]
        sel = ", ".join(f'"{c}" + :o' if c in ("start", "end") else
                        f'"{c}" + :c' if c == "correlationId" else f'"{c}"' for c in cols)
        q = f'insert into {t} ({", ".join(chr(34) + c + chr(34) for c in cols)}) select {sel} from {t} where start < :hi'
        rows_hi = hi + 1
        for r in range(1, reps):
            con.execute(q, {"o": r * span, "c": r * 10_000_000, "hi": rows_hi})
    con.commit()
    n = sum(con.execute(f"select count(*) from {t}").fetchone()[0] for t in tables)
    con.close()
    return n, n


# VmHWM, not ru_maxrss: Linux carries the parent's ru_maxrss across fork+exec
_PEAK = """
import re, sys, time
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
{imports}
base = hwm()
t = time.perf_counter(); n = {read}; dt = time.perf_counter() - t
print(n, dt, base, hwm())
"""
_READERS = {
    "kernelmap": ("from kernelmap.adapters import read", "len(read(sys.argv[1]))"),
    # HTA reads a directory of per-rank traces; the file is its only entry
    "hta": ("import os\nfrom hta.common.trace import Trace",
            "(lambda t: (t.parse_traces(use_multiprocessing=False), len(t.get_trace(next(iter(t.traces)))))[1])"
            "(Trace(trace_dir=os.path.dirname(sys.argv[1])))"),
}


def _peak(path: Path, reader: str = "kernelmap") -> dict:
    """Read ``path`` in a fresh process: its own wall time and peak RSS (VmHWM) against the file size."""
    imports, read = _READERS[reader]
    code = _PEAK.format(imports=imports, read=read)
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    rows, dt, base, peak = out.stdout.split()[-4:]
    size = path.stat().st_size
    return {"rows": int(rows), "seconds_fresh_process": float(dt), "input_bytes": size,
            "peak_rss_bytes": int(peak), "rss_before_read_bytes": int(base),
            "peak_rss_ratio": int(peak) / size, "peak_rss_growth_ratio": (int(peak) - int(base)) / size}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    (d / "kineto").mkdir()  # a directory of its own: HTA reads every trace in the directory it is given
    k, s = d / "kineto" / "rank0.json", d / "nsys.sqlite"
    return {"kineto": (k, _scale_kineto(k)), "nsys": (s, _scale_nsys(s))}


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_adapter_speed(benchmark, traces, fmt):
    benchmark.group = f"adapter speed: {fmt}"
    from kernelmap.adapters import read

    path, (n_events, n_records, *_) = traces[fmt]
    assert n_events >= TARGET
    df = benchmark.pedantic(read, args=(path, fmt), rounds=1, iterations=1)
    assert len(df) == n_records  # Kineto flow (s/f), metadata and instant events are read but are not records
    secs = benchmark.stats.stats.mean
    from kernelmap.adapters import _common

    benchmark.extra_info.update({"events": n_events, "events_per_s": n_events / secs, "records": len(df),
                                 "json_parser": "orjson" if _common._orjson is not None else "json", **_peak(path)})


def test_hta_kineto_speed(benchmark, traces):
    """The anchor, on the same file in the same session: Holistic Trace Analysis parsing the scaled
    Kineto trace (``pip install holistictraceanalysis==0.5.0``; skipped without it). Shown in the
    same benchmark group as kernelmap's Kineto adapter, so the table compares the two directly."""
    pytest.importorskip("hta")
    from hta.common.trace import Trace

    benchmark.group = "adapter speed: kineto"
    path, (n_events, n_complete, n_trace_spans) = traces["kineto"]

    def parse():
        t = Trace(trace_dir=str(path.parent))
        t.parse_traces(use_multiprocessing=False)
        return t.get_trace(next(iter(t.traces)))

    df = benchmark.pedantic(parse, rounds=1, iterations=1)
    assert len(df) == n_complete - n_trace_spans  # HTA keeps every complete event but the "Trace" span
    benchmark.extra_info.update({"events": n_events, "events_per_s": n_events / benchmark.stats.stats.mean,
                                 "records": len(df), "hta_version": _hta_version(), **_peak(path, "hta")})


def _hta_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("holistictraceanalysis")
    except PackageNotFoundError:
        return None
