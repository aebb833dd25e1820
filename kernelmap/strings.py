"""Fast tests on the records' string columns (issue 11).

A ``string`` column holds one Python object per row, but the adapters share one object per
distinct value (a kernel name, a kind), so a million rows hold a few hundred objects. Hashing the
objects' addresses (one int64 pass) and then comparing only those few objects by value gives the
same answers as pandas' comparisons, which compare every row's string (several times slower).
Inside ``categorical_columns`` (``normalise``'s records) the columns made here are Categoricals
instead, and every function here answers for them from their codes as it does for ``string``.
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
import pandas as pd

from . import native

# The records' string dtype: one Python object per row, shared by the rows of one value (what the
# codes below rely on). pandas 3's default "string" is Arrow-backed, where every test here would
# first make a Python object per row (measured: normalise 4x slower on pandas 3.0.6 here, 18x on
# the GPU machine), so the storage is named, never left to the pandas version.
STRING = pd.StringDtype("python")


_CATEGORICAL = contextvars.ContextVar("kernelmap_categorical_columns", default=False)


@contextlib.contextmanager
def categorical_columns():
    """Inside (this thread or task): the records' string columns made by ``from_codes`` and
    ``string_array`` are Categoricals of their distinct values (1 byte a row for up to 128 values)
    instead of ``STRING`` (8 bytes a row, a pointer to a shared object). ``normalise`` holds its
    records so (issue 11: a million-event frame's strings in ~19 MB, not ~150 MB); every reader
    of a records column here accepts both."""
    token = _CATEGORICAL.set(True)
    try:
        yield
    finally:
        _CATEGORICAL.reset(token)


@contextlib.contextmanager
def object_columns():
    """Inside: pandas leaves an object column of str as it is (pandas 2's behaviour), where pandas 3
    infers its Arrow-backed ``str`` dtype (``future.infer_string``). An adapter's own frames (SQL
    result sets, per-table columns) then keep their rows' shared objects; converted to Arrow, each
    row's string was copied there and made a Python object again for every test and for the
    records (measured: the nsys adapter 2x slower on pandas 3.0.6)."""
    try:
        pd.get_option("future.infer_string")
    except KeyError:  # pragma: no cover - a pandas before the option (2.0; OptionError is a KeyError)
        yield
        return
    with pd.option_context("future.infer_string", False):
        yield


def is_string(dtype) -> bool:
    """Whether ``dtype`` is a records string column's: ``STRING``, or the Categorical that
    normalise holds them in."""
    if isinstance(dtype, pd.CategoricalDtype):  # of strings: object (or str) categories, or none yet
        return dtype.categories.dtype == object or pd.api.types.is_string_dtype(dtype.categories.dtype)
    return isinstance(dtype, pd.StringDtype) and dtype.storage == "python"


def _categorical(col):
    """The column's Categorical, or None where it is not one."""
    arr = col.array if isinstance(col, pd.Series) else col
    return arr if isinstance(arr, pd.Categorical) else None


def objects(col) -> np.ndarray:
    """The column's own object array (a ``string`` column's values, NA as ``pd.NA``; no copy)."""
    arr = col.array if isinstance(col, pd.Series) else col
    if isinstance(arr, pd.Categorical):
        return np.append(np.asarray(arr.categories, dtype=object), pd.NA)[arr.codes]
    if isinstance(arr, pd.arrays.StringArray) and isinstance(getattr(arr, "_ndarray", None), np.ndarray):
        return arr._ndarray  # itself (pandas 3's np.asarray gives a new read-only view each time)
    return np.asarray(arr, dtype=object)


def object_array(values: list) -> np.ndarray:
    """A 1-D object array of ``values`` as they are (lists stay elements, never become a dimension)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def factorize(col, most: int | None = None, small: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """(codes, distinct values) of a column of strings: codes -1 for NA, the values in order of
    first appearance (``pd.factorize``'s answer). ``most``: None where the column holds more
    distinct objects than that (the caller then has a better way than by object). ``small``: the
    codes in the smallest signed type that holds them (``code_type``; int8 for up to 128 values),
    for a caller that only compares them or indexes with them (a row's code in 1 byte, not 8). An
    unchanged array asked again is answered from the objects' codes kept from the first time
    (``_Answers``)."""
    cat = _categorical(col)
    if cat is not None:
        return _factorize_categorical(cat, most, small)
    values = np.ascontiguousarray(objects(col))
    if len(values) == 0:
        return np.zeros(0, dtype="int64"), np.zeros(0, dtype=object)
    address = np.frombuffer(memoryview(values).cast("B"), dtype=np.int64)
    known = _CACHE.get(values, address, small)
    if known is not None:
        return None if most is not None and known[2] > most else known[:2]
    if most is not None:  # a look at a few thousand rows first
        step = max(1, len(values) // 4096)
        if len(pd.unique(address[::step])) * step > most:
            return None
    obj_codes, distinct, first = _object_codes(address)
    if most is not None and len(distinct) > most:
        return None
    objs = values[first]
    code_of_obj, uniques = pd.factorize(objs)
    _CACHE.put(values, obj_codes, distinct, objs, code_of_obj, uniques)
    return _gather(code_of_obj, obj_codes, uniques, small), uniques


def _factorize_categorical(cat: pd.Categorical, most, small: bool):
    """``factorize`` of a Categorical: its codes renumbered in order of first appearance."""
    if len(cat) == 0:
        return np.zeros(0, dtype="int64"), np.zeros(0, dtype=object)
    rank, uniques = category_ranks(cat, small)
    if most is not None and len(uniques) > most:
        return None
    return rank[cat.codes], uniques


def category_ranks(col, small: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """For a Categorical column: (each category code's ``factorize`` code, the distinct values in
    order of first appearance), so that ``rank[codes]`` of any slice of its codes is that slice of
    ``factorize``'s codes; ``rank[-1]`` (NA, and categories no row has) is -1. ``small``: ``rank``
    in ``code_type``. None for another column."""
    cat = _categorical(col)
    if cat is None:
        return None
    codes = cat._codes
    kept = _RANKS.get(id(codes))
    if kept is not None and kept[0]() is codes:
        rank, uniques = kept[1:]
    else:
        cats = np.asarray(cat.categories, dtype=object)
        present = _first_seen(codes, len(cats))  # the distinct codes in order of first appearance
        rank = np.full(len(cats) + 1, -1, dtype=np.int64)
        rank[present] = np.arange(len(present))
        uniques = cats[present]
        if not codes.flags.writeable:  # ours (``_frozen``): its rows cannot change, the answer is kept
            _keep_ranks(codes, rank, uniques)
    return (rank.astype(code_type(len(uniques))) if small else rank), uniques


def _first_seen(codes: np.ndarray, n: int) -> np.ndarray:
    """The codes 0..n-1 that occur in ``codes`` (-1: NA), in order of first appearance: by the
    native helper where it is built (one pass, which ends once all n are seen), else by pandas."""
    helpers = _NATIVE
    if helpers is not None and codes.dtype.kind == "i" and codes.dtype.itemsize in (1, 2, 4) \
            and codes.flags.c_contiguous:
        return np.frombuffer(helpers.first_seen(codes, codes.dtype.itemsize, n), dtype=np.int64)
    seen = pd.unique(codes)
    return seen[seen >= 0].astype(np.int64)


# id(codes) -> (weakref to the codes, rank, uniques): ``category_ranks`` of the Categoricals made
# here, whose codes are read-only (``_frozen``), so an answer stays true while its array lives
_RANKS: dict[int, tuple] = {}


def _keep_ranks(codes: np.ndarray, rank: np.ndarray, uniques: np.ndarray) -> None:
    import weakref

    key = id(codes)
    try:
        ref = weakref.ref(codes, lambda r, key=key: _RANKS.pop(key, None) if _RANKS.get(key, (None,))[0] is r else None)
    except TypeError:  # pragma: no cover - an array type without weak references
        return
    _RANKS[key] = (ref, rank, uniques)
    while len(_RANKS) > 256:  # the oldest out
        _RANKS.pop(next(iter(_RANKS)), None)


def _frozen(cat: pd.Categorical) -> pd.Categorical:
    """``cat`` with its codes read-only: a write to its rows raises rather than changes them under
    the ranks kept for it (``category_ranks``); columns are changed by ``with_rows``, a new array."""
    cat._codes.flags.writeable = False
    return cat


def code_type(n: int) -> np.dtype:
    """The smallest signed integer type that holds the codes of ``n`` values and -1."""
    return np.min_scalar_type(-max(n, 1))


def _gather(code_of_obj: np.ndarray, obj_codes: np.ndarray, uniques, small: bool) -> np.ndarray:
    """Each row's value code (``code_of_obj[obj_codes]``), in ``code_type`` where ``small``."""
    return (code_of_obj.astype(code_type(len(uniques))) if small else code_of_obj)[obj_codes]


def _object_codes(address: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pd.factorize(address)`` and the first row of each distinct address: by the native helper
    where it is built (one pass), else by pandas."""
    helpers = _NATIVE
    if helpers is not None:
        codes, distinct, first = helpers.objcodes(address)
        return tuple(np.frombuffer(x, dtype=np.int64) for x in (codes, distinct, first))
    obj_codes, distinct = pd.factorize(address)
    first = np.empty(len(distinct), dtype=np.int64)
    first[obj_codes[::-1]] = np.arange(len(address) - 1, -1, -1)
    return obj_codes, distinct, first


def _same_objects(address: np.ndarray, obj_codes: np.ndarray, distinct: np.ndarray) -> bool:
    """Whether ``distinct[obj_codes]`` is ``address``, row for row: by the native helper where it
    is built (one pass, no temporary), else by numpy."""
    helpers = _NATIVE
    if helpers is not None and obj_codes.dtype.kind == "u" and obj_codes.flags.c_contiguous:
        return helpers.same_objects(address, obj_codes, distinct)
    return bool(np.array_equal(distinct[obj_codes], address))


_NATIVE = native.helpers  # the optional C helpers (kernelmap/native.py), None where not built


class _Answers:
    """The last few ``factorize`` answers, by array. An answer is given again only for the same
    array object, still alive, whose rows hold the same objects as when it was answered: the row
    addresses are checked against the distinct objects' addresses, which the entry keeps alive (so
    no other object can have taken one of those addresses meanwhile). A row written since, to any
    other object, fails the check; an entry dies with its array."""

    def __init__(self, size: int = 32):
        import threading

        self.size = size
        self.lock = threading.RLock()  # normalise summarises in one thread while another writes
        # id(array) -> (weakref, each row's object code (smallest int), the objects' addresses, the objects,
        # each object's value code, the distinct values)
        self.entries: dict[int, tuple] = {}

    def get(self, values: np.ndarray, address: np.ndarray, small: bool = False):
        with self.lock:
            return self._get(values, address, small)

    def _get(self, values: np.ndarray, address: np.ndarray, small: bool = False):
        e = self.entries.get(id(values))
        if e is None or e[0]() is not values:
            return None
        _, obj_codes, distinct, _, code_of_obj, uniques = e
        if len(obj_codes) != len(address) or not _same_objects(address, obj_codes, distinct):
            self.entries.pop(id(values), None)
            return None
        self.entries[id(values)] = self.entries.pop(id(values))  # most recent last
        return _gather(code_of_obj, obj_codes, uniques, small), uniques, len(distinct)

    def put(self, values: np.ndarray, obj_codes, distinct, objs, code_of_obj, uniques) -> None:
        with self.lock:
            self._put(values, obj_codes, distinct, objs, code_of_obj, uniques)

    def _put(self, values: np.ndarray, obj_codes, distinct, objs, code_of_obj, uniques) -> None:
        import weakref

        if len(values) < 4096:  # small arrays are factorised as fast as checked
            return
        key = id(values)
        try:
            ref = weakref.ref(values, lambda _r, key=key: self._drop(key, _r))
        except TypeError:  # pragma: no cover - an array type without weak references
            return
        small = obj_codes.astype(np.min_scalar_type(len(objs)))  # 1 byte a row for up to 256 objects
        self.entries[key] = (ref, small, distinct, objs, code_of_obj, uniques)
        while len(self.entries) > self.size:  # the oldest out (pop: a dying array may have taken it already)
            self.entries.pop(next(iter(self.entries)), None)

    def _drop(self, key: int, ref) -> None:
        with self.lock:
            e = self.entries.get(key)
            if e is not None and e[0] is ref:
                self.entries.pop(key, None)


_CACHE = _Answers()


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
    if isinstance(arr, pd.Categorical):
        return arr.codes < 0
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


def string_array(values):
    """The records' string column of ``values`` (str, NA where None or NA): a ``STRING`` array,
    or inside ``categorical_columns`` a Categorical of the distinct values."""
    if not _CATEGORICAL.get():
        cat = _categorical(values)
        return _string_array(values) if cat is None else to_string_array(cat)
    return categorical(values)


def categorical(values) -> pd.Categorical:
    """``values`` (a string column, or str and NA) as a Categorical of their distinct values."""
    cat = _categorical(values)
    if cat is not None:
        return cat
    codes, uniques = factorize(values)
    return _categorical_from_codes(codes, uniques)


def from_codes(codes: np.ndarray, uniques):
    """The records' string column whose row i is ``uniques[codes[i]]`` (NA where the code is -1):
    a ``STRING`` array (``_string_from_codes``), or inside ``categorical_columns`` a Categorical."""
    if _CATEGORICAL.get():
        return _categorical_from_codes(codes, uniques)
    return _string_from_codes(codes, uniques)


def _categorical_from_codes(codes: np.ndarray, uniques) -> pd.Categorical:
    """``from_codes`` as a Categorical: ``uniques`` its categories (distinct values where they are
    not distinct strings: equal values, and NA, merged as ``pd.array(..., dtype="string")`` would)."""
    codes = np.asarray(codes)
    uniques = list(uniques)
    if not _distinct_strings(uniques):
        conv = np.asarray(pd.array(object_array(uniques), dtype=STRING), dtype=object)  # pandas' conversion
        ucodes, distinct_u = pd.factorize(np.where(pd.isna(conv), None, conv) if len(conv) else conv)
        codes = np.append(ucodes, -1)[codes]
        uniques = list(distinct_u)
    return _frozen(pd.Categorical.from_codes(codes, categories=pd.Index(object_array(uniques), dtype=object)))


def _string_array(values) -> pd.arrays.StringArray:
    """``pd.array(values, dtype="string")``: each distinct value converted once (pandas' own
    conversion of those), the rows taken from them; pandas' conversion of every row where the rows
    do not share objects."""
    coded = factorize(values, most=len(values) // 4)
    if coded is None:
        return pd.array(np.asarray(values, dtype=object), dtype=STRING)
    return _cached(*coded)


def _cached(codes: np.ndarray, uniques) -> pd.arrays.StringArray:
    """``from_codes(codes, uniques)`` (``uniques`` in order of first appearance in ``codes``), its
    factorisation kept for a later ``factorize`` of it."""
    out, objs, obj_codes = _taken(codes, uniques)
    if objs is not None:
        # its factorisation is known (factorize's uniques are in order of first appearance): the
        # rows hold these objects, so a later factorize of it is answered from them
        _CACHE.put(objects(out), obj_codes, np.array([id(o) for o in objs], dtype=np.int64), objs,
                   np.append(np.arange(len(objs) - 1), -1), objs[:-1])
    return out


def _string_from_codes(codes: np.ndarray, uniques) -> pd.arrays.StringArray:
    """The ``string`` array whose row i is ``uniques[codes[i]]`` (NA where the code is -1):
    ``pd.array(np.asarray(uniques, dtype=object)[codes], dtype="string")`` with each value
    converted once, and no object array of the rows made first. Where ``uniques`` are distinct
    strings, the codes are factorised in one int64 pass and a later ``factorize`` of the array is
    answered as ``string_array``'s is."""
    codes = np.ascontiguousarray(codes, dtype=np.int64)
    uniques = list(uniques)
    if len(codes) < 4096 or not _distinct_strings(uniques):  # small: as fast either way
        return _taken(codes, uniques)[0]
    obj_codes, distinct, _ = _object_codes(codes)
    # distinct: the codes in order of first appearance, -1 (NA) among them where some rows have it
    rank = np.cumsum(distinct >= 0) - 1
    first = np.where(distinct >= 0, rank, -1)[obj_codes]
    return _cached(first, [uniques[c] for c in distinct[distinct >= 0].tolist()])


def _distinct_strings(values: list) -> bool:
    return all(type(v) is str for v in values) and len(set(values)) == len(values)


class Vocab:
    """A column's few values as int codes into ``values`` (-1: none), each distinct value once:
    a column worked out as codes and made strings once, at the end (``strings``)."""

    def __init__(self, values=()) -> None:
        self.values: list = []
        self._index: dict = {}
        for v in values:
            self.code(v)

    def code(self, value) -> int:
        """The code of ``value`` (added where new); -1 for None."""
        if value is None:
            return -1
        c = self._index.get(value)
        if c is None:
            c = self._index[value] = len(self.values)
            self.values.append(value)
        return c

    def codes_of(self, values) -> np.ndarray:
        """The codes of the given values (-2 for one not known: no row has it)."""
        return np.array([self._index.get(v, -2) for v in values], dtype=np.int32)

    def take(self, codes: np.ndarray) -> np.ndarray:
        """The values of ``codes`` as an object array (None for -1)."""
        return object_array([*self.values, None])[codes]

    def strings(self, codes: np.ndarray) -> pd.arrays.StringArray:
        return from_codes(codes, self.values)


def with_rows(col, rows: np.ndarray, values) -> pd.Categorical:
    """A new string column: ``col`` with ``values`` (one value, or one per row; NA where None)
    at positions ``rows``; the column itself is not written to (a frame may share it)."""
    cat = _categorical(col)
    if np.ndim(values) == 0 and not isinstance(values, pd.Categorical | pd.Series | np.ndarray | list):
        values = [values] * len(rows)
    vcodes, vuniques = factorize(values if isinstance(values, pd.Series | pd.Categorical | pd.api.extensions.ExtensionArray)
                                 else object_array(list(values)))
    cats = list(cat.categories)
    at = {v: i for i, v in enumerate(cats)}
    for v in vuniques:
        if v not in at:
            at[v] = len(cats)
            cats.append(v)
    where = np.append(np.array([at[v] for v in vuniques], dtype=np.int64), -1)
    codes = cat.codes.astype(code_type(len(cats)))
    codes[rows] = where[vcodes]
    return _frozen(pd.Categorical.from_codes(codes, categories=pd.Index(object_array(cats), dtype=object)))


def set_rows(df: pd.DataFrame, col: str, rows, values) -> None:
    """``df.loc[rows, col] = values`` for a records frame (its RangeIndex: labels are positions);
    string columns through ``with_rows``. ``rows``: a bool mask or positions."""
    rows = np.asarray(rows)
    if rows.dtype == bool:
        rows = np.flatnonzero(rows)
    if not len(rows):
        return
    if isinstance(df[col].dtype, pd.CategoricalDtype):
        if isinstance(values, pd.Series):
            values = values.array
        df[col] = with_rows(df[col], rows, values)
        return
    new = df[col].array.copy()
    new[rows] = values.array if isinstance(values, pd.Series) else values
    df[col] = new


def to_string_array(col) -> pd.arrays.StringArray:
    """A string column as ``STRING`` (each distinct value one object, shared by its rows)."""
    cat = _categorical(col)
    if cat is None:
        arr = col.array if isinstance(col, pd.Series) else col
        return arr if isinstance(arr, pd.arrays.StringArray) else pd.array(np.asarray(arr, dtype=object), dtype=STRING)
    codes, uniques = cat.codes, cat.categories
    if not len(codes):
        return pd.array([], dtype=STRING)
    if len(codes) < len(uniques):  # fewer rows than categories (a selection): only those its rows hold
        used = np.unique(codes[codes >= 0])
        codes = np.where(codes >= 0, np.searchsorted(used, codes), -1)
        uniques = uniques[used]
    return _taken(codes, uniques)[0]  # each category converted once


def plain(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its Categorical string columns as ``STRING`` (the other columns not copied):
    for pandas' own operations, whose answers on a Categorical differ (unobserved categories)."""
    cats = [c for c, t in frame.dtypes.items() if isinstance(t, pd.CategoricalDtype)]
    if not cats:
        return frame
    out = frame.copy(deep=False)
    for c in cats:
        out[c] = pd.Series(to_string_array(frame[c]), index=frame.index, copy=False)
    return out


def _taken(codes: np.ndarray, uniques):
    """(``from_codes``' array, the objects its rows hold by code with pd.NA last, the rows' codes
    into those), or (the array, None, None) where ``uniques`` are not distinct strings."""
    uniques = object_array(list(uniques))
    converted = np.asarray(pd.array(uniques, dtype=STRING), dtype=object)
    if len(pd.unique(uniques)) != len(uniques) or pd.isna(converted).any():
        return pd.array(np.append(uniques, None)[codes], dtype=STRING), None, None
    objs = np.append(converted, pd.NA)
    obj_codes = np.where(codes < 0, len(converted), codes)  # code -1 (NA): the last
    rows = objs[obj_codes]
    try:  # str and pd.NA only, as pandas made them: no second check of every row
        return pd.arrays.StringArray._simple_new(rows, STRING), objs, obj_codes
    except (AttributeError, TypeError):  # pragma: no cover - another pandas
        return pd.arrays.StringArray(rows), None, None
