"""``kernelmap normalise``: run the adapters on any mix of traces and logs, link the files of one
run to each other, write one records table (Parquet, docs/SCHEMA.md) and print the summary.

Files of one run are the files of one directory (or all files, with ``--run``); files of other
runs are concatenated, never linked. ``kernelmap normalise RUN_DIR`` (a ``kernelmap run``
directory) re-normalises the run in place: RUN_DIR/records.parquet and RUN_DIR/attribution.json. ``event_id`` is made unique within a run by offsetting each
file's ids (links are offset with them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from . import adapters, attribution, calllink, cpusampler, frameworks, heap, kernelmath, schema, strings
from .adapters import graph_replay
from .commlink import link as link_communication
from .errors import KernelmapError, ParseError
from .frameworks import dataparallel
from .rundir import ALGORITHM_FILE, GRAPH_REFERENCE, LIBS_TRACE_DIR, LIBS_TRACES, RunDir, pass_result_name


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="traces and logs, any mix (.gz and .xz read transparently); or one `kernelmap run` directory")
    p.add_argument("-o", "--output", help="Parquet file to write (default: records.parquet; for a run "
                                          "directory, RUN_DIR/records.parquet and RUN_DIR/attribution.json)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--replace", action="store_true", help="replace an existing --output")
    p.add_argument("--run", help="treat all files as one run of this name")
    p.add_argument("--framework", choices=frameworks.FRAMEWORKS, help="framework of files that do not say it")


def _offset(df: pd.DataFrame, base: int) -> pd.DataFrame:
    if base == 0:  # a run's first file: its ids as they are (no new columns)
        return df
    for col in ("event_id", "op_event_id", "call_event_id"):
        df[col] = df[col] + base
    return df


def normalise(paths, run: str | None = None, framework: str | None = None, device: str | None = None,
              batch_size: int | None = None, log_steps: int | None = None,
              steady_calls: int | None = None, libs_trace: Path | None = None,
              tf32_override: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Records of all ``paths`` and the summary: overall figures, per-run figures, per-file notes.
    ``log_steps``: the training steps the library logs cover (for calls per step), where known;
    ``steady_calls``: their timed steps (after warm-up), where known: only a signature's last that
    many log calls must agree for its kernels to link (``attribution.link_library_calls``);
    ``libs_trace``: the libs pass's own kernel trace, where it recorded one (``kernelmap/calllink.py``:
    the logged calls own their kernels there, and the links are carried to these records first);
    ``tf32_override``: ``NVIDIA_TF32_OVERRIDE`` as the workers saw it (their pass files'), beside what the logs
    say (``kernelmath.fill`` applies both before any kernel takes a math)."""
    df, summary = records(paths, run, framework, device, batch_size, log_steps, steady_calls, libs_trace, tf32_override)
    summary = summary()
    return schema.in_schema_dtypes(df), summary


def records(paths, run: str | None = None, framework: str | None = None, device: str | None = None,
            batch_size: int | None = None, log_steps: int | None = None,
            steady_calls: int | None = None, libs_trace: Path | None = None,
            tf32_override: str | None = None) -> tuple[pd.DataFrame, Callable[[], dict]]:
    """``normalise``'s records (validated) and the function that summarises them (it only reads
    them: ``main`` runs it before the records are written). The records are compact
    (``schema.compact_records``: strings as Categoricals, some integer columns narrow)."""
    with schema.compact_records():
        return _records(paths, run, framework, device, batch_size, log_steps, steady_calls, libs_trace, tf32_override)


