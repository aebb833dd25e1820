"""The adapters' fast paths give what their plain counterparts give: orjson or stdlib json, numpy
or pandas numbers, float/int arrays or object lists to Int64."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernelmap.adapters import _common, read

DATA = Path(__file__).parent / "data"

_TRICKY = [[[1, 2], [3]], [], [[]], [1.5], [1e16], ["é"], [True], [None], [math.nan], [2**70], [-3, [4]], None,
           [[64, 1, 28, 28], [32, 1, 3, 3], [32], [], []], {"a": 1}, "x", 5, -0.0]


@pytest.fixture
def no_orjson(monkeypatch):
    monkeypatch.setattr(_common, "_orjson", None)


def test_compact_json_same_with_and_without_orjson(monkeypatch):
    fast = _common.compact_json(_TRICKY)
    monkeypatch.setattr(_common, "_orjson", None)
    assert _common.compact_json(_TRICKY) == fast


@pytest.mark.parametrize("doc", [b'{"a": NaN}', b'{"a": 123456789012345678901234567890}', b'\xef\xbb\xbf{"a": 1}',
                                 '{"a": 1}'.encode("utf-16"), b'{"a": "\\ud800"}', b'{"a": 1, "a": 2}', b'[1e400]'])
def test_load_json_same_with_and_without_orjson(tmp_path, monkeypatch, doc):
    p = tmp_path / "doc.json"
    p.write_bytes(doc)

    def load():
        try:
            return repr(_common.load_json(p))
        except Exception as exc:  # noqa: BLE001 - the comparison is of whatever happens
            return type(exc).__name__

    fast = load()
    monkeypatch.setattr(_common, "_orjson", None)
    assert load() == fast


@pytest.mark.parametrize("name", ["gpu_kineto.json.gz", "cpu_torch_kineto.json.gz", "cpu_mxnet_profile.json.gz"])
def test_json_adapters_same_without_orjson(monkeypatch, name):
    fast = read(DATA / name)
    monkeypatch.setattr(_common, "_orjson", None)
    pd.testing.assert_frame_equal(read(DATA / name), fast, check_exact=True)


@pytest.mark.parametrize("values", [[1, None, 2.5], [1, 2, 3], [], [None], [True, 1], ["12", 3], [2**60, 1],
                                    [math.inf, 1], [{"a": 1}, 2], ["x", None]])
def test_numeric_is_to_numeric(values):
    got = _common.numeric(values)
    want = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
    np.testing.assert_array_equal(got.to_numpy(dtype="float64"), want.to_numpy(dtype="float64"))


@pytest.mark.parametrize("values", [np.array([1.4, np.nan, -2.5, 3.5]), np.array([1, 2], dtype="int64"),
                                    pd.Series([np.nan]), np.array([], dtype="float64")])
def test_int64_array_fast_path_is_the_object_path(values):
    fast = _common.int64_array(values, "x", "c")
    slow = _common.int64_array(pd.Series(values, dtype=object), "x", "c")
    pd.testing.assert_extension_array_equal(fast, slow)
