"""One bench job, one saved run (``kernelmap save-job``).

``nox -s bench`` and ``nox -s benchmarks`` run one pytest process per framework (their CUDA runtimes
never share a process; JAX runs from its own interpreter), each writing ``--benchmark-json`` to a
scratch file; ``save_job`` merges those files into ONE numbered run holding every framework and mode
of the job, with the top-level key ``"kernelmap_job"`` (``keys.JOB_KEY``): the job id, which ``nox -s
bench`` also gives ``kernelmap run`` (``$KERNELMAP_JOB``, the run directory's name) so that a report
pairs the two. A part that is missing, empty or not a pytest-benchmark JSON file is an error naming
it, and nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..errors import KernelmapError
from .keys import JOB_KEY, PARTS_KEY, benchmark_identity, parse_when
from .storage import BenchStorage, machine_id


def read_part(path: str | Path) -> dict:
    """One framework's ``--benchmark-json`` file of a bench job. Missing, empty, not JSON, not a
    pytest-benchmark file, or already a merged job: an error naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise KernelmapError(f"{path}: no such file (that framework's step benchmarks wrote no "
                             "--benchmark-json)") from None
    except OSError as exc:
        raise KernelmapError(f"{path}: cannot be read ({exc.strerror})") from None
    if not text.strip():
        raise KernelmapError(f"{path}: empty (pytest wrote no benchmark into it)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KernelmapError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise KernelmapError(f"{path}: not a pytest-benchmark JSON file (no 'benchmarks' list)")
    if data.get(JOB_KEY):
        raise KernelmapError(f"{path}: already a saved job ({data[JOB_KEY]}); give the per-framework files")
    for b in data["benchmarks"]:
        if not isinstance(b, dict) or not isinstance(b.get("stats"), dict):
            raise KernelmapError(f"{path}: benchmark {b.get('name') if isinstance(b, dict) else b!r} has no stats")
    return data


def merge_job(parts: Sequence[str | Path], job: str) -> dict:
    """The per-framework ``--benchmark-json`` files of one bench job as ONE pytest-benchmark run: their
    benchmarks in the order given, the first part's machine and commit info (``dirty`` where any part's
    is; ``machine_info["kernelmap"]["framework_versions"]`` per framework), the earliest part's
    ``datetime``, ``JOB_KEY``: ``job``, and ``PARTS_KEY``: per part its file name, framework, datetime,
    Python and number of benchmarks. Every part is read before anything is merged; a key held by two
    parts is an error naming both."""
    if not job or not str(job).strip():
        raise KernelmapError("a job id is required (the run directory's name, e.g. 20261125T101500Z)")
    if not parts:
        raise KernelmapError(f"job {job}: no benchmark file to save")
    paths = [Path(p) for p in parts]
    datas = [read_part(p) for p in paths]
    held: dict = {}
    for path, data in zip(paths, datas, strict=True):
        for b in data["benchmarks"]:
            got = benchmark_identity(b, path)
            ident = got if isinstance(got, tuple) else b.get("fullname") or b.get("name")
            if ident in held:
                raise KernelmapError(f"{held[ident]} and {path} both hold benchmark {b.get('name')!r}")
            held[ident] = path
    first = datas[0]
    machine_info = json.loads(json.dumps(first.get("machine_info") or {}))
    versions = {}
    summary = []
    for path, data in zip(paths, datas, strict=True):
        km = (data.get("machine_info") or {}).get("kernelmap") or {}
        fw = km.get("framework")
        if fw:
            versions[fw] = km.get("framework_versions")
        summary.append({"file": path.name, "framework": fw, "datetime": data.get("datetime"),
                        "python_version": (data.get("machine_info") or {}).get("python_version"),
                        "benchmarks": len(data["benchmarks"])})
    if isinstance(machine_info.get("kernelmap"), dict):
        km = machine_info["kernelmap"]
        km.pop("framework", None)
        km["framework_versions"] = versions
    commit = dict(first.get("commit_info") or {})
    if any((d.get("commit_info") or {}).get("dirty") for d in datas):
        commit["dirty"] = True
    stamps = [(w, d.get("datetime")) for d in datas if (w := parse_when(d.get("datetime"))) is not None]
    return {
        "machine_info": machine_info,
        "commit_info": commit,
        "benchmarks": [b for d in datas for b in d["benchmarks"]],
        "datetime": min(stamps, key=lambda s: s[0])[1] if stamps else first.get("datetime"),
        "version": first.get("version"),
        JOB_KEY: str(job),
        PARTS_KEY: summary,
    }


def save_job(storage: str | Path, parts: Sequence[str | Path], job: str, machine: str | None = None) -> Path:
    """Merge one bench job's per-framework files (``merge_job``) and save them as the next numbered run
    of ``machine`` (default: this interpreter's ``machine_id``) under ``storage``; its path."""
    data = merge_job(parts, job)
    return BenchStorage(storage).save(data, machine or machine_id(), BenchStorage.tag(data))
