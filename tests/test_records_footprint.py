"""benches/records_footprint.py on the records of the real H200 nsys export
(tests/data/gpu_nsys.sqlite.gz): 3,256 rows as ``kernelmap normalise`` makes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import bench_module

from kernelmap import normalise, schema

ROOT = Path(__file__).resolve().parents[1]
NSYS = ROOT / "tests" / "data" / "gpu_nsys.sqlite.gz"


@pytest.fixture(scope="module")
def fp():
    return bench_module("records_footprint")


@pytest.fixture(scope="module")
def records():
    df, summary = normalise.normalise([NSYS])
    assert summary["events"] == len(df) == 3256
    return df


def test_schema_dtypes_cost_what_pandas_says(fp, records):
    cols = {c.name: c for c in fp.footprint(records)}
    assert list(cols) == list(schema.COLUMNS)
    ints = [c for c in cols.values() if c.dtype == "Int64"]
    strs = [c for c in cols.values() if c.dtype == "string"]
    assert (len(ints), len(strs)) == (23, 23)  # schema v3: devices; mode and math; math_ran, math_dtypes, math_source; math_unit
    # Int64: 8-byte values and a 1-byte mask; string: an 8-byte pointer a row (objects not counted)
    assert {c.bytes for c in ints} == {3256 * 9}
    assert {c.bytes for c in strs} == {3256 * 8}
    assert sum(c.bytes for c in cols.values()) == 23 * 3256 * 9 + 23 * 3256 * 8 == 1_273_096


def test_narrowest_types_follow_the_fixture_ranges(fp, records):
    cols = {c.name: c for c in fp.footprint(records)}
    # ranges in this export: event_id 0..3255, correlation_id 300..6945, grid_x 1..6272, pid 641,
    # tid 641..686, start_ns up to 62,977,805 (ns since the session start); batch_size all NA
    assert cols["event_id"].narrow_dtype == "Int16"
    assert cols["correlation_id"].narrow_dtype == "Int16"
    assert cols["grid_x"].narrow_dtype == "Int16"
    assert cols["pid"].narrow_dtype == cols["tid"].narrow_dtype == "Int16"
    assert cols["start_ns"].narrow_dtype == "Int32"
    assert cols["batch_size"].narrow_dtype == "Int8"
    assert cols["event_id"].narrow_bytes == 3256 * 3  # 2-byte values and the mask
    assert all(cols[c].narrow_dtype == "category" for c in schema.COLUMNS if schema.DTYPES[c] is schema.STRING)
    s = fp.summary(list(cols.values()), len(records), input_bytes=None, interpreter=None)
    assert s["narrow_bytes"] == sum(c.narrow_bytes for c in cols.values()) < s["bytes"] / 3


def test_a_narrowing_that_changes_values_is_refused(fp, records, monkeypatch):
    # a "narrowing" that fills NA (grid_x is NA on every row that is not a kernel) must not be counted
    real = fp.narrowest
    monkeypatch.setattr(fp, "narrowest", lambda col: col.fillna(0) if col.name == "grid_x" else real(col))
    with pytest.raises(ValueError, match="grid_x"):
        fp.footprint(records)


def test_cli_figures_and_json(fp, records, tmp_path, capsys):
    out = tmp_path / "r.parquet"
    schema.write_parquet(records, out)
    js = tmp_path / "fp.json"
    assert fp.main([str(out), "--input", str(NSYS), "--json", str(js)]) == 0
    text = capsys.readouterr().out
    assert "3,256 rows: 1.3 MB in the schema's dtypes (391 B a row)" in text
    s = json.loads(js.read_text())
    assert s["bytes"] == 1_273_096 and s["input_bytes"] == NSYS.stat().st_size
    assert s["interpreter_bytes"] > 30e6  # pandas and pyarrow alone are more than that
    assert s["floor_x_input"] == pytest.approx((s["interpreter_bytes"] + s["bytes"]) / s["input_bytes"])


def test_cli_bad_records_file(fp, tmp_path, capsys):
    bad = tmp_path / "not.parquet"
    bad.write_text("not parquet")
    js = tmp_path / "fp.json"
    assert fp.main([str(bad), "--json", str(js)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not a readable Parquet file" in err
    assert not js.exists()
