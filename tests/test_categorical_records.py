"""``normalise`` holds the records' string columns as Categoricals (``strings.categorical_columns``,
issue 11): every reader gives the answers it gives on ``string`` columns, and the written file is
the same, byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernelmap import schema
from kernelmap import strings as S
from kernelmap.normalise import normalise, records

DATA = Path(__file__).parent / "data"
GPU_GROUP = ["gpu_kineto.json.gz", "gpu_nsys.sqlite.gz", "gpu_cudnn.log.gz", "gpu_cublas.log.gz", "gpu_cublaslt.log.gz"]


def _columns():
    rng = np.random.default_rng(0)
    pool = np.array(["kernel", "op", None, "runtime", "at::native::x", "Dgrad_k"], dtype=object)
    shared = pool[rng.integers(0, len(pool), 5000)]
    own = np.array([None if v is None else "".join(v) for v in shared], dtype=object)  # one object per row
    return {"shared": pd.Series(pd.array(shared, dtype=S.STRING)), "own": pd.Series(pd.array(own, dtype=S.STRING)),
            "empty": pd.Series(pd.array([], dtype=S.STRING)), "all_na": pd.Series(pd.array([None] * 9, dtype=S.STRING))}


@pytest.mark.parametrize("name", ["shared", "own", "empty", "all_na"])
def test_categorical_column_answers_as_its_string_column(name):
    col = _columns()[name]
    cat = pd.Series(S.categorical(col))
    assert isinstance(cat.dtype, pd.CategoricalDtype)
    for small in (False, True):
        got, want = S.factorize(cat, small=small), S.factorize(col, small=small)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[0].dtype == want[0].dtype
        assert list(got[1]) == list(want[1])
    np.testing.assert_array_equal(S.isna(cat), col.isna().to_numpy())
    np.testing.assert_array_equal(S.isin(cat, ["op", "runtime"]), col.isin(["op", "runtime"]).to_numpy())
    np.testing.assert_array_equal(S.eq(cat, "op"), col.eq("op").fillna(False).to_numpy(dtype=bool))
    np.testing.assert_array_equal(S.contains(cat, "native"),
                                  col.str.contains("native", regex=False, na=False).to_numpy(dtype=bool))
    assert S.distinct(cat) == list(col.dropna().unique())
    pd.testing.assert_extension_array_equal(S.to_string_array(cat), col.array)
    pd.testing.assert_extension_array_equal(S.string_array(cat), col.array)  # outside the mode: the schema's dtype


def test_categorical_codes_are_renumbered_by_first_appearance():
    """Unused categories, and categories in another order than the rows', are not the answer:
    ``factorize`` gives pandas' codes of the values (first appearance), as for a string column."""
    cat = pd.Categorical(["b", "a", None, "b", "c"], categories=["z", "c", "a", "b"])
    codes, uniques = S.factorize(cat)
    np.testing.assert_array_equal(codes, [0, 1, -1, 0, 2])
    assert list(uniques) == ["b", "a", "c"]
    assert S.factorize(cat, most=2) is None  # more distinct values than asked for
    assert S.distinct(cat) == ["b", "a", "c"]


def test_mode_makes_categoricals_inside_only():
    codes = np.array([0, 1, -1, 0, 2])
    outside = S.from_codes(codes, ["x", "y", "z"])
    assert outside.dtype == S.STRING
    with S.categorical_columns():
        inside = S.from_codes(codes, ["x", "y", "z"])
        assert isinstance(inside, pd.Categorical)
        assert isinstance(S.string_array(np.array(["a", None], dtype=object)), pd.Categorical)
        vocab = S.Vocab(["p", "q"])
        assert isinstance(vocab.strings(np.array([1, 0, -1])), pd.Categorical)
    assert S.from_codes(codes, ["x", "y", "z"]).dtype == S.STRING
    pd.testing.assert_extension_array_equal(S.to_string_array(inside), outside)
    with pytest.raises(RuntimeError), S.categorical_columns():
        raise RuntimeError("left by an exception")
    assert S.from_codes(codes, ["x", "y", "z"]).dtype == S.STRING  # the mode ends with its block


