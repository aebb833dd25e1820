"""Library calls of the modes that replay CUDA graphs (PyTorch cuda-graph and compile-graphs), on a real
H200 run (tests/data/gpu_replay_modes_run: `kernelmap run --framework pytorch --mode cuda-graph
compile-graphs --profile all --batch-size 64 --steps 20`, records as normalised there, no raw traces).

A replayed step calls no library: cuDNN/cuBLAS are called while warming up and capturing (cuda-graph: 4
warm-up steps, the last one captured, plus the framework pass's eager reference step: 5 calls of each;
compile-graphs: 4, the CUDA graph trees' warm-up and recording). Counted per logged step, those calls
read 0.21 and 0.19 per step and the check failed 10 times on a correct run; now the table gives no
per-step figure for these modes, and the check asks that the capture called each layer and direction the
model has, and none that it lacks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.frameworks.case import Case
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C

from kernelmap import schema

RUN = Path(__file__).parent / "data" / "gpu_replay_modes_run"
KEYS = {"pytorch-cuda-graph": 5, "pytorch-compile-graphs": 4}  # cuDNN calls logged per layer and direction


def _library_checks(d: Path) -> pd.DataFrame:
    ch = C.self_checks([A.load_run(d)], None)
    return ch[ch["check"] == C.Check.LIBRARY_CALLS]


def test_replay_modes_are_named_by_the_descriptor():
    assert Case("pytorch", "cuda-graph").replay_reason and Case("pytorch", "compile-graphs").replay_reason
    assert Case("pytorch", "eager").replay_reason is None and Case("pytorch", "compile").replay_reason is None
    assert Case("mxnet", "hybridized").replay_reason is None


def test_the_capture_calls_each_layer_and_direction_of_the_model():
    lib = _library_checks(RUN)
    assert len(lib) == 12 and (lib["status"] == C.PASS).all(), lib[["framework", "subject", "status", "detail"]]
    for key, n in KEYS.items():
        rows = lib[lib["framework"] == key].set_index("subject")
        assert rows["measured"].isna().all()  # no per-step figure
        assert rows.loc["conv1 bwd_data", "detail"].endswith("made no call of this layer and direction: 0 logged")
        for s in ("conv1 fwd", "conv1 bwd_weight", "conv2 fwd", "conv2 bwd_data", "conv2 bwd_weight"):
            assert rows.loc[s, "detail"].endswith(f"made calls of this layer and direction: {n} logged"), s


def test_the_library_call_table_gives_no_per_step_figure_for_replays():
    t = A.library_calls([A.load_run(RUN)])
    conv = t[t["canonical_op"] == "conv2d"]
    assert set(conv["framework"]) == set(KEYS)
    assert conv["calls_per_step"].isna().all() and conv["ms_per_step"].isna().all()
    assert conv["basis"].str.contains("while warming up and capturing, none in a replayed step").all()
    assert sorted(conv.groupby("framework")["logged_calls"].sum().items()) == [
        ("pytorch-compile-graphs", 20), ("pytorch-cuda-graph", 25)]


@pytest.mark.parametrize("change", ["extra direction", "missing layer"])
def test_the_check_fails_where_the_capture_called_other_than_the_model(tmp_path, change):
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    rec = schema.read_parquet(d / "records.parquet")
    conv1 = rec.index[(rec["framework"] == "pytorch") & (rec["mode"] == "cuda-graph") & (rec["kind"] == "library_call")
                      & (rec["layer"] == "conv1") & (rec["direction"] == "bwd_weight")]
    assert len(conv1) == 5
    if change == "extra direction":  # a data gradient for the input layer, which the model has not
        rec.loc[conv1[:1], "direction"] = "bwd_data"
        subject = "conv1 bwd_data"
    else:  # no filter-gradient call of conv1 at all
        rec = rec.drop(index=conv1)
        subject = "conv1 bwd_weight"
    schema.write_parquet(rec, d / "records.parquet")
    lib = _library_checks(d)
    bad = lib[lib["status"] == C.FAIL]
    assert bad[["framework", "subject"]].values.tolist() == [["pytorch-cuda-graph", subject]]