def _records(paths, run, framework, device, batch_size, log_steps, steady_calls, libs_trace=None, tf32_override=None):
    groups: dict[str, list[Path]] = {}
    for p in map(Path, paths):
        key = run or (p.resolve().parent.name or p.stem)
        groups.setdefault(key, []).append(p)
    frames, linked, files = [], [], []
    for name, members in groups.items():
        parts, base, overrides = [], 0, [] if tf32_override is None else [str(tf32_override)]
        for p in members:
            df = adapters.read(p)
            overrides += df.attrs.get("tf32_override", [])
            fmt = df.attrs.get("format")
            files.append({"file": str(p), "format": fmt, "run": name, "rows": len(df),
                          **{k: v for k, v in df.attrs.items() if k != "format"}})
            df = _offset(df, base)
            base += len(df)
            one = np.zeros(len(df), dtype="int64")
            df["run"] = strings.from_codes(one, [name])
            if framework:
                strings.set_rows(df, "framework", strings.isna(df["framework"]) | strings.eq(df["framework"], "unknown"),
                                 framework)
            if device:
                df["device"] = strings.from_codes(one, [device])
            if batch_size is not None:
                df["batch_size"] = batch_size
            parts.append(df)
        rdf = schema.concat(parts)
        parts = df = None  # rdf is the only copy of the records from here (peak memory)
        rdf = schema.conform(rdf, copy=False)
        reasons: dict = {}
        pre: dict = {}
        if libs_trace is not None:
            trace = adapters.read(libs_trace)
            # the case's processes ran one set of library algorithms (Framework.shared_algorithms_env)
            shared = (libs_trace.parent.parent / ALGORITHM_FILE).is_file()
            pre = calllink.link_in_libs_pass(rdf, trace, calllink.base_ns(libs_trace, trace), shared)
            trace = None
            reasons = pre.pop("reasons")
            ref_path = libs_trace.parent / GRAPH_REFERENCE  # a replay mode's libs pass: its reference step
            if ref_path.is_file():
                ref = adapters.read(ref_path)
                replayed = calllink.link_replayed(rdf, ref, calllink.base_ns(ref_path, ref))
                ref = None
                reasons.update(replayed.pop("reasons"))
                pre.update(replayed)
            pre["libs_trace"] = str(libs_trace)
            pre["algorithms_shared"] = shared
        links = attribution.link_library_calls(rdf, steady_calls, exclude=reasons)
        links.update(attribution.link_onednn(rdf))
        links.update(pre)
        links.update(kernelmath.fill(rdf, overrides))  # issue 38: each kernel's math, after the TF32 override
        linked.append((name, rdf, links, reasons))
        frames.append(rdf)
    if len(frames) == 1:  # one run: its records are the table, its figures the overall ones
        df = schema.validate(schema.conform(frames[0], copy=False))
    else:
        df = schema.validate(schema.conform(schema.concat(frames)))
    frames = None

    def summary() -> dict:
        runs = {}
        for name, rdf, links, reasons in linked:
            own = attribution.summarise(rdf, log_steps, steady_calls, reasons)
            runs[name] = {**own, **links}
        top = own if len(linked) == 1 else attribution.summarise(df, log_steps, steady_calls)
        return {**top, "runs": runs, "files": files}

    return df, summary


# records up to this many rows (one Parquet row group) are summarised in a second thread while they are written
SUMMARY_BESIDE_WRITE = schema.ROW_GROUP


def main(args: argparse.Namespace) -> int:
    # the phases' arrays (columns, labels, Parquet groups) reuse the pages of those freed before them
    with heap.freed_pages_kept():
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    dirs = [f for f in args.files if Path(f).is_dir()]
    if dirs:
        return _main_run_dir(args, dirs)
    args.output = args.output or "records.parquet"
    if Path(args.output).exists() and not args.replace:
        raise KernelmapError(f"{args.output}: already exists; choose another -o or pass --replace")
    df, summarise = records(args.files, run=args.run, framework=args.framework)
    heap.release_freed()  # the read's freed pages, before the summary's and the write's arrays
    if len(df) <= SUMMARY_BESIDE_WRITE:
        # records of one row group: the summary is made in a second thread while the group is
        # converted and encoded (pyarrow, without the GIL), and goes into the footer after it (the
        # same file, byte for byte). OWLv2's 104k records: ~20-30 ms less (tests/test_normalise.py)
        with ThreadPoolExecutor(1, thread_name_prefix="kernelmap-summary") as worker:
            made = worker.submit(summarise)
            schema.write_parquet(df, args.output, validated=True, footer_meta=lambda: {"summary": made.result()})
        summary = made.result()
    else:
        # summarised first, then written: beside the write, the summary's arrays and the row groups
        # were alive together (1M-event nsys file: peak 3.2x of the file, 2.98x one after the other;
        # the Kineto file's ~40 ms of summary are no longer hidden behind its write). The summary still
        # goes into the footer, after the row groups, as before (the same file, byte for byte).
        summary = summarise()
        heap.release_freed()
        schema.write_parquet(df, args.output, validated=True, footer_meta={"summary": summary})
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        _print(summary, args.output)
    return 0


