"""Records stay identical while the adapters and attribution are made faster (issue 11).

``tests/data/records_digests.json`` holds, per real fixture, a digest of the records (every column's
name, dtype and values) and of the summary, computed by the code as it was before the speed work
(``python tests/test_records_identity.py --write`` rewrites it; do that only for an intended
change of records). Each case below recomputes its digest and compares. The Kineto files are also
read with a tiny chunk size, so that the chunked path is cut into many pieces and must still give
the same records as the one-chunk read.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from kernelmap import adapters, schema
from kernelmap.adapters import kineto
from kernelmap.errors import ParseError
from kernelmap.normalise import normalise, normalise_run_dir

DATA = Path(__file__).parent / "data"
DIGESTS = DATA / "records_digests.json"
# files of one run, normalised together (linked by signature / by op)
GROUPS = {
    "gpu": ["gpu_kineto.json.gz", "gpu_nsys.sqlite.gz", "gpu_cudnn.log.gz", "gpu_cublas.log.gz", "gpu_cublaslt.log.gz"],
    "cpu_torch": ["cpu_torch_kineto.json.gz", "cpu_torch_onednn.log.gz"],
    "cpu_mxnet": ["cpu_mxnet_profile.json.gz", "cpu_mxnet_onednn.log.gz"],
}


def frame_digest(df: pd.DataFrame) -> str:
    """The digest of the records' columns but the case's (schema v3's mode, math, devices: issue 36), which
    ``case_columns`` checks apart, and the math columns (issue 38: tests/test_math_column.py checks them): the
    digests stored before them still hold for every other column. ``math_unit`` (``schema.UNIT_COLUMNS``) is in
    the digests: they were rewritten when it was added, every other column checked unchanged first."""
    df = df.drop(columns=[*schema.CASE_COLUMNS, *schema.MATH_COLUMNS])
    h = hashlib.sha256()
    h.update(repr((len(df), list(df.columns))).encode())
    for col in df.columns:
        s = df[col]
        h.update(f"{col}:{s.dtype}".encode())
        h.update(pd.util.hash_pandas_object(s, index=False, categorize=False).to_numpy().tobytes())
        h.update(s.isna().to_numpy().tobytes())
    return h.hexdigest()


def json_digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def record_files() -> list[str]:
    """Every fixture file an adapter recognises (relative to tests/data)."""
    out = []
    for p in sorted(DATA.rglob("*")):
        if not p.is_file() or p.suffix in (".py", ".md", ".parquet") or "foreign" in p.relative_to(DATA).parts:
            continue  # foreign/: other people's traces, checked by test_foreign_traces.py (one is refused)
        try:
            adapters.detect(p)
        except ParseError:
            continue
        out.append(p.relative_to(DATA).as_posix())
    return out


def case_columns(df: pd.DataFrame) -> set[tuple]:
    """The distinct (framework, mode, math, devices) of the records."""
    cols = ["framework", *schema.CASE_COLUMNS]
    return set(df[cols].astype(object).where(df[cols].notna(), None).itertuples(index=False, name=None))


# what issue 38's math column added to attrs and summaries (tests/test_math_column.py checks them), left out
# of the digests made before it
MATH_ATTRS = ("tf32_override",)
MATH_SUMMARY_KEYS = ("tf32_overridden_calls", "kernels_math_from_call", "kernels_math_from_name", "kernels_math_from_op")


def without_math(summary: dict) -> dict:
    for entry in (summary.get("runs") or {}).values():
        for k in MATH_SUMMARY_KEYS:
            entry.pop(k, None)
        for f in entry.get("files") or []:
            for k in MATH_ATTRS:
                f.pop(k, None)
    for f in summary.get("files") or []:
        for k in MATH_ATTRS:
            f.pop(k, None)
    return summary


def file_digest(rel: str) -> dict:
    df = adapters.read(DATA / rel)
    assert df[list(schema.CASE_COLUMNS)].isna().all().all()  # a file alone does not know its case
    attrs = {k: v for k, v in df.attrs.items() if k not in MATH_ATTRS}
    return {"records": frame_digest(df), "attrs": json_digest(attrs), "rows": len(df)}


def group_digest(files: list[str], run: str) -> dict:
    df, summary = normalise([DATA / f for f in files], run=run)
    summary = without_math(json.loads(json.dumps(summary, default=str).replace(str(DATA), "<DATA>")))
    return {"records": frame_digest(df), "summary": json_digest(summary), "rows": len(df)}


def run_dir_digest(tmp: Path) -> dict:
    run = tmp / "cpu_run_all"
    shutil.copytree(DATA / "cpu_run_all", run)
    summary = normalise_run_dir(run)
    summary = without_math(json.loads(json.dumps(summary, default=str).replace(str(run), "<RUN>")))
    df = schema.read_parquet(run / "records.parquet")
    # every record and attribution entry carries its case's typed key (issue 36); checked here, left out of
    # the digests made before it (attribution.json's entries then named the case by its framework alone)
    assert case_columns(df) == {("pytorch", "eager", "fp32", 1), ("mxnet", "imperative", "fp32", 1)}
    added = ("mode", "math", "devices", "case")
    for entry in [*summary["runs"].values(), *summary["by_source"]]:
        assert entry["case"] == entry["framework"] and entry["devices"] == 1  # the default modes' names
        for k in added:
            del entry[k]
    return {"records": frame_digest(df), "summary": json_digest(summary), "rows": len(df)}


def all_digests(tmp: Path) -> dict:
    out = {"files": {f: file_digest(f) for f in record_files()}}
    out["groups"] = {name: group_digest(files, name) for name, files in GROUPS.items()}
    for d in ("jax_gpu", "jax_cpu"):
        out["groups"][d] = group_digest([f for f in record_files() if f.startswith(d + "/")], d)
    out["run_dir"] = run_dir_digest(tmp)
    return out


@pytest.fixture(scope="module")
def stored():
    assert DIGESTS.is_file(), f"{DIGESTS} missing: run python {Path(__file__).name} --write on the reference code"
    return json.loads(DIGESTS.read_text())


def test_fixture_set_unchanged(stored):
    assert record_files() == sorted(stored["files"])


@pytest.mark.parametrize("rel", sorted(json.loads(DIGESTS.read_text())["files"]) if DIGESTS.is_file() else [])
def test_file_records_identical(stored, rel):
    assert file_digest(rel) == stored["files"][rel]


@pytest.mark.parametrize("rel", [f for f in record_files() if adapters.detect(DATA / f) == "kineto"])
def test_kineto_small_chunks_identical(stored, rel, monkeypatch):
    """Cut into chunks of 4 KiB (hundreds of chunks), a trace gives the same records."""
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(kineto, "_scan", None)  # the chunked path, not the native scanner
    assert file_digest(rel) == stored["files"][rel]


@pytest.mark.parametrize("rel", [f for f in record_files() if adapters.detect(DATA / f) == "kineto"])
def test_kineto_typed_path_taken_and_general_path_identical(stored, rel, monkeypatch):
    """The typed (msgspec) path reads every real Kineto fixture, and the general (orjson dict)
    path it falls back to gives the same records."""
    if kineto._typed is None:
        pytest.skip("msgspec not installed: only the general path exists")
    monkeypatch.setattr(kineto, "_scan", None)  # the typed path, not the native scanner
    taken = []
    real = kineto._typed_columns
    monkeypatch.setattr(kineto, "_typed_columns", lambda *a: taken.append(1) or real(*a))
    assert file_digest(rel) == stored["files"][rel]
    assert taken, "the typed path fell back on a real fixture"
    monkeypatch.setattr(kineto, "_typed", None)
    assert file_digest(rel) == stored["files"][rel]


@pytest.mark.parametrize("optional", ["installed", "missing"])
@pytest.mark.parametrize("rel", [f for f in record_files() if adapters.detect(DATA / f) == "kineto"])
def test_kineto_native_path_taken(stored, rel, optional, monkeypatch):
    """The native scanner (where it is built) reads every real Kineto fixture itself, with the
    same records; also where orjson and msgspec are not installed (the GPU machine's environment:
    the scanner once needed orjson to check the document around the array, and without it every
    file took the standard library's parse, 10x slower)."""
    if kineto._scan is None:
        pytest.skip("the native scanner is not built here")
    if optional == "missing":
        from kernelmap.adapters import _common

        monkeypatch.setattr(_common, "_orjson", None)
        monkeypatch.setattr(kineto, "_typed", None)
    taken = []
    real = kineto._scanned
    monkeypatch.setattr(kineto, "_scanned", lambda *a: (lambda r: taken.append(r is not None) or r)(real(*a)))
    assert file_digest(rel) == stored["files"][rel]
    # one scan per Kineto file read: a graph replay's trace also reads its reference step beside it
    assert taken and all(taken), "the native scanner left a real fixture to the Python paths"
    ref = (DATA / rel).with_name("graph-reference.json.gz")
    assert len(taken) == (2 if ref.is_file() and ref != DATA / rel else 1)


@pytest.mark.parametrize("name", [*GROUPS, "jax_gpu", "jax_cpu"])
def test_normalise_identical(stored, name):
    files = GROUPS.get(name) or [f for f in record_files() if f.startswith(name + "/")]
    assert group_digest(files, name) == stored["groups"][name]


def test_run_dir_identical(stored, tmp_path):
    assert run_dir_digest(tmp_path) == stored["run_dir"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_records_identity.py --write")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        DIGESTS.write_text(json.dumps(all_digests(Path(tmp)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {DIGESTS}")
