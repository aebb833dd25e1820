"""Trim a multi-device run to a small fixture: its several-device cases' last traced steps, every rank.

    python tests/data/trim_devices_run.py RUN_DIR OUT_DIR --steps 3 [--cases pytorch-x2/bs64 jax-x2/bs64]

For each case kept (default: every case on more than one device whose folder holds a trace): manifest.json
(``reduced_manifest``: told of the kept cases only), results.json (the kept cases' entries),
parity-devices-<case>.json, each rank's folder (rank 0 the case folder, rank<r>/ the others) with its pass results (``*.json``), NCCL log and HLO text as they are, and its trace trimmed to the last ``--steps``
``kernelmap:step#N`` regions (complete events, as Kineto and XLA write them, or MXNet's B/E pairs): every event from the first kept step's
start on (the capture ends after the last step; a capture pass synchronises its devices after every step, so no
earlier step's kernel runs into the window), every metadata event, and the step markers of steps the trace recorded no work in (MXNet's warm-up steps:
its profiler writes their spans while its operator profiling is off); numbers keep their written text
(tests/data/foreign/make_fixtures.py's load and dump). The library logs (cuDNN's, cuBLAS's: megabytes) are left out,
but those named by ``--logs CASE:NAME`` (e.g. ``mxnet-x2/bs1024:cudnn.log``): the case folder's log whole, gzipped
(``NAME.gz``, read as it is): its calls are counted over the libs pass's logged steps, so a log cut to the kept
steps would contradict its pass result.
Each rank is trimmed to the same step numbers; a trace without those steps is an error naming it.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "foreign"))
from make_fixtures import dump, load  # noqa: E402  (a script beside this one)

STEP = re.compile(r"^kernelmap:step#(\d+)$")
TRACE = "trace.json.gz"
KEEP_AS_IS = ("*.json", "nccl.log", "*.hlo.txt.gz")


def steps_of(doc: dict) -> dict[int, tuple]:
    """Step number -> (start, end) of its ``kernelmap:step#N`` complete event(s) or B/E pair (the widest)."""
    out: dict[int, tuple] = {}
    for e in doc["traceEvents"]:
        m = STEP.match(str(e.get("name", "")))
        if m and e.get("ph") in ("X", "B", "E"):  # MXNet's profiler writes its step spans as B/E pairs
            n, s = int(m.group(1)), e["ts"]
            t = s + e.get("dur", 0) if e["ph"] == "X" else s
            a, b = out.get(n, (s, t))
            out[n] = (min(a, s), max(b, t))
    return out


def trim(doc: dict, keep: list[int], where: Path) -> dict:
    """``doc`` with the events of steps ``keep`` on (see the module docstring)."""
    steps = steps_of(doc)
    missing = [n for n in keep if n not in steps]
    if missing:
        raise SystemExit(f"{where}: no kernelmap:step#{missing[0]} in the trace (its steps: {sorted(steps)})")
    t0 = min(steps[n][0] for n in keep)
    marks = [e for e in doc["traceEvents"] if STEP.match(str(e.get("name", "")))]
    work = sorted(e["ts"] for e in doc["traceEvents"]  # what ran: not the workload's own regions (kernelmap:...)
                  if "ts" in e and e.get("ph") != "M" and not str(e.get("name", "")).startswith("kernelmap:"))
    empty = {n for n, (a, b) in steps.items() if bisect.bisect_left(work, a) == bisect.bisect_right(work, b)}
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "M" or ("ts" in e and e["ts"] >= t0)
          or (e in marks and int(STEP.match(e["name"]).group(1)) in empty)]
    return {**doc, "traceEvents": ev}


def reduced_manifest(m: dict, cases: list[str], results: list[dict], steps: int) -> dict:
    """``m`` told of the kept cases only: its asked cases (``config.cases``), frameworks, notes naming a case
    (``<case> bs ...``: the kept ones'), the devices' parity of the kept cases; the one-device parity (files not
    kept) left out; a note saying so."""
    kept = [r for r in results if r.get("dir") in cases]
    fws = {r.get("framework") for r in kept}
    names = {str(r["dir"]).split("/")[0] for r in kept}
    cfg = m.get("config") or {}
    out = {**m, "frameworks": {k: v for k, v in (m.get("frameworks") or {}).items() if k in fws},
           "parity": {}, "parity_devices": {k: v for k, v in (m.get("parity_devices") or {}).items() if k in names},
           "notes": [n for n in m.get("notes") or [] if not re.match(r"^\S+ bs \d", n) or n.split()[0] in names]}
    if "cases" in cfg:
        out["config"] = {**cfg, "cases": [c for c in cfg["cases"] if c.get("dir") in cases]}
    out["notes"].append(f"trimmed by tests/data/trim_devices_run.py to the cases {', '.join(cases)} (their last "
                        f"{steps} traced steps); the one-device parity and other cases left out")
    return out


def rank_folders(case: Path) -> list[Path]:
    return [case, *sorted(p for p in case.glob("rank*") if p.is_dir() and p.name[4:].isdigit())]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cases", nargs="*")
    ap.add_argument("--logs", nargs="*", default=[], metavar="CASE:NAME")
    a = ap.parse_args(argv)
    results = json.loads((a.run / "results.json").read_text())
    cases = a.cases or [r["dir"] for r in results if (r.get("devices") or 1) > 1 and (a.run / r["dir"] / TRACE).is_file()]
    if a.out.exists():
        raise SystemExit(f"{a.out}: exists; give a new folder")
    a.out.mkdir(parents=True)
    manifest = json.loads((a.run / "manifest.json").read_text())
    (a.out / "manifest.json").write_text(json.dumps(reduced_manifest(manifest, cases, results, a.steps), indent=1) + "\n")
    for name in {str(c).split("/")[0] for c in cases}:  # the kept cases' parity across devices
        if (a.run / f"parity-devices-{name}.json").is_file():
            shutil.copy2(a.run / f"parity-devices-{name}.json", a.out)
    (a.out / "results.json").write_text(json.dumps([r for r in results if r.get("dir") in cases], indent=1) + "\n")
    for case in cases:
        src = a.run / case
        first = steps_of(load(src / TRACE))
        keep = sorted(first)[-a.steps:]
        for folder in rank_folders(src):
            dst = a.out / folder.relative_to(a.run)
            dst.mkdir(parents=True, exist_ok=True)
            for pattern in KEEP_AS_IS:
                for f in folder.glob(pattern):
                    shutil.copy2(f, dst / f.name)
            if not (folder / TRACE).is_file():  # every rank's trace, or no fixture (a rank must not go missing)
                raise SystemExit(f"{folder / TRACE}: absent (rank 0's is there)")
            dump(trim(load(folder / TRACE), keep, folder / TRACE), dst / TRACE)
        for name in (x.split(":", 1)[1] for x in a.logs if x.split(":", 1)[0] == case):
            with open(src / name, "rb") as fi, gzip.GzipFile(a.out / case / f"{name}.gz", "wb", 9, mtime=0) as fo:
                shutil.copyfileobj(fi, fo)
        print(f"{case}: steps {keep[0]}-{keep[-1]} of {sorted(first)}, ranks {len(rank_folders(src))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
