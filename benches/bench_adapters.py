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


def _scale_kineto(dst: Path) -> tuple[int, int]:
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
    return reps * len(ev), reps * sum(e.get("ph") == "X" for e in ev)


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
from kernelmap.adapters import read
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
base = hwm()
t = time.perf_counter(); df = read(sys.argv[1]); dt = time.perf_counter() - t
print(len(df), dt, base, hwm())
"""


def _peak(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True, text=True, check=True)
    rows, dt, base, peak = out.stdout.split()
    size = path.stat().st_size
    return {"rows": int(rows), "seconds_fresh_process": float(dt), "input_bytes": size,
            "peak_rss_bytes": int(peak), "rss_before_read_bytes": int(base),
            "peak_rss_ratio": int(peak) / size, "peak_rss_growth_ratio": (int(peak) - int(base)) / size}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    k, s = d / "kineto.json", d / "nsys.sqlite"
    return {"kineto": (k, _scale_kineto(k)), "nsys": (s, _scale_nsys(s))}


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_adapter_speed(benchmark, traces, fmt):
    from kernelmap.adapters import read

    path, (n_events, n_records) = traces[fmt]
    assert n_events >= TARGET
    df = benchmark.pedantic(read, args=(path, fmt), rounds=1, iterations=1)
    assert len(df) == n_records  # Kineto flow (s/f), metadata and instant events are read but are not records
    secs = benchmark.stats.stats.mean
    from kernelmap.adapters import _common

    benchmark.extra_info.update({"events": n_events, "events_per_s": n_events / secs, "records": len(df),
                                 "json_parser": "orjson" if _common._orjson is not None else "json", **_peak(path)})