def _main_run_dir(args: argparse.Namespace, dirs: list[str]) -> int:
    """``kernelmap normalise RUN_DIR``: the run directory's own records and attribution, rewritten."""
    run_dir = Path(dirs[0])
    if len(args.files) > 1:
        raise KernelmapError(f"{run_dir}: a run directory is normalised on its own; pass it alone "
                             "(or pass files, not directories)")
    if not (run_dir / "manifest.json").is_file():
        raise KernelmapError(f"{run_dir}: not a kernelmap run directory (no manifest.json); pass trace and log files")
    if args.output or args.run or args.framework:
        raise KernelmapError(f"{run_dir}: -o, --run and --framework apply to files; a run directory is normalised "
                             "into RUN_DIR/records.parquet and RUN_DIR/attribution.json")
    summary = normalise_run_dir(run_dir)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        files = sum(len(r["files"]) for r in summary["runs"].values())
        sys.stdout.write(f"{files} file(s) of {len(summary['runs'])} framework x batch size run(s) -> "
                         f"{run_dir / 'records.parquet'}, {run_dir / 'attribution.json'}\n")
        _print_runs(summary)
        if summary["not_records"]:
            sys.stdout.write(f"{len(summary['not_records'])} file(s) not read (pass results, timings; each with its "
                             "reason under not_records in attribution.json)\n")
        absent = [x["file"] for x in summary["not_records"] if x["reason"] == ABSENT]
        if absent:
            sys.stdout.write(f"{len(absent)} trace(s) results.json lists are absent, their cases' records hold none "
                             f"of their rows: {', '.join(absent)}\n")
    return 0


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _print(s: dict, out) -> None:
    w = sys.stdout.write
    w(f"{s['events']} records from {len(s['files'])} file(s) -> {out}\n")
    _print_runs(s)
    for f in s["files"]:
        g = f.get("graph_replays")
        if g:  # adapters/graph_replay.py
            w(f"  {f['file']}: {graph_replay.describe({k: g[k] for k in ('kernels', 'memsets', 'memcpys')})} replayed "
              f"from {g['launches']} graph launch(es), attributed by the {g['attributed_by']}\n")


def _print_runs(s: dict) -> None:
    w = sys.stdout.write
    for name, r in s["runs"].items():
        w(f"run {name}: {r['kernels']} kernels read, {r['ops']} framework ops\n")
        for src, b in r["by_source"].items():
            w(f"  {src}: {b['kernels']} kernels, {b['kernel_time_ns'] / 1e6:.3f} ms over {b['steps']} step(s), "
              f"{_pct(b['attributed_kernel_time_share'])} of kernel time in a model op (the CNN's vocabulary) "
              f"({_pct(b['attributed_kernel_time_share_in_op_steps'])} in the {b['op_steps']} step(s) with ops), "
              f"{_pct(b['launch_op_known_kernel_time_share'])} with its launching op known; "
              f"library kernels linked to a call {b['library_kernels_linked']}/{b['library_kernels']} "
              f"({_pct(b['library_kernel_time_linked_share'])} of their time)\n")
            for u in b["library_unlinked_top"][:3]:
                w(f"    unlinked: {u['count']} x {u['kernel_name'][:70]}: {u['reason']}\n")
            for u in b["unattributed_top"][:3]:
                w(f"    unattributed: {u['count']} x {u['kernel_name'][:90]} ({u['time_ns'] / 1e3:.1f} us)\n")
        if r["library_calls"]:
            w("  library calls: " + ", ".join(f"{k} {v}" for k, v in r["library_calls"].items()) + "\n")
        if r["onednn_primitives"]:
            w("  oneDNN executions: " + ", ".join(f"{k} {v}" for k, v in r["onednn_primitives"].items())
              + f" ({r['onednn_linked']} linked to an op)\n")
        if r.get("blas_calls"):
            w("  BLAS calls: " + ", ".join(f"{k} {v}" for k, v in r["blas_calls"].items())
              + f" ({r['blas_linked']} linked to an op)\n")


# --- run directories -------------------------------------------------------------------------
def _pass_file(path: Path) -> dict | None:
    """A worker's result of a pass (``libs.json``, ``framework.json``); None where it is missing or not an object;
    not JSON: an error naming the file."""
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise KernelmapError(f"{path}: not JSON ({exc})") from None
    return d if isinstance(d, dict) else None


