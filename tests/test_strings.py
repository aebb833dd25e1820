"""``kernelmap.strings``: the by-object tests on string columns give pandas' own answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kernelmap import strings as S


def _columns():
    rng = np.random.default_rng(0)
    pool = np.array(["kernel", "op", None, "runtime", "at::native::x", "Dgrad_k"], dtype=object)
    shared = pool[rng.integers(0, len(pool), 5000)]
    own = np.array([None if v is None else "".join(v) for v in shared], dtype=object)  # one object per row
    mixed = shared.copy()
    mixed[::3] = np.nan
    mixed[1::7] = 5
    return {"shared": pd.Series(pd.array(shared, dtype=S.STRING)), "own": pd.Series(pd.array(own, dtype=S.STRING)),
            "object": pd.Series(mixed, dtype=object), "empty": pd.Series(pd.array([], dtype=S.STRING))}


@pytest.mark.parametrize("name", ["shared", "own", "object", "empty"])
def test_strings_are_pandas(name):
    col = _columns()[name]
    codes, uniques = S.factorize(col)
    want_codes, want_uniques = pd.factorize(np.asarray(col.array, dtype=object))
    np.testing.assert_array_equal(codes, want_codes)
    assert list(uniques) == list(want_uniques)
    np.testing.assert_array_equal(S.isna(col), col.isna().to_numpy())
    np.testing.assert_array_equal(S.notna(col), col.notna().to_numpy())
    strs = col.astype("string")
    np.testing.assert_array_equal(S.isin(strs, ["op", "runtime"]), strs.isin(["op", "runtime"]).to_numpy())
    np.testing.assert_array_equal(S.eq(strs, "op"), strs.eq("op").fillna(False).to_numpy(dtype=bool))
    np.testing.assert_array_equal(S.contains(strs, "native"),
                                  strs.str.contains("native", regex=False, na=False).to_numpy(dtype=bool))
    assert S.distinct(strs) == list(strs.dropna().unique())
    pd.testing.assert_extension_array_equal(S.string_array(col), pd.array(np.asarray(col, dtype=object), dtype=S.STRING))
    if name != "empty":
        assert (S.factorize(col, most=10) is None) == (name == "own")  # rows of their own objects: step aside


@pytest.mark.parametrize("n", [3, 128, 129, 32768, 32769])
def test_factorize_small_codes_are_the_codes_in_the_smallest_type(n):
    """``small=True``: pandas' codes, in int8 up to 128 values (codes 0..127 and -1), int16 from
    129 on, int32 from 32769 on; the first answer and the one from the kept codes (the array asked again) alike."""
    rng = np.random.default_rng(1)
    pool = np.array([f"v{i}" for i in range(n)] + [None], dtype=object)
    rows = pool[np.r_[np.arange(n + 1), rng.integers(0, n + 1, 5000)]]  # every value (and NA) at least once
    col = pd.Series(pd.array(rows, dtype=S.STRING))
    want_codes, want_uniques = pd.factorize(rows)
    want_type = np.int8 if n <= 128 else np.int16 if n <= 32768 else np.int32
    for _ in range(2):
        codes, uniques = S.factorize(col, small=True)
        assert codes.dtype == want_type
        np.testing.assert_array_equal(codes, want_codes)
        assert list(uniques) == list(want_uniques)
    assert S.factorize(col)[0].dtype == np.int64  # the default: pandas' own type


def test_object_array_keeps_lists_as_elements():
    a = S.object_array([[1, 2], [3, 4]])
    assert a.shape == (2,) and a[0] == [1, 2]


def _pandas(col):
    return pd.factorize(np.asarray(col, dtype=object))


def _same(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    assert list(got[1]) == list(want[1])


def test_factorize_answers_again_only_for_the_unchanged_array(monkeypatch):
    pool = np.array(["conv", "relu", None, "pool"], dtype=object)
    arr = pd.array(pool[np.arange(20_000) % 4], dtype=S.STRING)
    _same(S.factorize(arr), _pandas(arr))
    calls = []
    real = pd.factorize
    monkeypatch.setattr(pd, "factorize", lambda *a, **k: calls.append(1) or real(*a, **k))
    _same(S.factorize(arr), _pandas(arr))  # unchanged: answered from the kept codes
    assert len(calls) == 1  # only _pandas' own call
    arr[7] = "".join(["li", "near"])  # a new object and a new value, written in place
    calls.clear()
    _same(S.factorize(arr), _pandas(arr))
    assert len(calls) > 1  # the check saw the change and factorised again
    arr[9] = "".join(["co", "nv"])  # an equal value in another object
    _same(S.factorize(arr), _pandas(arr))
    arr[11] = None
    _same(S.factorize(arr), _pandas(arr))


def test_factorize_answers_die_with_their_array():
    arr = pd.array(np.array(["a", "b"] * 5000, dtype=object), dtype=S.STRING)
    S.factorize(arr)
    key = id(np.asarray(arr, dtype=object))
    assert key in S._CACHE.entries
    del arr
    import gc

    gc.collect()
    assert key not in S._CACHE.entries


def test_string_array_result_factorises_as_pandas():
    pool = np.array(["x", None, "y", "x"], dtype=object)
    arr = S.string_array(pool[np.arange(10_000) % 4])
    _same(S.factorize(arr), _pandas(arr))
    arr[3] = "z"
    _same(S.factorize(arr), _pandas(arr))


@pytest.mark.parametrize("values", [
    np.zeros(0, dtype="int64"), np.array([7], dtype="int64"),
    np.repeat(np.random.default_rng(2).integers(0, 5, 3000) * 16 + 4096, 3),  # runs, few values
    np.random.default_rng(3).integers(-2**62, 2**62, 50_000),  # all distinct: the table grows
])
def test_object_codes_native_and_pandas_agree(values, monkeypatch):
    values = np.ascontiguousarray(values, dtype="int64")
    want_codes, want_distinct = pd.factorize(values)
    built = S._NATIVE
    answers = []
    for native in ([built] if built is not None else []) + [None]:
        monkeypatch.setattr(S, "_NATIVE", native)
        codes, distinct, first = S._object_codes(values)
        np.testing.assert_array_equal(codes, want_codes)
        np.testing.assert_array_equal(distinct, want_distinct)
        np.testing.assert_array_equal(first, np.unique(want_codes, return_index=True)[1])  # first rows
        answers.append(native)
    assert len(answers) == (2 if built is not None else 1)


@pytest.mark.parametrize("uniques", [["a", "bb", "c"], ["a", "a", "c"], ["a", None, "c"], []])
def test_from_codes_is_pandas(uniques):
    rng = np.random.default_rng(4)
    codes = rng.integers(-1, len(uniques), 6000) if uniques else np.full(10, -1)
    got = S.from_codes(codes, uniques)
    want = pd.array(np.append(np.array(uniques, dtype=object), None)[codes], dtype=S.STRING)
    pd.testing.assert_extension_array_equal(got, want)
    _same(S.factorize(got), _pandas(got))


def test_string_arrays_are_python_storage_under_arrow_default():
    """Where pandas' default "string" is Arrow-backed (mode.string_storage; pandas 3, as on the GPU
    machine), the arrays built here are still Python-object strings (``STRING``): the codes rely on
    rows sharing objects. They concatenate with an Arrow-backed column (a python StringArray
    labelled Arrow once broke pd.concat in normalise), and records conform to STRING."""
    from kernelmap import schema

    rows = ["conv", "relu", "conv", "conv", "pool", "conv", "relu", "conv", None, "conv", "conv", "conv"] * 10
    with pd.option_context("mode.string_storage", "pyarrow"):
        assert pd.array([], dtype="string").dtype.storage == "pyarrow"
        arr = S.string_array(pd.Series(rows, dtype=object))
        assert arr.dtype == S.STRING and arr.dtype.storage == "python"
        other = pd.DataFrame({"x": pd.array(["fc"], dtype="string")})  # Arrow-backed
        both = pd.concat([pd.DataFrame({"x": arr}), other], ignore_index=True)
        assert both["x"].tolist() == [*[r if r is not None else pd.NA for r in rows], "fc"]
        coded = S.from_codes(np.array([0, 1, -1, 0] * 1100), ["a", "b"])
        assert coded.dtype.storage == "python" and coded[:4].tolist() == ["a", "b", pd.NA, "a"]
        conformed = schema.conform(pd.DataFrame({"kind": other["x"]}))
        assert conformed["kind"].dtype.storage == "python" and conformed["kind"].tolist() == ["fc"]
        assert str(conformed["kind"].dtype) == schema.COLUMNS["kind"]  # validate's test holds
    python = S.string_array(pd.Series(rows, dtype=object))
    assert python.tolist() == arr.tolist()


@pytest.mark.parametrize("width", ["uint8", "uint16", "uint32", "uint64"])
def test_same_objects_native_and_numpy_agree(width, monkeypatch):
    """The cache's check that an array still holds the objects of its answer: the native pass and
    numpy give the same verdict, for a match and for a row changed (the last)."""
    rng = np.random.default_rng(7)
    distinct = rng.integers(2**20, 2**40, 40)
    codes = rng.integers(0, 40, 20_000).astype(width)
    address = distinct[codes]
    changed = address.copy()
    changed[-1] += 8
    built = S._NATIVE
    for native in ([built] if built is not None else []) + [None]:
        monkeypatch.setattr(S, "_NATIVE", native)
        assert S._same_objects(address, codes, distinct)
        assert not S._same_objects(changed, codes, distinct)


@pytest.mark.parametrize("values", [["conv2d", "linear", "relu"], ["fwd"], []])
def test_from_codes_of_values_is_string_array(values):
    """``from_codes`` of distinct values is ``string_array`` of the rows' values, and a later ``factorize`` of it
    answers as pandas does (values in order of first appearance)."""
    rng = np.random.default_rng(8)
    for n in (50, 20_000):
        codes = rng.integers(-1, len(values), n) if values else np.full(n, -1)
        got = S.from_codes(codes.astype("int32"), values)
        want = S.string_array(np.append(np.array(values, dtype=object), None)[codes])
        pd.testing.assert_extension_array_equal(got, want)
        _same(S.factorize(got), _pandas(got))


def test_object_columns_keep_object_str_and_restore_the_option():
    """Inside ``object_columns`` an object column of str stays object (pandas 3 would make it its
    Arrow-backed ``str``), its rows the same objects; after it, pandas infers as it did before."""

    name = "".join(["kernel", "_a"])  # a str object of its own
    arr = np.array([name, None, name], dtype=object)
    before = pd.DataFrame({"a": arr})["a"].dtype
    with S.object_columns():
        col = pd.DataFrame({"a": arr})["a"]
        assert col.dtype == object and col.iloc[0] is name and col.iloc[2] is name
        assert pd.concat([col, col], ignore_index=True).dtype == object
    assert pd.DataFrame({"a": arr})["a"].dtype == before


def test_string_array_of_a_selection_converts_only_its_categories(monkeypatch):
    """``to_string_array`` of a few rows of a Categorical (a selection of the records): pandas' own string
    array of those rows (NA stays NA), converting only the categories those rows hold (none for no rows)."""
    cats = pd.Categorical.from_codes(np.array([0, 3, -1, 3, 1, 0, 2, 4, 4, 5]), categories=[f"k{i}" for i in range(50)])
    seen: list[int] = []
    taken = S._taken
    monkeypatch.setattr(S, "_taken", lambda codes, uniques: seen.append(len(uniques)) or taken(codes, uniques))
    for rows in ([1, 2, 3], [2], [0, 5, 7, 8], [], list(range(10))):
        got = S.to_string_array(cats.take(rows))
        want = pd.array(np.asarray(cats.take(rows), dtype=object), dtype=S.STRING)
        assert got.dtype == S.STRING and got.equals(want), rows
    assert seen == [1, 0, 2, 6]  # k3; none (NA only); k0, k4; k0-k5 (no call for no rows)