@pytest.mark.parametrize("uniques", [["a", "a", "b"], ["a", None, "b"], ["a", pd.NA, "a"]])
def test_categorical_from_codes_merges_equal_values_and_na_as_string_does(uniques):
    codes = np.array([0, 1, 2, -1, 2, 1, 0])
    with S.categorical_columns():
        cat = S.from_codes(codes, uniques)
    pd.testing.assert_extension_array_equal(S.to_string_array(cat), S.from_codes(codes, uniques))
    assert len(cat.categories) == len({u for u in uniques if isinstance(u, str)})


def test_set_rows_adds_new_values_and_leaves_the_old_array():
    base = np.array(["fwd", None, "bwd", "fwd", None], dtype=object)
    with S.categorical_columns():
        cat = pd.DataFrame({"d": S.string_array(base)})
    plain = pd.DataFrame({"d": pd.array(base, dtype=S.STRING)})
    old = cat["d"].array
    for frame in (cat, plain):
        S.set_rows(frame, "d", np.array([1, 3]), ["bwd_data", None])
        S.set_rows(frame, "d", np.array([True, False, False, False, True]), "update")
    assert isinstance(cat["d"].dtype, pd.CategoricalDtype)
    assert cat["d"].astype(object).where(cat["d"].notna(), None).tolist() == ["update", "bwd_data", "bwd", None, "update"]
    pd.testing.assert_extension_array_equal(S.to_string_array(cat["d"]), plain["d"].array)
    assert old.tolist()[:4] == ["fwd", np.nan, "bwd", "fwd"]  # the column it replaced is as it was


def test_concat_unites_categories():
    with S.categorical_columns():
        a = schema.conform(pd.DataFrame({"kind": ["op", "kernel"], "kernel_name": [None, "k1"]}))
        b = schema.conform(pd.DataFrame({"kind": ["runtime", "op"], "kernel_name": ["k2", None],
                                         "dur_ns": [5, None]}))
    both = schema.concat([a, b])
    assert isinstance(both["kind"].dtype, pd.CategoricalDtype)
    assert both["kind"].tolist() == ["op", "kernel", "runtime", "op"]
    assert S.to_string_array(both["kernel_name"]).tolist() == [pd.NA, "k1", "k2", pd.NA]
    assert both["dur_ns"].dtype == "Int64" and both["dur_ns"].tolist()[2:] == [5, pd.NA]
    want = pd.concat([S.plain(a), S.plain(b)], ignore_index=True)
    pd.testing.assert_frame_equal(S.plain(both), want)


def test_validate_takes_categorical_strings_only_for_string_columns():
    with S.categorical_columns():
        df = schema.conform(pd.DataFrame({"kind": ["op"], "dur_ns": [1]}))
    assert schema.validate(df) is df
    bad = df.assign(dur_ns=pd.Categorical([1]))
    with pytest.raises(schema.SchemaError, match="dur_ns"):
        schema.validate(bad)
    bad = df.assign(kind=pd.Categorical(["opp"]))  # the vocabulary is checked as for a string column
    with pytest.raises(schema.SchemaError, match="vocabulary"):
        schema.validate(bad)
    bad = df.assign(layer=pd.Categorical([3]))  # categories that are not strings
    with pytest.raises(schema.SchemaError, match="layer"):
        schema.validate(bad)


def test_records_are_categorical_and_written_as_the_string_schema(tmp_path):
    """The frame ``normalise`` writes has Categorical strings; its file is byte for byte the file of
    the same records in the schema's dtypes, and reads back as those."""
    files = [DATA / f for f in GPU_GROUP]
    compact, summarise = records(files, run="gpu")
    strs = [c for c in schema.COLUMNS if schema.DTYPES[c] is S.STRING]
    assert all(isinstance(compact[c].dtype, pd.CategoricalDtype) for c in strs)
    plain, summary = normalise(files, run="gpu")
    assert all(plain[c].dtype == S.STRING for c in strs)
    assert summarise() == summary
    schema.write_parquet(compact, tmp_path / "compact.parquet")
    schema.write_parquet(plain, tmp_path / "plain.parquet")
    assert (tmp_path / "compact.parquet").read_bytes() == (tmp_path / "plain.parquet").read_bytes()
    pd.testing.assert_frame_equal(schema.read_parquet(tmp_path / "compact.parquet"), plain)
    # the frame takes far less memory than its strings as objects (1 byte a row for up to 128 values)
    mem = {c: compact[c].memory_usage(index=False, deep=False) for c in strs}
    assert all(mem[c] < len(compact) * 2 + 64 * 1024 for c in strs), mem