def _log_steps(path: Path, warmup: bool = True) -> int | None:
    """Steps the library-log pass ran (warm-up included: the logs are on from process start; without
    it where ``warmup`` is False), from the worker's ``libs.json``; None where it is missing or does
    not say."""
    d = _pass_file(path)
    if d is None:
        return None
    w, n = d.get("warmup_steps"), d.get("steps")
    if not (isinstance(w, int) and isinstance(n, int)):
        return None
    return w + n if warmup else n


OWN_RESULT = "kernelmap's own: the worker's result of this pass (its step timings, summarised in results.json)"
OWN_ALGORITHMS = ("kernelmap's own: the library algorithms the case's processes shared (the first chose them; "
                  "Framework.shared_algorithms_env)")
HLO_COMPANION = adapters.HLO_COMPANION  # the reason of an adapter's companion file
OWN_SAMPLES = ("kernelmap's own: the CPU framework pass's CPU-time samples (kernelmap/cpusampler.py), read by the "
               "report for its ops' CPU time")


def own_file(f: Path) -> str | None:
    """Why a file of a case's folder is not read on its own where it is kernelmap's own (a worker's pass
    result) or an adapter's companion file (XLA's HLO text); None for any other file."""
    from .worker import PASSES

    stem, _, trial = f.name.removesuffix(".json").partition("-")
    if f.name.endswith(".json") and stem in PASSES and (not trial or trial.isdigit()):
        return OWN_RESULT
    if f.name == cpusampler.SAMPLES_FILE:
        return OWN_SAMPLES
    if f.stem == Path(ALGORITHM_FILE).stem:  # MXNet's algorithms.tsv, XLA's algorithms.textproto
        return OWN_ALGORITHMS
    return adapters.companion(f)


def _tf32_override(bs_dir: Path) -> str | None:
    """``NVIDIA_TF32_OVERRIDE`` as the case's workers saw it (their pass files' ``tf32_override``: the libs
    pass's, else the framework pass's), for ``kernelmath.fill``: at 0, the calls whose TF32 the logs leave open
    are fp32 (``kernelmath.apply_override``) before any kernel takes its call's or its op's math."""
    for name in ("libs", "framework"):
        d = _pass_file(bs_dir / pass_result_name(name))
        if d is not None:
            value = d.get("tf32_override")
            return None if value is None else str(value)
    return None


# the captures read from every rank of a multi-process case: the traces (rank 0's library logs stand for all)
RANK_FORMATS = frozenset({*(d.trace_source for d in frameworks.REGISTRY.values()), "nsys"})
# the names a pass writes its trace under in its case folder (the libs pass's own trace, in libs/, has them too)
TRACE_NAMES = LIBS_TRACES
ABSENT = "absent: results.json lists it, the case folder has it not; its case's records hold none of its rows"


def absent_traces(run_dir: Path, entries) -> tuple[list[str], list[str]]:
    """(listed, absent): the traces (``TRACE_NAMES``) the cases' results.json entries list (``files``) in the case
    folders that are there, and those of them the folder has not (neither as listed nor gzipped: a trimmed copy's)."""
    listed = [f for e in entries if (run_dir / e.dir).is_dir() for f in e.entry.get("files") or ()
              if isinstance(f, str) and Path(f).name in TRACE_NAMES]
    return listed, [f for f in listed if not any((run_dir / g).is_file() for g in (f, f + ".gz"))]


