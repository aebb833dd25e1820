"""torch.compile under nsys: the rows of a real nsys capture of the compile mode (H200, `kernelmap run
--framework pytorch --mode all --profile all --batch-size 64 ...`, pytorch-compile bs 64, 20 steps), as
its export gave them, with the labels the adapter adds (canonical op, direction, layer, phase, step,
launching op, call) taken off: tests/data/gpu_compile_nsys_bs64_rows.parquet, 3786 rows.

On the GPU that capture's kernel time was 85.96% attributed: the nsys adapter did not know torch.compile's
wrapper ranges nor its generated kernels (the Kineto adapter did). ``nsys.label_rows`` now does both."""

from __future__ import annotations

import contextlib
import gzip
import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from kernelmap import attribution, strings
from kernelmap.adapters import _trace, inductor, nsys

ROWS = Path(__file__).parent / "data" / "gpu_compile_nsys_bs64_rows.parquet"


def _rows() -> tuple[pd.DataFrame, list]:
    df = pd.read_parquet(ROWS)
    for c in ("canonical_op", "direction", "layer", "phase"):
        df[c] = pd.array([pd.NA] * len(df), dtype="string")
    dims = [json.loads(s) if isinstance(s, str) else None for s in df["shapes"].tolist()]
    return df, dims


def _unattributed_share(df: pd.DataFrame) -> tuple[int, float]:
    k = df[df["kind"] == "kernel"]
    un = k["canonical_op"].isna() | (k["canonical_op"] == "other")
    return int(un.sum()), float(k.loc[un, "dur_ns"].sum() / k["dur_ns"].sum())


def test_the_fixture_is_the_capture():
    df = pd.read_parquet(ROWS)
    assert df["kind"].value_counts().to_dict() == {"op": 1800, "runtime": 1106, "kernel": 760, "annotation": 60,
                                                   "memset": 40, "step": 20}
    assert df["kernel_name"].str.startswith("triton_").sum() == 320


def test_without_torch_compiles_rules_its_generated_kernels_have_no_op():
    """The old path (label alone) gives the figure the GPU report printed: 320 kernels, 14.04% of the time."""
    df, dims = _rows()
    _trace.label(df, dims, "pytorch")
    n, share = _unattributed_share(df)
    assert n == 320 and share == pytest.approx(1 - 0.85966, abs=5e-5)


def test_label_rows_attributes_every_kernel_of_the_compiled_step():
    df, dims = _rows()
    nsys.label_rows(df, dims, "pytorch")
    assert _unattributed_share(df) == (0, 0.0)
    assert not (df["kind"].eq("op") & df["op_name"].str.match(inductor.WRAPPER.pattern).fillna(False)).any()
    k = df[df["kind"] == "kernel"]
    triton = k[k["kernel_name"].str.startswith("triton_")]
    assert (triton["library"] == "native").all() and triton["phase"].isin(["forward", "backward"]).all()
    lk = attribution.library_kernels(df.assign(call_event_id=pd.array([pd.NA] * len(df), dtype="Int64")))
    assert len(lk) == 360 and lk["layer"].notna().all() and not lk["direction"].isin(["bwd"]).any()


# The same case's whole nsys export from a later run (H200, 2026-11-26, `kernelmap run --framework all --mode all
# --profile all --batch-size 64 1024 --steps 20`): read as the run reads it. There ``op_name`` and ``kernel_name``
# are categoricals of different categories (``strings.categorical_columns``, as ``normalise`` holds its records),
# and ``label_rows`` stopped that run's normalise with "Cannot set a Categorical with another, without identical
# categories" (the rows above are strings).
EXPORT = Path(__file__).parent / "data" / "gpu_compile_nsys_bs64.sqlite.gz"


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("nsys") / "nsys.sqlite"
    p.write_bytes(gzip.decompress(EXPORT.read_bytes()))
    return p


@pytest.mark.parametrize("categorical", [False, True], ids=["string-columns", "normalise-categoricals"])
def test_the_whole_export_of_a_compiled_step_reads_with_every_kernel_attributed(export, categorical):
    with sqlite3.connect(export) as con:  # an independent reader: the export's own kernel table
        n, total = con.execute('SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
    assert (n, total) == (760, 4805272)
    with strings.categorical_columns() if categorical else contextlib.nullcontext():
        df = nsys.read(export)
    assert isinstance(df["kernel_name"].dtype, pd.CategoricalDtype) == categorical
    k = df[df["kind"] == "kernel"]
    assert len(k) == n and int(k["dur_ns"].sum()) == total
    assert _unattributed_share(df) == (0, 0.0)
    assert (k["kernel_name"].astype(str).str.startswith("triton_")).sum() == 320
