"""``normalise`` holds its records compact (``schema.compact_records``, issue 11): the string
columns as Categoricals (``strings.categorical_columns``), some integer columns in their narrowest
type. Every reader gives the answers it gives on the schema's dtypes, and the written file is the
same, byte for byte."""

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
    with schema.compact_records():
        a = schema.conform(pd.DataFrame({"kind": ["op", "kernel"], "kernel_name": [None, "k1"], "stream": [7, 7]}))
        b = schema.conform(pd.DataFrame({"kind": ["runtime", "op"], "kernel_name": ["k2", None],
                                         "dur_ns": [5, None], "stream": [None, 300]}))
    assert (str(a["stream"].dtype), str(b["stream"].dtype)) == ("Int8", "Int16")
    both = schema.concat([a, b])
    assert isinstance(both["kind"].dtype, pd.CategoricalDtype)
    assert both["kind"].tolist() == ["op", "kernel", "runtime", "op"]
    assert S.to_string_array(both["kernel_name"]).tolist() == [pd.NA, "k1", "k2", pd.NA]
    assert both["dur_ns"].dtype == "Int64" and both["dur_ns"].tolist()[2:] == [5, pd.NA]
    assert both["stream"].tolist() == [7, 7, pd.NA, 300]
    want = pd.concat([schema.in_schema_dtypes(a), schema.in_schema_dtypes(b)], ignore_index=True)
    pd.testing.assert_frame_equal(schema.in_schema_dtypes(both), want)


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


def test_records_are_compact_and_written_as_the_schema(tmp_path):
    """The frame ``normalise`` writes has Categorical strings and narrow integers; its file is byte
    for byte the file of the same records in the schema's dtypes, and reads back as those."""
    files = [DATA / f for f in GPU_GROUP]
    compact, summarise = records(files, run="gpu")
    strs = [c for c in schema.COLUMNS if schema.DTYPES[c] is S.STRING]
    assert all(isinstance(compact[c].dtype, pd.CategoricalDtype) for c in strs)
    narrow = {c: str(compact[c].dtype) for c in schema.NARROW_INTS}
    assert narrow["grid_y"] == "Int8" and narrow["block_x"] == "Int16" and narrow["batch_size"] == "Int8", narrow
    assert all(str(compact[c].dtype) == "Int64" for c in schema.COLUMNS if c not in schema.NARROW_INTS
               and schema.DTYPES[c] == "Int64")  # ids, times, steps: as they are
    plain, summary = normalise(files, run="gpu")
    assert all(plain[c].dtype == S.STRING for c in strs)
    assert all(str(plain[c].dtype) == "Int64" for c in schema.NARROW_INTS)
    pd.testing.assert_frame_equal(schema.in_schema_dtypes(compact), plain)
    assert summarise() == summary
    schema.write_parquet(compact, tmp_path / "compact.parquet")
    schema.write_parquet(plain, tmp_path / "plain.parquet")
    assert (tmp_path / "compact.parquet").read_bytes() == (tmp_path / "plain.parquet").read_bytes()
    pd.testing.assert_frame_equal(schema.read_parquet(tmp_path / "compact.parquet"), plain)
    # the frame takes far less memory than its strings as objects (1 byte a row for up to 128 values)
    mem = {c: compact[c].memory_usage(index=False, deep=False) for c in strs}
    assert all(mem[c] < len(compact) * 2 + 64 * 1024 for c in strs), mem


@pytest.mark.parametrize(("values", "want"), [
    ([0, 127, -128, None], "Int8"), ([128, None], "Int16"), ([-129], "Int16"), ([32767, -32768], "Int16"),
    ([32768], "Int32"), ([2**31 - 1, -(2**31)], "Int32"), ([2**31], "Int64"), ([-(2**63), 2**63 - 1], "Int64"),
    ([None, None], "Int8"), ([], "Int8"),
])
def test_narrow_int_takes_the_narrowest_type_that_holds_the_values(values, want):
    arr = pd.array(values, dtype="Int64")
    got = schema.narrow_int(arr)
    assert str(got.dtype) == want
    assert got.astype("Int64").tolist() == arr.tolist()  # the same values, NA where NA
    assert schema.narrow_int(got) is got  # narrow already: itself


def test_narrow_columns_only_inside_compact_records():
    df = pd.DataFrame({"kind": ["op"], "tid": [5], "start_ns": [3]})
    assert str(schema.conform(df)["tid"].dtype) == "Int64"
    with schema.compact_records():
        compact = schema.conform(df)
    assert str(compact["tid"].dtype) == "Int8" and str(compact["start_ns"].dtype) == "Int64"
    assert schema.validate(compact) is compact
    wide_where_not_allowed = compact.assign(start_ns=pd.array([3], dtype="Int8"))
    with pytest.raises(schema.SchemaError, match="start_ns"):
        schema.validate(wide_where_not_allowed)
    assert str(schema.conform(df)["tid"].dtype) == "Int64"  # the mode ends with its block


def test_category_ranks_renumber_any_slice():
    cat = pd.Categorical(["b", "a", None, "b", "c"], categories=["z", "c", "a", "b"])
    rank, uniques = S.category_ranks(cat)
    codes, want_uniques = S.factorize(cat)
    for lo, hi in [(0, 5), (2, 5), (1, 3)]:
        np.testing.assert_array_equal(rank[cat.codes[lo:hi]], codes[lo:hi])
    assert list(uniques) == list(want_uniques) == ["b", "a", "c"]
    assert S.category_ranks(cat, small=True)[0].dtype == np.int8
    assert S.category_ranks(pd.Series(pd.array(["x"], dtype=S.STRING))) is None  # not a Categorical


def test_categoricals_made_here_refuse_writes_to_their_rows():
    """Their first-appearance ranks are kept (``category_ranks``): their codes are read-only, so a
    write to a row raises instead of leaving a kept answer wrong; ``with_rows`` makes a new one."""
    with S.categorical_columns():
        made = S.from_codes(np.array([1, 0, 1, -1]), ["p", "q"])
    assert list(S.factorize(made)[1]) == ["q", "p"]
    with pytest.raises(ValueError):
        made[0] = "p"
    changed = S.with_rows(made, np.array([0]), ["p"])
    assert list(S.factorize(changed)[1]) == ["p", "q"] and list(S.factorize(made)[1]) == ["q", "p"]


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32"])
@pytest.mark.parametrize("codes", [[3, -1, 1, 3, 0, 1], [-1, -1], [], [0, 0, 0], [4, 2]])
def test_first_seen_native_and_pandas_agree(monkeypatch, dtype, codes):
    """The codes that occur, in order of first appearance (the native pass stops once every
    category is seen; categories no row has are left out, as NA is)."""
    arr = np.array(codes, dtype=dtype)
    want = [c for c in pd.unique(arr) if c >= 0]
    native = S._first_seen(arr, 5)
    assert native.tolist() == want
    if S._NATIVE is None:
        pytest.skip("the native helper is not built")
    monkeypatch.setattr(S, "_NATIVE", None)
    assert S._first_seen(arr, 5).tolist() == want
