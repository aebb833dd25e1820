"""Communication linking and its figures under pandas' copy-on-write (the default from pandas 3; the 4x H200
machine's pandas ran with it on 2026-11-27 and `kernelmap normalise` of every several-device run stopped in
commlink.mark_copies: "ValueError: output array is read-only"). Under copy-on-write ``Series.to_numpy()`` hands
out pandas' own array, read-only: an in-place ``&=`` on it fails. Each step here runs on the real CPU capture of
tests/data/cpu_devices_run with copy-on-write on, and gives what it gives with it off."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports.analyses import comm

from kernelmap import commlink, schema
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_devices_run"
COW = "mode.copy_on_write"



def _has_cow() -> bool:
    try:
        pd.get_option(COW)
    except KeyError:  # pandas before 1.5
        return False
    return True


pytestmark = pytest.mark.skipif(not _has_cow(), reason="this pandas has no copy-on-write mode")


def _normalised(tmp: Path, cow: bool) -> pd.DataFrame:
    run = tmp / "run"
    shutil.copytree(DATA, run)
    with pd.option_context(COW, cow):
        normalise_run_dir(run)
    return schema.read_parquet(run / "records.parquet")


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> pd.DataFrame:
    return _normalised(tmp_path_factory.mktemp("plain"), False)


def test_a_read_only_array_is_what_copy_on_write_hands_out():
    with pd.option_context(COW, True):
        assert not (pd.Series([1, 2]) > 1).to_numpy().flags.writeable  # the cause: never write into it


def test_normalise_under_copy_on_write_gives_the_same_records(plain, tmp_path):
    cow = _normalised(tmp_path, True)  # raised ValueError in mark_copies before
    pd.testing.assert_frame_equal(cow, plain)
    mx = cow[(cow["run"] == "mxnet-x2/bs32") & (cow["canonical_op"] == commlink.COLLECTIVE)]
    assert (mx["op_name"] != "KVStoreReduce").sum() > 0  # the KVStore's copies marked: mark_copies ran through


def test_the_figures_per_step_and_rank_under_copy_on_write(plain):
    want = comm.per_step(plain)
    with pd.option_context(COW, True):
        got = comm.per_step(plain)
        arr, coll = comm.arrivals(plain), comm.collectives(plain)
    pd.testing.assert_frame_equal(got, want)
    assert sorted(got.loc[got["run"] == "pytorch-x2/bs32", "rank"].tolist()) == [0, 0, 0, 1, 1, 1]
    pd.testing.assert_frame_equal(arr, comm.arrivals(plain))
    pd.testing.assert_frame_equal(coll, comm.collectives(plain))


def test_mark_copies_under_copy_on_write_on_the_columns_normalise_hands_it(plain):
    # normalise assigns the case's columns as plain Python values (numpy int64 ``devices``): the array of
    # ``devices > 1`` is then pandas' own, read-only under copy-on-write (an Int64 column's is a fresh copy)
    df = plain[plain["run"] == "mxnet-x2/bs32"].copy()
    copies = (df["canonical_op"] == commlink.COLLECTIVE).fillna(False) & (df["op_name"] != "KVStoreReduce").fillna(False)
    assert copies.sum() == 51  # CopyCPU2CPU in the optimizer phase
    bare = df.assign(devices=2, canonical_op=df["canonical_op"].where(~copies))
    with pd.option_context(COW, True):
        out = commlink.mark_copies(bare)  # raised "output array is read-only" before
    assert ((out["canonical_op"] == commlink.COLLECTIVE).fillna(False) == (df["canonical_op"] == commlink.COLLECTIVE)
            .fillna(False)).all()
