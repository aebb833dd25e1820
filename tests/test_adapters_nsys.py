"""nsys SQLite adapter against the runner's H200 export (tests/data/gpu_nsys.sqlite.gz: PyTorch bs64,
the 10 timed steps under emit_nvtx -- the capture range leaves the warm-up out; tables the adapter
does not read dropped, see tests/data/record_gpu_fixtures.py and gpu_fixtures.json)."""

from __future__ import annotations

import gzip
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from kernelmap.frameworks import registry

from kernelmap import strings
from kernelmap.adapters import canonical, detect, nsys
from kernelmap.errors import ParseError

DATA = Path(__file__).parent / "data"
GZ = DATA / "gpu_nsys.sqlite.gz"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nsys") / "run.sqlite"
    with gzip.open(GZ, "rb") as fi, open(out, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    return out


@pytest.fixture(scope="module")
def df(db):
    return nsys.read(db)


def test_kernel_count_and_time_match_sqlite(db, df):
    con = sqlite3.connect(db)
    n, total = con.execute('select count(*), sum("end" - start) from CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
    k = df[df["kind"].eq("kernel")]
    assert len(k) == n == 490
    assert int(k["dur_ns"].sum()) == total
    names = {r[0] for r in con.execute("select s.value from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s on s.id = k.demangledName")}
    assert set(k["kernel_name"]) == names


def test_other_tables_counted(db, df):
    con = sqlite3.connect(db)
    tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
    assert "CUPTI_ACTIVITY_KIND_MEMCPY" not in tables  # nsys writes no table without rows
    for table, kind in (("CUPTI_ACTIVITY_KIND_RUNTIME", "runtime"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"),
                        ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        n = con.execute(f"select count(*) from {table}").fetchone()[0] if table in tables else 0
        assert int(df["kind"].eq(kind).sum()) == n
    ranges = con.execute("select count(*) from NVTX_EVENTS where eventType in (59, 60) and \"end\" is not null").fetchone()[0]
    assert int(df["kind"].isin(["op", "annotation", "step"]).sum()) == ranges


def test_emit_nvtx_parsed_structurally(db, df):
    con = sqlite3.connect(db)
    n = con.execute("select count(*) from NVTX_EVENTS where text like 'aten::conv2d,%'").fetchone()[0]
    conv = df[df["op_name"].eq("aten::conv2d")]
    assert len(conv) == n == 20  # 10 steps under emit_nvtx x 2 conv layers
    assert sorted(conv["layer"].unique()) == ["conv1", "conv2"]
    assert conv["seq"].notna().all()
    assert conv["shapes"].str.startswith("[[64,").all()


def test_kernels_in_emit_nvtx_steps_are_attributed(db, df):
    # kernels launched while emit_nvtx op ranges were being recorded: all must have a canonical op
    con = sqlite3.connect(db)
    lo, hi = con.execute("select min(start), max(\"end\") from NVTX_EVENTS where text like 'aten::%'").fetchone()
    k = df[df["kind"].eq("kernel")]
    launched = df[df["kind"].eq("runtime") & df["start_ns"].between(lo, hi)]["correlation_id"]
    inside = k[k["correlation_id"].isin(launched)]
    assert len(inside) == 490  # 49 kernels per step x 10 steps
    assert inside["canonical_op"].notna().all(), inside.loc[inside["canonical_op"].isna(), "kernel_name"].head()
    assert len(inside) == len(k)  # the capture holds the timed steps only
    assert set(inside["iteration"]) == set(range(5, 15))
    conv_bwd = inside[inside["canonical_op"].eq("conv2d") & inside["phase"].eq("backward")
                      & ~inside["kernel_name"].str.contains("at::native", regex=False)]
    # cuDNN backward kernels: split by name (dgrad/wgrad) or by the named kernels around them
    assert set(conv_bwd["direction"]) == {"bwd_data", "bwd_weight"}
    assert set(conv_bwd.loc[conv_bwd["kernel_name"].str.contains("dgrad"), "direction"]) == {"bwd_data"}
    assert set(conv_bwd.loc[conv_bwd["kernel_name"].str.contains("wgrad", case=False), "direction"]) == {"bwd_weight"}
    assert set(conv_bwd.loc[conv_bwd["layer"].eq("conv1"), "direction"]) == {"bwd_weight"}  # conv1: no input grad


def test_missing_column_is_named(tmp_path):
    p = tmp_path / "bad.sqlite"
    con = sqlite3.connect(p)
    con.execute('create table CUPTI_ACTIVITY_KIND_KERNEL (start int, "end" int, streamId int, demangledName int)')
    con.execute("insert into CUPTI_ACTIVITY_KIND_KERNEL values (1, 2, 7, 1)")
    con.commit()
    con.close()
    with pytest.raises(ParseError, match="CUPTI_ACTIVITY_KIND_KERNEL lacks column.*correlationId"):
        nsys.read(p)


def test_sqlite_without_trace_tables(tmp_path):
    p = tmp_path / "empty.sqlite"
    sqlite3.connect(p).execute("create table t (a int)").connection.commit()
    assert detect(p) == "nsys"
    with pytest.raises(ParseError, match="no CUPTI_ACTIVITY_KIND_KERNEL"):
        nsys.read(p)


def test_nsys_rep_needs_nsys(tmp_path, monkeypatch):
    p = tmp_path / "run.nsys-rep"
    p.write_bytes(b"\x00not sqlite")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect(p) == "nsys"
    with pytest.raises(ParseError, match="nsys is not on PATH"):
        nsys.read(p)


def test_gzipped_export_reads_the_same(db, df):
    again = nsys.read(GZ)
    assert len(again) == len(df) and again["source_file"].iloc[0] == GZ.name


@pytest.mark.parametrize(("select", "native"), [
    ("SELECT 'k' AS kind, a, b - a AS d, NULL AS gtid FROM t", True),
    ("SELECT a, txt FROM t", True),  # text with NULLs: object str/None
    ("SELECT a, n FROM t", False),  # integers and NULLs: pandas makes float64
    ("SELECT a, r FROM t", False),  # floats
    ("SELECT a, mixed FROM t", False),  # integers and text
    ("SELECT a FROM t WHERE a < 0", False),  # no rows
])
def test_native_query_is_pandas(tmp_path, select, native):
    """The native SQLite reader gives ``pd.read_sql_query``'s frame, or steps aside."""
    import pandas as pd

    if nsys._native is None:
        pytest.skip("the native helpers are not built here")
    db = tmp_path / "t.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (a INTEGER, b INTEGER, n INTEGER, r REAL, txt TEXT, mixed)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)",
                    [(i, 2 * i + 2**60, None if i % 3 else i, i / 3, None if i % 4 == 1 else f"t{i % 5}é",
                      i if i % 2 else "x") for i in range(50)])
    con.commit()
    assert (nsys._native.query(str(db), select) is not None) == native
    pd.testing.assert_frame_equal(nsys._query(con, db, select), pd.read_sql_query(select, con), check_exact=True)
    con.close()


def test_schema_describes_the_nsys_adapter_as_it_is():
    """docs/SCHEMA.md's nsys entry once said only "emit_nvtx ranges -> op": it names the rules the adapter
    follows for MXNet's NVTX ranges, and every module.name it cites exists."""
    schema = (Path(__file__).resolve().parents[1] / "docs" / "SCHEMA.md").read_text()
    entry = schema.split("* **nsys**:", 1)[1].split("\n* **", 1)[0]
    cited = set(re.findall(r"`(\w+)\.(\w+)`", entry))
    assert {("nsys", "nvtx_framework"), ("canonical", "ASYNC_FRAMEWORKS"), ("canonical", "until_next"),
            ("canonical", "layers_by_position")} <= cited
    assert ("registry", "NsysWindow") in cited and "`kernelmap:capture`" in entry
    assert canonical.CAPTURE_RANGE == "kernelmap:capture"
    modules = {"nsys": nsys, "canonical": canonical, "registry": registry}
    assert all(hasattr(modules[m], name) for m, name in cited), cited
    assert "`MX*`" in entry and "not ops" in entry and "`kernelmap:*`" in entry
    assert nsys._nvtx_is_op(["MXNDArrayWaitAll", "Convolution", "kernelmap:forward"], "mxnet") == [False, True, False]
    assert (Path(nsys.__file__).parent / "_trace.py").is_file() and "`adapters/_trace.py`" in entry


@pytest.mark.parametrize("window", [None, (1000, 1006)])
def test_stacked_is_concat_window_and_stable_sort(window):
    """``_stacked``, the column-at-a-time stacking of the tables, is pandas' concat (columns a table
    lacks: NA, dtypes widened as the frame's concat widens them), the rows starting inside the
    capture window, stably sorted by start."""
    import numpy as np
    import pandas as pd

    def tables():  # kernels, runtime calls and NVTX ranges as the SQL queries give them
        return [
            pd.DataFrame({"kind": np.array(["kernel"] * 4, dtype=object), "start_ns": np.array([1005, 1001, 1003, 1001]),
                          "dur_ns": np.array([2, 3, 1, 1]), "kernel_name": np.array(["k1", "k2", None, "k1"], dtype=object),
                          "gtid": np.full(4, np.nan)}),
            pd.DataFrame({"kind": np.array(["runtime"] * 3, dtype=object), "start_ns": np.array([1000, 1004, 1001]),
                          "dur_ns": np.array([1, 1, 1]), "op_name": np.array(["cudaLaunchKernel"] * 3, dtype=object),
                          "gtid": np.array([7, 7, 8])}),
            pd.DataFrame({"kind": np.array(["op", "step"], dtype=object), "start_ns": np.array([999, 1001]),
                          "dur_ns": np.array([9, 8]), "op_name": np.array(["aten::mm", "kernelmap:step#1"], dtype=object),
                          "seq": np.array([3.0, np.nan]), "dims": np.array([[[2, 2]], None], dtype=object), "gtid": np.array([7, 7])}),
        ]

    with strings.object_columns():  # as adapters.read runs the adapter: object columns of str on every pandas
        want = pd.concat(tables(), ignore_index=True)
        if window is not None:
            want = want[((want["start_ns"] >= window[0]) & (want["start_ns"] <= window[1])).to_numpy()]
        want = want.sort_values("start_ns", kind="stable", ignore_index=True)
        got = nsys._stacked(tables(), window)
    pd.testing.assert_frame_equal(got, want)
    assert len(got) == (9 if window is None else 8) and got["kind"].dtype == object
