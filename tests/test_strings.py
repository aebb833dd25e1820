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
    return {"shared": pd.Series(pd.array(shared, dtype="string")), "own": pd.Series(pd.array(own, dtype="string")),
            "object": pd.Series(mixed, dtype=object), "empty": pd.Series(pd.array([], dtype="string"))}


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
    pd.testing.assert_extension_array_equal(S.string_array(col), pd.array(np.asarray(col, dtype=object), dtype="string"))
    if name != "empty":
        assert (S.factorize(col, most=10) is None) == (name == "own")  # rows of their own objects: step aside


def test_object_array_keeps_lists_as_elements():
    a = S.object_array([[1, 2], [3, 4]])
    assert a.shape == (2,) and a[0] == [1, 2]