def normalise_run_dir(run_dir: str | os.PathLike) -> dict:
    """Normalise the captures of every case results.json records (``RunDir.read_cases``: its typed key and
    its folder, ``RUN_DIR/<case>/bs<N>/*``) into ``RUN_DIR/records.parquet`` and ``RUN_DIR/attribution.json``;
    returns the summary. Each record carries its case's key (framework, mode, math, devices, batch size) as
    recorded, never read from a folder's name. Files no adapter recognises (clean.json, step timings) are
    listed under ``not_records``, and so is each trace an entry lists (``files``) that its case folder has not
    (``absent_traces``; named on the console too); where every listed trace is absent, an error naming them, nothing
    written (the records would be the library logs' alone)."""
    rd = RunDir(run_dir)
    run_dir = rd.path
    manifest = rd.read_manifest() if rd.manifest.is_file() else {}
    cases = rd.read_cases()
    listed, absent = absent_traces(run_dir, cases)
    if listed and len(absent) == len(listed):  # the records would be the library logs' alone
        raise KernelmapError(f"{run_dir}: every trace {rd.results.name} lists is absent ({', '.join(absent)}): no "
                             f"kernel or op to normalise; {rd.records.name} and {rd.attribution.name} not written (those there "
                             "left as they are)")
    frames, per, skipped, sources = [], {}, [{"file": f, "reason": ABSENT} for f in absent], []
    for entry in sorted(cases, key=lambda e: e.dir.parts):  # folder order, as the records always were
        key, bs_dir = entry.key, run_dir / entry.dir
        if not bs_dir.is_dir():
            continue  # a case whose captures were removed (kept for its report), or a clean-only run
        files = []
        # issue 39: the other ranks' captures (rank<r>/) are the case's records too, each with its rank
        for f in sorted(p for d in (bs_dir, *dataparallel.rank_dirs(bs_dir)) for p in d.iterdir()
                        if p.is_file() and not p.name.startswith(".")):
            if f.name == GRAPH_REFERENCE:  # the Kineto adapter reads it with the trace beside it
                skipped.append({"file": str(f.relative_to(run_dir)),
                                "reason": "the reference step of a graph-replay trace, read with that trace "
                                          "(adapters/graph_replay.py) to attribute its replayed kernels"})
                continue
            own = own_file(f)
            if own:  # kernelmap's own file, or one an adapter reads with the trace beside it: not "unrecognised"
                skipped.append({"file": str(f.relative_to(run_dir)), "reason": own})
                continue
            if f.suffix in (".nsys-rep", ".qdrep") and f.with_suffix(".sqlite").is_file():
                # The runner keeps the report for the GUI beside its SQLite export: one capture,
                # read once (reading both would count every kernel twice).
                skipped.append({"file": str(f.relative_to(run_dir)),
                                "reason": f"the same capture as {f.with_suffix('.sqlite').name}, which was read"})
                continue
            try:
                fmt = adapters.detect(f)
                if f.parent != bs_dir and fmt not in RANK_FORMATS:  # issue 39: a rank's library log
                    skipped.append({"file": str(f.relative_to(run_dir)),
                                    "reason": "a rank's library log: the case's library calls are rank 0's"})
                    continue
                files.append(f)
            except ParseError as exc:
                skipped.append({"file": str(f.relative_to(run_dir)), "reason": exc.cause})
        if not files:
            continue
        name, fw, bs = str(entry.dir), key.framework, key.batch_size
        libs_trace = next((p for p in (bs_dir / LIBS_TRACE_DIR / n for n in LIBS_TRACES) if p.is_file()), None)
        libs = bs_dir / pass_result_name("libs")
        df, s = normalise(files, run=name, framework=fw, device=RunDir.framework_device(manifest, fw),
                          batch_size=bs, log_steps=_log_steps(libs), steady_calls=_log_steps(libs, warmup=False),
                          libs_trace=libs_trace, tf32_override=_tf32_override(bs_dir))
        case_cols = {c: key.to_fields()[c] for c in schema.CASE_COLUMNS}
        df = link_communication(df.assign(**case_cols))  # issue 39: communication linked to its issuing ops
        frames.append(df)
        fields = {**key.to_fields(), "case": key.name}  # attribution.json names each case by its typed key
        per[name] = {**s["runs"][name], "files": s["files"], **fields}
        sources += [{**fields, "source": src, **{k: v for k, v in b.items() if not isinstance(v, list)}}
                    for src, b in s["runs"][name]["by_source"].items()]
    if not frames and rd.records.is_file():
        # a run whose captures were removed (kept for its report): its records stay, not emptied
        raise KernelmapError(f"{run_dir}: no trace or log file under RUN_DIR/<framework>/bs<N>/ to normalise; "
                             f"{rd.records.name} and {rd.attribution.name} were left as they are")
    df = schema.conform(pd.concat(frames, ignore_index=True)) if frames else schema.empty()
    summary = {"runs": per, "by_source": sources, "not_records": skipped}
    heap.release_freed()
    schema.write_parquet(df, rd.records, extra_meta={"summary": summary})
    rd.write_json(rd.attribution, summary)
    return summary
