"""Fast tests on the records' string columns (issue 11).

A ``string`` column holds one Python object per row, but the adapters share one object per
distinct value (a kernel name, a kind), so a million rows hold a few hundred objects. Hashing the
objects' addresses (one int64 pass) and then comparing only those few objects by value gives the
same answers as pandas' comparisons, which compare every row's string (several times slower).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def objects(col) -> np.ndarray:
    """The column's own object array (a ``string`` column's values, NA as ``pd.NA``; no copy)."""
    arr = col.array if isinstance(col, pd.Series) else col
    return np.asarray(arr, dtype=object)


def object_array(values: list) -> np.ndarray:
    """A 1-D object array of ``values`` as they are (lists stay elements, never become a dimension)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def factorize(col, most: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(codes, distinct values) of a column of strings: codes -1 for NA, the values in order of
    first appearance (``pd.factorize``'s answer). ``most``: None where the column holds more
    distinct objects than that (the caller then has a better way than by object)."""
    values = np.ascontiguousarray(objects(col))
    if len(values) == 0:
        return np.zeros(0, dtype="int64"), np.zeros(0, dtype=object)
    address = np.frombuffer(memoryview(values).cast("B"), dtype=np.int64)
    if most is not None:  # a look at a few thousand rows first
        step = max(1, len(values) // 4096)
        if len(pd.unique(address[::step])) * step > most:
            return None
    obj_codes, distinct = pd.factorize(address)
    if most is not None and len(distinct) > most:
        return None
    first = np.empty(len(distinct), dtype=np.int64)
    first[obj_codes[::-1]] = np.arange(len(values) - 1, -1, -1)  # the first row of each object
    codes, uniques = pd.factorize(values[first])
    return codes[obj_codes], uniques


def isin(col, wanted) -> np.ndarray:
    """Rows whose value is one of ``wanted`` (NA never is): ``col.isin(wanted)`` as a bool array."""
    wanted = set(wanted)
    return matches(col, wanted.__contains__)


def eq(col, value) -> np.ndarray:
    """``col.eq(value).fillna(False)`` as a bool array."""
    return isin(col, (value,))


def distinct(col) -> list:
    """The distinct non-NA values, in order of first appearance (``col.dropna().unique()``)."""
    return list(factorize(col)[1])


def isna(col) -> np.ndarray:
    """``col.isna()`` as a bool array. A ``string`` array holds its NA as the one ``pd.NA`` object:
    its address, compared in one int64 pass."""
    arr = col.array if isinstance(col, pd.Series) else col
    if isinstance(arr, pd.arrays.StringArray):
        values = np.ascontiguousarray(objects(arr))
        if len(values):
            return np.frombuffer(memoryview(values).cast("B"), dtype=np.int64) == id(pd.NA)
    return np.asarray(pd.isna(arr), dtype=bool)


def notna(col) -> np.ndarray:
    return ~isna(col)


def matches(col, test) -> np.ndarray:
    """``test(value)`` of each row's value, asked once per distinct value (False for NA)."""
    codes, uniques = factorize(col)
    hit = np.array([bool(test(u)) for u in uniques] + [False], dtype=bool)  # code -1 (NA): the last
    return hit[codes]


def contains(col, sub: str) -> np.ndarray:
    """``col.str.contains(sub, regex=False, na=False)`` as a bool array."""
    return matches(col, lambda u: sub in u)


def string_array(values) -> pd.arrays.StringArray:
    """``pd.array(values, dtype="string")``: each distinct value converted once (pandas' own
    conversion of those), the rows taken from them; pandas' conversion of every row where the rows
    do not share objects."""
    coded = factorize(values, most=len(values) // 4)
    if coded is None:
        return pd.array(np.asarray(values, dtype=object), dtype="string")
    codes, uniques = coded
    converted = np.asarray(pd.array(uniques, dtype="string"), dtype=object)
    rows = np.append(converted, pd.NA)[codes]  # code -1 (NA): the last
    try:  # str and pd.NA only, as pandas made them: no second check of every row
        return pd.arrays.StringArray._simple_new(rows, _string_dtype())
    except (AttributeError, TypeError):  # pragma: no cover - another pandas
        return pd.arrays.StringArray(rows)


def _string_dtype() -> pd.StringDtype:
    return pd.array([], dtype="string").dtype
